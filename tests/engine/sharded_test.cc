// Sharded saves: ranks write their own shards, the manifest records the
// global layout, and loads re-shard to a different number of ranks (checked
// bit for bit against the global tensors).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/sharded.h"
#include "storage/backends.h"
#include "support/errors.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

// Global tensors: "rows" F32[10, 6] split by rows, "cols" I32[5, 8] split by
// columns, "cube" F64[3, 4, 5] split along the middle dimension, and "bias"
// F32[6] replicated on every rank.
struct Globals {
  std::vector<float> rows = std::vector<float>(60);
  std::vector<int32_t> cols = std::vector<int32_t>(40);
  std::vector<double> cube = std::vector<double>(60);
  std::vector<float> bias = std::vector<float>(6);
  Globals() {
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) * 1.25f - 7.0f;
    for (size_t i = 0; i < cols.size(); ++i) cols[i] = static_cast<int32_t>(i * 7919 % 1000) - 500;
    for (size_t i = 0; i < cube.size(); ++i) cube[i] = static_cast<double>(i) / 7.0;
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i) + 0.5f;
  }
};

const Shape kRows{10, 6}, kCols{5, 8}, kCube{3, 4, 5};

// The box of a row-major global tensor, copied element by element (a naive
// reference independent of copy_box).
template <class T>
std::vector<T> slice(const std::vector<T>& global, const Shape& shape, const Box& box) {
  std::vector<T> out;
  const size_t rank = shape.size();
  std::vector<uint64_t> idx(rank, 0);
  const uint64_t n = num_elements(box.shape);
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t rem = k, flat = 0;
    for (size_t d = rank; d-- > 0;) {
      idx[d] = rem % box.shape[d];
      rem /= box.shape[d];
    }
    for (size_t d = 0; d < rank; ++d) flat = flat * shape[d] + box.offsets[d] + idx[d];
    out.push_back(global[flat]);
  }
  return out;
}

// One rank's shards, owning their bytes.
struct RankState {
  std::vector<float> rows;
  std::vector<int32_t> cols;
  std::vector<double> cube;
  std::vector<float> bias;
  Box rows_box, cols_box, cube_box;
  StateDict state;
  std::map<std::string, ShardSpec> specs;
};

// A rank's boxes of the global tensors under an even split.
RankState with_boxes(int rank, int world) {
  RankState r;
  r.rows_box = even_split(kRows, 0, rank, world);
  r.cols_box = even_split(kCols, 1, rank, world);
  r.cube_box = even_split(kCube, 1, rank, world);
  return r;
}

// Adds the rank's buffers to its state and its boxes to its specs, once the
// buffers are filled (the state holds spans into them).
void register_tensors(RankState& r) {
  r.state.add_mutable<float>("rows", r.rows_box.shape, r.rows);
  r.state.add_mutable<int32_t>("cols", r.cols_box.shape, r.cols);
  r.state.add_mutable<double>("cube", r.cube_box.shape, r.cube);
  r.state.add_mutable<float>("bias", {6}, r.bias);
  r.specs["rows"] = {kRows, r.rows_box.offsets};
  r.specs["cols"] = {kCols, r.cols_box.offsets};
  r.specs["cube"] = {kCube, r.cube_box.offsets};
}

RankState make_rank(const Globals& g, int rank, int world) {
  RankState r = with_boxes(rank, world);
  r.rows = slice(g.rows, kRows, r.rows_box);
  r.cols = slice(g.cols, kCols, r.cols_box);
  r.cube = slice(g.cube, kCube, r.cube_box);
  r.bias = g.bias;
  register_tensors(r);
  return r;
}

// A rank's empty buffers for loading its boxes.
RankState make_target(int rank, int world) {
  RankState r = with_boxes(rank, world);
  r.rows.assign(num_elements(r.rows_box.shape), -1);
  r.cols.assign(num_elements(r.cols_box.shape), -1);
  r.cube.assign(num_elements(r.cube_box.shape), -1);
  r.bias.assign(6, -1);
  register_tensors(r);
  return r;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class ShardedTest : public ::testing::Test {
 protected:
  TempDir dir;
  Globals g;
  ManagerOptions quiet() {
    ManagerOptions o;
    o.warn = [](const std::string&) {};
    return o;
  }
  // Saves with `world` thread ranks into the manager's next checkpoint.
  CheckpointRecord save_with_threads(CheckpointManager& m, int world) {
    Checkpoint reserved = m.reserve_next();
    std::vector<RankShards> reports(static_cast<size_t>(world));
    std::vector<std::thread> ranks;
    std::vector<RankState> states;
    for (int r = 0; r < world; ++r) states.push_back(make_rank(g, r, world));
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        auto& s = states[static_cast<size_t>(r)];
        reports[static_cast<size_t>(r)] = save_rank_shards(s.state, s.specs, reserved, r);
      });
    }
    for (auto& t : ranks) t.join();
    return commit_sharded(m, reserved, reports, {{"step", 1}});
  }
  // Saves `all`, a float tensor "w" of `global`, split by rows between two
  // ranks, into the manager's next checkpoint.
  CheckpointRecord save_rows_by_two_ranks(CheckpointManager& m, const Shape& global,
                                          const std::vector<float>& all) {
    Checkpoint reserved = m.reserve_next();
    std::vector<RankShards> reports;
    for (int r = 0; r < 2; ++r) {
      Box box = even_split(global, 0, r, 2);
      std::vector<float> mine = slice(all, global, box);
      StateDict s;
      s.add<float>("w", box.shape, mine);
      reports.push_back(save_rank_shards(s, {{"w", {global, box.offsets}}}, reserved, r));
    }
    return commit_sharded(m, reserved, reports, {{"step", 1}});
  }
  void expect_loads_into(const Checkpoint& cp, int world) {
    ShardedReader reader(cp);
    for (int r = 0; r < world; ++r) {
      RankState t = make_target(r, world);
      LoadReport rep = reader.load(t.state, t.specs);
      EXPECT_EQ(rep.loaded.size(), 4u);
      EXPECT_TRUE(bitwise_equal(t.rows, slice(g.rows, kRows, t.rows_box))) << "rows, rank " << r;
      EXPECT_TRUE(bitwise_equal(t.cols, slice(g.cols, kCols, t.cols_box))) << "cols, rank " << r;
      EXPECT_TRUE(bitwise_equal(t.cube, slice(g.cube, kCube, t.cube_box))) << "cube, rank " << r;
      EXPECT_TRUE(bitwise_equal(t.bias, g.bias)) << "bias, rank " << r;
    }
  }
};

TEST(EvenSplit, CoversTheDimensionWithTheRemainderOnTheFirstRanks) {
  Shape s{10, 4};
  EXPECT_EQ(even_split(s, 0, 0, 3), (Box{{0, 0}, {4, 4}}));
  EXPECT_EQ(even_split(s, 0, 1, 3), (Box{{4, 0}, {3, 4}}));
  EXPECT_EQ(even_split(s, 0, 2, 3), (Box{{7, 0}, {3, 4}}));
  EXPECT_EQ(even_split(s, 1, 3, 4), (Box{{0, 3}, {10, 1}}));
  EXPECT_THROW(even_split(s, 2, 0, 1), Error);
  EXPECT_THROW(even_split(s, 0, 3, 3), Error);
}

TEST(PlanRead, TakesEachOverlapOnceAndSkipsReplicas) {
  std::vector<Box> saved{{{0, 0}, {5, 4}}, {{5, 0}, {5, 4}}, {{0, 0}, {5, 4}}};
  auto plan = plan_read(saved, Box{{3, 1}, {4, 2}});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].shard, 0u);
  EXPECT_EQ(plan[0].src, (Box{{3, 1}, {2, 2}}));
  EXPECT_EQ(plan[0].dst, (Box{{0, 0}, {2, 2}}));
  EXPECT_EQ(plan[1].shard, 1u);
  EXPECT_EQ(plan[1].src, (Box{{0, 1}, {2, 2}}));
  EXPECT_EQ(plan[1].dst, (Box{{2, 0}, {2, 2}}));
}

TEST(PlanRead, RefusesABoxTheShardsDoNotCover) {
  std::vector<Box> saved{{{0, 0}, {5, 4}}};
  EXPECT_THROW(plan_read(saved, Box{{3, 0}, {4, 4}}), Error);
}

TEST(CopyBox, CopiesColumnSlicesElementByElement) {
  std::vector<int32_t> src(5 * 8);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i);
  std::vector<int32_t> dst(3 * 4, -1);
  copy_box(std::as_bytes(std::span<const int32_t>(src)), {5, 8}, Box{{1, 2}, {3, 3}},
           std::as_writable_bytes(std::span<int32_t>(dst)), {3, 4}, Box{{0, 1}, {3, 3}}, 4);
  std::vector<int32_t> want{-1, 10, 11, 12, -1, 18, 19, 20, -1, 26, 27, 28};
  EXPECT_EQ(dst, want);
}

TEST(BuildLayout, RefusesGapsAndOverlapsNamingTheTensorAndRanks) {
  auto report = [](int rank, Box box) {
    RankShards r;
    r.rank = rank;
    r.files.push_back({rank_file_name(rank), 1, 0});
    r.shards.push_back({"w", DType::kF32, {4, 4}, std::move(box), rank_file_name(rank)});
    return r;
  };
  try {
    build_layout({report(0, {{0, 0}, {2, 4}}), report(1, {{1, 0}, {3, 4}})});
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("tensor \"w\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  }
  try {
    build_layout({report(0, {{0, 0}, {2, 4}}), report(1, {{3, 0}, {1, 4}})});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cover 12 of its 16"), std::string::npos) << e.what();
  }
  RankShards bad = report(1, {{2, 0}, {2, 4}});
  bad.shards[0].global_shape = {8, 4};
  EXPECT_THROW(build_layout({report(0, {{0, 0}, {2, 4}}), bad}), Error);
  auto layout = build_layout({report(0, {{0, 0}, {2, 4}}), report(1, {{2, 0}, {2, 4}})});
  EXPECT_EQ(layout["format"], "cairn.sharded/1");
  EXPECT_EQ(layout["world_size"], 2);
  EXPECT_EQ(layout["tensors"]["w"]["shape"], nlohmann::json({4, 4}));
}

TEST(RankShardsJson, RoundTrips) {
  RankShards r;
  r.rank = 3;
  r.files.push_back({"rank_00003.safetensors", 123, 0xdeadbeefcafef00dULL});
  r.shards.push_back({"w", DType::kBF16, {4, 4}, Box{{0, 2}, {4, 2}}, "rank_00003.safetensors"});
  RankShards back = RankShards::from_json(nlohmann::json::parse(r.to_json().dump()));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.files[0].xxh3, r.files[0].xxh3);
  EXPECT_EQ(back.shards[0].box, r.shards[0].box);
  EXPECT_EQ(back.shards[0].dtype, DType::kBF16);
  EXPECT_THROW(RankShards::from_json({{"rank", 1}}), Error);
}

TEST_F(ShardedTest, SavedByFourRanksLoadsIntoTwoThreeOneAndFour) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 4);
  EXPECT_TRUE(rec.checkpoint.verify().empty());
  Manifest manifest = rec.checkpoint.manifest();
  EXPECT_EQ(manifest.files.size(), 4u);
  EXPECT_EQ(manifest.layout["world_size"], 4);
  EXPECT_EQ(manifest.layout["tensors"]["rows"]["shape"], nlohmann::json({10, 6}));
  EXPECT_EQ(manifest.layout["tensors"]["cols"]["shards"].size(), 4u);
  for (int world : {2, 3, 1, 4}) expect_loads_into(rec.checkpoint, world);
}

// The Trainer commits its ranks' files as they come, without a layout: the
// rank files' headers give it back, so the checkpoint still re-shards.
TEST_F(ShardedTest, ACheckpointCommittedWithoutALayoutReShardsFromItsRankFilesHeaders) {
  CheckpointManager m(dir.str(), {}, quiet());
  Checkpoint reserved = m.reserve_next();
  std::vector<ManifestEntry> files;
  for (int r = 0; r < 4; ++r) {
    RankState s = make_rank(g, r, 4);
    const RankShards report = save_rank_shards(s.state, s.specs, reserved, r);
    files.insert(files.end(), report.files.begin(), report.files.end());
  }
  // A safetensors file of the user's beside them is no rank file: left out.
  StateDict extra;
  std::vector<float> x(3, 2.0f);
  extra.add<float>("x", {3}, x);
  files.push_back(save(extra, reserved.storage(), "extra.safetensors"));
  CheckpointRecord rec = m.commit_reserved(reserved, {{"step", 1}}, files);
  EXPECT_TRUE(rec.checkpoint.manifest().layout.is_null());
  ShardedReader reader(rec.checkpoint);
  EXPECT_EQ(reader.world_size(), 4);
  for (int world : {3, 1, 2}) expect_loads_into(rec.checkpoint, world);
}

TEST_F(ShardedTest, ACheckpointWithoutALayoutOrRankFilesIsRefusedNamingIt) {
  CheckpointManager m(dir.str(), {}, quiet());
  Checkpoint reserved = m.reserve_next();
  StateDict plain;
  std::vector<float> w(4, 1.0f);
  plain.add<float>("w", {4}, w);
  std::vector<ManifestEntry> files{save(plain, reserved.storage(), "model.safetensors")};
  CheckpointRecord rec = m.commit_reserved(reserved, {{"step", 1}}, files);
  try {
    ShardedReader reader(rec.checkpoint);
    FAIL() << "expected kCorruption";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find(rec.checkpoint.uri()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no file is a rank file"), std::string::npos) << e.what();
  }
}

TEST_F(ShardedTest, SavedByThreeRanksLoadsIntoFour) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 3);
  expect_loads_into(rec.checkpoint, 4);
}

TEST_F(ShardedTest, OnS3SavedByFourRanksLoadsIntoThreeAndOne) {
  CheckpointManager m(S3Server::instance().fresh_uri("sharded"), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 4);
  EXPECT_EQ(rec.checkpoint.uri().rfind("s3://", 0), 0u);
  EXPECT_TRUE(rec.checkpoint.verify().empty());
  for (int world : {3, 1}) expect_loads_into(rec.checkpoint, world);
}

TEST_F(ShardedTest, ReadsAnyBoxAcrossASplitInTheOtherDirection) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 4);
  ShardedReader reader(rec.checkpoint);
  // Saved split by rows; read a column band spanning every rank's rows.
  Box band{{0, 2}, {10, 3}};
  std::vector<float> out(30);
  reader.read("rows", band, std::as_writable_bytes(std::span<float>(out)));
  EXPECT_TRUE(bitwise_equal(out, slice(g.rows, kRows, band)));
}

TEST_F(ShardedTest, EachRankFileIsPlainSafetensorsWithItsPlacement) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 4);
  auto f = MappedState::open(rec.checkpoint.storage(), "rank_00002.safetensors");
  EXPECT_EQ(f.tensor("rows").shape, (Shape{2, 6}));
  auto placement = nlohmann::json::parse(f.header().metadata.at("cairn.shards"));
  EXPECT_EQ(placement["rows"]["offsets"], nlohmann::json({6, 0}));
  EXPECT_EQ(placement["rows"]["global_shape"], nlohmann::json({10, 6}));
}

TEST_F(ShardedTest, ForkedProcessRanksReportThroughJsonAndCommitOnce) {
  CheckpointManager m(dir.str(), {}, quiet());
  Checkpoint reserved = m.reserve_next();
  const int world = 4;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        RankState s = make_rank(g, r, world);
        RankShards rep = save_rank_shards(s.state, s.specs, reserved, r);
        write_text(dir / ("report_" + std::to_string(r) + ".json"), rep.to_json().dump());
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<RankShards> reports;
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r;
    reports.push_back(RankShards::from_json(
        nlohmann::json::parse(read_text(dir / ("report_" + std::to_string(r) + ".json")))));
  }
  CheckpointRecord rec = commit_sharded(m, reserved, reports);
  EXPECT_TRUE(rec.checkpoint.verify().empty());
  expect_loads_into(rec.checkpoint, 3);
}

TEST_F(ShardedTest, ACheckpointWithAMissingRankIsNotCommitted) {
  CheckpointManager m(dir.str(), {}, quiet());
  Checkpoint reserved = m.reserve_next();
  std::vector<RankShards> reports;
  for (int r = 0; r < 3; ++r) {  // rank 3 of 4 never reports
    RankState s = make_rank(g, r, 4);
    reports.push_back(save_rank_shards(s.state, s.specs, reserved, r));
  }
  try {
    commit_sharded(m, reserved, reports);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("saved by no rank"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(reserved.is_committed());
  EXPECT_FALSE(m.latest());
}

TEST_F(ShardedTest, LoadListsMismatchesAndWritesNothing) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 2);
  ShardedReader reader(rec.checkpoint);
  RankState t = make_target(0, 2);
  t.specs["rows"].global_shape = {12, 6};
  std::vector<float> extra(2);
  t.state.add_mutable<float>("extra", {2}, extra);
  try {
    reader.load(t.state, t.specs);
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rows: saved F32[10, 6], state F32[12, 6]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing from the file: extra"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.cols, std::vector<int32_t>(t.cols.size(), -1));
}

TEST_F(ShardedTest, AShardFileChangedAfterCommitIsDetected) {
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_with_threads(m, 2);
  auto path = dir / rec.name / "rank_00001.safetensors";
  std::string bytes = read_text(path);
  bytes.back() ^= 1;
  write_text(path, bytes);
  ShardedReader reader(rec.checkpoint);
  RankState t = make_target(0, 1);
  try {
    reader.load(t.state, t.specs);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("rank_00001.safetensors"), std::string::npos) << e.what();
  }
}

// A re-shard that needs part of a rank file checks the checksum blocks it
// reads and nothing else: a changed byte in a part it does not read goes
// unnoticed by it, and is caught, naming the file, by the load that reads it.
TEST_F(ShardedTest, AReshardedLoadVerifiesTheBlocksItReadsAndOnlyThose) {
  const Shape global{2048, 1024};  // F32: 8 MiB; 4 MiB per saved rank
  std::vector<float> all(num_elements(global));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i % 65521) * 0.25f;
  CheckpointManager m(dir.str(), {}, quiet());
  CheckpointRecord rec = save_rows_by_two_ranks(m, global, all);
  for (const auto& f : rec.checkpoint.manifest().files) {
    if (f.path.rfind("rank_", 0) == 0) {
      EXPECT_EQ(f.block_size, kChecksumBlockSize) << f.path;
      EXPECT_EQ(f.block_xxh3.size(), (f.size + f.block_size - 1) / f.block_size) << f.path;
    }
  }
  // Change the last element of rank 1's file (the last rows of the tensor).
  auto path = dir / rec.name / "rank_00001.safetensors";
  std::string bytes = read_text(path);
  bytes[bytes.size() - 2] ^= 0x40;
  write_text(path, bytes);

  auto load = [&](int r) {
    ShardedReader reader(rec.checkpoint);
    Box box = even_split(global, 0, r, 4);
    std::vector<float> out(num_elements(box.shape), -1);
    StateDict t;
    t.add_mutable<float>("w", box.shape, out);
    reader.load(t, {{"w", {global, box.offsets}}});
    EXPECT_TRUE(bitwise_equal(out, slice(all, global, box))) << "new rank " << r;
  };
  load(0);
  load(1);
  load(2);  // the first half of rank 1's file
  std::string msg = error_message_of([&] { load(3); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("rank_00001.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum block"), std::string::npos) << msg;
}

// Stored elsewhere than on the local file system (memory:// here; S3 the
// same way), a re-sharded load fetches only the checksum blocks holding what
// it reads, with ranged reads, and still verifies each of them.
TEST_F(ShardedTest, AReshardedLoadFromStorageFetchesOnlyTheBlocksItReads) {
  clear_memory_bucket("sharded-partial");
  const Shape global{2048, 1024};  // F32: 8 MiB; 4 MiB per saved rank
  std::vector<float> all(num_elements(global));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i % 65521) * 0.5f;
  CheckpointManager m("memory://sharded-partial/exp", {}, quiet());
  CheckpointRecord rec = save_rows_by_two_ranks(m, global, all);
  // Change the last element of rank 1's file (the last rows of the tensor).
  Storage& storage = rec.checkpoint.storage();
  std::string bytes = storage.get("rank_00001.safetensors");
  bytes[bytes.size() - 2] ^= 0x40;
  storage.put("rank_00001.safetensors", bytes);

  const uint64_t quarter = uint64_t{8} << 20 >> 2;
  auto load = [&](int r) {
    ShardedReader reader(rec.checkpoint);
    Box box = even_split(global, 0, r, 4);
    std::vector<float> out(num_elements(box.shape), -1);
    StateDict t;
    t.add_mutable<float>("w", box.shape, out);
    const uint64_t before = memory_bytes_read("sharded-partial");
    reader.load(t, {{"w", {global, box.offsets}}});
    EXPECT_TRUE(bitwise_equal(out, slice(all, global, box))) << "new rank " << r;
    // A quarter of the tensor, plus at most the header's blocks and one
    // partial block at each end of the range.
    const uint64_t read = memory_bytes_read("sharded-partial") - before;
    EXPECT_GE(read, quarter) << "new rank " << r;
    EXPECT_LE(read, quarter + 4 * kChecksumBlockSize) << "new rank " << r;
  };
  load(0);
  load(1);
  load(2);  // the first half of rank 1's file: the changed block is not read
  std::string msg = error_message_of([&] { load(3); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("rank_00001.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum block"), std::string::npos) << msg;
  clear_memory_bucket("sharded-partial");
}

TEST_F(ShardedTest, ACheckpointWithoutALayoutIsRefused) {
  auto cp = Checkpoint::from_directory((dir / "plain").string());
  CheckpointWriter w(cp);
  w.write_file("x", "y");
  w.commit({}, 0);
  try {
    ShardedReader reader(cp);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("no sharded layout"), std::string::npos);
  }
}

}  // namespace
}  // namespace cairn::testing
