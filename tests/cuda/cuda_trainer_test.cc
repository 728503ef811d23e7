// The Trainer with CUDA workers: two worker processes each train a model and
// Adam in CUDA memory, save them through the LibTorch adapter (device
// tensors, copied through pinned staging) and report the file, synchronously
// or asynchronously; a worker that fails makes the group restart from the
// latest checkpoint, whose state each rank restores straight into CUDA
// memory, and the run ends with the bytes of a run that never failed.
// (No process group: each rank trains alone.) Skips without a GPU.
//
// The workers are forked from this process, and CUDA does not survive a
// fork of a process that initialized it: this process never touches CUDA,
// it asks a child whether there is a GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/torch.h"
#include "cairn/train.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;

bool cuda_usable_in_a_child() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(torch::cuda::is_available() ? 0 : 1);
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string file_name(int rank) { return fmt::format("rank{}.safetensors", rank); }

// Each rank: a seeded MLP and its data on the GPU, Adam, `epochs` epochs of
// one step; resumes from get_checkpoint(); every epoch saves the rank's own
// file and reports it. Rank 1 throws at epoch `fail_at` on the first attempt.
void train_on_gpu(const nlohmann::json& config) {
  const TrainContext& ctx = train::get_context();
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(100 + ctx.world_rank);
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 1));
  const torch::Tensor x = torch::randn({256, 32}).to(gpu);
  const torch::Tensor y = torch::randn({256, 1}).to(gpu);
  model->to(gpu);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  int start = 0;
  if (auto checkpoint = train::get_checkpoint()) {
    auto dir = checkpoint->as_directory();
    nlohmann::json meta =
        libtorch::load_file(dir.path() / file_name(ctx.world_rank), *model, &adam);
    start = meta.at("epoch").get<int>() + 1;
    for (const auto& p : model->parameters()) {
      if (!p.is_cuda()) throw std::runtime_error("a restored parameter is not on the GPU");
    }
  }
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    adam.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    adam.step();
    if (epoch == config.value("fail_at", -1) && ctx.attempt == 0 && ctx.world_rank == 1) {
      throw std::runtime_error("injected failure");
    }
    train::TemporaryDirectory temp;
    libtorch::save_file(fs::path(temp.path()) / file_name(ctx.world_rank), *model, &adam,
                        {{"epoch", epoch}});
    train::report({{"epoch", epoch}, {"start", start}, {"loss", loss.item<double>()}},
                  Checkpoint::from_directory(temp.path()),
                  {.async = config.at("async").get<bool>()});
  }
}

// Runs the loop in `dir`/`name` and returns the files of its latest
// checkpoint, by name.
std::map<std::string, std::string> run(const TempDir& dir, const std::string& name,
                                       const nlohmann::json& config, int* failures) {
  RunConfig rc;
  rc.name = name;
  rc.storage_path = dir.str();
  rc.failure_config.max_failures = 1;
  Result r = Trainer(train_on_gpu, config, ScalingConfig{.num_workers = 2}, rc).fit();
  EXPECT_FALSE(r.error) << *r.error;
  std::map<std::string, std::string> files;
  if (r.error || !r.checkpoint) return files;
  EXPECT_EQ(r.metrics.at("epoch"), config.at("epochs").get<int>() - 1);
  auto local = r.checkpoint->as_directory();
  for (int rank = 0; rank < 2; ++rank) {
    files[file_name(rank)] = read_text(local.path() / file_name(rank));
  }
  auto state = nlohmann::json::parse(read_text(dir.path() / name / "trainer_state.json"));
  *failures = state.value("failures", 0);
  // One round per epoch: a restart resumed where the latest checkpoint ended.
  const std::vector<nlohmann::json> rounds = read_json_lines(dir.path() / name / "result.json");
  EXPECT_EQ(rounds.size(), config.at("epochs").get<size_t>());
  for (size_t i = 0; i < rounds.size(); ++i) {
    EXPECT_EQ(rounds[i].at("epoch"), i);
    const int fail_at = config.value("fail_at", -1);
    EXPECT_EQ(rounds[i].at("start"), fail_at >= 0 && static_cast<int>(i) >= fail_at ? fail_at : 0)
        << "round " << i;
  }
  return files;
}

class CudaTrainer : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!cuda_usable_in_a_child()) {
      GTEST_SKIP() << "no CUDA device (or a LibTorch without CUDA) on this machine";
    }
  }
};

TEST_P(CudaTrainer, AFailedCudaWorkerRestartsFromTheLatestCheckpointAndEndsBitForBit) {
  TempDir dir;
  const bool async = GetParam();
  int failures = -1;
  const auto plain = run(dir, "plain", {{"epochs", 5}, {"async", async}}, &failures);
  EXPECT_EQ(failures, 0);
  const auto failed =
      run(dir, "failed", {{"epochs", 5}, {"async", async}, {"fail_at", 2}}, &failures);
  EXPECT_EQ(failures, 1);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(failed.size(), 2u);
  for (const auto& [name, bytes] : plain) {
    EXPECT_GT(bytes.size(), 0u) << name;
    EXPECT_TRUE(failed.at(name) == bytes) << name << " differs after the restart";
  }
  EXPECT_FALSE(plain.at(file_name(0)) == plain.at(file_name(1))) << "the ranks trained alike";
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsyncReports, CudaTrainer, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Async") : std::string("Sync");
                         });

}  // namespace
}  // namespace cairn::testing
