#include <gtest/gtest.h>

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/transfer.h"
#include "manager/history.h"
#include "manager/scan.h"
#include "storage/backends.h"
#include "support/errors.h"
#include "support/gate.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"
#include "util/hash.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A source checkpoint in memory holding one file with `contents`.
Checkpoint source(const std::string& name, const std::string& contents) {
  auto cp = Checkpoint::from_directory("memory://sources/" + name);
  cp.storage().put("model.bin", contents);
  return cp;
}

bool mentions(const std::vector<std::string>& lines, std::string_view what) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

std::vector<uint64_t> indices(const std::vector<CheckpointRecord>& records) {
  std::vector<uint64_t> out;
  for (const auto& r : records) out.push_back(r.index);
  return out;
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_memory_bucket("sources");
    clear_memory_bucket("exp");
    // gc sweeps the node's unused views too: keep other tests' out of counts.
    setenv("CAIRN_CACHE_DIR", cache_.str().c_str(), 1);
  }
  void TearDown() override {
    clear_memory_bucket("sources");
    clear_memory_bucket("exp");
    unsetenv("CAIRN_CACHE_DIR");
  }
  TempDir cache_;
  const std::string uri = "memory://exp/run";
  ManagerOptions quiet() {
    ManagerOptions o;
    o.warn = [this](const std::string& w) { warnings.push_back(w); };
    return o;
  }
  // quiet(), deleting in the background.
  ManagerOptions background() {
    ManagerOptions o = quiet();
    o.background_delete = true;
    return o;
  }
  std::vector<std::string> warnings;
};

TEST_F(ManagerTest, RegisterPersistsACommittedCopyUnderANumberedName) {
  CheckpointManager m(uri, {}, quiet());
  auto src = source("a", "weights");
  src.set_metadata({{"epoch", 3}});
  auto r = m.register_checkpoint({{"loss", 0.5}}, src);
  EXPECT_EQ(r.name, "checkpoint_000000");
  EXPECT_EQ(r.checkpoint.uri(), uri + "/checkpoint_000000");
  EXPECT_TRUE(r.checkpoint.is_committed());
  EXPECT_EQ(r.checkpoint.storage().get("model.bin"), "weights");
  EXPECT_EQ(r.checkpoint.get_metadata()["epoch"], 3);
  EXPECT_EQ(r.checkpoint.manifest().metrics["loss"], 0.5);
  EXPECT_TRUE(r.checkpoint.verify().empty());
  EXPECT_EQ(m.register_checkpoint({}, src).name, "checkpoint_000001");
}

// An experiment reached through a symbolic link (a data disk linked into
// place) reopens with its history: the scan sees the checkpoints behind the
// link, so none is taken for deleted and the latest one is resumed.
TEST_F(ManagerTest, AnExperimentBehindASymbolicLinkReopensWithItsHistory) {
  TempDir real, links;
  fs::create_directory_symlink(real.path(), links / "exp");
  const std::string path = (links / "exp").string();
  {
    CheckpointManager m(path, {}, quiet());
    for (int i = 0; i < 3; ++i) m.register_checkpoint({{"i", i}}, source("s", "x"));
  }
  CheckpointManager again(path, {}, quiet());
  EXPECT_EQ(indices(again.history()), (std::vector<uint64_t>{0, 1, 2}));
  ASSERT_TRUE(again.latest());
  EXPECT_EQ(again.latest()->metrics["i"], 2);
  EXPECT_TRUE(warnings.empty());
}

TEST_F(ManagerTest, KeepsEveryCheckpointByDefault) {
  CheckpointManager m(uri, {}, quiet());
  for (int i = 0; i < 5; ++i) m.register_checkpoint({{"i", i}}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
}

TEST_F(ManagerTest, KeepsTheKBestAndDeletesTheRestFromStorage) {
  CheckpointConfig c;
  c.num_to_keep = 2;
  c.checkpoint_score_attribute = "val/acc";
  c.checkpoint_score_order = "max";
  CheckpointManager m(uri, c, quiet());
  for (double acc : {0.5, 0.9, 0.7, 0.1})
    m.register_checkpoint({{"val", {{"acc", acc}}}}, source("s", "x"));
  // 0.9 and 0.7 are best; 0.1 is the latest and survives.
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(indices(m.best()), (std::vector<uint64_t>{1, 2, 3}));
  auto s = open_storage(uri);
  EXPECT_FALSE(s->exists("checkpoint_000000/model.bin"));
  EXPECT_TRUE(s->list("checkpoint_000000").empty());
  m.register_checkpoint({{"val", {{"acc", 0.8}}}}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(m.latest()->index, 4u);
}

TEST_F(ManagerTest, BeforeDeleteDefersTheNamesItReturnsUntilRetentionAsksAgain) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  ManagerOptions o = quiet();
  std::vector<std::vector<std::string>> asked;
  std::vector<std::string> defer = {"checkpoint_000000"};
  o.before_delete = [&](const std::vector<std::string>& doomed, const std::vector<std::string>&) {
    asked.push_back(doomed);
    return defer;
  };
  CheckpointManager m(uri, c, o);
  for (int i = 0; i < 3; ++i) m.register_checkpoint({{"i", i}}, source("s", "x"));
  // The deferred one stays committed and in the history; the others go.
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0, 2}));
  auto s = open_storage(uri);
  EXPECT_TRUE(s->exists("checkpoint_000000/.cairn/manifest.json"));
  EXPECT_FALSE(s->exists("checkpoint_000001/model.bin"));
  // Asked again on the next save, with it still among the doomed.
  defer.clear();
  m.register_checkpoint({{"i", 3}}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{3}));
  EXPECT_FALSE(s->exists("checkpoint_000000/model.bin"));
  ASSERT_EQ(asked.size(), 3u);
  EXPECT_EQ(asked[1], (std::vector<std::string>{"checkpoint_000000", "checkpoint_000001"}));
  EXPECT_EQ(asked[2], (std::vector<std::string>{"checkpoint_000000", "checkpoint_000002"}));
  EXPECT_TRUE(warnings.empty());
}

TEST_F(ManagerTest, BackgroundDeletesUncommitAtOnceAndDeleteTheDataAfterTheSaveReturns) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  ManagerOptions o = background();
  Gate gate;
  std::atomic<int> data_removals{0};
  set_memory_faults("exp",
                    MemoryFaults{std::nullopt, [&](std::string_view op, std::string_view key) {
                                   if (op == "remove" && key.ends_with("model.bin")) {
                                     // A deletion inside the save waits 5 s, then
                                     // counts, and the check below fails.
                                     gate.wait_for(std::chrono::seconds(5));
                                     ++data_removals;
                                   }
                                 }});
  {
    CheckpointManager m(uri, c, o);
    m.register_checkpoint({}, source("s", "x"));
    // Returns although the deletion of checkpoint 0's data is held: the
    // checkpoint has left the experiment, its data waits in the trash.
    m.register_checkpoint({}, source("s", "y"));
    auto s = open_storage(uri);
    EXPECT_FALSE(Checkpoint(s->child("checkpoint_000000")).is_committed());
    EXPECT_TRUE(s->list("checkpoint_000000").empty());
    EXPECT_EQ(s->get(".cairn.trash/checkpoint_000000/model.bin"), "x");
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1}));
    const ExperimentListing listed = read_experiment(uri);
    EXPECT_EQ(listed.checkpoints.size(), 1u);
    EXPECT_TRUE(listed.uncommitted.empty());
    EXPECT_EQ(data_removals.load(), 0);
    gate.open();
    m.wait_for_deletes();
    EXPECT_EQ(data_removals.load(), 1);
    EXPECT_TRUE(s->list(".cairn.trash").empty());
    // The destructor waits for deletions still queued.
    m.register_checkpoint({}, source("s", "z"));
  }
  set_memory_faults("exp", {});
  EXPECT_EQ(data_removals.load(), 2);
  EXPECT_TRUE(open_storage(uri)->list("checkpoint_000001").empty());
  EXPECT_TRUE(open_storage(uri)->list(".cairn.trash").empty());
  EXPECT_TRUE(warnings.empty());
}

TEST_F(ManagerTest, WithoutBackgroundDeletionTheDataIsGoneWhenTheSaveReturns) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  ManagerOptions o = quiet();
  o.background_delete = false;
  std::vector<std::string> removed;
  const auto caller = std::this_thread::get_id();
  set_memory_faults("exp",
                    MemoryFaults{std::nullopt, [&](std::string_view op, std::string_view key) {
                                   if (op == "remove" && key.ends_with("model.bin")) {
                                     EXPECT_EQ(std::this_thread::get_id(), caller) << key;
                                     removed.emplace_back(key);
                                   }
                                   EXPECT_NE(op, "rename") << key;
                                 }});
  CheckpointManager m(uri, c, o);
  m.register_checkpoint({}, source("s", "x"));
  m.register_checkpoint({}, source("s", "y"));
  EXPECT_EQ(removed, (std::vector<std::string>{"run/checkpoint_000000/model.bin"}));
  auto s = open_storage(uri);
  EXPECT_TRUE(s->list("checkpoint_000000").empty());
  EXPECT_TRUE(s->list(".cairn.trash").empty());
  set_memory_faults("exp", {});
}

TEST_F(ManagerTest, WhenTheTrashCannotTakeAFileTheDeleterRemovesItWhereItLies) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  set_memory_faults("exp",
                    MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                                   if (op == "rename" && key.ends_with("model.bin")) {
                                     throw Error(ErrorCode::kNoSpace,
                                                 std::string(key) + ": injected failure");
                                   }
                                 }});
  {
    CheckpointManager m(uri, c, quiet());
    m.register_checkpoint({}, source("s", "x"));
    m.register_checkpoint({}, source("s", "y"));
    EXPECT_FALSE(Checkpoint(open_storage(uri)->child("checkpoint_000000")).is_committed());
    m.wait_for_deletes();
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1}));
  }
  set_memory_faults("exp", {});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checkpoint_000000"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("injected failure"), std::string::npos) << warnings[0];
  auto s = open_storage(uri);
  EXPECT_TRUE(s->list("checkpoint_000000").empty());
  EXPECT_TRUE(s->list(".cairn.trash").empty());
  EXPECT_EQ(s->get("checkpoint_000001/model.bin"), "y");
}

TEST_F(ManagerTest, TheTrashAStoppedWriterLeftIsEmptiedByTheNextOpenAndGcAndCopiedByNothing) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  {
    CheckpointManager m(uri, c, quiet());
    m.register_checkpoint({{"score", 1}}, source("s", "x"));
  }
  // What a writer killed while its deleter ran leaves behind.
  auto s = open_storage(uri);
  s->put(".cairn.trash/checkpoint_000007/model.bin", "stale");
  s->put(".cairn.trash/checkpoint_000007/.cairn/metadata.json", "{}");
  // Not an experiment of its own, and never copied.
  EXPECT_EQ(find_experiments("memory://exp"), (std::vector<std::string>{"run"}));
  copy_experiment(uri, "memory://exp/copy");
  EXPECT_TRUE(open_storage("memory://exp/copy")->list(".cairn.trash").empty());
  EXPECT_EQ(read_experiment("memory://exp/copy").checkpoints.size(), 1u);
  // `cairn gc` empties it.
  GcReport dry = collect_garbage(uri, /*dry_run=*/true);
  EXPECT_EQ(dry.removed.size(), 2u);
  EXPECT_TRUE(s->exists(".cairn.trash/checkpoint_000007/model.bin"));
  GcReport gc = collect_garbage(uri, /*dry_run=*/false);
  EXPECT_EQ(gc.removed.size(), 2u);
  EXPECT_TRUE(s->list(".cairn.trash").empty());
  // So does the next open, off the caller's thread.
  s->put(".cairn.trash/checkpoint_000008/model.bin", "stale");
  {
    CheckpointManager m(uri, c, quiet());
    m.wait_for_deletes();
    EXPECT_TRUE(s->list(".cairn.trash").empty());
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0}));
  }
  EXPECT_TRUE(warnings.empty());
}

TEST_F(ManagerTest, WithBackgroundDeletesTheNextSaveWritesOnlyAfterTheQueuedDeletions) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  ManagerOptions o = background();
  Gate gate;
  std::mutex mu;
  std::vector<std::string> events;
  set_memory_faults(
      "exp",
      MemoryFaults{std::nullopt, [&](std::string_view op, std::string_view key) {
                     if (op == "remove" && key == "run/.cairn.trash/checkpoint_000000/model.bin") {
                       gate.wait_for(std::chrono::seconds(5));
                       std::lock_guard<std::mutex> g(mu);
                       events.push_back("removed 0");
                     } else if (key.starts_with("run/checkpoint_000002/")) {
                       std::lock_guard<std::mutex> g(mu);
                       events.push_back(std::string(op) + " 2");
                     }
                   }});
  {
    CheckpointManager m(uri, c, o);
    m.register_checkpoint({}, source("s", "x"));
    m.register_checkpoint({}, source("s", "y"));  // queues checkpoint 0's deletion, held
    std::thread third([&] { m.register_checkpoint({}, source("s", "z")); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate.open();
    third.join();
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{2}));
  }
  set_memory_faults("exp", {});
  // Had the third save not waited, it would have written during the 100 ms
  // the deletion was held.
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0], "removed 0");
  EXPECT_TRUE(warnings.empty());
}

TEST_F(ManagerTest, AFailedBackgroundDeleteWarnsAndTheNextOpenRemovesTheLeftover) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  ManagerOptions o = background();
  set_memory_faults(
      "exp", MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                            if (op == "remove" && key.ends_with("model.bin")) {
                              throw Error(ErrorCode::kIO, std::string(key) + ": injected failure");
                            }
                          }});
  {
    CheckpointManager m(uri, c, o);
    m.register_checkpoint({}, source("s", "x"));
    m.register_checkpoint({}, source("s", "y"));
    m.wait_for_deletes();
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checkpoint_000000"), std::string::npos) << warnings[0];
  set_memory_faults("exp", {});
  auto s = open_storage(uri);
  EXPECT_TRUE(s->exists(".cairn.trash/checkpoint_000000/model.bin"));  // left in the trash
  EXPECT_TRUE(s->list("checkpoint_000000").empty());
  CheckpointManager again(uri, c, quiet());
  again.wait_for_deletes();
  EXPECT_TRUE(s->list(".cairn.trash").empty());
  EXPECT_EQ(indices(again.history()), (std::vector<uint64_t>{1}));
}

TEST_F(ManagerTest, WithoutAttributeKeepsTheMostRecent) {
  CheckpointConfig c;
  c.num_to_keep = 2;
  CheckpointManager m(uri, c, quiet());
  for (int i = 0; i < 4; ++i) m.register_checkpoint({}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(indices(m.best()), (std::vector<uint64_t>{3, 2}));
}

TEST_F(ManagerTest, MinOrderKeepsTheLowest) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  c.checkpoint_score_attribute = "loss";
  c.checkpoint_score_order = "min";
  CheckpointManager m(uri, c, quiet());
  for (double loss : {0.3, 0.1, 0.2, 0.4})
    m.register_checkpoint({{"loss", loss}}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(m.best().front().index, 1u);
}

TEST_F(ManagerTest, AMissingScoreWarnsAndRanksWorst) {
  CheckpointConfig c;
  c.num_to_keep = 1;
  c.checkpoint_score_attribute = "loss";
  c.checkpoint_score_order = "min";
  CheckpointManager m(uri, c, quiet());
  m.register_checkpoint({{"other", 1}}, source("s", "x"));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("\"loss\""), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("checkpoint_000000"), std::string::npos) << warnings[0];
  m.register_checkpoint({{"loss", 100.0}}, source("s", "x"));
  m.register_checkpoint({{"loss", 200.0}}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 2}));
}

TEST_F(ManagerTest, AScoreThatIsNotANumberIsRefusedBeforeAnythingIsWritten) {
  CheckpointConfig c;
  c.checkpoint_score_attribute = "loss";
  CheckpointManager m(uri, c, quiet());
  m.register_checkpoint({{"loss", 1.0}}, source("s", "x"));
  try {
    m.register_checkpoint({{"loss", "low"}}, source("s", "x"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("\"loss\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"low\""), std::string::npos) << e.what();
  }
  EXPECT_TRUE(open_storage(uri)->list("checkpoint_000001").empty());
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0}));
}

TEST_F(ManagerTest, BadConfigurationsAreRefusedNamingTheField) {
  auto expect_bad = [&](CheckpointConfig c, const std::string& field) {
    try {
      CheckpointManager m(uri, c, quiet());
      FAIL() << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  CheckpointConfig zero;
  zero.num_to_keep = 0;
  expect_bad(zero, "num_to_keep");
  CheckpointConfig order;
  order.checkpoint_score_order = "up";
  expect_bad(order, "checkpoint_score_order");
  CheckpointConfig hours;
  hours.keep_checkpoint_every_n_hours = -1;
  expect_bad(hours, "keep_checkpoint_every_n_hours");
}

TEST_F(ManagerTest, ASecondWriterOfOneExperimentGetsALockError) {
  TempDir dir;
  CheckpointManager first(dir.str(), {}, quiet());
  try {
    CheckpointManager second(dir.str(), {}, quiet());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kLocked);
    EXPECT_NE(std::string(e.what()).find(".cairn.lock"), std::string::npos) << e.what();
  }
}

TEST_F(ManagerTest, ANewManagerSeesTheSameLatestAndBest) {
  CheckpointConfig c;
  c.num_to_keep = 2;
  c.checkpoint_score_attribute = "acc";
  std::vector<uint64_t> best_before;
  {
    CheckpointManager m(uri, c, quiet());
    for (double acc : {0.2, 0.8, 0.5, 0.1}) m.register_checkpoint({{"acc", acc}}, source("s", "x"));
    best_before = indices(m.best());
  }
  CheckpointManager again(uri, c, quiet());
  EXPECT_EQ(indices(again.best()), best_before);
  EXPECT_EQ(again.latest()->index, 3u);
  EXPECT_EQ(again.best().front().metrics["acc"], 0.8);
  EXPECT_EQ(again.register_checkpoint({{"acc", 0.3}}, source("s", "x")).index, 4u);
}

TEST_F(ManagerTest, KeepEveryNHoursPinsCheckpointsOnTheInjectedClock) {
  double now = 1'000'000.0;
  ManagerOptions o = quiet();
  o.clock = [&] { return now; };
  CheckpointConfig c;
  c.num_to_keep = 1;
  c.keep_checkpoint_every_n_hours = 2;
  CheckpointManager m(uri, c, o);
  for (int i = 0; i < 12; ++i) {  // one every 30 minutes for 6 hours
    now += 1800;
    m.register_checkpoint({}, source("s", "x"));
  }
  // Pinned at 2h, 4h, 6h after the start (indices 3, 7, 11); 11 is also the
  // latest and the one most recent checkpoint num_to_keep asks for.
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{3, 7, 11}));
  for (const auto& r : m.history()) EXPECT_TRUE(r.pinned) << r.name;
  now += 1800;
  m.register_checkpoint({}, source("s", "x"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{3, 7, 11, 12}))
      << "pinned ones outlive the window";
}

TEST_F(ManagerTest, ALeftoverOfAnInterruptedSaveIsRemovedOnOpenAndItsIndexNotReused) {
  {
    CheckpointManager m(uri, {}, quiet());
    m.register_checkpoint({}, source("s", "x"));
  }
  auto s = open_storage(uri);
  s->put("checkpoint_000001/model.bin", "half written");  // no manifest: never committed
  CheckpointManager m(uri, {}, quiet());
  EXPECT_FALSE(s->exists("checkpoint_000001/model.bin"));
  EXPECT_EQ(m.register_checkpoint({}, source("s", "x")).index, 2u);
}

TEST_F(ManagerTest, ACheckpointCommittedBeforeACrashIsAdoptedWithItsMetrics) {
  {
    CheckpointManager m(uri, {}, quiet());
    m.register_checkpoint({{"step", 0}}, source("s", "x"));
  }
  // The process died after the commit and before recording it.
  CheckpointWriter w(Checkpoint(open_storage(uri)->child("checkpoint_000001")));
  w.write_file("model.bin", "y");
  w.commit({{"step", 1}}, 123.0);
  CheckpointManager m(uri, {}, quiet());
  ASSERT_EQ(indices(m.history()), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(m.latest()->metrics["step"], 1);
  EXPECT_EQ(m.latest()->created_at, 123.0);
}

TEST_F(ManagerTest, ARecordWhoseCheckpointIsGoneIsDropped) {
  {
    CheckpointManager m(uri, {}, quiet());
    m.register_checkpoint({}, source("s", "x"));
    m.register_checkpoint({}, source("s", "x"));
  }
  delete_checkpoint(Checkpoint(open_storage(uri)->child("checkpoint_000000")));
  CheckpointManager m(uri, {}, quiet());
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1}));
}

TEST_F(ManagerTest, AFullDiskDuringASaveLosesNothingCommitted) {
  CheckpointManager m(uri, {}, quiet());
  m.register_checkpoint({{"i", 0}}, source("s", std::string(1000, 'a')));
  set_memory_faults("exp", MemoryFaults{1500, nullptr});
  try {
    m.register_checkpoint({{"i", 1}}, source("s", std::string(1000, 'b')));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find("checkpoint_000001"), std::string::npos) << e.what();
  }
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0}));
  EXPECT_TRUE(m.latest()->checkpoint.verify().empty());
  EXPECT_TRUE(open_storage(uri)->list("checkpoint_000001").empty())
      << "the failed save is cleaned up";
  set_memory_faults("exp", {});
  EXPECT_EQ(m.register_checkpoint({{"i", 2}}, source("s", "c")).index, 2u);
}

TEST_F(ManagerTest, AFullDeviceDuringASaveNamesTheFileAndLosesNothingCommitted) {
  SmallTmpfs tmpfs(512);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  const std::string exp = (tmpfs.path() / "exp").string();
  CheckpointManager m(exp, {}, quiet());
  m.register_checkpoint({{"i", 0}}, source("s", std::string(100 << 10, 'a')));
  try {
    m.register_checkpoint({{"i", 1}}, source("s", std::string(1 << 20, 'b')));
    FAIL() << "1 MiB fit in what is left of a 512 KiB tmpfs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find("checkpoint_000001/model.bin"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0}));
  EXPECT_TRUE(m.latest()->checkpoint.verify().empty());
  EXPECT_FALSE(fs::exists(tmpfs.path() / "exp" / "checkpoint_000001"))
      << "the failed save left nothing";
  EXPECT_EQ(m.register_checkpoint({{"i", 2}}, source("s", "small")).index, 2u)
      << "saving goes on once space is back";
}

TEST_F(ManagerTest, PermissionDeniedOnTheDeviceIsNamedAndReadingStillWorks) {
  SmallTmpfs tmpfs(512);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  const std::string exp = (tmpfs.path() / "exp").string();
  {
    CheckpointManager m(exp, {}, quiet());
    m.register_checkpoint({{"i", 0}}, source("s", "weights"));
  }
  tmpfs.remount_read_only();
  try {
    CheckpointManager m(exp, {}, quiet());
    FAIL() << "opened a writer on a read-only device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(std::string(e.what()).find("exp"), std::string::npos) << e.what();
  }
  auto listing = read_experiment(exp);
  ASSERT_EQ(listing.checkpoints.size(), 1u);
  EXPECT_TRUE(listing.checkpoints[0].checkpoint.verify().empty());
  EXPECT_EQ(listing.checkpoints[0].checkpoint.storage().get("model.bin"), "weights");
}

TEST_F(ManagerTest, PermissionDeniedOnTheManifestLeavesTheCheckpointInvisible) {
  CheckpointManager m(uri, {}, quiet());
  m.register_checkpoint({}, source("s", "x"));
  set_memory_faults(
      "exp", MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                            if (op == "commit" && key.find("manifest") != std::string_view::npos)
                              throw Error(ErrorCode::kPermissionDenied,
                                          std::string(key) + ": access denied");
                          }});
  try {
    m.register_checkpoint({}, source("s", "x"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(std::string(e.what()).find("checkpoint_000001/.cairn/manifest.json"),
              std::string::npos)
        << e.what();
  }
  set_memory_faults("exp", {});
  EXPECT_FALSE(Checkpoint(open_storage(uri)->child("checkpoint_000001")).is_committed());
  EXPECT_EQ(read_experiment(uri).checkpoints.size(), 1u);
}

TEST_F(ManagerTest, FilesWrittenByOthersCommitThroughAReservation) {
  CheckpointManager m(uri, {}, quiet());
  Checkpoint reserved = m.reserve_next();
  reserved.storage().put("rank0.bin", "zero");
  reserved.storage().put("rank1.bin", "one!");
  std::vector<ManifestEntry> files = {{"rank0.bin", 4, xxh3_64("zero")},
                                      {"rank1.bin", 4, xxh3_64("one!")}};
  auto r = m.commit_reserved(reserved, {{"loss", 1}}, files, {{"world_size", 2}});
  EXPECT_TRUE(r.checkpoint.verify().empty());
  EXPECT_EQ(r.checkpoint.manifest().layout["world_size"], 2);

  Checkpoint bad = m.reserve_next();
  bad.storage().put("rank0.bin", "zero");
  EXPECT_THROW(m.commit_reserved(bad, {}, {{"rank0.bin", 5, 0}}), Error) << "size mismatch";
  EXPECT_THROW(m.commit_reserved(bad, {}, {{"missing.bin", 1, 0}}), Error);
  EXPECT_THROW(m.commit_reserved(Checkpoint::from_directory("memory://exp/run/elsewhere"), {}, {}),
               Error);
  m.abandon_reserved(bad);
  EXPECT_TRUE(bad.storage().list("").empty()) << "what the failed save wrote is removed";
  EXPECT_THROW(m.commit_reserved(bad, {}, {}), Error)
      << "an abandoned reservation cannot be committed";
  EXPECT_THROW(m.abandon_reserved(bad), Error);

  Checkpoint with_meta = m.reserve_next();
  with_meta.storage().put("w.bin", "w");
  nlohmann::json meta = {{"epoch", 4}};
  auto r2 = m.commit_reserved(with_meta, {}, {{"w.bin", 1, xxh3_64("w")}}, nullptr, &meta);
  EXPECT_EQ(r2.checkpoint.get_metadata()["epoch"], 4);
  EXPECT_EQ(r2.index, 2u) << "the abandoned index 1 is not reused";
}

TEST_F(ManagerTest, ReadingAnExperimentNeedsNoLockAndChangesNothing) {
  CheckpointManager m(uri, {}, quiet());
  m.register_checkpoint({{"acc", 1}}, source("s", "x"));
  open_storage(uri)->put("checkpoint_000007/partial", "p");
  auto listing = read_experiment(uri);
  ASSERT_EQ(listing.checkpoints.size(), 1u);
  EXPECT_EQ(listing.checkpoints[0].metrics["acc"], 1);
  EXPECT_EQ(listing.uncommitted, (std::vector<std::string>{"checkpoint_000007"}));
  EXPECT_TRUE(open_storage(uri)->exists("checkpoint_000007/partial"));
}

TEST_F(ManagerTest, GcRemovesLeftoversAndSkipsExperimentsWithALiveWriter) {
  TempDir root;
  {
    CheckpointManager a((root / "a").string(), {}, quiet());
    a.register_checkpoint({}, source("s", "x"));
  }
  write_text(root / "a" / "checkpoint_000005" / "model.bin", "leftover");
  write_text(root / "a" / "checkpoint_000000" / ".x.cairn-tmp-1-2-3", "incomplete metadata update");
  CheckpointManager live((root / "b").string(), {}, quiet());
  write_text(root / "b" / "checkpoint_000000" / "model.bin", "in flight");

  EXPECT_EQ(find_experiments(root.str()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(find_experiments((root / "a").string()), (std::vector<std::string>{""}));
  GcReport dry = collect_garbage(root.str(), /*dry_run=*/true);
  EXPECT_EQ(dry.removed.size(), 2u);
  EXPECT_TRUE(fs::exists(root / "a" / "checkpoint_000005"));
  GcReport report = collect_garbage(root.str());
  EXPECT_EQ(report.removed.size(), 2u);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_NE(report.skipped[0].find("/b"), std::string::npos) << report.skipped[0];
  EXPECT_FALSE(fs::exists(root / "a" / "checkpoint_000005"));
  EXPECT_TRUE(fs::exists(root / "a" / "checkpoint_000000" / ".cairn" / "manifest.json"));
  EXPECT_TRUE(fs::exists(root / "b" / "checkpoint_000000" / "model.bin"))
      << "a live writer's save is untouched";
}

TEST_F(ManagerTest, ACorruptHistoryFileIsNamedAndNothingIsDeleted) {
  TempDir dir;
  {
    CheckpointManager m(dir.str(), {}, quiet());
    m.register_checkpoint({}, source("s", "x"));
  }
  for (std::string bad :
       {std::string("[1]"), std::string(R"({"format": 7, "checkpoints": []})"),
        std::string(
            R"({"format": "cairn-manager", "checkpoints": [{"index": 0, "pinned": "yes"}]})")}) {
    write_text(dir / "checkpoint_manager.json", bad);
    try {
      CheckpointManager m(dir.str(), {}, quiet());
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption) << bad;
      EXPECT_NE(std::string(e.what()).find("checkpoint_manager.json"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(fs::exists(dir / "checkpoint_000000" / "model.bin"));
  fs::remove(dir / "checkpoint_manager.json");
  CheckpointManager rebuilt(dir.str(), {}, quiet());
  EXPECT_EQ(rebuilt.history().size(), 1u);
}

// Text that is not JSON is what an interrupted write leaves (a torn
// snapshot): rebuilt from the manifests with a warning, nothing deleted.
TEST_F(ManagerTest, AHistoryFileThatIsNotJsonIsRebuiltWithAWarning) {
  TempDir dir;
  {
    CheckpointManager m(dir.str(), {}, quiet());
    m.register_checkpoint({{"loss", 0.5}}, source("s", "x"));
  }
  write_text(dir / "checkpoint_manager.json", "{not json");
  CheckpointManager m(dir.str(), {}, quiet());
  ASSERT_EQ(m.history().size(), 1u);
  EXPECT_EQ(m.history()[0].metrics, (json{{"loss", 0.5}}));
  EXPECT_TRUE(fs::exists(dir / "checkpoint_000000" / "model.bin"));
  EXPECT_TRUE(mentions(warnings, "checkpoint_manager.json: torn"));
}

CheckpointConfig keep(int n) {
  CheckpointConfig c;
  c.num_to_keep = n;
  return c;
}

TEST_F(ManagerTest, ASourceThatDoesNotExistOrIsAFileFailsAndChangesNothing) {
  TempDir dir;
  CheckpointManager m(uri, keep(1), quiet());
  m.register_checkpoint({{"i", 0}}, source("good", "weights"));
  std::string msg = error_message_of(
      [&] { m.register_checkpoint({}, Checkpoint::from_directory((dir / "typo").string())); },
      ErrorCode::kNotFound);
  EXPECT_NE(msg.find("typo"), std::string::npos) << msg;
  EXPECT_NE(msg.find("registering"), std::string::npos) << msg;
  write_text(dir / "file", "not a directory");
  error_message_of(
      [&] { m.register_checkpoint({}, Checkpoint::from_directory((dir / "file").string())); },
      ErrorCode::kInvalidArgument);
  error_message_of(
      [&] { m.register_checkpoint({}, Checkpoint::from_directory("memory://sources/none")); },
      ErrorCode::kNotFound);
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0})) << "retention deleted nothing";
  EXPECT_TRUE(m.latest()->checkpoint.verify().empty());
  size_t objects = 0;  // the history's log has one record per change
  for (const auto& o : open_storage(uri)->list(""))
    if (o.key.rfind("checkpoint_manager.log/", 0) != 0) ++objects;
  EXPECT_EQ(objects, 3u) << "model.bin, manifest, history";
  EXPECT_EQ(m.register_checkpoint({}, source("next", "w")).index, 1u) << "no index was used";
}

// One register of a checkpoint on storage that fills up at some step: either
// it throws and the new checkpoint is invisible (the old one intact), or it
// returns and the new one is committed. Either way, once space is back, a
// reopened manager's history agrees with storage and retention holds.
struct FullDiskOutcome {
  bool succeeded = false;
  bool warned_about_history = false;
};

class FullDiskTest : public ManagerTest {
 protected:
  FullDiskOutcome register_on_full_storage(const std::string& experiment,
                                           const CheckpointConfig& config,
                                           const std::function<void()>& fill,
                                           const std::function<void()>& unfill) {
    {
      CheckpointManager m(experiment, config, quiet());
      m.register_checkpoint({{"i", 0}}, source("a", std::string(3000, 'a')));
    }
    fill();
    FullDiskOutcome out;
    warnings.clear();
    {
      CheckpointManager m(experiment, config, quiet());  // opening a full disk works too
      try {
        auto r = m.register_checkpoint({{"i", 1}}, source("b", std::string(3000, 'b')));
        out.succeeded = true;
        EXPECT_EQ(r.index, 1u);
        EXPECT_EQ(m.latest()->index, 1u);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
        EXPECT_NE(std::string(e.what()).find("registering"), std::string::npos) << e.what();
        EXPECT_EQ(m.latest()->index, 0u);
      }
      for (const auto& w : warnings) {
        if (w.find("checkpoint_manager.json") != std::string::npos) out.warned_about_history = true;
      }
      unfill();
    }
    std::vector<uint64_t> want = {0};
    if (out.succeeded)
      want = config.num_to_keep ? std::vector<uint64_t>{1} : std::vector<uint64_t>{0, 1};
    auto storage = open_storage(experiment);
    for (uint64_t i : {0, 1}) {
      const bool kept = std::find(want.begin(), want.end(), i) != want.end();
      EXPECT_EQ(Checkpoint(storage->child(checkpoint_name(i))).is_committed(), kept) << i;
    }
    EXPECT_EQ(indices(read_experiment(experiment).checkpoints), want);
    CheckpointManager reopened(experiment, config, quiet());
    EXPECT_EQ(indices(reopened.history()), want);
    EXPECT_TRUE(reopened.latest()->checkpoint.verify().empty());
    return out;
  }
};

TEST_F(FullDiskTest, EveryByteOfFreeSpaceGivesAnExactOutcomeOnMemoryStorage) {
  for (const CheckpointConfig& config : {CheckpointConfig{}, keep(1)}) {
    bool saw_failure = false, saw_success = false, saw_success_despite_history = false;
    for (uint64_t extra = 0; extra <= 9000; extra += 5) {
      clear_memory_bucket("exp");
      auto out = register_on_full_storage(
          uri, config,
          [&] {
            uint64_t used = 0;
            for (const auto& o : open_storage("memory://exp")->list("")) used += o.size;
            set_memory_faults("exp", MemoryFaults{used + extra, nullptr});
          },
          [] { set_memory_faults("exp", {}); });
      if (HasFailure()) FAIL() << "with " << extra << " bytes free";
      (out.succeeded ? saw_success : saw_failure) = true;
      if (out.succeeded && out.warned_about_history) saw_success_despite_history = true;
    }
    EXPECT_TRUE(saw_failure);
    EXPECT_TRUE(saw_success);
    if (!config.num_to_keep) {
      EXPECT_TRUE(saw_success_despite_history)
          << "some free space lets the commit through but not the history write";
    }
  }
}

TEST_F(FullDiskTest, EveryPageOfFreeSpaceGivesAnExactOutcomeOnARealFileSystem) {
  SmallTmpfs tmpfs(1024);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  const fs::path exp = tmpfs.path() / "exp";
  const fs::path filler = tmpfs.path() / "filler";
  for (const CheckpointConfig& config : {CheckpointConfig{}, keep(1)}) {
    bool saw_failure = false, saw_success = false;
    for (uint64_t pages = 0; pages <= 8; ++pages) {
      fs::remove_all(exp);
      auto out = register_on_full_storage(
          exp.string(), config,
          [&] {
            struct statvfs st;
            ASSERT_EQ(::statvfs(tmpfs.path().c_str(), &st), 0);
            const uint64_t free_bytes = uint64_t{st.f_bavail} * st.f_frsize;
            ASSERT_GT(free_bytes, pages * 4096);
            write_text(filler, std::string(free_bytes - pages * 4096, 'f'));
          },
          [&] { fs::remove(filler); });
      if (HasFailure()) FAIL() << "with " << pages << " pages free";
      (out.succeeded ? saw_success : saw_failure) = true;
    }
    EXPECT_TRUE(saw_failure);
    EXPECT_TRUE(saw_success);
  }
}

TEST_F(ManagerTest, EmptyFoldersLeftByACrashAreRemovedOnOpenAndTheirIndicesNeverReused) {
  TempDir dir;
  {
    CheckpointManager m(dir.str(), keep(1), quiet());
    m.register_checkpoint({}, source("s", "x"));
    m.register_checkpoint({}, source("s", "y"));
  }
  EXPECT_FALSE(fs::exists(dir / "checkpoint_000000")) << "retention leaves no empty folder";
  // A crash between mkdir and the first file, and one between unlink and rmdir.
  fs::create_directories(dir / "checkpoint_000004");
  fs::create_directories(dir / "checkpoint_000003" / "sub" / "deeper");
  EXPECT_EQ(read_experiment(dir.str()).uncommitted,
            (std::vector<std::string>{"checkpoint_000003", "checkpoint_000004"}));
  CheckpointManager m(dir.str(), keep(1), quiet());
  EXPECT_FALSE(fs::exists(dir / "checkpoint_000003"));
  EXPECT_FALSE(fs::exists(dir / "checkpoint_000004"));
  EXPECT_EQ(m.register_checkpoint({}, source("s", "z")).index, 5u);
}

TEST_F(ManagerTest, AReservedIndexIsNeverHandedOutAgainAfterACrash) {
  {
    CheckpointManager m(uri, {}, quiet());
    EXPECT_EQ(m.reserve_next().uri(), uri + "/checkpoint_000000");
    // The driver dies here, before any rank wrote a file.
  }
  CheckpointManager m(uri, {}, quiet());
  EXPECT_EQ(m.reserve_next().uri(), uri + "/checkpoint_000001");
}

// kDeferred takes the index without I/O (an AsyncSaver's save()); the
// index is persisted by prepare_reserved(), before anything is written.
TEST_F(ManagerTest, ADeferredReservationIsPersistedWhenPrepared) {
  using Reservation = CheckpointManager::Reservation;
  {
    CheckpointManager m(uri, {}, quiet());
    EXPECT_EQ(m.reserve_next(Reservation::kDeferred).uri(), uri + "/checkpoint_000000");
    // Dies before preparing it: nothing was written there.
  }
  {
    CheckpointManager m(uri, {}, quiet());
    const Checkpoint a = m.reserve_next(Reservation::kDeferred);
    const Checkpoint b = m.reserve_next(Reservation::kDeferred);
    EXPECT_EQ(a.uri(), uri + "/checkpoint_000000");  // handed out again
    EXPECT_EQ(b.uri(), uri + "/checkpoint_000001");
    m.prepare_reserved(a);  // persists both indices
    m.prepare_reserved(b);
    try {
      m.prepare_reserved(Checkpoint(open_storage(uri)->child("checkpoint_000007")));
      ADD_FAILURE() << "a location this manager did not reserve was prepared";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
      EXPECT_NE(std::string(e.what()).find("checkpoint_000007"), std::string::npos) << e.what();
    }
  }
  CheckpointManager m(uri, {}, quiet());
  EXPECT_EQ(m.reserve_next().uri(), uri + "/checkpoint_000002");
}

TEST_F(ManagerTest, TheLastIndexIsAnErrorNotAWrapToZero) {
  {
    CheckpointWriter w(Checkpoint(open_storage(uri)->child(checkpoint_name(UINT64_MAX - 1))));
    w.write_file("model.bin", "last");
    w.commit({}, 1.0);
  }
  CheckpointManager m(uri, {}, quiet());
  ASSERT_EQ(m.latest()->index, UINT64_MAX - 1);
  std::string msg = error_message_of([&] { m.register_checkpoint({}, source("s", "x")); },
                                     ErrorCode::kFailedPrecondition);
  EXPECT_NE(msg.find("every checkpoint index"), std::string::npos) << msg;
  error_message_of([&] { (void)m.reserve_next(); }, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{UINT64_MAX - 1}));
  EXPECT_FALSE(open_storage(uri)->exists("checkpoint_000000/model.bin"));
}

TEST_F(ManagerTest, ALeftoverAtTheLastIndexDoesNotWrapTheNextIndexToZero) {
  open_storage(uri)->put(checkpoint_name(UINT64_MAX) + "/model.bin", "leftover");
  CheckpointManager m(uri, {}, quiet());
  error_message_of([&] { m.register_checkpoint({}, source("s", "x")); },
                   ErrorCode::kFailedPrecondition);
}

std::string deep_json(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST_F(ManagerTest, DeeplyNestedStoredJsonIsCorruptionOrNotAdoptedNeverACrash) {
  TempDir dir;
  {
    CheckpointManager m(dir.str(), {}, quiet());
    m.register_checkpoint({}, source("s", "x"));
  }
  write_text(dir / "checkpoint_manager.json", deep_json(100000));
  std::string msg = error_message_of([&] { CheckpointManager m(dir.str(), {}, quiet()); },
                                     ErrorCode::kCorruption);
  EXPECT_NE(msg.find("checkpoint_manager.json"), std::string::npos) << msg;
  error_message_of([&] { (void)read_experiment(dir.str()); }, ErrorCode::kCorruption);

  fs::remove(dir / "checkpoint_manager.json");
  write_text(dir / "checkpoint_000000/.cairn/manifest.json",
             R"({"format": "cairn-checkpoint", "version": 1, "created_at": 1, "metrics": )" +
                 deep_json(100000) + R"(, "files": []})");
  CheckpointManager m(dir.str(), {}, quiet());
  EXPECT_TRUE(m.history().empty()) << "a damaged checkpoint is not adopted";
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.back().find("nested deeper"), std::string::npos) << warnings.back();
}

// Checkpoint folders whose manifest is empty or cut short, which the history
// does not list. On a store that never tears a write (memory, local files,
// S3: StorageCapabilities::torn_writes) no interrupted commit leaves such a
// manifest, so they are damage after a commit: listed as damaged, kept by gc
// and by the next open (which warns, naming them, and never reuses their
// indices), never adopted. (On a store that tears writes they are leftovers:
// tests/s3/end_to_end_test.cc, with CAIRN_S3_TORN_WRITES=on.)
TEST_F(ManagerTest, UnreadableManifestsOnAStoreThatNeverTearsWritesAreDamageThatNothingRemoves) {
  {
    CheckpointManager m(uri, {}, quiet());
    m.register_checkpoint({{"i", 0}}, source("s", "x"));
    m.register_checkpoint({{"i", 1}}, source("s", "y"));
  }
  auto storage = open_storage(uri);
  ASSERT_FALSE(storage->capabilities().torn_writes);
  const std::string whole = storage->get("checkpoint_000001/.cairn/manifest.json");
  storage->put("checkpoint_000002/model.bin", "z");
  storage->put("checkpoint_000002/.cairn/manifest.json", "");
  storage->put("checkpoint_000003/model.bin", "z");
  storage->put("checkpoint_000003/.cairn/manifest.json", whole.substr(0, whole.size() - 9));

  ExperimentListing listing = read_experiment(uri);
  EXPECT_EQ(indices(listing.checkpoints), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(listing.uncommitted.empty());
  ASSERT_EQ(listing.damaged.size(), 2u);
  EXPECT_NE(listing.damaged.at("checkpoint_000003").find("checkpoint_000003/.cairn/manifest.json"),
            std::string::npos);

  GcReport report = collect_garbage(uri);
  EXPECT_FALSE(mentions(report.removed, "checkpoint_000002"));
  EXPECT_FALSE(mentions(report.removed, "checkpoint_000003"));
  EXPECT_TRUE(mentions(report.skipped, "checkpoint_000003: kept, damaged after its commit"));
  EXPECT_TRUE(storage->exists("checkpoint_000002/model.bin"));
  EXPECT_TRUE(storage->exists("checkpoint_000003/.cairn/manifest.json"));

  CheckpointManager m(uri, {}, quiet());
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(storage->exists("checkpoint_000002/model.bin"));
  EXPECT_TRUE(storage->exists("checkpoint_000003/model.bin"));
  EXPECT_TRUE(mentions(warnings, "checkpoint_000003 is damaged"))
      << (warnings.empty() ? "" : warnings.back());
  EXPECT_EQ(m.register_checkpoint({}, source("s", "w")).index, 4u) << "indices are never reused";
  const std::string msg = error_message_of(
      [&] { Checkpoint(storage->child("checkpoint_000002")).manifest(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("checkpoint_000002/.cairn/manifest.json: damaged"), std::string::npos) << msg;
}

// The newest checkpoint, listed by the history, damaged after its commit:
// the open reads it (the history vouches without reading), warns naming it,
// serves the one before as the latest, and leaves its files in place;
// retention never deletes it for being unreadable.
TEST_F(ManagerTest, ADamagedLatestCheckpointIsSetAsideAndTheNewestIntactOneServes) {
  CheckpointConfig keep_two;
  keep_two.num_to_keep = 2;
  {
    CheckpointManager m(uri, keep_two, quiet());
    for (int i = 0; i < 3; ++i) m.register_checkpoint({{"i", i}}, source("s", "x"));
  }
  auto storage = open_storage(uri);
  const std::string key = "checkpoint_000002/.cairn/manifest.json";
  const std::string whole = storage->get(key);
  storage->put(key, whole.substr(0, whole.size() / 2));

  CheckpointManager m(uri, keep_two, quiet());
  ASSERT_TRUE(m.latest());
  EXPECT_EQ(m.latest()->name, "checkpoint_000001");
  EXPECT_TRUE(mentions(warnings, "the latest checkpoint checkpoint_000002 cannot be read"))
      << (warnings.empty() ? "" : warnings.back());
  EXPECT_TRUE(mentions(warnings, "the latest intact one is checkpoint_000001"));
  // Two more saves: retention keeps two of the intact ones and never touches
  // the damaged one's files.
  m.register_checkpoint({{"i", 3}}, source("s", "y"));
  m.register_checkpoint({{"i", 4}}, source("s", "z"));
  EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(storage->exists("checkpoint_000002/model.bin"));
  EXPECT_EQ(storage->get(key), whole.substr(0, whole.size() / 2));
}

// A manifest that is whole JSON but fails its self-check was damaged after
// its commit (bit rot, an edit), which no interrupted write leaves: it is
// corruption for a person to look at, and gc must not delete the data.
TEST_F(ManagerTest, AManifestDamagedAfterItsCommitIsCorruptionThatGcLeavesInPlace) {
  {
    CheckpointManager m(uri, {}, quiet());
    m.register_checkpoint({{"i", 0}}, source("s", "x"));
    m.register_checkpoint({{"i", 1}}, source("s", "y"));
  }
  auto storage = open_storage(uri);
  const std::string key = "checkpoint_000001/.cairn/manifest.json";
  std::string text = storage->get(key);
  const size_t at = text.find("\"i\": 1");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 5] = '7';
  storage->put(key, text);
  ASSERT_FALSE(Manifest::torn(text));

  collect_garbage(uri);
  EXPECT_TRUE(storage->exists(key));
  EXPECT_TRUE(storage->exists("checkpoint_000001/model.bin"));
  const std::string msg = error_message_of(
      [&] { Checkpoint(storage->child("checkpoint_000001")).manifest(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("damaged after it was written"), std::string::npos) << msg;
}

// A snapshot of the history torn by an interrupted write (empty, or cut
// short) is rebuilt from the committed manifests by the next open, with a
// warning, instead of stopping every open until a person deletes it.
TEST_F(ManagerTest, ATornHistorySnapshotIsRebuiltFromTheManifestsWithAWarning) {
  CheckpointConfig config;
  config.num_to_keep = 2;
  config.checkpoint_score_attribute = "acc";
  {
    CheckpointManager m(uri, config, quiet());
    for (int i = 0; i < 4; ++i)
      m.register_checkpoint({{"acc", i % 2 ? 0.9 : 0.1}}, source("s", "x"));
  }
  auto storage = open_storage(uri);
  const std::string snapshot = storage->get("checkpoint_manager.json");
  for (const std::string& torn : {std::string(), snapshot.substr(0, snapshot.size() / 2)}) {
    storage->put("checkpoint_manager.json", torn);
    warnings.clear();
    ExperimentListing listing = read_experiment(uri);  // `cairn ls`: no error
    EXPECT_EQ(indices(listing.checkpoints), (std::vector<uint64_t>{1, 3}));
    CheckpointManager m(uri, config, quiet());
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 3}));
    EXPECT_EQ(m.history()[0].metrics, (json{{"acc", 0.9}}));
    EXPECT_TRUE(mentions(warnings, "checkpoint_manager.json: torn")) << torn.size();
    EXPECT_FALSE(history::torn_snapshot(storage->get("checkpoint_manager.json")))
        << "rewritten whole";
  }
  CheckpointManager m(uri, config, quiet());
  EXPECT_EQ(m.register_checkpoint({{"acc", 0.5}}, source("s", "x")).index, 4u);
}

TEST_F(ManagerTest, MetricsTooDeepOrNotUtf8AreRefusedBeforeAnythingIsWritten) {
  CheckpointManager m(uri, {}, quiet());
  json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = json{{"a", std::move(deep)}};
  error_message_of(
      [&] {
        m.register_checkpoint({{"deep", deep}}, source("s", "x"));
      },
      ErrorCode::kInvalidArgument);
  error_message_of(
      [&] {
        m.register_checkpoint({{"note", "\xff"}}, source("s", "x"));
      },
      ErrorCode::kInvalidArgument);
  EXPECT_TRUE(m.history().empty());
  EXPECT_EQ(m.register_checkpoint({}, source("s", "x")).index, 0u);
}

TEST_F(ManagerTest, AScoreAttributeThatIsNotUtf8IsRefusedNamingTheField) {
  CheckpointConfig c;
  c.checkpoint_score_attribute = "loss\xff";
  std::string msg =
      error_message_of([&] { CheckpointManager m(uri, c, quiet()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("checkpoint_score_attribute"), std::string::npos) << msg;
}

TEST_F(ManagerTest, AFlatMetricKeyMatchesTheScoreAttributeAsANestedOneDoes) {
  CheckpointConfig c = keep(1);
  c.checkpoint_score_attribute = "eval/loss";
  c.checkpoint_score_order = "min";
  CheckpointManager m(uri, c, quiet());
  m.register_checkpoint({{"eval/loss", 0.1}}, source("s", "best"));
  m.register_checkpoint({{"eval", {{"loss", 0.5}}}}, source("s", "worse"));
  m.register_checkpoint({{"eval/loss", 0.9}}, source("s", "latest"));
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(indices(m.best()), (std::vector<uint64_t>{0, 2})) << "the best and the latest";
}

}  // namespace
}  // namespace cairn::testing

namespace cairn {
namespace {

// The rule itself: a torn manifest is a leftover only where no history
// lists the checkpoint and the store can tear a write.
TEST(DamagedNotLeftover, OnlyAnUnlistedTornManifestOnAStoreThatTearsWritesIsALeftover) {
  EXPECT_TRUE(damaged_not_leftover(/*history_lists_it=*/true, /*store_tears_writes=*/true));
  EXPECT_TRUE(damaged_not_leftover(true, false));
  EXPECT_TRUE(damaged_not_leftover(false, false));
  EXPECT_FALSE(damaged_not_leftover(false, true));
}

}  // namespace
}  // namespace cairn
