// Data-parallel training (cairn/torch_distributed.h) in real Trainer worker
// processes: ranks on different shards end bitwise identical and equal to
// single-process training on the whole batch, every rank reports the same
// checkpoint, a killed rank or a rank that stops taking part fails the group
// without a hang and the restart forms a new process group on a new port.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "cairn/torch_distributed.h"
#include "cairn/train.h"
#include "support/mpirun.h"
#include "support/temp_dir.h"
#include "torch/torch_support.h"
#include "train/train_support.h"

namespace cairn::libtorch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

constexpr int64_t kRows = 12;  // divides evenly by 2 and by 3 ranks
constexpr double kLr = 0.1;

// A model with a parameter that only some ranks use (fc_b), for the
// unused-parameter test; the others use fc_a alone.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl()
      : fc_a(register_module("fc_a", torch::nn::Linear(4, 1))),
        fc_b(register_module("fc_b", torch::nn::Linear(4, 1))) {}
  torch::nn::Linear fc_a;
  torch::nn::Linear fc_b;
};
TORCH_MODULE(TwoHeads);

// The same data on every rank and in the test process.
std::pair<torch::Tensor, torch::Tensor> dataset() {
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({kRows, 4});
  torch::Tensor y = x.matmul(torch::tensor({{1.0f}, {-2.0f}, {0.5f}, {3.0f}})) + 0.25;
  return {x, y};
}

torch::Tensor loss_of(TwoHeads& model, const torch::Tensor& x, const torch::Tensor& y, bool use_b) {
  torch::Tensor out = model->fc_a->forward(x);
  if (use_b) out = out + model->fc_b->forward(x);
  return torch::mse_loss(out, y);
}

std::string context_json(const TrainContext& c) {
  nlohmann::json j = testing::rendezvous_seen(c);
  j["attempt"] = c.attempt;
  return j.dump();
}

// How long a stalled rank sleeps: the runtime must stop it long before.
constexpr int kStallSeconds = 300;

// The DDP loop. Config: steps, out; optional: kill_rank/kill_step (that rank
// SIGKILLs itself before that step, first attempt only), stall_rank/
// stall_step (that rank skips the step's all-reduce and sleeps, first
// attempt only), b_ranks (ranks that use fc_b; default all), timeout_ms,
// bucket_bytes, plain_backward (loss.backward() instead of ddp.backward).
void ddp_loop(const nlohmann::json& config) {
  torch::set_num_threads(1);
  const TrainContext& ctx = train::get_context();
  const int rank = ctx.world_rank;
  const fs::path out = config.at("out").get<std::string>();
  write_file(out / fmt::format("ctx-{}-{}.json", rank, ctx.attempt), context_json(ctx));

  DistributedOptions options;
  options.timeout = std::chrono::milliseconds(config.value("timeout_ms", 20'000));
  ProcessGroup& group = process_group(options);

  torch::manual_seed(100 + rank);  // different on every rank: DDP must make them equal
  TwoHeads model;
  DataParallelOptions ddp_options;
  ddp_options.bucket_bytes = config.value("bucket_bytes", ddp_options.bucket_bytes);
  DistributedDataParallel ddp(*model, group, ddp_options);
  write_file(out / fmt::format("buckets-{}.txt", rank), std::to_string(ddp.buckets().size()));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));

  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    auto dir = ckpt->as_directory();
    start = load_file(dir.path() / "state.safetensors", *model, &opt).at("step").get<int>() + 1;
  }
  auto [x, y] = dataset();
  const torch::Tensor mine = shard_indices(kRows);
  const torch::Tensor xs = x.index_select(0, mine), ys = y.index_select(0, mine);
  bool use_b = true;
  if (config.contains("b_ranks")) {
    use_b = false;
    for (int r : config["b_ranks"]) use_b |= r == rank;
  }

  const int steps = config.at("steps").get<int>();
  for (int step = start; step < steps; ++step) {
    if (ctx.attempt == 0 && config.value("kill_rank", -1) == rank &&
        config.value("kill_step", -1) == step) {
      ::raise(SIGKILL);
    }
    opt.zero_grad();
    torch::Tensor loss = loss_of(model, xs, ys, use_b);
    if (ctx.attempt == 0 && config.value("stall_rank", -1) == rank &&
        config.value("stall_step", -1) == step) {
      // The others must not wait for this (kStallSeconds).
      std::this_thread::sleep_for(std::chrono::seconds(kStallSeconds));
    }
    try {
      if (config.value("plain_backward", false)) {
        loss.backward();  // the PyTorch habit: the hooks average
      } else {
        ddp.backward(loss);
      }
    } catch (const Error& e) {
      write_file(out / fmt::format("error-{}-{}.txt", rank, ctx.attempt),
                 fmt::format("{}\n{}", error_code_name(e.code()), e.what()));
      throw;
    }
    opt.step();
    // Every rank saves and reports the same state: identical bytes.
    train::TemporaryDirectory tmp;
    save_file(fs::path(tmp.path()) / "state.safetensors", *model, &opt, {{"step", step}});
    train::report({{"step", step}, {"loss", loss.item<double>()}},
                  Checkpoint::from_directory(tmp.path()));
  }
  save_file(out / fmt::format("final-{}.safetensors", rank), *model);
}

// What single-process training on the whole batch ends with (every rank
// using fc_b).
TwoHeads reference(int steps) {
  torch::manual_seed(100);  // rank 0's initial weights, which DDP broadcasts
  TwoHeads model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  auto [x, y] = dataset();
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    loss_of(model, x, y, true).backward();
    opt.step();
  }
  return model;
}

RunConfig run_in(const TempDir& dir, int max_failures = 0) {
  RunConfig r;
  r.name = "ddp";
  r.storage_path = dir.str();
  r.failure_config.max_failures = max_failures;
  r.failure_config.report_timeout_s = 60;
  return r;
}

TwoHeads load_model(const fs::path& file) {
  TwoHeads m;
  load_file(file, *m);
  return m;
}

// Every rank's final weights are the same bytes (the files too) and equal,
// within float rounding, to single-process training on the whole batch.
void expect_ranks_match_reference(const fs::path& out, int world, int steps) {
  const std::string first = slurp(out / "final-0.safetensors");
  ASSERT_FALSE(first.empty());
  TwoHeads rank0 = load_model(out / "final-0.safetensors");
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(slurp(out / fmt::format("final-{}.safetensors", r)), first) << "rank " << r;
    TwoHeads other = load_model(out / fmt::format("final-{}.safetensors", r));
    expect_same_module(*rank0, *other);
  }
  TwoHeads ref = reference(steps);
  auto mine = rank0->named_parameters();
  for (const auto& p : ref->named_parameters()) {
    EXPECT_TRUE(torch::allclose(mine[p.key()], p.value(), 1e-5, 1e-6))
        << p.key() << ": " << mine[p.key()] << " vs " << p.value();
  }
  // The weights moved: the comparison is not between two untouched models.
  torch::manual_seed(100);
  TwoHeads initial;
  EXPECT_FALSE(torch::allclose(initial->fc_a->weight, rank0->fc_a->weight));
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

void run_and_check(int world, int64_t bucket_bytes, size_t buckets,
                   const nlohmann::json& extra = nlohmann::json::object()) {
  torch::set_num_threads(1);
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  constexpr int kSteps = 5;
  nlohmann::json config = {
      {"steps", kSteps}, {"out", out.string()}, {"bucket_bytes", bucket_bytes}};
  config.update(extra);
  Trainer trainer(ddp_loop, config, ScalingConfig{.num_workers = world}, run_in(dir));
  const Result result = trainer.fit();
  ASSERT_FALSE(result.error) << *result.error;
  EXPECT_EQ(result.metrics.at("step"), kSteps - 1);
  ASSERT_TRUE(result.checkpoint);
  expect_ranks_match_reference(out, world, kSteps);
  EXPECT_EQ(slurp(out / "buckets-0.txt"), std::to_string(buckets));
  // The committed checkpoint holds the state every rank reported.
  auto committed = result.checkpoint->as_directory();
  TwoHeads saved = load_model(committed.path() / "state.safetensors");
  expect_same_module(*saved, *load_model(out / "final-0.safetensors"));
  EXPECT_EQ(testing::expect_all_verify((dir / "ddp").string()), static_cast<size_t>(kSteps));

  // Rendezvous: one address and port for all, and torchrun's variables.
  const nlohmann::json c0 = read_json(out / "ctx-0-0.json");
  EXPECT_EQ(c0.at("master_addr"), "127.0.0.1");
  EXPECT_GT(c0.at("master_port").get<int>(), 0);
  for (int r = 0; r < world; ++r) {
    const nlohmann::json c = read_json(out / fmt::format("ctx-{}-0.json", r));
    EXPECT_EQ(c.at("master_port"), c0.at("master_port")) << "rank " << r;
    EXPECT_EQ(c.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(c.at("MASTER_PORT"), std::to_string(c0.at("master_port").get<int>()));
    EXPECT_EQ(c.at("RANK"), std::to_string(r));
    EXPECT_EQ(c.at("WORLD_SIZE"), std::to_string(world));
    EXPECT_EQ(c.at("LOCAL_RANK"), std::to_string(r));
    EXPECT_EQ(c.at("LOCAL_WORLD_SIZE"), std::to_string(world));
    EXPECT_EQ(c.at("GROUP_RANK"), "0");
  }
}

TEST(TorchDistributed, TwoRanksOnHalvesMatchSingleProcessTraining) {
  run_and_check(2, 25 << 20, 1);  // every gradient in one bucket
}

TEST(TorchDistributed, ThreeRanksOnThirdsMatchSingleProcessTrainingWithTwoBuckets) {
  run_and_check(3, 20, 2);  // fc_a's weight and bias (16 + 4 bytes), then fc_b's
}

TEST(TorchDistributed, PlainLossBackwardAveragesTheGradientsAsPyTorchsDdpDoes) {
  // A newcomer's loop: loss.backward() after prepare_model, no ddp.backward.
  // The ranks train on different halves, so without averaging they drift.
  run_and_check(2, 20, 2, {{"plain_backward", true}});
}

TEST(TorchDistributed, ParameterUnusedOnOneRankStaysInStep) {
  torch::set_num_threads(1);
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  Trainer trainer(ddp_loop, {{"steps", 3}, {"out", out.string()}, {"b_ranks", {0}}},
                  ScalingConfig{.num_workers = 2}, run_in(dir));
  const Result result = trainer.fit();
  ASSERT_FALSE(result.error) << *result.error;
  TwoHeads r0 = load_model(out / "final-0.safetensors");
  TwoHeads r1 = load_model(out / "final-1.safetensors");
  expect_same_module(*r0, *r1);
  // fc_b learned from rank 0's half alone (averaged with rank 1's zeros).
  torch::manual_seed(100);
  TwoHeads initial;
  EXPECT_FALSE(torch::equal(initial->fc_b->weight, r0->fc_b->weight));
}

TEST(TorchDistributed, KilledRankRestartsTheGroupOnANewPortFromTheLatestCheckpoint) {
  torch::set_num_threads(1);
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  constexpr int kSteps = 6;
  Trainer trainer(ddp_loop,
                  {{"steps", kSteps}, {"out", out.string()}, {"kill_rank", 1}, {"kill_step", 3}},
                  ScalingConfig{.num_workers = 2}, run_in(dir, /*max_failures=*/1));
  const Result result = trainer.fit();
  ASSERT_FALSE(result.error) << *result.error;
  // Rank 0 did not wait for the killed rank until its collective timed out
  // (20 s): the runtime stopped it, or the all-reduce failed on the closed
  // connection. (Checked by how it ended, not by the run's duration.)
  if (fs::exists(out / "error-0-0.txt")) {
    const std::string error = slurp(out / "error-0-0.txt");
    EXPECT_NE(error.substr(0, error.find('\n')), "timeout") << "a rank waited on the killed one";
  }
  EXPECT_EQ(result.metrics.at("step"), kSteps - 1);
  // The second attempt resumed after step 2 (its first report is step 3) on
  // a port of its own.
  const nlohmann::json a0 = read_json(out / "ctx-0-0.json");
  const nlohmann::json a1 = read_json(out / "ctx-0-1.json");
  EXPECT_EQ(a1.at("attempt"), 1);
  EXPECT_NE(a0.at("master_port"), a1.at("master_port"));
  EXPECT_EQ(read_json(out / "ctx-1-1.json").at("master_port"), a1.at("master_port"));
  // Bitwise resume (weights and momentum) makes the run equal to an
  // uninterrupted one.
  expect_ranks_match_reference(out, 2, kSteps);
  const auto state = nlohmann::json::parse(slurp(dir / "ddp" / "trainer_state.json"));
  EXPECT_EQ(state.at("failures"), 1);
  EXPECT_NE(state.at("last_failure").get<std::string>().find("SIGKILL"), std::string::npos)
      << state.at("last_failure");
}

TEST(TorchDistributed, RankThatStopsTakingPartTimesOutTheOthersAndTheGroupRestarts) {
  torch::set_num_threads(1);
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  constexpr int kSteps = 4;
  const auto start = Clock::now();
  Trainer trainer(ddp_loop,
                  {{"steps", kSteps},
                   {"out", out.string()},
                   {"stall_rank", 1},
                   {"stall_step", 2},
                   {"timeout_ms", 1500}},
                  ScalingConfig{.num_workers = 2}, run_in(dir, /*max_failures=*/1));
  const Result result = trainer.fit();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(result.error) << *result.error;
  // Far longer than the run takes under any load: reaching it means the
  // runtime waited out the stalled rank instead of stopping it.
  EXPECT_LT(seconds, kStallSeconds) << "the runtime waited for the stalled rank";
  // Rank 0's all-reduce gave up after the timeout with an error naming it.
  const std::string error = slurp(out / "error-0-0.txt");
  EXPECT_EQ(error.substr(0, error.find('\n')), "timeout") << error;
  EXPECT_NE(error.find("rank 0 of 2: all_reduce"), std::string::npos) << error;
  EXPECT_EQ(result.metrics.at("step"), kSteps - 1);
  expect_ranks_match_reference(out, 2, kSteps);
}

TEST(TorchDistributed, ProcessGroupOutsideAWorkerIsAFailedPrecondition) {
  try {
    process_group();
    FAIL() << "process_group() outside a worker returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("outside a Trainer worker"), std::string::npos);
  }
  EXPECT_THROW(shard_indices(10), Error);
}

TEST(TorchDistributed, ShardIndicesSplitTheDatasetLikeDistributedSampler) {
  // Evenly: disjoint and covering, strided.
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    torch::Tensor s = shard_indices(12, r, 3);
    ASSERT_EQ(s.numel(), 4);
    EXPECT_EQ(s[0].item<int64_t>(), r);
    EXPECT_EQ(s[1].item<int64_t>(), r + 3);
    for (int64_t i = 0; i < s.numel(); ++i) seen.insert(s[i].item<int64_t>());
  }
  EXPECT_EQ(seen.size(), 12u);
  // Unevenly: padded with the first indices, or cut with drop_last.
  EXPECT_TRUE(torch::equal(shard_indices(5, 1, 2), torch::tensor({1, 3, 0}, torch::kLong)));
  EXPECT_TRUE(torch::equal(shard_indices(5, 1, 2, {.drop_last = true}),
                           torch::tensor({1, 3}, torch::kLong)));
  EXPECT_EQ(shard_indices(1, 2, 3).numel(), 1);  // padding beyond the dataset's size
  // Shuffled: the same permutation on every rank for one seed and epoch.
  std::set<int64_t> shuffled;
  for (int r = 0; r < 2; ++r) {
    torch::Tensor s = shard_indices(10, r, 2, {.shuffle = true, .seed = 3, .epoch = 1});
    EXPECT_TRUE(torch::equal(s, shard_indices(10, r, 2, {.shuffle = true, .seed = 3, .epoch = 1})));
    for (int64_t i = 0; i < s.numel(); ++i) shuffled.insert(s[i].item<int64_t>());
  }
  EXPECT_EQ(shuffled.size(), 10u);
  EXPECT_FALSE(torch::equal(shard_indices(10, 0, 2, {.shuffle = true, .seed = 3, .epoch = 1}),
                            shard_indices(10, 0, 2, {.shuffle = true, .seed = 3, .epoch = 2})));
  try {
    shard_indices(10, 2, 2);
    FAIL() << "rank 2 of 2 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

#ifdef CAIRN_DDP_MPI_PROGRAM
// Under mpirun, one rank per MPI process: the rendezvous comes from the MPI
// driver and the ranks end identical.
TEST(TorchDistributed, TwoMpiProcessesTrainDataParallel) {
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  const testing::MpirunResult r = testing::finish_mpirun(
      testing::start_mpirun(2, {}, {CAIRN_DDP_MPI_PROGRAM, dir.str(), out.string()},
                            out / "mpirun.log"),
      std::chrono::seconds(120));
  ASSERT_EQ(r.exit_status, 0) << r.log;
  const std::string& log = r.log;
  const std::string rank0 = slurp(out / "final-0.safetensors");
  ASSERT_FALSE(rank0.empty()) << log;
  EXPECT_EQ(slurp(out / "final-1.safetensors"), rank0);
  const nlohmann::json c0 = read_json(out / "ctx-0.json"), c1 = read_json(out / "ctx-1.json");
  EXPECT_GT(c0.at("master_port").get<int>(), 0);
  EXPECT_EQ(c0, c1);
  EXPECT_EQ(testing::expect_all_verify((dir / "ddp_mpi").string()), 3u);
}
#endif

}  // namespace
}  // namespace cairn::libtorch
