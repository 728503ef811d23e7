// The pure parts of `cairn cp`: rate, ETA and duration formatting, the
// terminal bar and log lines drawn from numbers, when the reporter redraws
// (with an injected clock), and the --json and text summaries.
#include "cli/cp.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cairn::cli {
namespace {

TransferProgress progress(uint64_t done, uint64_t total, uint64_t files_done = 3,
                          uint64_t files_total = 10, uint64_t skipped = 0) {
  TransferProgress p;
  p.bytes_done = done;
  p.bytes_total = total;
  p.bytes_skipped = skipped;
  p.files_done = files_done;
  p.files_total = files_total;
  return p;
}

constexpr uint64_t kMiB = 1 << 20;

TEST(CpFormat, RatesUseBinaryUnitsPerSecondAndADashWhenUnknown) {
  EXPECT_EQ(format_rate(512), "512 B/s");
  EXPECT_EQ(format_rate(3.1 * kMiB), "3.1 MiB/s");
  EXPECT_EQ(format_rate(0), "-");
  EXPECT_EQ(format_rate(-1), "-");
  EXPECT_EQ(format_rate(1.0 / 0.0), "-");
}

TEST(CpFormat, DurationsRoundUpToSecondsAndUseMinutesAndHours) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(8.2), "9s");
  EXPECT_EQ(format_duration(59), "59s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(25 * 3600 + 180), "25h03m");
  EXPECT_EQ(format_duration(-1), "-");
  EXPECT_EQ(format_duration(0.0 / 0.0), "-");
}

TEST(CpFormat, TheRateCountsOnlyBytesTransferredNotThoseFoundInPlace) {
  EXPECT_FALSE(transfer_rate(progress(10 * kMiB, 40 * kMiB), 0).has_value());
  EXPECT_FALSE(transfer_rate(progress(0, 40 * kMiB), 5).has_value());
  EXPECT_DOUBLE_EQ(*transfer_rate(progress(10 * kMiB, 40 * kMiB), 2), 5.0 * kMiB);
  // 6 MiB were already at the destination: 4 MiB moved in 2 s.
  EXPECT_DOUBLE_EQ(*transfer_rate(progress(10 * kMiB, 40 * kMiB, 3, 10, 6 * kMiB), 2), 2.0 * kMiB);
}

TEST(CpFormat, TheEtaIsWhatIsLeftAtTheRateSoFar) {
  EXPECT_DOUBLE_EQ(*estimate_eta(progress(10 * kMiB, 40 * kMiB), 2), 6.0);
  EXPECT_DOUBLE_EQ(*estimate_eta(progress(40 * kMiB, 40 * kMiB), 0), 0.0);
  EXPECT_FALSE(estimate_eta(progress(0, 40 * kMiB), 5).has_value());
}

TEST(CpFormat, NoEtaIsShownBeforeEnoughTimeAndEnoughBytes) {
  // The first small file of a large copy, done in a blink: its rate says
  // nothing about the rest.
  const TransferProgress first_file = progress(4096, 2048 * kMiB, 1, 100);
  EXPECT_NE(render_progress_line(first_file, 0.01).find("ETA -"), std::string::npos)
      << render_progress_line(first_file, 0.01);
  EXPECT_NE(render_progress_bar(first_file, 0.01, 120).find("ETA      - "), std::string::npos)
      << render_progress_bar(first_file, 0.01, 120);
  // Long enough, but still under 1% of the bytes moved.
  EXPECT_FALSE(estimate_eta(progress(10 * kMiB, 2048 * kMiB), 60).has_value());
  // Enough bytes, too soon.
  EXPECT_FALSE(estimate_eta(progress(10 * kMiB, 40 * kMiB), kEtaMinSeconds / 2).has_value());
  // Bytes found in place are neither moved nor left to move.
  EXPECT_FALSE(estimate_eta(progress(1000 * kMiB, 2048 * kMiB, 3, 10, 999 * kMiB), 10).has_value());
  EXPECT_TRUE(estimate_eta(progress(1048 * kMiB, 2048 * kMiB, 3, 10, 1000 * kMiB), 10).has_value());
}

TEST(CpBar, ShowsTheBarPercentBytesRateEtaAndFilesWithinTheWidth) {
  std::string line = render_progress_bar(progress(10 * kMiB, 40 * kMiB), 2, 120);
  EXPECT_EQ(line,
            "[##########..............................]   25%   10.0 MiB/40.0 MiB    5.0 MiB/s "
            "ETA     6s  3/10 files");
  EXPECT_LE(line.size(), 120u);
  // An 80-column terminal (79 usable) still gets a bar.
  std::string narrow = render_progress_bar(progress(10 * kMiB, 40 * kMiB), 2, 79);
  EXPECT_LE(narrow.size(), 79u);
  EXPECT_EQ(narrow.rfind("[#", 0), 0u) << narrow;
  std::string tiny = render_progress_bar(progress(10 * kMiB, 40 * kMiB), 2, 20);
  EXPECT_EQ(tiny.size(), 20u);
  EXPECT_EQ(tiny.find('['), std::string::npos) << tiny;
}

TEST(CpBar, EveryFrameOfOneCopyHasTheSameWidthAndTheSameBar) {
  const uint64_t total = 1500 * kMiB;
  std::vector<TransferProgress> frames = {progress(0, total, 0, 120),
                                          progress(700, total, 1, 120),
                                          progress(3 * kMiB, total, 9, 120),
                                          progress(900 * kMiB, total, 99, 120),
                                          progress(1499 * kMiB, total, 119, 120),
                                          progress(total, total, 120, 120)};
  for (size_t width : {79u, 100u, 160u}) {
    SCOPED_TRACE(width);
    std::string first;
    for (size_t i = 0; i < frames.size(); ++i) {
      // Rates from a few B/s to hundreds of MiB/s, ETAs from none to hours.
      const double elapsed = i == 0 ? 0.0 : (i == 1 ? 100.0 : 3.0);
      std::string frame = render_progress_bar(frames[i], elapsed, width);
      if (first.empty()) first = frame;
      EXPECT_EQ(frame.size(), first.size()) << first << "\n" << frame;
      EXPECT_EQ(frame.find(']'), first.find(']')) << first << "\n" << frame;
    }
  }
}

TEST(CpBar, AnEmptyCopyIsCompleteAndAFreshOneHasNoRateOrEta) {
  EXPECT_NE(render_progress_bar(progress(0, 0, 0, 0), 0, 100).find("100%"), std::string::npos);
  std::string fresh = render_progress_bar(progress(0, 40 * kMiB, 0, 10), 0, 120);
  EXPECT_NE(fresh.find("  0%"), std::string::npos) << fresh;
  EXPECT_NE(fresh.find("- ETA      -"), std::string::npos) << fresh;
}

TEST(CpLines, ALogLineCarriesTheSameNumbers) {
  EXPECT_EQ(render_progress_line(progress(10 * kMiB, 40 * kMiB), 2),
            "cp: 25% 10.0 MiB/40.0 MiB, 3/10 files, 5.0 MiB/s, ETA 6s");
}

struct Recorder {
  double now = 100.0;
  std::vector<std::string> written;
  ProgressReporter make(ProgressReporter::Mode mode) {
    return ProgressReporter(
        mode, [this] { return now; }, [this](const std::string& s) { written.push_back(s); }, 100);
  }
};

TEST(CpReporter, RedrawsTheBarInPlaceAtMostTenTimesASecondAndEndsItsLine) {
  Recorder r;
  auto reporter = r.make(ProgressReporter::Mode::kBar);
  reporter.update(progress(1, 100));  // first update draws
  r.now += 0.05;
  reporter.update(progress(2, 100));  // too soon
  r.now += 0.06;
  reporter.update(progress(3, 100));
  ASSERT_EQ(r.written.size(), 2u);
  EXPECT_EQ(r.written[0].front(), '\r');
  EXPECT_NE(r.written[0].find("\x1b[K"), std::string::npos);
  reporter.update(progress(100, 100, 10, 10));  // too soon, but finish() draws the last state
  reporter.finish();
  ASSERT_EQ(r.written.size(), 4u);
  EXPECT_NE(r.written[2].find("100%"), std::string::npos) << r.written[2];
  EXPECT_EQ(r.written[3], "\n");
}

TEST(CpReporter, WritesLogLinesEveryFewSecondsAndAFinalOne) {
  Recorder r;
  auto reporter = r.make(ProgressReporter::Mode::kLines);
  reporter.update(progress(1, 100));
  r.now += 1;
  reporter.update(progress(2, 100));
  r.now += ProgressReporter::kLineInterval;
  reporter.update(progress(50, 100));
  reporter.update(progress(100, 100, 10, 10));
  reporter.finish();
  ASSERT_EQ(r.written.size(), 3u);
  for (const auto& line : r.written) {
    EXPECT_EQ(line.rfind("cp: ", 0), 0u) << line;
    EXPECT_EQ(line.back(), '\n');
  }
  EXPECT_NE(r.written[1].find("50%"), std::string::npos) << r.written[1];
  EXPECT_NE(r.written[2].find("100%"), std::string::npos) << r.written[2];
}

TEST(CpReporter, AbortEndsADrawnBarSoTheErrorStartsOnItsOwnLine) {
  Recorder r;
  auto bar = r.make(ProgressReporter::Mode::kBar);
  bar.abort();
  EXPECT_TRUE(r.written.empty());
  bar.update(progress(1, 100));
  bar.abort();
  EXPECT_EQ(r.written.back(), "\n");
  auto off = r.make(ProgressReporter::Mode::kOff);
  const size_t before = r.written.size();
  off.update(progress(1, 100));
  off.finish();
  EXPECT_EQ(r.written.size(), before);
}

TransferReport sample_report() {
  TransferReport r;
  r.kind = TransferKind::kExperiment;
  r.source = "file:///data/runs/a";
  r.destination = "memory://b/a";
  r.files_copied = 4;
  r.bytes_copied = 3 * kMiB;
  r.files_skipped = 1;
  r.bytes_skipped = 1024;
  r.checkpoints_copied = {"memory://b/a/checkpoint_000001"};
  r.checkpoints_unchanged = {"memory://b/a/checkpoint_000000"};
  r.uncommitted_skipped = {"file:///data/runs/a/checkpoint_000002"};
  r.seconds = 1.5;
  return r;
}

TEST(CpResult, JsonHasTheDocumentedFieldsInOrder) {
  nlohmann::ordered_json j = cp_to_json(sample_report());
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "schema_version", "command", "kind", "source", "destination", "files_copied",
                      "bytes_copied", "files_skipped", "bytes_skipped", "checkpoints_copied",
                      "checkpoints_unchanged", "uncommitted_skipped", "warnings", "seconds"}));
  EXPECT_EQ(j["command"], "cp");
  EXPECT_EQ(j["kind"], "experiment");
  EXPECT_EQ(j["bytes_copied"], 3 * kMiB);
  EXPECT_EQ(j["uncommitted_skipped"][0], "file:///data/runs/a/checkpoint_000002");
}

TEST(CpResult, TextSummarizesCopiedAndSkippedAndNamesWhatWasLeftOut) {
  EXPECT_EQ(cp_to_text(sample_report()),
            "not copied (uncommitted, an interrupted save?): "
            "file:///data/runs/a/checkpoint_000002\n"
            "1 checkpoint copied, 1 already there\n"
            "cp: copied 4 files (3.0 MiB), skipped 1 file (1.0 KiB) already in place, in 1.5 s, "
            "to memory://b/a\n");
}

}  // namespace
}  // namespace cairn::cli
