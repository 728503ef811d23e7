// Async saves: save() returns after the snapshot, staging is reused, saves
// commit through the protocol in order, and errors are never lost.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cairn/async_save.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state.h"
#include "cairn/state_manager.h"
#include "storage/backends.h"
#include "support/gate.h"

namespace cairn::testing {
namespace {

bool is_state_file(std::string_view key) { return key.ends_with(".safetensors"); }

// The last path component of a checkpoint's URI (its directory name).
std::string dir_name(const Checkpoint& cp) {
  const std::string uri = cp.uri();
  return uri.substr(uri.find_last_of('/') + 1);
}

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
  // Saves `s` into memory://async/<name> with `saver`, waits, and maps it.
  static MappedState save_and_map(AsyncSaver& saver, const StateDict& s, const std::string& name) {
    auto cp = Checkpoint::from_directory("memory://async/" + name);
    saver.save(s, cp).wait();
    return MappedState::open(cp.storage(), kStateFileName);
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
  // Every write of a state file waits at `gate`; the first one then fails
  // with "injected write failure". Each state file's commit is logged in
  // `commits` (keys, in order).
  void hold_state_writes_fail_first(Gate& gate) {
    MemoryFaults f;
    f.before = [this, &gate](std::string_view op, std::string_view key) {
      if (op == "write" && is_state_file(key)) {
        gate.wait();
        if (writes_seen.fetch_add(1) == 0) throw Error(ErrorCode::kIO, "injected write failure");
      }
    };
    set_memory_faults("async", f);
  }
  // Every write of a state file waits at `gate`; state file commits are
  // logged in `commits`.
  void hold_and_log_state_writes(Gate& gate) {
    MemoryFaults f;
    f.before = [this, &gate](std::string_view op, std::string_view key) {
      if (op == "write" && is_state_file(key)) gate.wait();
      if (op == "commit" && is_state_file(key)) {
        std::lock_guard<std::mutex> g(commits_mu);
        commits.emplace_back(key);
      }
    };
    set_memory_faults("async", f);
  }
  std::atomic<int> writes_seen{0};
  std::mutex commits_mu;
  std::vector<std::string> commits;

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

// Saves of one state reuse its layout; each file must still hold the
// metadata, names, shapes and bytes of the state it was saved from.
TEST_F(AsyncSaveTest, EverySaveHoldsItsOwnStateWhetherTheTensorsChangedOrOnlyTheMetadata) {
  AsyncSaver saver;
  std::vector<float> b(6, 3.0f);
  auto save = [&](const StateDict& s, const std::string& name) {
    return save_and_map(saver, s, name);
  };
  StateDict s = state();
  auto first = save(s, "a");
  s.metadata = {{"epoch", 2}, {"note", std::string(300, 'x')}};  // a longer header
  s.string_metadata = {{"format", "pt"}};
  auto second = save(s, "b");
  s.metadata = nlohmann::json::object();  // no metadata at all
  s.string_metadata.clear();
  auto third = save(s, "c");
  s.add<float>("b", {2, 3}, b);  // a new tensor
  auto fourth = save(s, "d");
  s.remove("w");
  s.add<float>("w", {1000}, w);  // the same name, a new shape
  auto fifth = save(s, "e");

  EXPECT_EQ(first.metadata()["epoch"], 1);
  EXPECT_EQ(second.metadata()["note"], std::string(300, 'x'));
  EXPECT_EQ(second.header().metadata.at("format"), "pt");
  EXPECT_TRUE(third.header().metadata.empty());
  EXPECT_EQ(fourth.names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(fifth.tensor("w").shape, (Shape{1000}));
  for (const auto* m : {&first, &second, &third, &fourth, &fifth}) {
    const TensorView v = m->tensor("w");
    ASSERT_EQ(v.bytes.size(), 4000u);
    EXPECT_EQ(std::memcmp(v.bytes.data(), w.data(), 4000), 0) << m->source();
  }
  EXPECT_EQ(std::memcmp(fourth.tensor("b").bytes.data(), b.data(), 24), 0);
}

// A tensor given new memory under the same name, dtype and shape keeps the
// layout but must be saved from its new bytes; copies of an unchanged state
// (what a manager saves) reuse the whole plan and still save current bytes.
TEST_F(AsyncSaveTest, ASaveReadsTheBuffersTheStateViewsNowNotThoseOfTheLastSave) {
  AsyncSaver saver;
  auto save = [&](const StateDict& s, const std::string& name) {
    return save_and_map(saver, s, name);
  };
  StateDict s = state();
  auto first = save(s, "a");
  std::vector<float> moved(1000, 7.0f);
  s.add<float>("w", {1000}, moved);
  auto second = save(s, "b");
  std::fill(moved.begin(), moved.end(), 8.0f);
  StateDict copy = s;
  copy.metadata["step"] = 3;
  auto third = save(copy, "c");
  EXPECT_EQ(first.tensor("w").as<float>()[0], 1.0f);
  EXPECT_EQ(second.tensor("w").as<float>()[999], 7.0f);
  EXPECT_EQ(third.tensor("w").as<float>()[999], 8.0f);
  EXPECT_EQ(third.metadata()["step"], 3);
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

// A save issued while the previous checkpoint's deletion still runs stalls
// only for its snapshot; its writer waits for the deletion before writing,
// so the disk never holds more than with deletion inside the save.
TEST_F(AsyncSaveTest, ASaveDoesNotWaitForAPendingDeletionButItsWriteDoes) {
  CheckpointConfig config;
  config.num_to_keep = 1;
  Gate deletion;
  std::atomic<int> removed{0};
  std::atomic<bool> third_written{false};
  MemoryFaults f;
  f.before = [&](std::string_view op, std::string_view key) {
    if (op == "remove" && key.find(".cairn.trash/") != std::string_view::npos &&
        is_state_file(key)) {
      deletion.wait_for(std::chrono::seconds(60));  // bounded, should save() wait here
      ++removed;
    }
    if (op == "write" && key.find("checkpoint_000002/") != std::string_view::npos &&
        is_state_file(key)) {
      third_written = true;
    }
  };
  set_memory_faults("async", f);
  {
    ManagerOptions background = quiet();
    background.background_delete = true;
    CheckpointManager manager("memory://async/exp", config, background);
    AsyncSaver saver;
    saver.save(state(), manager).wait();
    // Its commit retires checkpoint 0, whose deletion the gate holds.
    saver.save(state(), manager).wait();
    SaveHandle third = saver.save(state(), manager);
    EXPECT_EQ(removed.load(), 0);  // save() returned while the deletion was held
    EXPECT_FALSE(third_written.load());
    EXPECT_FALSE(third.done());
    deletion.open();
    third.wait();
    EXPECT_TRUE(third_written.load());
    manager.wait_for_deletes();
    EXPECT_EQ(removed.load(), 2);
    auto history = manager.history();
    ASSERT_EQ(history.size(), 1u);
    EXPECT_EQ(history[0].index, 2u);
  }
  set_memory_faults("async", {});
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

TEST_F(AsyncSaveTest, WhenBusyWaitBlocksUntilThePendingSaveCommits) {
  Gate gate;
  hold_state_writes(gate);
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver;  // kWait, max_in_flight 1
  SaveHandle first = saver.save(state(), manager);
  std::atomic<bool> returned{false};
  bool first_committed_on_return = false;
  SaveHandle second;
  std::thread t([&] {
    second = saver.save(state(), manager);
    // Committed, though its handle may say done a moment later (the slot is
    // freed first).
    first_committed_on_return =
        Checkpoint::from_directory("memory://async/exp/" + checkpoint_name(0)).is_committed();
    returned = true;
  });
  spin_until([&] { return saver.stats().waits == 1; });  // blocked in save()
  EXPECT_FALSE(returned);
  EXPECT_FALSE(first.done());
  gate.open();
  t.join();
  EXPECT_TRUE(first_committed_on_return) << "save() returned before the pending save committed";
  saver.wait_all();
  ASSERT_TRUE(first.record() && second.record());
  EXPECT_EQ(first.record()->index, 0u);
  EXPECT_EQ(second.record()->index, 1u);
  auto st = saver.stats();
  EXPECT_EQ(st.saves, 2u);
  EXPECT_EQ(st.waits, 1u);
  EXPECT_EQ(st.skipped, 0u);
  EXPECT_EQ(st.extra_buffer_saves, 0u);
  EXPECT_EQ(st.staging_allocations, 1u);
  EXPECT_GE(st.max_stall_seconds, st.last_stall_seconds);
  EXPECT_GT(st.total_stall_seconds, 0.0);
}

TEST_F(AsyncSaveTest, WhenBusyExtraBufferSnapshotsAtOnceUpToTheCapAndCommitsInOrder) {
  Gate gate;
  hold_and_log_state_writes(gate);
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{
      .max_in_flight = 1, .when_busy = WhenBusy::kExtraBuffer, .max_staging_buffers = 2});
  std::vector<SaveHandle> h;
  std::fill(w.begin(), w.end(), 0.0f);
  h.push_back(saver.save(state(), manager));
  std::fill(w.begin(), w.end(), 1.0f);
  // The first save is held writing: this one snapshots into a second buffer.
  h.push_back(saver.save(state(), manager));
  EXPECT_FALSE(h[0].done());
  EXPECT_FALSE(h[1].done());
  auto st = saver.stats();
  EXPECT_EQ(st.waits, 0u);
  EXPECT_EQ(st.extra_buffer_saves, 1u);
  EXPECT_EQ(st.staging_allocations, 2u);
  // Both buffers hold pending saves: the cap makes a third save wait.
  std::fill(w.begin(), w.end(), 2.0f);
  std::atomic<bool> returned{false};
  SaveHandle third;
  std::thread t([&] {
    third = saver.save(state(), manager);
    returned = true;
  });
  spin_until([&] { return saver.stats().waits == 1; });
  EXPECT_FALSE(returned);
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  gate.open();
  t.join();
  h.push_back(third);
  saver.wait_all();
  EXPECT_EQ(saver.stats().staging_allocations, 2u) << "more buffers than max_staging_buffers";
  EXPECT_EQ(saver.stats().saves, 3u);
  auto history = manager.history();
  ASSERT_EQ(history.size(), 3u);
  ASSERT_EQ(commits.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(h[i].record());
    EXPECT_EQ(h[i].record()->index, i);
    EXPECT_EQ(history[i].index, i);
    EXPECT_NE(commits[i].find(dir_name(h[i].checkpoint())), std::string::npos)
        << "commit " << i << " was " << commits[i];
    EXPECT_EQ(load(history[i].checkpoint), std::vector<float>(1000, static_cast<float>(i)));
  }
}

TEST_F(AsyncSaveTest, ExtraBuffersMustBeAtLeastMaxInFlight) {
  EXPECT_THROW(
      AsyncSaver(AsyncSaveOptions{
          .max_in_flight = 3, .when_busy = WhenBusy::kExtraBuffer, .max_staging_buffers = 2}),
      Error);
}

TEST_F(AsyncSaveTest, WhenBusySkipReturnsASkippedHandleAndReservesNothing) {
  Gate gate;
  hold_state_writes(gate);
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{.when_busy = WhenBusy::kSkip});
  SaveHandle first = saver.save(state(), manager);
  SaveHandle skipped = saver.save(state(), manager);  // the first is held writing
  EXPECT_TRUE(skipped.skipped());
  EXPECT_TRUE(skipped.done());
  EXPECT_EQ(skipped.error(), nullptr);
  EXPECT_NO_THROW(skipped.wait());
  EXPECT_FALSE(skipped.record());
  EXPECT_FALSE(skipped.manifest());
  try {
    (void)skipped.checkpoint();
    FAIL() << "a skipped save has a checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
  }
  EXPECT_FALSE(first.skipped());
  EXPECT_FALSE(first.done());
  auto st = saver.stats();
  EXPECT_EQ(st.saves, 1u);
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_EQ(st.waits, 0u);
  gate.open();
  first.wait();
  SaveHandle next = saver.save(state(), manager);
  EXPECT_FALSE(next.skipped());
  next.wait();
  ASSERT_TRUE(next.record());
  EXPECT_EQ(next.record()->index, 1u) << "the skipped save reserved an index";
  auto history = manager.history();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].index, 0u);
  EXPECT_EQ(history[1].index, 1u);
  EXPECT_EQ(saver.stats().skipped, 1u);
  EXPECT_EQ(saver.stats().saves, 2u);
}

TEST_F(AsyncSaveTest, StateManagerReserveReadiesSaveAsyncForEveryStep) {
  StateCheckpointOptions o;
  o.manager = quiet();
  StateCheckpointManager mgr("memory://async/sm", o);
  StateDict bad = state();
  bad.metadata = nlohmann::json::array();
  EXPECT_THROW(mgr.reserve(bad), Error);
  mgr.reserve(state());  // sized for the largest step's header
  for (uint64_t step : {uint64_t{1}, uint64_t{1} << 62}) {
    auto h = mgr.save_async(state(), step);
    ASSERT_TRUE(h);
    h->wait();
  }
  std::vector<float> out(1000, 0.0f);
  StateDict into;
  into.add_mutable<float>("w", {10, 100}, out);
  EXPECT_EQ(mgr.restore(into).step, uint64_t{1} << 62);
  EXPECT_EQ(out, w);
}

TEST_F(AsyncSaveTest, StateManagerSkipDoesNotCountAsTheLastStep) {
  Gate gate;
  hold_state_writes(gate);
  StateCheckpointOptions o;
  o.async.when_busy = WhenBusy::kSkip;
  o.manager = quiet();
  StateCheckpointManager mgr("memory://async/sm", o);
  auto a = mgr.save_async(state(), 10);
  auto b = mgr.save_async(state(), 11);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->skipped());
  EXPECT_TRUE(b->skipped());
  EXPECT_EQ(mgr.last_step(), 10u);
  gate.open();
  mgr.wait();
  auto c = mgr.save_async(state());
  ASSERT_TRUE(c);
  c->wait();
  EXPECT_EQ(mgr.last_step(), 11u);
  EXPECT_EQ(mgr.checkpoints().size(), 2u);
}

TEST_F(AsyncSaveTest, ReserveAllocatesAheadSoTheFirstSaveAllocatesNothing) {
  AsyncSaver saver;
  saver.reserve(state());
  auto st = saver.stats();
  EXPECT_EQ(st.staging_allocations, 1u);
  EXPECT_GE(st.staging_bytes, 4000u);
  EXPECT_EQ(st.saves, 0u);
  saver.save(state(), Checkpoint::from_directory("memory://async/a")).wait();
  saver.save(state(), Checkpoint::from_directory("memory://async/b")).wait();
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  EXPECT_EQ(load(Checkpoint::from_directory("memory://async/b")), w);
  // Reserving what is held already allocates nothing; more does.
  saver.reserve(4000);
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  saver.reserve(uint64_t{5} << 20);
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  EXPECT_GE(saver.stats().staging_bytes, uint64_t{5} << 20);
  // kWait with max_in_flight 1 holds one buffer.
  EXPECT_THROW(saver.reserve(4000, 2), Error);
  EXPECT_THROW(saver.reserve(4000, 0), Error);
  saver.close();
  EXPECT_THROW(saver.reserve(4000), Error);
}

TEST_F(AsyncSaveTest, ReserveInTheBackgroundIsWhatTheFirstSaveUses) {
  constexpr auto kBackground = AsyncSaver::Reserve::kBackground;
  AsyncSaver saver;
  saver.reserve(state(), 1, kBackground);
  // The save first waits for the reservation: it allocates nothing itself.
  saver.save(state(), Checkpoint::from_directory("memory://async/a")).wait();
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  EXPECT_EQ(load(Checkpoint::from_directory("memory://async/a")), w);
  // The arguments are checked before the call returns.
  EXPECT_THROW(saver.reserve(4000, 2, kBackground), Error);
  EXPECT_THROW(saver.reserve(4000, 0, kBackground), Error);
  // wait_all() and close() wait for a reservation at work; so does the
  // destructor.
  saver.reserve(uint64_t{5} << 20, 1, kBackground);
  saver.wait_all();
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  EXPECT_GE(saver.stats().staging_bytes, uint64_t{5} << 20);
  saver.reserve(uint64_t{9} << 20, 1, kBackground);
  saver.close();
  EXPECT_EQ(saver.stats().staging_allocations, 3u);
  AsyncSaver other;
  other.reserve(uint64_t{5} << 20, 1, kBackground);
}

TEST_F(AsyncSaveTest, AReservationThatFailsInTheBackgroundIsThrownByTheNextCallOnce) {
  AsyncSaver saver;
  // No machine maps an exbibyte: the allocation fails on the saver's thread.
  saver.reserve(uint64_t{1} << 60, 1, AsyncSaver::Reserve::kBackground);
  try {
    (void)saver.save(state(), Checkpoint::from_directory("memory://async/a"));
    FAIL() << "the failed reservation was not thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in the background"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(Checkpoint::from_directory("memory://async/a").is_committed());
  // Once: the next save runs, on staging of its own.
  saver.save(state(), Checkpoint::from_directory("memory://async/b")).wait();
  EXPECT_EQ(load(Checkpoint::from_directory("memory://async/b")), w);
  saver.reserve(uint64_t{1} << 60, 1, AsyncSaver::Reserve::kBackground);
  EXPECT_THROW(saver.wait_all(), Error);
  // close() throws it too, and closes all the same.
  saver.reserve(uint64_t{1} << 60, 1, AsyncSaver::Reserve::kBackground);
  EXPECT_THROW(saver.close(), Error);
  EXPECT_THROW(saver.reserve(4000), Error);  // closed
  saver.close();
}

TEST_F(AsyncSaveTest, ReserveCoversTheExtraBuffers) {
  Gate gate;
  hold_state_writes(gate);
  AsyncSaver saver(AsyncSaveOptions{.when_busy = WhenBusy::kExtraBuffer});  // 2 buffers
  saver.reserve(state(), 2);
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  SaveHandle a = saver.save(state(), Checkpoint::from_directory("memory://async/a"));
  SaveHandle b = saver.save(state(), Checkpoint::from_directory("memory://async/b"));
  EXPECT_FALSE(a.done());
  EXPECT_EQ(saver.stats().extra_buffer_saves, 1u);
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  gate.open();
  saver.wait_all();
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
}

TEST_F(AsyncSaveTest, ReserveWaitsForATooSmallBufferHoldingAPendingSave) {
  Gate gate;
  hold_state_writes(gate);
  AsyncSaver saver;
  SaveHandle a = saver.save(state(), Checkpoint::from_directory("memory://async/a"));
  std::atomic<bool> returned{false};
  std::thread t([&] {
    saver.reserve(uint64_t{4} << 20);
    returned = true;
  });
  EXPECT_FALSE(returned);
  gate.open();
  t.join();
  // The pending save frees its buffer once committed and its handle says
  // done a moment later, so a.done() may still be false here.
  a.wait();
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
  EXPECT_EQ(load(Checkpoint::from_directory("memory://async/a")), w);
}

// A failed background save's error reaches the caller under every policy:
// the first save's write is held, a second save is issued while it is
// pending, then the first fails.
TEST_F(AsyncSaveTest, AFailedSavesErrorSurfacesUnderWait) {
  Gate gate;
  hold_state_writes_fail_first(gate);
  AsyncSaver saver;
  SaveHandle first = saver.save(state(), Checkpoint::from_directory("memory://async/x"));
  std::string thrown;
  std::thread t([&] {
    try {
      (void)saver.save(state(), Checkpoint::from_directory("memory://async/y"));
    } catch (const Error& e) {
      thrown = e.what();
    }
  });
  spin_until([&] { return saver.stats().waits == 1; });
  gate.open();
  t.join();
  // The blocked save threw the error of the save it waited for.
  EXPECT_NE(thrown.find("injected write failure"), std::string::npos) << thrown;
  EXPECT_THROW(first.wait(), Error);
  EXPECT_NO_THROW(saver.wait_all());
  EXPECT_EQ(saver.stats().saves, 1u);
  EXPECT_FALSE(Checkpoint::from_directory("memory://async/x").is_committed());
  EXPECT_FALSE(Checkpoint::from_directory("memory://async/y").is_committed());
}

TEST_F(AsyncSaveTest, AFailedSavesErrorSurfacesUnderExtraBuffer) {
  Gate gate;
  hold_state_writes_fail_first(gate);
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{.when_busy = WhenBusy::kExtraBuffer});
  (void)saver.save(state(), manager);  // fails; no one looks at its handle
  SaveHandle second = saver.save(state(), manager);
  gate.open();
  second.wait();  // the later save commits although the earlier failed
  try {
    saver.wait_all();
    FAIL() << "the failed save's error was lost";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected write failure"), std::string::npos);
  }
  EXPECT_NO_THROW(saver.wait_all());
  auto history = manager.history();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].index, 1u);
}

TEST_F(AsyncSaveTest, AFailedSavesErrorSurfacesUnderSkip) {
  Gate gate;
  hold_state_writes_fail_first(gate);
  CheckpointManager manager("memory://async/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{.when_busy = WhenBusy::kSkip});
  (void)saver.save(state(), manager);  // fails; no one looks at its handle
  SaveHandle skipped = saver.save(state(), manager);
  EXPECT_TRUE(skipped.skipped());
  gate.open();
  EXPECT_EQ(skipped.error(), nullptr);
  try {
    saver.wait_all();
    FAIL() << "the failed save's error was lost";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected write failure"), std::string::npos);
  }
  SaveHandle ok = saver.save(state(), manager);
  EXPECT_FALSE(ok.skipped());
  ok.wait();
  ASSERT_TRUE(ok.record());
  EXPECT_EQ(ok.record()->index, 1u);
  EXPECT_EQ(manager.history().size(), 1u);
}

}  // namespace
}  // namespace cairn::testing
