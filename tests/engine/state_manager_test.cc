// StateCheckpointManager: tf.train.CheckpointManager's behaviour on top of
// the foundation's CheckpointManager.
#include <gtest/gtest.h>

#include <chrono>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/state_manager.h"
#include "storage/backends.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

class StateManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_memory_bucket("sm"); }
  void TearDown() override { clear_memory_bucket("sm"); }

  const std::string uri = "memory://sm/run";
  std::vector<float> w = std::vector<float>(6, 0.0f);
  std::vector<int64_t> counter = std::vector<int64_t>(1, 0);

  StateDict state() {
    StateDict s;
    s.add_mutable<float>("w", {2, 3}, w);
    s.add_mutable<int64_t>("counter", {}, counter);
    s.metadata = {{"epoch", 2}, {"rng", "abc"}};
    return s;
  }
  StateCheckpointOptions opts() {
    StateCheckpointOptions o;
    o.manager.warn = [](const std::string&) {};
    return o;
  }
  static std::vector<uint64_t> indices(const std::vector<CheckpointRecord>& rs) {
    std::vector<uint64_t> out;
    for (const auto& r : rs) out.push_back(r.index);
    return out;
  }
};

TEST_F(StateManagerTest, SaveThenRestoreRoundTripsTensorsMetadataAndStep) {
  StateCheckpointManager m(uri, opts());
  w = {1, 2, 3, 4, 5, 6};
  counter[0] = 7;
  auto r = m.save(state(), 100, {{"loss", 0.5}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->metrics["step"], 100);
  EXPECT_EQ(r->metrics["loss"], 0.5);
  std::vector<float> saved = w;
  w.assign(6, 0.0f);
  counter[0] = 0;
  StateDict target = state();
  RestoreResult res = m.restore(target);
  EXPECT_EQ(w, saved);
  EXPECT_EQ(counter[0], 7);
  EXPECT_EQ(res.step, 100u);
  EXPECT_EQ(res.metadata["epoch"], 2);
  EXPECT_EQ(res.metadata["rng"], "abc");
  EXPECT_EQ(target.metadata["step"], 100);
  EXPECT_EQ(res.record.index, r->index);
}

TEST_F(StateManagerTest, WorksOnALocalDirectoryWithZeroCopyOpen) {
  TempDir dir;
  StateCheckpointManager m(dir.str(), opts());
  w = {1, 2, 3, 4, 5, 6};
  auto r = m.save(state());
  ASSERT_TRUE(r);
  EXPECT_TRUE(std::filesystem::exists(dir / "checkpoint_000000" / "state.safetensors"));
  auto mapped = m.open(*r);
  auto v = mapped.tensor("w").as<float>();
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()), w);
}

TEST_F(StateManagerTest, MaxToKeepDeletesTheOldest) {
  auto o = opts();
  o.max_to_keep = 2;
  StateCheckpointManager m(uri, o);
  for (uint64_t s = 0; s < 5; ++s) m.save(state(), s);
  EXPECT_EQ(indices(m.checkpoints()), (std::vector<uint64_t>{3, 4}));
  EXPECT_FALSE(open_storage(uri)->exists("checkpoint_000000/state.safetensors"));
  EXPECT_EQ(m.latest()->index, 4u);
}

TEST_F(StateManagerTest, WithBackgroundDeletionWaitReturnsOnceTheRemovedDataIsGone) {
  auto o = opts();
  o.max_to_keep = 2;
  o.manager.background_delete = true;
  // The deleter's removal of the last save's victim is slow: wait() must
  // outlast it, where it used to return at once with the file still there.
  set_memory_faults(
      "sm",
      {.capacity = std::nullopt, .before = [](std::string_view op, std::string_view key) {
         if (op == "remove" && key.find("checkpoint_000002/state.") != std::string_view::npos) {
           std::this_thread::sleep_for(std::chrono::milliseconds(300));
         }
       }});
  StateCheckpointManager m(uri, o);
  for (uint64_t s = 0; s < 5; ++s) m.save(state(), s);
  m.wait();
  set_memory_faults("sm", {});
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(open_storage(uri)->exists(fmt::format("checkpoint_{:06d}/state.safetensors", i)))
        << i;
  }
  // The retired files left the checkpoints' folders inside the saves; what
  // wait() waited for is their removal from the trash.
  EXPECT_TRUE(open_storage(uri)->list(".cairn.trash").empty());
  EXPECT_EQ(indices(m.checkpoints()), (std::vector<uint64_t>{3, 4}));
}

TEST_F(StateManagerTest, CheckpointIntervalSkipsSavesUntilEnoughStepsPassed) {
  auto o = opts();
  o.checkpoint_interval = 10;
  StateCheckpointManager m(uri, o);
  EXPECT_TRUE(m.save(state(), 0));
  EXPECT_FALSE(m.save(state(), 5));
  EXPECT_FALSE(m.save(state(), 9));
  EXPECT_TRUE(m.save(state(), 10));
  EXPECT_FALSE(m.save(state(), 15));
  EXPECT_TRUE(m.save(state(), 15, {}, /*force=*/true));
  EXPECT_EQ(m.checkpoints().size(), 3u);
  EXPECT_EQ(m.last_step(), 15u);
}

TEST_F(StateManagerTest, StepCounterCountsOnWhenNoStepIsGivenAndResumesOnReopen) {
  {
    StateCheckpointManager m(uri, opts());
    EXPECT_EQ(m.save(state())->metrics["step"], 0);
    EXPECT_EQ(m.save(state())->metrics["step"], 1);
    EXPECT_EQ(m.save(state(), 41)->metrics["step"], 41);
  }
  StateCheckpointManager again(uri, opts());
  EXPECT_EQ(again.last_step(), 41u);
  EXPECT_EQ(again.save(state())->metrics["step"], 42);
}

TEST_F(StateManagerTest, BestByMetricRanksAndRetainsTheBest) {
  auto o = opts();
  o.max_to_keep = 2;
  o.best_metric = "eval/loss";
  o.best_mode = "min";
  StateCheckpointManager m(uri, o);
  const double losses[] = {0.9, 0.1, 0.5, 0.3, 0.8};
  for (uint64_t s = 0; s < 5; ++s) m.save(state(), s, {{"eval", {{"loss", losses[s]}}}});
  auto best = m.best();
  ASSERT_FALSE(best.empty());
  EXPECT_EQ(best[0].index, 1u);
  // The two best (1, 3) are kept, and the latest (4) is never deleted.
  EXPECT_EQ(indices(m.checkpoints()), (std::vector<uint64_t>{1, 3, 4}));
}

TEST_F(StateManagerTest, ANonNumericBestMetricIsRefusedBeforeAnythingIsWritten) {
  auto o = opts();
  o.best_metric = "loss";
  StateCheckpointManager m(uri, o);
  try {
    m.save(state(), 0, {{"loss", "low"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("loss"), std::string::npos);
  }
  EXPECT_TRUE(open_storage(uri)->list("checkpoint_000000").empty());
  EXPECT_FALSE(m.latest());
}

TEST_F(StateManagerTest, KeepEveryNHoursPinsCheckpointsPastMaxToKeep) {
  double now = 1000.0;
  auto o = opts();
  o.max_to_keep = 1;
  o.keep_checkpoint_every_n_hours = 1.0;
  o.manager.clock = [&] { return now; };
  StateCheckpointManager m(uri, o);
  for (uint64_t s = 0; s < 6; ++s) {
    m.save(state(), s);
    now += 1800;  // half an hour per save
  }
  auto kept = m.checkpoints();
  size_t pinned = 0;
  for (const auto& r : kept) pinned += r.pinned ? 1 : 0;
  EXPECT_GE(pinned, 2u);
  EXPECT_EQ(kept.back().index, 5u);
  EXPECT_LT(kept.size(), 6u);
}

TEST_F(StateManagerTest, RestoreAssertsConsumedListingEveryProblemAndWritesNothing) {
  StateCheckpointManager m(uri, opts());
  w = {1, 2, 3, 4, 5, 6};
  m.save(state());
  std::vector<float> wrong(6, -1.0f), extra(1, -1.0f);
  StateDict target;
  target.add_mutable<float>("w", {3, 2}, wrong);  // shape differs
  target.add_mutable<float>("bias", {1}, extra);  // not saved
  // "counter" was saved but is not expected.
  try {
    m.restore(target);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing from the file: bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected (not in the state): counter"), std::string::npos) << msg;
    EXPECT_NE(msg.find("w: file F32[2, 3], state F32[3, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint_000000"), std::string::npos) << msg;
  }
  EXPECT_EQ(wrong, std::vector<float>(6, -1.0f));
}

TEST_F(StateManagerTest, RestoreDetectsAFileChangedAfterCommit) {
  TempDir dir;
  StateCheckpointManager m(dir.str(), opts());
  w = {1, 2, 3, 4, 5, 6};
  m.save(state());
  auto path = dir / "checkpoint_000000" / "state.safetensors";
  std::string bytes = read_text(path);
  bytes[bytes.size() - 1] ^= 0x40;
  write_text(path, bytes);
  StateDict target = state();
  try {
    m.restore(target);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("state.safetensors"), std::string::npos) << e.what();
  }
}

// A load of some tensors with the manifest's block checksums reads and
// checks only the blocks it needs: damage elsewhere in the file does not
// stop it, damage in what it reads does, naming the bytes.
TEST_F(StateManagerTest, ASubsetLoadChecksTheBlocksItReadsAndNothingElse) {
  TempDir dir;
  StateCheckpointManager m(dir.str(), opts());
  const size_t n = kChecksumBlockSize;  // floats: each tensor spans 4 blocks
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i), b[i] = -static_cast<float>(i);
  StateDict s;
  s.add<float>("a", {n}, a);
  s.add<float>("b", {n}, b);
  auto r = m.save(s);
  ASSERT_TRUE(r);
  ManifestEntry entry;
  for (const auto& f : r->checkpoint.manifest().files) {
    if (f.path == kStateFileName) entry = f;
  }
  ASSERT_FALSE(entry.block_xxh3.empty());
  // Damage the middle of "b".
  const SafetensorsHeader header = m.open(*r).header();
  const uint64_t at = header.data_start() + header.find("b")->begin + n * 2;
  auto path = dir / "checkpoint_000000" / "state.safetensors";
  std::string bytes = read_text(path);
  bytes[at] ^= 0x40;
  write_text(path, bytes);

  auto load = [&](const std::string& name, std::vector<float>& out, LoadOptions o) {
    out.assign(n, 0.0f);
    StateDict t;
    t.add_mutable<float>(name, {n}, out);
    o.strict = false;
    load_into(r->checkpoint.storage(), kStateFileName, t, o);
  };
  std::vector<float> got;
  IoReport io;
  LoadOptions checked;
  checked.report = &io;
  load("a", got, checked.expect(entry));
  EXPECT_EQ(got, a);
  EXPECT_EQ(io.path, IoPath::kBuffered) << io.reason;
  // The whole-file checksum alone needs the whole file, damage included.
  LoadOptions whole;
  whole.expected_xxh3 = entry.xxh3;
  EXPECT_THROW(load("a", got, whole), Error);
  try {
    load("b", got, LoadOptions{}.expect(entry));
    FAIL() << "damaged bytes were loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    const uint64_t block = at / entry.block_size;
    EXPECT_NE(std::string(e.what()).find(fmt::format("bytes [{}, {}) (checksum block {})",
                                                     block * entry.block_size,
                                                     (block + 1) * entry.block_size, block)),
              std::string::npos)
        << e.what();
  }
}

TEST_F(StateManagerTest, RestoreWithoutACheckpointIsNotFound) {
  StateCheckpointManager m(uri, opts());
  StateDict target = state();
  try {
    m.restore(target);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST_F(StateManagerTest, AsyncSavesCommitAndRestore) {
  StateCheckpointManager m(uri, opts());
  for (int i = 0; i < 3; ++i) {
    w.assign(6, static_cast<float>(i));
    auto h = m.save_async(state(), static_cast<uint64_t>(i));
    ASSERT_TRUE(h);
  }
  m.wait();
  EXPECT_EQ(m.checkpoints().size(), 3u);
  w.assign(6, -1.0f);
  StateDict target = state();
  EXPECT_EQ(m.restore(target).step, 2u);
  EXPECT_EQ(w, std::vector<float>(6, 2.0f));
}

// A resumed run: restore() readies save_async()'s staging in the
// background, so the first save_async() allocates nothing (its stall is a
// copy, not the first touch of fresh memory); a run that saves
// synchronously gets the memory back at its first save(); the option off
// allocates nothing.
TEST_F(StateManagerTest, RestorePreparesTheStagingOfTheFirstAsyncSaveOfAResumedRun) {
  {
    StateCheckpointManager first(uri, opts());
    first.save(state(), 1);
  }
  {
    StateCheckpointManager resumed(uri, opts());
    EXPECT_FALSE(resumed.async_stats());
    StateDict target = state();
    resumed.restore(target);
    resumed.wait();  // the preparation has finished
    auto prepared = resumed.async_stats();
    ASSERT_TRUE(prepared);
    EXPECT_EQ(prepared->staging_allocations, 1u);
    EXPECT_GT(prepared->staging_bytes, 6 * sizeof(float) + sizeof(int64_t));
    ASSERT_TRUE(resumed.save_async(state(), 2));
    resumed.wait();
    EXPECT_EQ(resumed.async_stats()->staging_allocations, 1u);  // the prepared buffer
    EXPECT_EQ(resumed.async_stats()->saves, 1u);
  }
  {
    StateCheckpointManager synchronous(uri, opts());
    StateDict target = state();
    synchronous.restore(target);
    ASSERT_TRUE(synchronous.async_stats());
    synchronous.save(state(), 3);
    EXPECT_FALSE(synchronous.async_stats());  // freed for a run that saves synchronously
  }
  StateCheckpointOptions off = opts();
  off.prepare_async_on_restore = false;
  StateCheckpointManager plain(uri, off);
  StateDict target = state();
  EXPECT_EQ(plain.restore(target).step, 3u);
  EXPECT_FALSE(plain.async_stats());
}

// A fresh run's restore-or-start: the restore finds no checkpoint (and
// says so), and the state it was given readies the first save_async()'s
// staging all the same.
TEST_F(StateManagerTest, ARestoreThatFindsNoCheckpointStillPreparesTheFirstAsyncSave) {
  StateCheckpointManager fresh(uri, opts());
  StateDict target = state();
  testing::expect_error_naming(ErrorCode::kNotFound, "no checkpoint",
                               [&] { fresh.restore(target); });
  fresh.wait();
  auto prepared = fresh.async_stats();
  ASSERT_TRUE(prepared);
  EXPECT_EQ(prepared->staging_allocations, 1u);
  ASSERT_TRUE(fresh.save_async(state(), 1));
  fresh.wait();
  EXPECT_EQ(fresh.async_stats()->staging_allocations, 1u);  // the prepared buffer
  StateCheckpointOptions off = opts();
  off.prepare_async_on_restore = false;
  StateCheckpointManager plain(uri + "-off", off);
  testing::expect_error_naming(ErrorCode::kNotFound, "no checkpoint",
                               [&] { plain.restore(target); });
  EXPECT_FALSE(plain.async_stats());
}

TEST_F(StateManagerTest, ASecondManagerOnTheSameDirectoryIsLocked) {
  StateCheckpointManager m(uri, opts());
  try {
    StateCheckpointManager other(uri, opts());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kLocked);
  }
}

TEST_F(StateManagerTest, BadOptionsAreRefused) {
  auto o = opts();
  o.max_to_keep = 0;
  EXPECT_THROW(StateCheckpointManager(uri, o), Error);
  o = opts();
  o.checkpoint_interval = 0;
  EXPECT_THROW(StateCheckpointManager(uri, o), Error);
  o = opts();
  o.best_mode = "best";
  EXPECT_THROW(StateCheckpointManager(uri, o), Error);
}

TEST_F(StateManagerTest, WithAMemoryTierSavesLandInMemoryAndTheCloseKeepsTheNewest) {
  TempDir tier;
  StateCheckpointOptions o = opts();
  o.memory_tier.enabled = true;
  o.memory_tier.root = tier.str();
  o.memory_tier.persist_every_n = 2;
  {
    StateCheckpointManager m(uri, o);
    for (int step = 1; step <= 3; ++step) {
      w.assign(6, static_cast<float>(step));
      CheckpointRecord r = step < 3 ? *m.save(state(), step) : [&] {
        SaveHandle h = *m.save_async(state(), step);
        h.wait();
        return *h.record();
      }();
      EXPECT_EQ(r.tier, "memory") << step;
      EXPECT_EQ(r.checkpoint.uri().find(tier.str()), std::string("file://").size()) << step;
    }
    w.assign(6, 0.0f);
    StateDict target = state();
    RestoreResult res = m.restore(target);
    EXPECT_EQ(res.step, 3u);
    EXPECT_EQ(res.record.tier, "memory");
    EXPECT_EQ(w, std::vector<float>(6, 3.0f));
  }
  // The 2nd went to persistent storage in the background, the 3rd (the
  // newest) when the manager closed.
  StateCheckpointManager reopened(uri, opts());
  EXPECT_EQ(indices(reopened.checkpoints()), (std::vector<uint64_t>{1, 2}));
  w.assign(6, 0.0f);
  StateDict target = state();
  EXPECT_EQ(reopened.restore(target).step, 3u);
  EXPECT_EQ(w, std::vector<float>(6, 3.0f));
}

}  // namespace
}  // namespace cairn::testing
