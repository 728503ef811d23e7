// Async saves: save() returns after the snapshot, staging is reused, saves
// commit through the protocol in order, and errors are never lost.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "cairn/async_save.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state.h"
#include "storage/backends.h"

namespace cairn::testing {
namespace {

// Holds background writes of .safetensors files until opened.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> g(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

bool is_state_file(std::string_view key) { return key.ends_with(".safetensors"); }

class AsyncSaveTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_memory_bucket("async"); }
  void TearDown() override {
    set_memory_faults("async", {});
    clear_memory_bucket("async");
  }
  std::vector<float> w = std::vector<float>(1000, 1.0f);
  StateDict state() {
    StateDict s;
    s.add<float>("w", {10, 100}, w);
    s.metadata = {{"epoch", 1}};
    return s;
  }
  std::vector<float> load(const Checkpoint& cp) {
    std::vector<float> out(1000);
    StateDict t;
    t.add_mutable<float>("w", {10, 100}, out);
    load_into(cp.storage(), kStateFileName, t);
    return out;
  }
  // Every write of a state file in the bucket waits at `gate`.
  void hold_state_writes(Gate& gate) {
    MemoryFaults f;
    f.before = [&gate](std::string_view op, std::string_view key) {
      if (op == "write" && is_state_file(key)) gate.wait();
    };
    set_memory_faults("async", f);
  }
  ManagerOptions quiet() {
    ManagerOptions o;
    o.warn = [](const std::string&) {};
    return o;
  }
};

TEST_F(AsyncSaveTest, SaveReturnsAfterTheSnapshotSoTheCallerMayChangeItsTensors) {
  Gate gate;
  hold_state_writes(gate);
  AsyncSaver saver;
  auto cp = Checkpoint::from_directory("memory://async/cp");
  SaveHandle h = saver.save(state(), cp, {{"loss", 1.0}});
  // save() returned although the background write is held at the gate.
  EXPECT_FALSE(h.done());
  EXPECT_FALSE(cp.is_committed());
  std::fill(w.begin(), w.end(), 2.0f);
  gate.open();
  h.wait();
  EXPECT_TRUE(h.done());
  EXPECT_EQ(h.error(), nullptr);
  EXPECT_TRUE(cp.is_committed());
  EXPECT_EQ(load(cp), std::vector<float>(1000, 1.0f));
  EXPECT_EQ(cp.get_metadata()["epoch"], 1);
  ASSERT_TRUE(h.manifest());
  EXPECT_EQ(h.manifest()->metrics["loss"], 1.0);
}

TEST_F(AsyncSaveTest, StagingIsAllocatedOnceAndReusedBySaves) {
  AsyncSaver saver;
  for (int i = 0; i < 4; ++i) {
    saver.save(state(), Checkpoint::from_directory("memory://async/cp" + std::to_string(i))).wait();
  }
  std::vector<float> small(10);
  StateDict s;
  s.add<float>("w", {10}, small);
  saver.save(s, Checkpoint::from_directory("memory://async/small")).wait();
  auto st = saver.stats();
  EXPECT_EQ(st.saves, 5u);
  EXPECT_EQ(st.staging_allocations, 1u);
  EXPECT_GE(st.staging_bytes, 4000u);
}

TEST_F(AsyncSaveTest, ManagerSavesCommitInOrderAndApplyRetention) {
  CheckpointConfig config;
  config.num_to_keep = 2;
  CheckpointManager manager("memory://async/exp", config, quiet());
  AsyncSaver saver(AsyncSaveOptions{.max_in_flight = 2});
  std::vector<SaveHandle> handles;
  for (int i = 0; i < 4; ++i) {
    std::fill(w.begin(), w.end(), static_cast<float>(i));
    handles.push_back(saver.save(state(), manager, {{"i", i}}));
  }
  saver.wait_all();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(handles[static_cast<size_t>(i)].record());
    EXPECT_EQ(handles[static_cast<size_t>(i)].record()->index, static_cast<uint64_t>(i));
  }
  auto history = manager.history();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].index, 2u);
  EXPECT_EQ(history[1].index, 3u);
  EXPECT_EQ(load(history[1].checkpoint), std::vector<float>(1000, 3.0f));
  EXPECT_TRUE(history[1].checkpoint.verify().empty());
}

TEST_F(AsyncSaveTest, TwoSavesMayBePendingWhenConfigured) {
  Gate gate;
  hold_state_writes(gate);
  AsyncSaver saver(AsyncSaveOptions{.max_in_flight = 2});
  SaveHandle a = saver.save(state(), Checkpoint::from_directory("memory://async/a"));
  SaveHandle b = saver.save(state(), Checkpoint::from_directory("memory://async/b"));
  EXPECT_FALSE(a.done());
  EXPECT_FALSE(b.done());
  gate.open();
  saver.wait_all();
  EXPECT_TRUE(a.done() && b.done());
}

TEST_F(AsyncSaveTest, AnErrorIsRethrownByWaitAndNotAgainByTheSaver) {
  MemoryFaults f;
  f.capacity = 100;  // the state file does not fit: a full disk
  set_memory_faults("async", f);
  AsyncSaver saver;
  auto cp = Checkpoint::from_directory("memory://async/full");
  SaveHandle h = saver.save(state(), cp);
  try {
    h.wait();
    FAIL() << "a save to a full device succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory://async/full"), std::string::npos) << e.what();
  }
  EXPECT_NE(h.error(), nullptr);
  EXPECT_FALSE(cp.is_committed());
  set_memory_faults("async", {});
  EXPECT_NO_THROW(saver.wait_all());
  EXPECT_NO_THROW(saver.save(state(), Checkpoint::from_directory("memory://async/ok")).wait());
}

TEST_F(AsyncSaveTest, AnUnseenErrorSurfacesOnTheNextSaveOnceAndEarlierCheckpointsSurvive) {
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver;
  saver.save(state(), manager).wait();
  MemoryFaults f;
  std::atomic<int> failures{1};  // only the next state file's commit fails
  f.before = [&](std::string_view op, std::string_view key) {
    if (op == "commit" && is_state_file(key) && failures.fetch_sub(1) > 0) {
      throw Error(ErrorCode::kIO, "injected commit failure");
    }
  };
  set_memory_faults("async", f);
  (void)saver.save(state(), manager);  // fails in the background; no one waits for it
  try {
    (void)saver.save(state(), manager);
    FAIL() << "the earlier save's error was lost";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected commit failure"), std::string::npos);
  }
  // Seen once; the next save goes through.
  SaveHandle ok = saver.save(state(), manager);
  ok.wait();
  auto history = manager.history();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].index, 0u);
  EXPECT_EQ(history[1].index, 2u) << "the failed save's checkpoint must not be visible";
  EXPECT_TRUE(history[0].checkpoint.verify().empty());
}

TEST_F(AsyncSaveTest, AnUnseenErrorSurfacesOnWaitAllAndClose) {
  AsyncSaver saver;
  MemoryFaults f;
  f.before = [&](std::string_view op, std::string_view key) {
    if (op == "write" && is_state_file(key)) throw Error(ErrorCode::kIO, "injected write failure");
  };
  set_memory_faults("async", f);
  (void)saver.save(state(), Checkpoint::from_directory("memory://async/x"));
  EXPECT_THROW(saver.wait_all(), Error);
  EXPECT_NO_THROW(saver.wait_all());
  (void)saver.save(state(), Checkpoint::from_directory("memory://async/y"));
  EXPECT_THROW(saver.close(), Error);
  EXPECT_THROW((void)saver.save(state(), Checkpoint::from_directory("memory://async/z")), Error);
}

TEST_F(AsyncSaveTest, RefusesACommittedDestinationBeforeSnapshotting) {
  AsyncSaver saver;
  auto cp = Checkpoint::from_directory("memory://async/cp");
  saver.save(state(), cp).wait();
  try {
    (void)saver.save(state(), cp);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists);
  }
}

}  // namespace
}  // namespace cairn::testing
