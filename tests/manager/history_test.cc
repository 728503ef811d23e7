// The history's log format (manager/history.h) alone, and the manager's use
// of it on storage: appends, replay, compaction and damaged records.
#include <gtest/gtest.h>

#include <algorithm>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "manager/history.h"
#include "manager/history_store.h"
#include "storage/backends.h"

namespace cairn::testing {
namespace {

using nlohmann::json;
namespace h = cairn::history;

TEST(HistoryFormat, RecordsDecodeBackInOrder) {
  std::string bytes = h::encode_record({{"op", "counters"}, {"seq", 1}, {"next_index", 3}}) +
                      h::encode_record({{"op", "remove"}, {"seq", 2}, {"indices", {1}}});
  h::Decoded d = h::decode_records(bytes);
  EXPECT_FALSE(d.bad_offset);
  ASSERT_EQ(d.records.size(), 2u);
  EXPECT_EQ(d.records[0]["next_index"], 3);
  EXPECT_EQ(d.records[1]["op"], "remove");
}

TEST(HistoryFormat, ATornTailKeepsTheRecordsBeforeItAndNamesItsOffset) {
  std::string first = h::encode_record({{"op", "counters"}, {"seq", 1}, {"next_index", 3}});
  std::string second = h::encode_record({{"op", "counters"}, {"seq", 2}, {"next_index", 4}});
  for (size_t cut = 1; cut < second.size(); ++cut) {
    h::Decoded d = h::decode_records(first + second.substr(0, cut));
    ASSERT_EQ(d.records.size(), 1u) << cut;
    ASSERT_TRUE(d.bad_offset) << cut;
    EXPECT_EQ(*d.bad_offset, first.size());
    EXPECT_NE(d.problem.find("torn"), std::string::npos) << d.problem;
  }
}

TEST(HistoryFormat, AFlippedByteIsAChecksumMismatchAtThatRecord) {
  std::string first = h::encode_record({{"op", "counters"}, {"seq", 1}, {"next_index", 3}});
  std::string second = h::encode_record({{"op", "counters"}, {"seq", 2}, {"next_index", 4}});
  std::string bytes = first + second;
  bytes[bytes.size() - 3] ^= 0x20;
  h::Decoded d = h::decode_records(bytes);
  EXPECT_EQ(d.records.size(), 1u);
  ASSERT_TRUE(d.bad_offset);
  EXPECT_EQ(*d.bad_offset, first.size());
  EXPECT_NE(d.problem.find("checksum"), std::string::npos) << d.problem;
}

TEST(HistoryFormat, LogKeysSortInSeqOrderAndParseBack) {
  EXPECT_LT(h::log_key(9), h::log_key(10));
  EXPECT_LT(h::log_key(99999), h::log_key(UINT64_MAX));
  EXPECT_EQ(h::parse_log_key(h::log_key(12345)), 12345u);
  EXPECT_EQ(h::parse_log_key(h::log_key(UINT64_MAX)), UINT64_MAX);
  EXPECT_FALSE(h::parse_log_key("checkpoint_manager.log/12.rec"));
  EXPECT_FALSE(h::parse_log_key("checkpoint_manager.json"));
  EXPECT_FALSE(h::parse_log_key("checkpoint_manager.log/0000000000000000000x.rec"));
}

TEST(HistoryReplay, AddRemoveAndCountersApplyOnTheSnapshot) {
  h::State s;
  h::apply(s, h::add_record(1, 0, {json{{"loss", 1.0}}, 10.0, false}, 1, std::nullopt), "t");
  h::apply(s, h::add_record(2, 1, {json{{"loss", 0.5}}, 11.0, true}, 2, 11.0), "t");
  h::apply(s, h::counters_record(3, 5), "t");
  h::apply(s, h::remove_record(4, {0}), "t");
  ASSERT_EQ(s.records.size(), 1u);
  EXPECT_EQ(s.records.at(1).metrics["loss"], 0.5);
  EXPECT_TRUE(s.records.at(1).pinned);
  EXPECT_EQ(s.next_index, 5u);
  EXPECT_EQ(s.last_pinned_at, 11.0);
  // next_index never goes back, whatever order records come in.
  h::apply(s, h::counters_record(5, 2), "t");
  EXPECT_EQ(s.next_index, 5u);
}

TEST(HistoryReplay, AMalformedRecordIsCorruptionAndChangesNothing) {
  h::State s;
  s.next_index = 7;
  for (const json& bad : {json{{"op", "add"}, {"seq", 1}}, json{{"op", "explode"}},
                          json{{"op", "remove"}, {"indices", "all"}}, json::array()}) {
    try {
      h::apply(s, bad, "mem://x");
      ADD_FAILURE() << bad.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption);
      EXPECT_NE(std::string(e.what()).find("mem://x"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(s.records.empty());
  EXPECT_EQ(s.next_index, 7u);
}

TEST(HistoryReplay, TheSnapshotRoundTripsAndAnOldOneCoversEveryRecord) {
  h::State s;
  s.present = true;
  s.next_index = 3;
  s.log_seq = 17;
  s.records[2] = {json{{"a", 1}}, 5.0, true};
  h::State back = h::parse_snapshot(h::snapshot_json(s).dump(), "x");
  EXPECT_EQ(back.log_seq, 17u);
  EXPECT_EQ(back.next_index, 3u);
  EXPECT_EQ(back.records.at(2).metrics["a"], 1);
  json old = h::snapshot_json(s);
  old.erase("log_seq");
  EXPECT_EQ(h::parse_snapshot(old.dump(), "x").log_seq, UINT64_MAX);
}

// A snapshot cut short anywhere (or empty, or zeros) is torn: no history,
// rebuilt from the manifests. A whole one is not, even when malformed.
TEST(HistoryReplay, EveryPrefixOfASnapshotIsTornAndAWholeOneIsNot) {
  h::State s;
  s.present = true;
  s.next_index = 3;
  s.records[2] = {json{{"loss", 0.5}}, 12.0, false};
  const std::string text = h::snapshot_json(s).dump(1);
  EXPECT_FALSE(h::torn_snapshot(text));
  for (size_t n = 0; n < text.size(); ++n) {
    EXPECT_TRUE(h::torn_snapshot(text.substr(0, n))) << n << " bytes";
  }
  EXPECT_TRUE(h::torn_snapshot(std::string(64, '\0')));
  EXPECT_FALSE(h::torn_snapshot("[1, 2]")) << "whole JSON, malformed: parse_snapshot refuses it";
  EXPECT_FALSE(h::torn_snapshot(std::string(200, '[') + std::string(200, ']')))
      << "nested too deeply is malformed, not torn";
}

TEST(HistoryReplay, CompactionIsDueOnlyPastMaxOf64AndAnEighthOfTheLive) {
  EXPECT_FALSE(h::should_compact(64, 10));
  EXPECT_TRUE(h::should_compact(65, 10));
  EXPECT_FALSE(h::should_compact(1250, 10000));
  EXPECT_TRUE(h::should_compact(1251, 10000));
}

// The manager on memory:// storage.
class HistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_memory_bucket("hsrc");
    clear_memory_bucket("hexp");
    source_ = std::make_unique<Checkpoint>(Checkpoint::from_directory("memory://hsrc/a"));
    source_->storage().put("model.bin", "weights");
  }
  void TearDown() override {
    clear_memory_bucket("hsrc");
    clear_memory_bucket("hexp");
  }
  ManagerOptions collect() {
    ManagerOptions o;
    o.warn = [this](const std::string& w) { warnings.push_back(w); };
    return o;
  }
  std::vector<uint64_t> log_seqs() {
    std::vector<uint64_t> out;
    for (const auto& o : storage->list(""))
      if (auto s = h::parse_log_key(o.key)) out.push_back(*s);
    return out;
  }
  std::vector<uint64_t> history_indices(CheckpointManager& m) {
    std::vector<uint64_t> out;
    for (const auto& r : m.history()) out.push_back(r.index);
    return out;
  }
  void register_n(CheckpointManager& m, int n) {
    for (int i = 0; i < n; ++i) m.register_checkpoint({{"i", i}}, *source_);
  }

  const std::string uri = "memory://hexp/run";
  std::shared_ptr<Storage> storage = open_storage(uri);
  std::unique_ptr<Checkpoint> source_;
  std::vector<std::string> warnings;
};

TEST_F(HistoryTest, ARegisterAppendsOneRecordAndLeavesTheSnapshotAlone) {
  CheckpointManager m(uri, {}, collect());
  const std::string snapshot = storage->get(h::kSnapshotKey);
  register_n(m, 3);
  EXPECT_EQ(storage->get(h::kSnapshotKey), snapshot);
  EXPECT_EQ(log_seqs().size(), 3u);
}

TEST_F(HistoryTest, ANewManagerReplaysTheLogWithoutReadingManifests) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 5);
  }
  // Manifests that could not be read would make adoption warn: none may.
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(again.history()[3].metrics["i"], 3);
  EXPECT_TRUE(warnings.empty());
  // Nothing changed, so opening wrote no new snapshot and kept the log.
  EXPECT_EQ(log_seqs().size(), 5u);
}

TEST_F(HistoryTest, TheLogIsFoldedIntoTheSnapshotPastItsBound) {
  CheckpointManager m(uri, {}, collect());
  register_n(m, 70);
  EXPECT_LE(log_seqs().size(), 64u);
  h::State s = h::parse_snapshot(storage->get(h::kSnapshotKey), "x");
  EXPECT_GE(s.records.size(), 64u);
}

TEST_F(HistoryTest, RetentionDeletionsAreLoggedAndReplayed) {
  CheckpointConfig keep2;
  keep2.num_to_keep = 2;
  {
    CheckpointManager m(uri, keep2, collect());
    register_n(m, 5);
  }
  h::Loaded loaded = h::load_history(*storage, storage->list(""), [](const std::string&) {});
  std::vector<uint64_t> recorded;
  for (const auto& [i, e] : loaded.state.records) recorded.push_back(i);
  EXPECT_EQ(recorded, (std::vector<uint64_t>{3, 4}));
  EXPECT_FALSE(loaded.damaged);
}

TEST_F(HistoryTest, ATornLastRecordIsSkippedWithAWarningAndItsCheckpointAdopted) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  const std::string last = h::log_key(log_seqs().back());
  const std::string bytes = storage->get(last);
  storage->put(last, bytes.substr(0, bytes.size() - 5));
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(again.history()[2].metrics["i"], 2);  // from its manifest
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find(storage->uri_of(last)), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("offset 0"), std::string::npos) << warnings[0];
  // Repaired: a new snapshot, the damaged record gone.
  EXPECT_TRUE(log_seqs().empty());
}

TEST_F(HistoryTest, ABadRecordInTheMiddleIsSkippedAndTheRestStillApply) {
  CheckpointConfig keep_all;
  {
    CheckpointManager m(uri, keep_all, collect());
    register_n(m, 4);
    m.reserve_next();  // a counters record after the damaged one
  }
  std::vector<uint64_t> seqs = log_seqs();
  ASSERT_EQ(seqs.size(), 5u);
  const std::string middle = h::log_key(seqs[1]);
  std::string bytes = storage->get(middle);
  bytes[bytes.size() / 2] ^= 0x01;
  storage->put(middle, bytes);
  CheckpointManager again(uri, keep_all, collect());
  // Nothing committed is lost (index 1 is adopted from its manifest), and the
  // reservation after the damage still holds: index 4 is not handed out again.
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2, 3}));
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("checksum"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(storage->uri_of(middle)), std::string::npos) << warnings[0];
  EXPECT_EQ(again.register_checkpoint({}, *source_).index, 5u);
}

TEST_F(HistoryTest, ARecordWhoseCheckpointIsGoneIsDroppedNotResurrected) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  storage->remove(join_key(checkpoint_name(1), kManifestKey));
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 2}));
}

TEST_F(HistoryTest, ACompactionCrashBeforeTheLogIsRemovedDoesNotReapplyOldRecords) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 2);
  }
  // As if a compaction wrote its snapshot (covering seq 1 and 2, with newer
  // metrics) and crashed before removing the log objects it folded in.
  h::Loaded loaded = h::load_history(*storage, storage->list(""), [](const std::string&) {});
  h::State s = loaded.state;
  s.log_seq = loaded.max_seq;
  s.records.at(1).metrics = {{"i", "folded"}};
  storage->put(h::kSnapshotKey, h::snapshot_json(s).dump());
  ASSERT_EQ(log_seqs().size(), 2u);
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(again.history()[1].metrics["i"], "folded");
  EXPECT_TRUE(log_seqs().empty());  // removed by the repairing compaction
  // New records go after the old ones and replay.
  register_n(again, 1);
  EXPECT_GT(log_seqs().front(), loaded.max_seq);
}

TEST_F(HistoryTest, AnOldFormatExperimentOpensAndIsUpgradedOnFirstWrite) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  // The form older versions wrote: no log_seq, no log. Stale log objects
  // left beside it (by this version, then an older one rewrote the
  // snapshot) are covered by it.
  h::Loaded loaded = h::load_history(*storage, storage->list(""), [](const std::string&) {});
  json old = h::snapshot_json(loaded.state);
  old.erase("log_seq");
  old["checkpoints"][0]["metrics"] = {{"i", "old"}};
  storage->put(h::kSnapshotKey, old.dump(1));
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(again.history()[0].metrics["i"], "old");
  EXPECT_TRUE(warnings.empty());
  h::State upgraded = h::parse_snapshot(storage->get(h::kSnapshotKey), "x");
  EXPECT_NE(upgraded.log_seq, UINT64_MAX);
}

TEST_F(HistoryTest, AnExperimentCopyGetsTheLogFoldedIntoItsSnapshot) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  std::optional<std::string> folded = h::read_folded(*storage, [](const std::string&) {});
  ASSERT_TRUE(folded);
  h::State s = h::parse_snapshot(*folded, "x");
  EXPECT_EQ(s.records.size(), 3u);
  EXPECT_EQ(s.log_seq, log_seqs().back());
}

}  // namespace
}  // namespace cairn::testing
