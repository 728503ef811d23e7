// The run's result history: CRC32C, TFRecord and Event encoding, CSV
// flattening and escaping, result.json parsing, and RunResults's files
// across reopening.
#include "experiment/results.h"

#include <cmath>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "experiment/layout.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::experiment {
namespace {

using nlohmann::json;
using testing::error_message_of;
using testing::read_text;
using testing::TempDir;
using testing::write_text;

std::string le_bytes(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

TEST(ExperimentHistory, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);  // continues
}

TEST(ExperimentHistory, MaskedCrcAndTfrecordFraming) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  const std::string rec = tfrecord("hello");
  ASSERT_EQ(rec.size(), 8u + 4 + 5 + 4);
  EXPECT_EQ(rec.substr(0, 8), le_bytes(5, 8));
  EXPECT_EQ(rec.substr(8, 4), le_bytes(masked_crc32c(le_bytes(5, 8)), 4));
  EXPECT_EQ(rec.substr(12, 5), "hello");
  EXPECT_EQ(rec.substr(17, 4), le_bytes(masked_crc32c("hello"), 4));
}

TEST(ExperimentHistory, EventEncodingMatchesTheProtobufWireFormat) {
  const std::string v = encode_file_version_event(1.5);
  // wall_time: key 0x09, double; file_version: key 0x1a, length, bytes.
  EXPECT_EQ(v, std::string("\x09", 1) + le_bytes(0x3FF8000000000000ull, 8) + "\x1a\x0d" +
                   "brain.Event:2");
  const std::string e = encode_scalars_event(2.0, 300, {{"a/b", 0.5f}});
  std::string value = std::string("\x0a\x03", 2) + "a/b" + "\x15" + le_bytes(0x3F000000u, 4);
  std::string summary = std::string("\x0a", 1) + static_cast<char>(value.size()) + value;
  std::string want = std::string("\x09", 1) + le_bytes(0x4000000000000000ull, 8) +
                     "\x10\xac\x02" +  // step 300 as a varint
                     "\x2a" + static_cast<char>(summary.size()) + summary;
  EXPECT_EQ(e, want);
}

TEST(ExperimentHistory, FlattenJoinsNestedKeysAndKeepsOnlyNumbersForScalars) {
  json m = {{"loss", 0.25},   {"eval", {{"acc", 1}, {"deep", {{"x", -2}}}}},
            {"ok", true},     {"name", "run"},
            {"list", {1, 2}}, {"empty", json::object()}};
  json flat = flatten_metrics(m);
  EXPECT_EQ(flat, json({{"loss", 0.25},
                        {"eval/acc", 1},
                        {"eval/deep/x", -2},
                        {"ok", true},
                        {"name", "run"},
                        {"list", {1, 2}}}));
  auto s = numeric_scalars(m);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (std::pair<std::string, float>{"eval/acc", 1.0f}));
  EXPECT_EQ(s[1], (std::pair<std::string, float>{"eval/deep/x", -2.0f}));
  EXPECT_EQ(s[2], (std::pair<std::string, float>{"loss", 0.25f}));
}

// As Ray's TensorBoard logger: every numeric key of a row but the axes, at
// the step of its training_iteration (timesteps_total where the row has it),
// whatever the row's number in the file (a restored run's first row may be
// iteration 17).
TEST(ExperimentHistory, TensorBoardEventsHoldEveryNumericKeyOfARowAtItsTrainingIteration) {
  const json row = {{"loss", 0.5},
                    {"training_iteration", 17},
                    {"timestamp", 1700000000},
                    {"time_total_s", 12.5},
                    {"time_this_iter_s", 0.75},
                    {"iterations_since_restore", 1},
                    {"attempt", 0},
                    {"checkpoint_dir_name", "checkpoint_000016"},
                    {"done", false}};
  EXPECT_EQ(tensorboard_step(row), 17);
  const auto s = tensorboard_scalars(row);
  std::map<std::string, float> got(s.begin(), s.end());
  EXPECT_EQ(got, (std::map<std::string, float>{{"attempt", 0.0f},
                                               {"iterations_since_restore", 1.0f},
                                               {"loss", 0.5f},
                                               {"time_this_iter_s", 0.75f}}));
  json with_timesteps = row;
  with_timesteps["timesteps_total"] = 4096;
  EXPECT_EQ(tensorboard_step(with_timesteps), 4096);
  EXPECT_EQ(tensorboard_scalars(with_timesteps).size(), 5u);  // timesteps_total is a value too
}

TEST(ExperimentHistory, CsvEscapesCommasQuotesAndNewlines) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\r"), "\"cr\r\"");
  EXPECT_EQ(csv_field(" padded"), "\" padded\"");
  EXPECT_EQ(csv_field(nullptr), "");
  EXPECT_EQ(csv_field(3), "3");
  EXPECT_EQ(csv_field(0.5), "0.5");
  EXPECT_EQ(csv_field(true), "true");
  EXPECT_EQ(csv_field(json({1, 2})), "\"[1,2]\"");
  std::vector<std::string> header;
  EXPECT_TRUE(extend_header(header, json({{"b", 1}, {"a", "x,y"}})));
  EXPECT_FALSE(extend_header(header, json({{"a", 2}})));
  EXPECT_EQ(header, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(csv_record(header, json({{"a", "x,y"}, {"b", 1}})), "\"x,y\",1\n");
  EXPECT_EQ(csv_record(header, json({{"b", 2}})), ",2\n");
}

TEST(ExperimentHistory, ResultLinesIgnoreATornLastLine) {
  auto p = parse_result_lines("{\"a\":1}\n\n{\"a\":2}\n{\"a\":", "r.json");
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[1]["a"], 2);
  EXPECT_EQ(p.complete_bytes, 17u);
  EXPECT_TRUE(parse_result_lines("{\"a\":1}", "r.json").rows.empty());  // no newline yet
  std::string msg =
      error_message_of([] { parse_result_lines("{\"a\":1}\n{oops\n{\"a\":3}\n", "r.json"); },
                       ErrorCode::kCorruption);
  EXPECT_NE(msg.find("r.json line 2"), std::string::npos) << msg;
  msg = error_message_of([] { parse_result_lines("[1]\n", "r.json"); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
}

struct FakeClock {
  double now = 1000.0;
  RunResults::Clock fn() {
    return [this] { return now; };
  }
};

TEST(ExperimentHistory, RunHistoryAppendsAndContinuesAfterReopening) {
  TempDir dir;
  auto storage = open_storage(dir.str());
  FakeClock clock;
  {
    RunResults h(storage, clock.fn());
    clock.now = 1002.5;
    h.record({{"loss", 1.0}}, std::nullopt, 0);
    clock.now = 1004.0;
    h.record({{"loss", 0.5}, {"eval", {{"acc", 0.9}}}}, "checkpoint_000000", 0);
    EXPECT_EQ(h.rows().size(), 2u);
    EXPECT_EQ(h.event_file().rfind("events.out.tfevents.1000.", 0), 0u) << h.event_file();
  }
  clock.now = 2000.0;  // a new driver, later: the downtime is not counted
  RunResults h(storage, clock.fn());
  clock.now = 2001.0;
  h.record({{"loss", 0.25}}, std::nullopt, 1);
  ASSERT_EQ(h.rows().size(), 3u);
  const auto rows = parse_result_lines(read_text(dir / "result.json"), "r").rows;
  EXPECT_EQ(rows, h.rows());
  EXPECT_EQ(rows[0]["training_iteration"], 1);
  EXPECT_EQ(rows[0]["timestamp"], 1002);
  EXPECT_EQ(rows[0]["time_total_s"], 2.5);
  EXPECT_EQ(rows[0]["checkpoint_dir_name"], nullptr);
  EXPECT_EQ(rows[1]["checkpoint_dir_name"], "checkpoint_000000");
  EXPECT_EQ(rows[1]["time_total_s"], 4.0);
  EXPECT_EQ(rows[2]["training_iteration"], 3);
  EXPECT_EQ(rows[2]["time_total_s"], 5.0);
  EXPECT_EQ(rows[2]["attempt"], 1);
  // Ray's per-row keys: the time since the previous row (or the driver's
  // start), and the rows since the last (re)start.
  EXPECT_EQ(rows[0]["time_this_iter_s"], 2.5);
  EXPECT_EQ(rows[1]["time_this_iter_s"], 1.5);
  EXPECT_EQ(rows[2]["time_this_iter_s"], 1.0);
  EXPECT_EQ(rows[0]["iterations_since_restore"], 1);
  EXPECT_EQ(rows[1]["iterations_since_restore"], 2);
  EXPECT_EQ(rows[2]["iterations_since_restore"], 1);
  // progress.csv widened for eval/acc: every row has the column.
  EXPECT_EQ(read_text(dir / "progress.csv"),
            "attempt,checkpoint_dir_name,iterations_since_restore,loss,time_this_iter_s,"
            "time_total_s,timestamp,training_iteration,eval/acc\n"
            "0,,1,1.0,2.5,2.5,1002,1,\n"
            "0,checkpoint_000000,2,0.5,1.5,4.0,1004,2,0.9\n"
            "1,,1,0.25,1.0,5.0,2001,3,\n");
  // One event file per driver.
  int events = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    events += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(events, 2);
}

TEST(ExperimentHistory, ATornLineIsDroppedOnReopeningAndTheNextAppendStartsALine) {
  TempDir dir;
  auto storage = open_storage(dir.str());
  FakeClock clock;
  {
    RunResults h(storage, clock.fn());
    h.record({{"x", 1}}, std::nullopt, 0);
  }
  const std::string good = read_text(dir / "result.json");
  write_text(dir / "result.json", good + "{\"x\":2,\"trai");  // killed mid-append
  write_text(dir / "progress.csv", read_text(dir / "progress.csv") + "\"torn");
  RunResults h(storage, clock.fn());
  h.record({{"x", 3}}, std::nullopt, 0);
  const std::string text = read_text(dir / "result.json");
  EXPECT_EQ(text.rfind(good, 0), 0u);
  const auto rows = parse_result_lines(text, "r").rows;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["x"], 3);
  EXPECT_EQ(rows[1]["training_iteration"], 2);
  EXPECT_EQ(read_text(dir / "progress.csv"),
            "attempt,checkpoint_dir_name,iterations_since_restore,time_this_iter_s,time_total_s,"
            "timestamp,training_iteration,x\n"
            "0,,1,0.0,0.0,1000,1,1\n"
            "0,,1,0.0,0.0,1000,2,3\n");
}

// A kill between a commit and its row: the next driver writes the row from
// the checkpoint's committed metrics, once, and invents none (not for a
// checkpoint a row names, an older one, or a PBT copy from another trial).
TEST(ExperimentHistory, ACommittedCheckpointWithoutItsRowGetsItsRowOnce) {
  const std::string uri = "memory://history-backfill/exp";
  auto storage = open_storage(uri);
  FakeClock clock;
  TempDir src;
  write_text(src.path() / "w.bin", "w");
  CheckpointManager m(uri, {});
  auto commit = [&](const json& metrics) {
    return m.register_checkpoint(metrics, Checkpoint::from_directory(src.str()));
  };
  {
    RunResults h(storage, clock.fn());
    h.record({{"loss", 1.0}}, commit({{"loss", 1.0}, {"training_iteration", 1}}).name, 0, 1);
    h.record({{"loss", 0.5}}, std::nullopt, 0, 2);
    commit({{"loss", 0.25}, {"training_iteration", 3}});  // killed before its row
  }
  for (bool by_iteration : {true, false}) {
    SCOPED_TRACE(by_iteration ? "by iteration" : "by checkpoint");
    RunResults h(storage, clock.fn());
    h.backfill(m.history(), by_iteration, uri);
    ASSERT_EQ(h.rows().size(), 3u);
    EXPECT_EQ(h.rows()[2]["loss"], 0.25);
    EXPECT_EQ(h.rows()[2]["checkpoint_dir_name"], "checkpoint_000001");
    // Timestamped with its commit, not with the restore.
    EXPECT_EQ(h.rows()[2]["timestamp"],
              static_cast<int64_t>(std::floor(m.history().back().created_at)));
    EXPECT_EQ(h.rows()[2]["training_iteration"], 3);  // its own, or the row number
    if (by_iteration) {
      // Rewind the file to the two rows for the other mode.
      storage->put("result.json", h.rows()[0].dump() + "\n" + h.rows()[1].dump() + "\n");
    }
  }
  {
    RunResults h(storage, clock.fn());  // once written, not again
    h.backfill(m.history(), true, uri);
    EXPECT_EQ(h.rows().size(), 3u);
  }
  // A PBT copy from another trial carries the marker and gets no row.
  const CheckpointRecord copy = commit({{"loss", 0.1}, {"training_iteration", 9}});
  copy.checkpoint.update_metadata({{std::string(kClonedFromKey), "trial_00001/checkpoint_000004"}});
  RunResults h(storage, clock.fn());
  h.backfill(m.history(), true, uri);
  EXPECT_EQ(h.rows().size(), 3u);
  storage->remove_prefix("");
}

TEST(ExperimentHistory, ObjectStoresGetWholeObjects) {
  auto storage = open_storage("memory://history-test/exp");
  FakeClock clock;
  {
    RunResults h(storage, clock.fn());
    h.record({{"x", 1}}, std::nullopt, 0);
    h.record({{"x", 2}}, std::nullopt, 0);
  }
  RunResults h(storage, clock.fn());
  h.record({{"x", 3}}, std::nullopt, 0);
  EXPECT_EQ(read_result_rows(*storage), h.rows());
  ASSERT_EQ(h.rows().size(), 3u);
  EXPECT_EQ(h.rows()[2]["training_iteration"], 3);
  // Both drivers started in the same second: the second file gets a suffix.
  EXPECT_EQ(h.event_file().substr(h.event_file().size() - 2), ".1") << h.event_file();
  EXPECT_EQ(storage->get(h.event_file()),
            tfrecord(encode_file_version_event(1000.0)) +
                tfrecord(encode_scalars_event(1000.0, 3, tensorboard_scalars(h.rows()[2]))));
  storage->remove_prefix("");
}

}  // namespace
}  // namespace cairn::experiment
