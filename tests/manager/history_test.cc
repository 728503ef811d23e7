// The history's log format (manager/history.h) alone, and the manager's use
// of it on storage: appends, replay, compaction and damaged records.
#include <gtest/gtest.h>

#include <algorithm>

#include "cairn/commit.h"
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

TEST(HistoryReplay, EntriesCarrySizeAndFileCountAndADeletingRecordFlagsThem) {
  h::State s;
  h::State::Entry e{json{{"loss", 1.0}}, 10.0, false, 640, 3};
  h::apply(s, h::add_record(1, 0, e, 1, std::nullopt), "t");
  h::apply(s, h::add_record(2, 1, e, 2, std::nullopt), "t");
  h::apply(s, h::deleting_record(3, {0}), "t");
  EXPECT_EQ(s.records.at(0).size_bytes, 640u);
  EXPECT_EQ(s.records.at(0).file_count, 3u);
  EXPECT_TRUE(s.records.at(0).deleting);
  EXPECT_FALSE(s.records.at(1).deleting);
  EXPECT_EQ(s.version, h::kVersion);
  // The flag and the counts survive a snapshot; "remove" ends the entry.
  s.present = true;
  h::State back = h::parse_snapshot(h::snapshot_json(s).dump(), "x");
  EXPECT_TRUE(back.records.at(0).deleting);
  EXPECT_EQ(back.records.at(1).size_bytes, 640u);
  EXPECT_EQ(back.records.at(1).file_count, 3u);
  EXPECT_EQ(back.version, h::kVersion);
  h::apply(back, h::remove_record(4, {0}), "t");
  EXPECT_EQ(back.records.count(0), 0u);
}

// What an older Cairn wrote (a version-1 snapshot, or a record without a
// version after a version-2 snapshot) is read, but is no authority on which
// checkpoints are committed.
TEST(HistoryReplay, AnOlderSnapshotOrRecordLowersTheVersionAndKeepsTheEntries) {
  h::State s;
  s.present = true;
  s.records[0] = {json{{"a", 1}}, 5.0, false};
  json old = h::snapshot_json(s);
  old["version"] = 1;
  old["checkpoints"][0].erase("size_bytes");
  h::State v1 = h::parse_snapshot(old.dump(), "x");
  EXPECT_EQ(v1.version, 1);
  EXPECT_FALSE(v1.records.at(0).size_bytes);

  h::State v2 = h::parse_snapshot(h::snapshot_json(s).dump(), "x");
  json add = h::add_record(1, 1, {json{{"a", 2}}, 6.0, false}, 2, std::nullopt);
  add.erase("version");
  h::apply(v2, add, "t");
  EXPECT_EQ(v2.version, 1);
  EXPECT_EQ(v2.records.at(1).metrics["a"], 2);
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
    set_memory_faults("hexp", {});
    clear_memory_bucket("hsrc");
    clear_memory_bucket("hexp");
  }
  // From now on, `touched` gets every read and listing inside a checkpoint
  // folder ("read run/checkpoint_000001/.cairn/manifest.json") and every
  // listing of the whole experiment ("list run": a walk of every folder;
  // memory's list_names, one folder's names, is another op).
  void watch_checkpoint_reads() {
    touched.clear();
    set_memory_faults(
        "hexp", MemoryFaults{std::nullopt, [this](std::string_view op, std::string_view key) {
                               if (((op == "read" || op == "list") &&
                                    key.find("/checkpoint_0") != std::string_view::npos) ||
                                   (op == "list" && key.find('/') == std::string_view::npos)) {
                                 touched.push_back(std::string(op) + " " + std::string(key));
                               }
                             }});
  }
  std::string touched_text() const {
    std::string out;
    for (const auto& t : touched) out += t + "\n";
    return out;
  }
  // Appends a record to the log as the manager would, after the last one.
  void append_record(json record) {
    std::vector<uint64_t> seqs = log_seqs();
    h::Loaded loaded = h::load_history(*storage, storage->list(""), [](const std::string&) {});
    const uint64_t seq = std::max(seqs.empty() ? 0 : seqs.back(), loaded.state.log_seq) + 1;
    record["seq"] = seq;
    storage->put(h::log_key(seq), h::encode_record(record));
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
  std::vector<std::string> touched;
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
  // A deletion that crashed after its manifest went: announced first.
  append_record(h::deleting_record(0, {1}));
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

// The open lists no checkpoint folder and reads one manifest only: the
// newest's, the one a restart restores, so that damage to it is found there
// (ManagerTest.ADamagedLatestCheckpointIsSetAsideAndTheNewestIntactOneServes).
TEST_F(HistoryTest, OpeningAKeepAllExperimentReadsOnlyTheNewestManifest) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 5);
  }
  watch_checkpoint_reads();
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  ASSERT_EQ(touched.size(), 1u) << touched_text();
  EXPECT_NE(touched[0].find("read"), std::string::npos) << touched_text();
  EXPECT_NE(touched[0].find(checkpoint_name(4) + "/.cairn/manifest.json"), std::string::npos)
      << touched_text();
  EXPECT_EQ(again.history()[2].size_bytes, 7u);  // "weights"
  EXPECT_EQ(again.history()[2].file_count, 1u);
  EXPECT_TRUE(warnings.empty());
}

TEST_F(HistoryTest, ListingAKeepAllExperimentReadsNoManifest) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 4);
  }
  watch_checkpoint_reads();
  ExperimentListing listing = read_experiment(uri);
  ASSERT_EQ(listing.checkpoints.size(), 4u);
  EXPECT_TRUE(touched.empty()) << touched_text();
  EXPECT_EQ(listing.checkpoints[3].metrics["i"], 3);
  EXPECT_EQ(listing.checkpoints[3].size_bytes, 7u);
  EXPECT_EQ(listing.checkpoints[3].file_count, 1u);
}

// The crash between a commit and its history record: the one folder the
// history does not name is read, and only it.
TEST_F(HistoryTest, ACheckpointCommittedBeforeItsRecordIsAdoptedReadingOnlyItsFolder) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  CheckpointWriter w(Checkpoint(storage->child(checkpoint_name(3))));
  w.write_file("model.bin", "late");
  w.commit({{"i", 3}}, 123.0);
  storage->put(join_key(checkpoint_name(4), "model.bin"), "half written");
  watch_checkpoint_reads();
  ExperimentListing listing = read_experiment(uri);
  EXPECT_EQ(listing.checkpoints.size(), 4u);
  EXPECT_EQ(listing.uncommitted, (std::vector<std::string>{checkpoint_name(4)}));
  touched.clear();
  CheckpointManager again(uri, {}, collect());
  // The adopted newest one's manifest is read once, not again by the check
  // of the latest checkpoint.
  const std::string manifest = join_key(checkpoint_name(3), ".cairn/manifest.json");
  EXPECT_EQ(std::count_if(touched.begin(), touched.end(),
                          [&](const std::string& t) {
                            return t.rfind("read ", 0) == 0 &&
                                   t.find(manifest) != std::string::npos;
                          }),
            1)
      << touched_text();
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(again.history()[3].metrics["i"], 3);
  EXPECT_EQ(again.history()[3].size_bytes, 4u);
  EXPECT_FALSE(storage->exists(join_key(checkpoint_name(4), "model.bin"))) << "a leftover";
  for (const auto& t : touched) {
    EXPECT_TRUE(t.find(checkpoint_name(3)) != std::string::npos ||
                t.find(checkpoint_name(4)) != std::string::npos)
        << t;
  }
  EXPECT_EQ(again.register_checkpoint({}, *source_).index, 5u);
}

TEST_F(HistoryTest, RetentionAnnouncesADeletionInTheHistoryBeforeTheManifestGoes) {
  CheckpointConfig keep1;
  keep1.num_to_keep = 1;
  CheckpointManager m(uri, keep1, collect());
  register_n(m, 1);
  bool announced = false;
  set_memory_faults(
      "hexp", MemoryFaults{std::nullopt, [&](std::string_view op, std::string_view key) {
                             if (op != "remove" || !key.ends_with(kManifestKey)) return;
                             // Read on the side, as the next open would after a crash here.
                             h::Loaded now = h::load_history(*open_storage(uri), storage->list(""),
                                                             [](const std::string&) {});
                             announced =
                                 now.state.records.count(0) && now.state.records.at(0).deleting;
                           }});
  register_n(m, 1);
  set_memory_faults("hexp", {});
  EXPECT_TRUE(announced);
  h::Loaded after = h::load_history(*storage, storage->list(""), [](const std::string&) {});
  EXPECT_EQ(after.state.records.count(0), 0u) << "removed once the deletion is done";
}

// A crash during a deletion, after the manifest went: the announced entry's
// folder is read, found uncommitted, removed and its record dropped.
TEST_F(HistoryTest, ADeletionInterruptedAfterItsManifestIsFinishedOnOpen) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  append_record(h::deleting_record(0, {0, 1}));
  storage->remove(join_key(checkpoint_name(0), kManifestKey));  // 1 still whole: not yet begun
  ExperimentListing listing = read_experiment(uri);
  EXPECT_EQ(listing.checkpoints.size(), 2u);
  EXPECT_EQ(listing.uncommitted, (std::vector<std::string>{checkpoint_name(0)}));
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(storage->list(checkpoint_name(0)).empty());
  h::State s = h::parse_snapshot(storage->get(h::kSnapshotKey), "x");
  EXPECT_FALSE(s.records.at(1).deleting) << "a whole checkpoint is kept, its flag cleared";
}

// An experiment an older Cairn wrote (a version-1 history without sizes) is
// read from its manifests, and the next open upgrades the history.
TEST_F(HistoryTest, AnOldHistoryWithoutSizesIsReadFromTheManifestsAndUpgradedOnOpen) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 3);
  }
  h::Loaded loaded = h::load_history(*storage, storage->list(""), [](const std::string&) {});
  json old = h::snapshot_json(loaded.state);
  old["version"] = 1;
  old.erase("log_seq");
  for (auto& c : old["checkpoints"]) {
    c.erase("size_bytes");
    c.erase("file_count");
  }
  storage->put(h::kSnapshotKey, old.dump(1));
  for (uint64_t seq : log_seqs()) storage->remove(h::log_key(seq));
  // A manifest removed behind an older history's back is noticed, as before.
  storage->remove(join_key(checkpoint_name(1), kManifestKey));
  ExperimentListing listing = read_experiment(uri);
  ASSERT_EQ(listing.checkpoints.size(), 2u);
  EXPECT_FALSE(listing.checkpoints[0].size_bytes) << "the CLI reads the manifest for these";
  CheckpointManager again(uri, {}, collect());
  EXPECT_EQ(history_indices(again), (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(again.history()[1].size_bytes, 7u);
  h::State upgraded = h::parse_snapshot(storage->get(h::kSnapshotKey), "x");
  EXPECT_EQ(upgraded.version, h::kVersion);
  EXPECT_EQ(upgraded.records.at(2).file_count, 1u);
}

// A short log stays on close (ANewManagerReplaysTheLogWithoutReadingManifests);
// one past 64 records is folded in, so the next open reads one snapshot.
TEST_F(HistoryTest, ALongLogIsFoldedIntoTheSnapshotOnClose) {
  {
    CheckpointManager m(uri, {}, collect());
    register_n(m, 520);  // the log's bound is then 65 records: it holds 65
    EXPECT_GT(log_seqs().size(), 64u);
  }
  EXPECT_TRUE(log_seqs().empty());
  EXPECT_EQ(h::parse_snapshot(storage->get(h::kSnapshotKey), "x").records.size(), 520u);
}

}  // namespace
}  // namespace cairn::testing
