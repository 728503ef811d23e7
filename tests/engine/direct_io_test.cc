// Direct I/O (O_DIRECT) for large state files: the path chosen and reported,
// files byte-identical to the buffered path whatever the alignment of their
// sizes, windows of partial reads, and clear errors where it cannot work.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "cairn/async_save.h"
#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "engine/io.h"
#include "storage/backends.h"
#include "support/env.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;
using format::Window;

// A state whose sizes are deliberately not multiples of 4 KiB: a large
// tensor spanning many windows, an odd-sized one, small ones and an empty one.
struct Odd {
  std::vector<float> big;
  std::vector<uint8_t> odd;
  std::vector<double> small;
  std::vector<int32_t> empty;
  explicit Odd(size_t big_floats = (size_t{9} << 20) / 4 + 3)
      : big(big_floats), odd(12345), small(7) {
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 9973) * 0.5f;
    for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<uint8_t>(i * 31);
    std::iota(small.begin(), small.end(), -3.0);
  }
  StateDict state() {
    StateDict s;
    s.add<float>("big", {big.size()}, big);
    s.add<uint8_t>("odd", {odd.size()}, odd);
    s.add<double>("small", {small.size()}, small);
    s.add<int32_t>("empty", {0}, empty);
    s.metadata = {{"step", 7}};
    return s;
  }
};

struct OddTarget {
  std::vector<float> big;
  std::vector<uint8_t> odd;
  std::vector<double> small;
  std::vector<int32_t> empty;
  explicit OddTarget(const Odd& o) : big(o.big.size()), odd(o.odd.size()), small(o.small.size()) {}
  StateDict state() {
    StateDict s;
    s.add_mutable<float>("big", {big.size()}, big);
    s.add_mutable<uint8_t>("odd", {odd.size()}, odd);
    s.add_mutable<double>("small", {small.size()}, small);
    s.add_mutable<int32_t>("empty", {0}, empty);
    return s;
  }
};

std::string file_bytes(const fs::path& p) { return read_text(p); }

TEST(DirectIoChoice, AutoGoesDirectOnlyForLargeFilesWhereThereIsAPath) {
  using format::choose_write_path;
  EXPECT_EQ(choose_write_path(IoPath::kAuto, kDirectIoMinBytes, 4096, "", "f").path,
            IoPath::kDirect);
  auto small = choose_write_path(IoPath::kAuto, kDirectIoMinBytes - 1, 4096, "", "f");
  EXPECT_EQ(small.path, IoPath::kBuffered);
  EXPECT_NE(small.reason.find("small file"), std::string::npos) << small.reason;
  auto none = choose_write_path(IoPath::kAuto, uint64_t{1} << 30, 0, "", "f");
  EXPECT_EQ(none.path, IoPath::kBuffered);
  EXPECT_NE(none.reason.find("O_DIRECT"), std::string::npos) << none.reason;
  auto off = choose_write_path(IoPath::kAuto, uint64_t{1} << 30, 4096, "off", "f");
  EXPECT_EQ(off.path, IoPath::kBuffered);
  EXPECT_EQ(off.reason, "CAIRN_DIRECT_IO=off");
  // Asking explicitly overrides size and environment, both ways.
  EXPECT_EQ(choose_write_path(IoPath::kDirect, 10, 4096, "off", "f").path, IoPath::kDirect);
  EXPECT_EQ(choose_write_path(IoPath::kBuffered, uint64_t{1} << 30, 4096, "", "f").path,
            IoPath::kBuffered);
}

TEST(DirectIoChoice, AskingForDirectWithoutAPathNamesTheFile) {
  std::string msg = error_message_of(
      [] { format::choose_write_path(IoPath::kDirect, 1 << 20, 0, "", "memory://x/state"); },
      ErrorCode::kFailedPrecondition);
  EXPECT_NE(msg.find("memory://x/state"), std::string::npos) << msg;
}

TEST(DirectIoChoice, ACachedFileIsReadThroughThePageCache) {
  using format::choose_read_path;
  const uint64_t big = uint64_t{1} << 30;
  EXPECT_EQ(choose_read_path(IoPath::kAuto, big, true, 0.1, "", "f").path, IoPath::kDirect);
  auto warm = choose_read_path(IoPath::kAuto, big, true, 0.9, "", "f");
  EXPECT_EQ(warm.path, IoPath::kBuffered);
  EXPECT_NE(warm.reason.find("page cache"), std::string::npos) << warm.reason;
  EXPECT_EQ(choose_read_path(IoPath::kDirect, big, true, 1.0, "", "f").path, IoPath::kDirect);
}

TEST(DirectIoWindows, RoundOutMergeNeighboursAndSplitAtTheCap) {
  std::vector<std::byte> mem(100000);
  auto job = [&](uint64_t off, size_t n) { return format::ReadJob{off, {mem.data(), n}}; };
  // Two ranges in one page, one 3 pages on, one far away; given out of order.
  std::vector<format::ReadJob> jobs{job(1 << 20, 10), job(10, 20), job(100, 4000),
                                    job(3 * 4096 + 5, 1)};
  auto w = format::plan_windows(jobs, 4096, 1 << 20, /*merge_gap=*/4096 * 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], (Window{0, 4 * 4096}));
  EXPECT_EQ(w[1], (Window{1 << 20, (1 << 20) + 4096}));
  // Without merging, the page-3 range stands alone; a long range is split.
  w = format::plan_windows({job(10, 20), job(3 * 4096 + 5, 1), job(8192 * 10, 8192 * 3)}, 4096,
                           8192, 0);
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0], (Window{0, 4096}));
  EXPECT_EQ(w[1], (Window{3 * 4096, 4 * 4096}));
  EXPECT_EQ(w[2], (Window{8192 * 10, 8192 * 11}));
  EXPECT_EQ(w[4], (Window{8192 * 12, 8192 * 13}));
  // Empty jobs need no window.
  EXPECT_TRUE(format::plan_windows({job(4096, 0)}, 4096, 8192, 0).empty());
}

TEST(DirectIoRead, AFileThatEndsEarlyIsCorruptionNamingTheOffset) {
  std::vector<std::byte> out(10000);
  std::string msg = error_message_of(
      [&] {
        format::read_direct(
            {{0, out}}, 10000, 4096,
            [](uint64_t off, std::span<std::byte> buf) -> size_t {
              return off >= 4096 ? 0 : std::min<size_t>(buf.size(), 4096);
            },
            1 << 20, 1, "file:///x/state.safetensors");
      },
      ErrorCode::kCorruption);
  EXPECT_NE(msg.find("file:///x/state.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4096"), std::string::npos) << msg;
}

TEST(DirectIoSave, SaveFileWritesTheSameBytesDirectAndBufferedAndSaysWhichItUsed) {
  TempDir dir;
  Odd src;
  StateDict state = src.state();
  for (size_t block : {size_t{16} << 20, size_t{64} << 10, size_t{5000}}) {
    IoReport direct_report, buffered_report;
    SaveOptions direct{.block_size = block, .io = IoPath::kDirect, .report = &direct_report};
    SaveOptions buffered{.block_size = block, .io = IoPath::kBuffered, .report = &buffered_report};
    save_file(state, dir / "direct.safetensors", direct);
    save_file(state, dir / "buffered.safetensors", buffered);
    EXPECT_EQ(direct_report.path, IoPath::kDirect) << direct_report.reason;
    EXPECT_EQ(buffered_report.path, IoPath::kBuffered);
    EXPECT_EQ(fs::file_size(dir / "direct.safetensors"),
              fs::file_size(dir / "buffered.safetensors"));
    EXPECT_TRUE(file_bytes(dir / "direct.safetensors") == file_bytes(dir / "buffered.safetensors"))
        << "block " << block;
  }
  // Nothing but the two files is left behind.
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
  EXPECT_EQ(n, 2u);
}

TEST(DirectIoSave, StorageSavesGoDirectByDefaultForLargeFilesAndMatchTheBufferedBytes) {
  TempDir dir;
  auto storage = open_storage("file://" + dir.str());
  Odd src;
  StateDict state = src.state();
  IoReport auto_report, buffered_report;
  ManifestEntry a = save(state, *storage, "auto.safetensors", {.report = &auto_report});
  ManifestEntry b = save(state, *storage, "buffered.safetensors",
                         {.io = IoPath::kBuffered, .report = &buffered_report});
  EXPECT_EQ(auto_report.path, IoPath::kDirect) << auto_report.reason;
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.xxh3, b.xxh3);
  // The direct path takes block checksums window by window: the same ones.
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.block_xxh3, b.block_xxh3);
  EXPECT_EQ(a.block_xxh3.size(), (a.size + a.block_size - 1) / a.block_size);
  EXPECT_TRUE(file_bytes(dir / "auto.safetensors") == file_bytes(dir / "buffered.safetensors"));
  // A small state stays buffered, and says why.
  std::vector<float> tiny(10, 1.0f);
  StateDict small;
  small.add<float>("t", {10}, tiny);
  IoReport small_report;
  save(small, *storage, "small.safetensors", {.report = &small_report});
  EXPECT_EQ(small_report.path, IoPath::kBuffered);
  EXPECT_NE(small_report.reason.find("small file"), std::string::npos) << small_report.reason;
}

TEST(DirectIoSave, TheEnvironmentCanTurnTheAutomaticChoiceOff) {
  ScopedEnv off("CAIRN_DIRECT_IO", "off");
  TempDir dir;
  auto storage = open_storage("file://" + dir.str());
  Odd src;
  IoReport report;
  save(src.state(), *storage, "s.safetensors", {.report = &report});
  EXPECT_EQ(report.path, IoPath::kBuffered);
  EXPECT_EQ(report.reason, "CAIRN_DIRECT_IO=off");
}

TEST(DirectIoSave, AskingForDirectOnAStorageWithoutItFailsNamingTheObjectAndCommitsNothing) {
  auto storage = open_storage("memory://direct-io-test");
  Odd src(1000);
  std::string msg = error_message_of(
      [&] { save(src.state(), *storage, "s.safetensors", {.io = IoPath::kDirect}); },
      ErrorCode::kFailedPrecondition);
  EXPECT_NE(msg.find("memory://direct-io-test"), std::string::npos) << msg;
  EXPECT_FALSE(storage->stat("s.safetensors"));
}

// Direct writes allocate the whole file first (parallel direct writes into a
// growing file are serialized): a file that cannot fit fails there, naming
// it, before any of its data is written.
TEST(DirectIoSave, ADirectSaveThatCannotFitFailsAtItsPreallocationNamingTheFile) {
  SmallTmpfs disk(4 * 1024);  // less than one 9 MiB file
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  auto storage = open_storage("file://" + disk.path().string());
  Odd src;
  for (const std::string name : {"through-storage.safetensors", "save-file.safetensors"}) {
    std::string msg = error_message_of(
        [&] {
          if (name == "save-file.safetensors") {
            save_file(src.state(), disk.path() / name, {.io = IoPath::kDirect});
          } else {
            save(src.state(), *storage, name, {.io = IoPath::kDirect});
          }
        },
        ErrorCode::kNoSpace);
    EXPECT_NE(msg.find("preallocate"), std::string::npos) << msg;
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(disk.path() / name));
  }
  EXPECT_TRUE(storage->list_incomplete("").empty());
}

TEST(DirectIoSave, AFullDiskFailsTheDirectSaveNamingTheFileAndKeepsTheCommittedOne) {
  SmallTmpfs disk(12 * 1024);  // room for one 9 MiB file, not two
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  auto storage = open_storage("file://" + disk.path().string());
  Odd src;
  save(src.state(), *storage, "s.safetensors", {.io = IoPath::kDirect});
  const std::string before = file_bytes(disk.path() / "s.safetensors");
  std::string msg = error_message_of(
      [&] { save(src.state(), *storage, "t.safetensors", {.io = IoPath::kDirect}); },
      ErrorCode::kNoSpace);
  EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << msg;
  EXPECT_FALSE(storage->stat("t.safetensors"));
  EXPECT_TRUE(storage->list_incomplete("").empty());
  EXPECT_TRUE(file_bytes(disk.path() / "s.safetensors") == before);
}

TEST(DirectIoLoad, ColdDirectLoadsAndSubsetsReadTheSameTensorsAsBuffered) {
  TempDir dir;
  Odd src;
  save_file(src.state(), dir / "s.safetensors", {.io = IoPath::kDirect});
  for (IoPath io : {IoPath::kDirect, IoPath::kBuffered, IoPath::kAuto}) {
    for (size_t block : {size_t{16} << 20, size_t{8192}}) {
      OddTarget t(src);
      StateDict target = t.state();
      IoReport report;
      LoadReport r = load_into(dir / "s.safetensors", target,
                               {.block_size = block, .io = io, .report = &report});
      EXPECT_TRUE(r.consumed()) << r.describe();
      if (io != IoPath::kAuto) {
        EXPECT_EQ(report.path, io) << report.reason;
      }
      EXPECT_EQ(t.big, src.big);
      EXPECT_EQ(t.odd, src.odd);
      EXPECT_EQ(t.small, src.small);
      EXPECT_EQ(target.metadata["step"], 7);
    }
  }
  // A subset: only the odd-sized tensor, verified against the whole file's checksum.
  auto storage = open_storage("file://" + dir.str());
  auto info = storage->stat("s.safetensors");
  ASSERT_TRUE(info);
  std::vector<uint8_t> odd(src.odd.size());
  StateDict subset;
  subset.add_mutable<uint8_t>("odd", {odd.size()}, odd);
  IoReport report;
  load_into(*storage, "s.safetensors", subset,
            {.strict = false, .io = IoPath::kDirect, .report = &report});
  EXPECT_EQ(report.path, IoPath::kDirect);
  EXPECT_EQ(odd, src.odd);
}

TEST(DirectIoLoad, AChangedFileIsStillCaughtByTheManifestChecksum) {
  TempDir dir;
  auto storage = open_storage("file://" + dir.str());
  Odd src;
  ManifestEntry e = save(src.state(), *storage, "s.safetensors", {.io = IoPath::kDirect});
  {
    // Flip one byte in the big tensor's data, in place.
    std::fstream f(dir / "s.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.size / 2));
    f.put('\x7f');
  }
  OddTarget t(src);
  StateDict target = t.state();
  std::string msg = error_message_of(
      [&] {
        load_into(*storage, "s.safetensors", target,
                  {.expected_xxh3 = e.xxh3, .io = IoPath::kDirect});
      },
      ErrorCode::kCorruption);
  EXPECT_NE(msg.find("s.safetensors"), std::string::npos) << msg;
}

TEST(DirectIoAsync, AsyncSavesWriteTheStagingImageDirectlyAndMatchASynchronousSave) {
  TempDir dir;
  auto storage = open_storage("file://" + dir.str());
  Odd src;
  StateDict state = src.state();
  AsyncSaver saver({.write = {.io = IoPath::kDirect}});
  Checkpoint dest = Checkpoint::from_directory("file://" + (dir / "async").string());
  SaveHandle h = saver.save(state, dest);
  h.wait();
  // Block checksums of the whole-image direct path match a buffered save's.
  auto storage_b = open_storage("file://" + dir.str());
  ManifestEntry buffered = save(state, *storage_b, "b.safetensors", {.io = IoPath::kBuffered});
  EXPECT_EQ(h.manifest()->files.at(0).block_xxh3, buffered.block_xxh3);
  EXPECT_EQ(h.manifest()->files.at(0).xxh3, buffered.xxh3);
  save_file(state, dir / "sync.safetensors", {.io = IoPath::kBuffered});
  EXPECT_TRUE(file_bytes(dir / "async" / std::string(kStateFileName)) ==
              file_bytes(dir / "sync.safetensors"));
  saver.close();
}

}  // namespace
}  // namespace cairn::testing
