// Async sharded saves: AsyncSaver::save_sharded (ranks as threads of one
// process) and AsyncSaver::save_rank_shards (the rank side, reported to a
// committer) keep the async contract: the snapshot is taken in the call,
// the files are those of the synchronous save, staging is reused, saves
// commit in call order under every when_busy policy, specs are checked in
// the call, and a failed save commits nothing and is never lost.
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
#include "cairn/sharded.h"
#include "cairn/state.h"
#include "storage/backends.h"
#include "support/gate.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

// Global tensors: "rows" F32[10, 6] split by rows, "cols" I32[5, 8] split
// by columns, and "bias" F32[6] replicated on every rank. Element i of a
// save's tensors is a function of i and the save's `tag`.
const Shape kRows{10, 6}, kCols{5, 8};

float row_value(size_t i, int tag) { return static_cast<float>(i) * 1.25f - 7.0f + 100.0f * tag; }
int32_t col_value(size_t i, int tag) {
  return static_cast<int32_t>(i * 7919 % 1000) - 500 + 10000 * tag;
}
float bias_value(size_t i, int tag) { return static_cast<float>(i) + 0.5f + 100.0f * tag; }

// The elements of `box` of a row-major global tensor of `shape` whose flat
// element i is value(i), in row-major order (a naive reference).
template <class T, class F>
std::vector<T> box_values(const Shape& shape, const Box& box, F value) {
  std::vector<T> out;
  const uint64_t n = num_elements(box.shape);
  std::vector<uint64_t> idx(shape.size());
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t rem = k, flat = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      idx[d] = rem % box.shape[d];
      rem /= box.shape[d];
    }
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + box.offsets[d] + idx[d];
    out.push_back(value(static_cast<size_t>(flat)));
  }
  return out;
}

// One rank's shards, owning their bytes; the state views them.
struct Rank {
  int rank = 0;
  Box rows_box, cols_box;
  std::vector<float> rows, bias;
  std::vector<int32_t> cols;
  StateDict state;
  std::map<std::string, ShardSpec> specs;

  Rank(int r, int world) : rank(r) {
    rows_box = even_split(kRows, 0, r, world);
    cols_box = even_split(kCols, 1, r, world);
    rows.resize(num_elements(rows_box.shape));
    cols.resize(num_elements(cols_box.shape));
    bias.resize(6);
    state.add_mutable<float>("rows", rows_box.shape, rows);
    state.add_mutable<int32_t>("cols", cols_box.shape, cols);
    state.add_mutable<float>("bias", {6}, bias);
    specs["rows"] = {kRows, rows_box.offsets};
    specs["cols"] = {kCols, cols_box.offsets};
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  // Fills the buffers in place (the state keeps viewing them).
  void fill(int tag) {
    auto r = box_values<float>(kRows, rows_box, [&](size_t i) { return row_value(i, tag); });
    auto c = box_values<int32_t>(kCols, cols_box, [&](size_t i) { return col_value(i, tag); });
    std::copy(r.begin(), r.end(), rows.begin());
    std::copy(c.begin(), c.end(), cols.begin());
    for (size_t i = 0; i < 6; ++i) bias[i] = bias_value(i, tag);
  }
  void scribble() {
    std::fill(rows.begin(), rows.end(), -1.0f);
    std::fill(cols.begin(), cols.end(), -1);
    std::fill(bias.begin(), bias.end(), -1.0f);
  }
  ShardedPart part() const { return {rank, state, specs}; }
};

// `world` ranks holding the tensors of `tag`.
std::vector<std::unique_ptr<Rank>> make_world(int world, int tag = 0) {
  std::vector<std::unique_ptr<Rank>> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(std::make_unique<Rank>(r, world));
    out.back()->fill(tag);
  }
  return out;
}

std::vector<ShardedPart> parts_of(const std::vector<std::unique_ptr<Rank>>& world) {
  std::vector<ShardedPart> parts;
  for (const auto& r : world) parts.push_back(r->part());
  return parts;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Loads `cp` into `world` ranks and checks every box bit for bit against
// the tensors of `tag`.
void expect_holds(const Checkpoint& cp, int world, int tag) {
  ShardedReader reader(cp);
  for (int r = 0; r < world; ++r) {
    Rank t(r, world);
    t.scribble();
    LoadReport rep = reader.load(t.state, t.specs);
    EXPECT_EQ(rep.loaded.size(), 3u);
    auto rows = box_values<float>(kRows, t.rows_box, [&](size_t i) { return row_value(i, tag); });
    auto cols = box_values<int32_t>(kCols, t.cols_box, [&](size_t i) { return col_value(i, tag); });
    std::vector<float> bias(6);
    for (size_t i = 0; i < 6; ++i) bias[i] = bias_value(i, tag);
    EXPECT_TRUE(bitwise_equal(t.rows, rows)) << cp.uri() << " rows, rank " << r << " of " << world;
    EXPECT_TRUE(bitwise_equal(t.cols, cols)) << cp.uri() << " cols, rank " << r << " of " << world;
    EXPECT_TRUE(bitwise_equal(t.bias, bias)) << cp.uri() << " bias, rank " << r << " of " << world;
  }
}

std::vector<std::byte> file_bytes(const Checkpoint& cp, const std::string& key) {
  auto f = MappedState::open(cp.storage(), key);
  return {f.file_bytes().begin(), f.file_bytes().end()};
}

bool is_rank_file(std::string_view key) { return key.ends_with(".safetensors"); }

class AsyncShardedTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_memory_bucket("ashard"); }
  void TearDown() override {
    set_memory_faults("ashard", {});
    clear_memory_bucket("ashard");
  }
  static ManagerOptions quiet() {
    ManagerOptions o;
    o.warn = [](const std::string&) {};
    return o;
  }
  // Every write of a rank file waits at `gate`; commits of manifests are
  // logged in `manifests` (keys, in order).
  void hold_rank_writes(Gate& gate) {
    MemoryFaults f;
    f.before = [this, &gate](std::string_view op, std::string_view key) {
      if (op == "write" && is_rank_file(key)) gate.wait();
      if (op == "commit" && key.ends_with("manifest.json")) {
        std::lock_guard<std::mutex> g(log_mu);
        manifests.emplace_back(key);
      }
    };
    set_memory_faults("ashard", f);
  }
  // Writes of `key_suffix` fail with "injected write failure" and `code`,
  // `times` times.
  void fail_writes_of(std::string key_suffix, int times = 1, ErrorCode code = ErrorCode::kIO) {
    failures = times;
    MemoryFaults f;
    f.before = [this, key_suffix, code](std::string_view op, std::string_view key) {
      if (op == "write" && key.ends_with(key_suffix) && failures.fetch_sub(1) > 0) {
        throw Error(code, "injected write failure");
      }
    };
    set_memory_faults("ashard", f);
  }
  TempDir dir;
  std::atomic<int> failures{0};
  std::mutex log_mu;
  std::vector<std::string> manifests;
};

// ---- round trips ----

TEST_F(AsyncShardedTest, ThreadRanksSaveLikeTheSynchronousSaveAndReloadIntoOtherWorldSizes) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto ranks = make_world(world, /*tag=*/world);
    // The synchronous save: every rank a thread, then one commit.
    CheckpointManager sync_m((dir / ("sync" + std::to_string(world))).string(), {}, quiet());
    Checkpoint reserved = sync_m.reserve_next();
    std::vector<RankShards> reports(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        const Rank& rk = *ranks[static_cast<size_t>(r)];
        reports[static_cast<size_t>(r)] = save_rank_shards(rk.state, rk.specs, reserved, r);
      });
    }
    for (auto& t : threads) t.join();
    CheckpointRecord sync_rec = commit_sharded(sync_m, reserved, reports, {{"step", 7}});

    CheckpointManager async_m((dir / ("async" + std::to_string(world))).string(), {}, quiet());
    AsyncSaver saver;
    SaveHandle h = saver.save_sharded(parts_of(ranks), async_m, {{"step", 7}});
    h.wait();
    ASSERT_TRUE(h.record());
    ASSERT_TRUE(h.manifest());
    EXPECT_FALSE(h.rank_shards()) << "a committed sharded save has no single rank's report";
    const Checkpoint cp = h.record()->checkpoint;
    EXPECT_TRUE(cp.is_committed());
    EXPECT_TRUE(cp.verify().empty());
    EXPECT_EQ(h.manifest()->metrics["step"], 7);
    EXPECT_EQ(h.manifest()->layout, sync_rec.checkpoint.manifest().layout);
    EXPECT_EQ(h.manifest()->files.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const std::string file = rank_file_name(r);
      EXPECT_EQ(file_bytes(cp, file), file_bytes(sync_rec.checkpoint, file)) << file;
    }
    for (int load_world : {1, 2, 3, 4}) expect_holds(cp, load_world, world);
    saver.close();
  }
}

// Direct writes take each rank's image straight from the shared staging
// buffer (images at aligned offsets, the last window reading on into the
// next image): the files must still be exactly the synchronous ones.
TEST_F(AsyncShardedTest, DirectWritesOfSeveralRankImagesFromOneBufferMatchTheSynchronousFiles) {
  const int world = 3;
  auto ranks = make_world(world, /*tag=*/5);
  auto sync_cp = Checkpoint::from_directory((dir / "sync").string());
  std::vector<RankShards> reports;
  for (const auto& r : ranks)
    reports.push_back(save_rank_shards(r->state, r->specs, sync_cp, r->rank));
  commit_sharded(sync_cp, reports);
  IoReport report;
  AsyncSaver saver(AsyncSaveOptions{.write = {.io = IoPath::kDirect, .report = &report}});
  auto cp = Checkpoint::from_directory((dir / "async").string());
  SaveHandle h = saver.save_sharded(parts_of(ranks), cp);
  for (auto& r : ranks) r->scribble();
  h.wait();
  EXPECT_EQ(report.path, IoPath::kDirect) << report.reason;
  EXPECT_TRUE(cp.verify().empty());
  for (int r = 0; r < world; ++r) {
    const std::string file = rank_file_name(r);
    EXPECT_EQ(file_bytes(cp, file), file_bytes(sync_cp, file)) << file;
  }
  expect_holds(cp, 2, /*tag=*/5);
}

TEST_F(AsyncShardedTest, RankSavesReportThroughJsonAndTheCommitterCommitsOnce) {
  const int world = 3;
  auto ranks = make_world(world, /*tag=*/1);
  CheckpointManager m(dir.str(), {}, quiet());
  Checkpoint reserved = m.reserve_next();
  // Each rank has its own saver, as each process of a job would.
  std::vector<std::string> sent(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Rank& rk = *ranks[static_cast<size_t>(r)];
      AsyncSaver saver;
      SaveHandle h = saver.save_rank_shards(rk.state, rk.specs, reserved, r);
      rk.scribble();  // the next training step
      h.wait();
      ASSERT_TRUE(h.rank_shards());
      EXPECT_FALSE(h.manifest());
      EXPECT_FALSE(h.record());
      EXPECT_EQ(h.checkpoint().uri(), reserved.uri());
      sent[static_cast<size_t>(r)] = h.rank_shards()->to_json().dump();
      saver.close();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(reserved.is_committed()) << "a rank save committed";
  std::vector<RankShards> reports;
  for (const auto& j : sent) reports.push_back(RankShards::from_json(nlohmann::json::parse(j)));
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[2].rank, 2);
  ASSERT_EQ(reports[2].files.size(), 1u);
  EXPECT_EQ(reports[2].files[0].path, rank_file_name(2));
  CheckpointRecord rec = commit_sharded(m, reserved, reports, {{"step", 1}});
  EXPECT_TRUE(rec.checkpoint.verify().empty());
  expect_holds(rec.checkpoint, 2, /*tag=*/1);

  // The same bytes as the synchronous rank save.
  Rank again(1, world);
  again.fill(1);
  auto other = Checkpoint::from_directory((dir / "sync").string());
  save_rank_shards(again.state, again.specs, other, 1);
  EXPECT_EQ(file_bytes(rec.checkpoint, rank_file_name(1)), file_bytes(other, rank_file_name(1)));
}

// ---- snapshot and staging ----

TEST_F(AsyncShardedTest, TheCallerMayChangeItsTensorsOnceSaveReturns) {
  Gate gate;
  hold_rank_writes(gate);
  auto ranks = make_world(2, /*tag=*/3);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver;
  SaveHandle h = saver.save_sharded(parts_of(ranks), m);
  EXPECT_FALSE(h.done());  // held at the gate
  for (auto& r : ranks) r->scribble();
  gate.open();
  h.wait();
  ASSERT_TRUE(h.record());
  expect_holds(h.record()->checkpoint, 3, /*tag=*/3);
}

TEST_F(AsyncShardedTest, LaterSavesOfTheSameSizeAllocateNoStaging) {
  auto ranks = make_world(3);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver;
  for (int i = 0; i < 4; ++i) {
    for (auto& r : ranks) r->fill(i);
    saver.save_sharded(parts_of(ranks), m, {{"i", i}}).wait();
  }
  auto st = saver.stats();
  EXPECT_EQ(st.saves, 4u);
  EXPECT_EQ(st.staging_allocations, 1u);
  auto history = m.history();
  ASSERT_EQ(history.size(), 4u);
  for (int i = 0; i < 4; ++i) expect_holds(history[static_cast<size_t>(i)].checkpoint, 2, i);
}

TEST_F(AsyncShardedTest, ReserveForTheRanksAllocatesAheadOfTheFirstSave) {
  auto ranks = make_world(3);
  AsyncSaver saver;
  saver.reserve(parts_of(ranks));
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  saver.save_sharded(parts_of(ranks), m).wait();
  saver.save_sharded(parts_of(ranks), m).wait();
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  EXPECT_EQ(saver.stats().saves, 2u);
}

// ---- order and policies ----

TEST_F(AsyncShardedTest, ExtraBufferSavesCommitInCallOrderWithTheirOwnValues) {
  Gate gate;
  hold_rank_writes(gate);
  auto ranks = make_world(2);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{
      .max_in_flight = 1, .when_busy = WhenBusy::kExtraBuffer, .max_staging_buffers = 3});
  std::vector<SaveHandle> h;
  for (int i = 0; i < 3; ++i) {
    for (auto& r : ranks) r->fill(i);
    h.push_back(saver.save_sharded(parts_of(ranks), m, {{"i", i}}));
  }
  EXPECT_FALSE(h[0].done());
  EXPECT_EQ(saver.stats().waits, 0u);
  EXPECT_EQ(saver.stats().extra_buffer_saves, 2u);
  gate.open();
  saver.wait_all();
  auto history = m.history();
  ASSERT_EQ(history.size(), 3u);
  ASSERT_EQ(manifests.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(h[i].record());
    EXPECT_EQ(h[i].record()->index, i);
    EXPECT_NE(manifests[i].find(checkpoint_name(i)), std::string::npos)
        << "commit " << i << " was " << manifests[i];
    expect_holds(history[i].checkpoint, 2, static_cast<int>(i));
  }
}

TEST_F(AsyncShardedTest, WaitBlocksWhileMaxInFlightSavesArePending) {
  Gate gate;
  hold_rank_writes(gate);
  auto ranks = make_world(2);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{.max_in_flight = 2});
  SaveHandle a = saver.save_sharded(parts_of(ranks), m);
  SaveHandle b = saver.save_sharded(parts_of(ranks), m);
  EXPECT_EQ(saver.stats().waits, 0u);
  std::atomic<bool> returned{false};
  bool first_committed_on_return = false;
  SaveHandle c;
  std::thread t([&] {
    c = saver.save_sharded(parts_of(ranks), m);
    first_committed_on_return =
        Checkpoint::from_directory("memory://ashard/exp/" + checkpoint_name(0)).is_committed();
    returned = true;
  });
  spin_until([&] { return saver.stats().waits == 1; });
  EXPECT_FALSE(returned);
  EXPECT_FALSE(a.done());
  gate.open();
  t.join();
  EXPECT_TRUE(first_committed_on_return) << "save_sharded returned before a slot was free";
  saver.wait_all();
  ASSERT_TRUE(a.record() && b.record() && c.record());
  EXPECT_EQ(a.record()->index, 0u);
  EXPECT_EQ(b.record()->index, 1u);
  EXPECT_EQ(c.record()->index, 2u);
  EXPECT_EQ(saver.stats().saves, 3u);
  EXPECT_EQ(saver.stats().staging_allocations, 2u);
}

TEST_F(AsyncShardedTest, SkipTakesNothingAndReservesNoIndexWhileBusy) {
  Gate gate;
  hold_rank_writes(gate);
  auto ranks = make_world(2);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver(AsyncSaveOptions{.when_busy = WhenBusy::kSkip});
  SaveHandle first = saver.save_sharded(parts_of(ranks), m);
  SaveHandle skipped = saver.save_sharded(parts_of(ranks), m);
  SaveHandle skipped_rank = saver.save_rank_shards(
      ranks[0]->state, ranks[0]->specs, Checkpoint::from_directory("memory://ashard/rank"), 0);
  EXPECT_TRUE(skipped.skipped());
  EXPECT_TRUE(skipped.done());
  EXPECT_EQ(skipped.error(), nullptr);
  EXPECT_FALSE(skipped.record());
  EXPECT_TRUE(skipped_rank.skipped());
  EXPECT_FALSE(skipped_rank.rank_shards());
  EXPECT_FALSE(first.skipped());
  EXPECT_EQ(saver.stats().skipped, 2u);
  gate.open();
  first.wait();
  SaveHandle next = saver.save_sharded(parts_of(ranks), m);
  EXPECT_FALSE(next.skipped());
  next.wait();
  ASSERT_TRUE(next.record());
  EXPECT_EQ(next.record()->index, 1u) << "the skipped save reserved an index";
  EXPECT_EQ(m.history().size(), 2u);
  EXPECT_FALSE(
      Checkpoint::from_directory("memory://ashard/rank").storage().stat(rank_file_name(0)));
}

// ---- errors ----

TEST_F(AsyncShardedTest, AFailedRankWriteSurfacesAtWaitCommitsNothingAndKeepsEarlierCheckpoints) {
  auto ranks = make_world(3);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver;
  saver.save_sharded(parts_of(ranks), m).wait();
  fail_writes_of(rank_file_name(1));
  for (auto& r : ranks) r->fill(9);
  SaveHandle h = saver.save_sharded(parts_of(ranks), m);
  const Checkpoint reserved = h.checkpoint();
  try {
    h.wait();
    FAIL() << "a failed rank write was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected write failure"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(reserved.uri()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(h.record());
  EXPECT_FALSE(reserved.is_committed());
  EXPECT_TRUE(reserved.storage().list("").empty()) << "the failed save's files were left behind";
  EXPECT_NO_THROW(saver.wait_all()) << "an error seen at wait() was thrown again";
  auto history = m.history();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_TRUE(history[0].checkpoint.verify().empty());
  expect_holds(history[0].checkpoint, 2, /*tag=*/0);
  // The next save goes through.
  SaveHandle ok = saver.save_sharded(parts_of(ranks), m);
  ok.wait();
  expect_holds(ok.record()->checkpoint, 3, /*tag=*/9);
}

TEST_F(AsyncShardedTest, AnUnseenFailureSurfacesOnTheNextSaveOnceAndOnClose) {
  auto ranks = make_world(2);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver;
  fail_writes_of(".safetensors", 1, ErrorCode::kNoSpace);  // a full disk
  (void)saver.save_sharded(parts_of(ranks), m);            // no one looks at its handle
  try {
    (void)saver.save_sharded(parts_of(ranks), m);
    FAIL() << "the earlier save's error was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace) << e.what();
  }
  EXPECT_EQ(saver.stats().saves, 1u) << "the save that threw took a snapshot";
  set_memory_faults("ashard", {});
  saver.save_sharded(parts_of(ranks), m).wait();
  auto history = m.history();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].index, 1u) << "the failed save's checkpoint is visible";

  // A rank save's failure, unseen, surfaces on close().
  fail_writes_of(".safetensors", 1, ErrorCode::kNoSpace);
  (void)saver.save_rank_shards(ranks[0]->state, ranks[0]->specs,
                               Checkpoint::from_directory("memory://ashard/rank"), 0);
  EXPECT_THROW(saver.close(), Error);
}

TEST_F(AsyncShardedTest, AFailedRankSaveHasNoReportAndLeavesTheLocationToItsCommitter) {
  auto ranks = make_world(2);
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  Checkpoint reserved = m.reserve_next();
  AsyncSaver saver;
  SaveHandle ok = saver.save_rank_shards(ranks[0]->state, ranks[0]->specs, reserved, 0);
  ok.wait();
  fail_writes_of(rank_file_name(1));
  SaveHandle bad = saver.save_rank_shards(ranks[1]->state, ranks[1]->specs, reserved, 1);
  try {
    bad.wait();
    FAIL() << "a failed rank write was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(bad.rank_shards());
  // Rank 0's file stays: the committer decides what to do with the location.
  EXPECT_TRUE(reserved.storage().stat(rank_file_name(0)));
  EXPECT_FALSE(reserved.is_committed());
  // Without rank 1's report the committer cannot commit.
  EXPECT_THROW(commit_sharded(m, reserved, {*ok.rank_shards()}), Error);
  EXPECT_FALSE(reserved.is_committed());
}

// A bad spec is refused in the call itself, naming the tensor: nothing is
// snapshotted, no staging allocated, no index reserved.
TEST_F(AsyncShardedTest, BadSpecsFailInTheCallNamingTheTensor) {
  CheckpointManager m("memory://ashard/exp", {}, quiet());
  AsyncSaver saver;
  auto expect_refused = [&](std::vector<ShardedPart> parts, std::string_view tensor,
                            std::string_view why) {
    SCOPED_TRACE(why);
    try {
      (void)saver.save_sharded(parts, m);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(tensor), std::string::npos) << e.what();
    }
  };
  auto ranks = make_world(3);
  {
    auto parts = parts_of(ranks);
    parts[1].specs["nope"] = {kRows, {0, 0}};
    expect_refused(parts, "\"nope\"", "a spec naming no tensor");
  }
  {
    auto parts = parts_of(ranks);
    parts[2].specs["rows"].offsets = {9, 0};  // rows 9..10 of 10
    expect_refused(parts, "\"rows\"", "a shard leaving its global shape");
  }
  {
    auto parts = parts_of(ranks);
    parts.pop_back();  // rank 2 holds part of "rows" and "cols"
    expect_refused(parts, "\"cols\"", "a gap: a rank left out");
  }
  {
    auto parts = parts_of(ranks);
    parts[1].specs["rows"].offsets = parts[0].specs["rows"].offsets;
    expect_refused(parts, "\"rows\"", "overlapping shards");
  }
  {
    auto parts = parts_of(ranks);
    parts[1].specs["cols"].global_shape = {5, 9};
    expect_refused(parts, "\"cols\"", "two global shapes");
  }
  {
    auto parts = parts_of(ranks);
    parts[2].rank = 1;
    expect_refused(parts, "rank 1", "a rank twice");
  }
  expect_refused({}, "rank", "no parts");
  try {
    auto bad = ranks[0]->specs;
    bad["cols"].offsets = {0, 7};
    (void)saver.save_rank_shards(ranks[0]->state, bad,
                                 Checkpoint::from_directory("memory://ashard/rank"), 0);
    FAIL() << "a rank save accepted a shard leaving its global shape";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("\"cols\""), std::string::npos) << e.what();
  }
  auto st = saver.stats();
  EXPECT_EQ(st.saves, 0u);
  EXPECT_EQ(st.staging_allocations, 0u);
  EXPECT_EQ(st.last_stall_seconds, 0.0);
  SaveHandle h = saver.save_sharded(parts_of(ranks), m);
  h.wait();
  EXPECT_EQ(h.record()->index, 0u) << "a refused save reserved an index";
}

TEST_F(AsyncShardedTest, RefusesACommittedDestinationBeforeSnapshotting) {
  auto ranks = make_world(2);
  AsyncSaver saver;
  auto cp = Checkpoint::from_directory("memory://ashard/cp");
  saver.save_sharded(parts_of(ranks), cp, {{"step", 1}}).wait();
  EXPECT_TRUE(cp.is_committed());
  expect_holds(cp, 3, /*tag=*/0);
  for (int i = 0; i < 2; ++i) {
    try {
      if (i == 0) {
        (void)saver.save_sharded(parts_of(ranks), cp);
      } else {
        (void)saver.save_rank_shards(ranks[0]->state, ranks[0]->specs, cp, 0);
      }
      FAIL() << "saved into a committed checkpoint";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists);
    }
  }
  EXPECT_EQ(saver.stats().saves, 1u);
}

}  // namespace
}  // namespace cairn::testing
