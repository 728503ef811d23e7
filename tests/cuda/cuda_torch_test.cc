// The LibTorch adapter with CUDA tensors (a CUDA-enabled LibTorch and a GPU):
// async saves snapshot the state the training stream had produced when the
// call was made, sync saves write what a CPU copy of the state would, and
// restores into a CUDA model and optimizer resume bit for bit. Skips
// without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include "cairn/async_save.h"
#include "cairn/cuda.h"
#include "cairn/state_manager.h"
#include "cairn/torch.h"
#include "support/temp_dir.h"
#include "torch/torch_support.h"

namespace cairn::libtorch {
namespace {

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return bits_equal(a.to(torch::kCPU), b.to(torch::kCPU));
}

class CudaTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available() || cuda::device_count() == 0) {
      GTEST_SKIP() << "no CUDA device (or a LibTorch without CUDA) on this machine";
    }
  }
  cairn::testing::TempDir dir_;
};

// One Adam step on batch `step` on the model's device.
void train_step(Net& net, torch::optim::Adam& adam, int step, torch::Device device) {
  torch::manual_seed(1000 + step);
  torch::Tensor x = torch::randn({64, 8}).to(device);
  torch::Tensor y = torch::randn({64, 4}).to(device);
  net->zero_grad(true);
  torch::mse_loss(net->forward(x), y).backward();
  adam.step();
}

TEST_F(CudaTorch, SyncSaveOfACudaModelWritesWhatItsCpuTwinWrites) {
  Net cpu = make_net(3, 512);
  Net gpu = make_net(3, 512);
  gpu->to(torch::kCUDA);
  save_file(dir_ / "cpu.safetensors", *cpu, {}, {{"epoch", 1}});
  save_file(dir_ / "gpu.safetensors", *gpu, {}, {{"epoch", 1}});
  MappedState a = MappedState::open(dir_ / "cpu.safetensors");
  MappedState b = MappedState::open(dir_ / "gpu.safetensors");
  ASSERT_EQ(a.file_bytes().size(), b.file_bytes().size());
  EXPECT_EQ(std::memcmp(a.file_bytes().data(), b.file_bytes().data(), a.file_bytes().size()), 0);
}

TEST_F(CudaTorch, AsyncSaveSnapshotsQueuedWorkAndNotWorkAfterTheCallReturns) {
  Net net = make_net(4, 2048);
  net->to(torch::kCUDA);
  StateDict state = state_dict(*net);
  AsyncSaver saver;
  saver.reserve(state);
  torch::NoGradGuard no_grad;
  // Slow work on the current stream, then the values the file must hold.
  torch::Tensor big = torch::randn({4096, 4096}, torch::kCUDA);
  for (int i = 0; i < 30; ++i) big = torch::tanh(big.matmul(big));
  for (auto& p : net->parameters()) p.fill_(1.5);
  SaveHandle h = saver.save(state, Checkpoint::from_directory((dir_ / "cp").string()));
  // Changed right after the call: the file must not see it.
  for (auto& p : net->parameters()) p.add_(1.0);
  h.wait();
  MappedState file = MappedState::open(h.checkpoint().storage(), kStateFileName);
  for (const auto& item : net->named_parameters()) {
    TensorView v = file.tensor(item.key());
    auto values = v.as<float>();
    ASSERT_EQ(values.size(), static_cast<size_t>(item.value().numel()));
    for (size_t i = 0; i < values.size(); i += 997) ASSERT_EQ(values[i], 1.5f) << item.key();
    EXPECT_EQ(values.back(), 1.5f) << item.key();
  }
  EXPECT_EQ(net->parameters()[0].cpu().data_ptr<float>()[0], 2.5f);
  EXPECT_GT(saver.stats().staging_pinned_bytes, 0u);
}

TEST_F(CudaTorch, ARestoredCudaModelAndOptimizerResumeBitForBit) {
  const torch::Device cuda(torch::kCUDA);
  Net a = make_net(5, 256);
  a->to(cuda);
  torch::optim::Adam adam_a(a->parameters(), torch::optim::AdamOptions(1e-3));
  for (int s = 0; s < 3; ++s) train_step(a, adam_a, s, cuda);
  StateCheckpointManager manager((dir_ / "run").string());
  save(manager, *a, {&adam_a}, 3);

  Net b = make_net(6, 256);
  b->to(cuda);
  torch::optim::Adam adam_b(b->parameters(), torch::optim::AdamOptions(1e-3));
  restore(manager, *b, {&adam_b});
  for (auto& p : b->parameters()) EXPECT_TRUE(p.is_cuda());
  for (int s = 3; s < 5; ++s) {
    train_step(a, adam_a, s, cuda);
    train_step(b, adam_b, s, cuda);
  }
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(same_bits(pa[i], pb[i])) << i;
}

TEST_F(CudaTorch, AFileSavedFromTheCpuLoadsStraightIntoCudaTensors) {
  Net cpu = make_net(7, 1024);
  save_file(dir_ / "w.safetensors", *cpu);
  Net gpu = make_net(8, 1024);
  gpu->to(torch::kCUDA);
  // The engine's copying load into the module's CUDA tensors.
  StateDict target;
  add_module(target, *gpu);
  IoReport report;
  LoadOptions o;
  o.report = &report;
  load_into(dir_ / "w.safetensors", target, o);
  EXPECT_NE(report.reason.find("bounce"), std::string::npos) << report.reason;
  auto pa = cpu->parameters(), pb = gpu->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(same_bits(pa[i], pb[i])) << i;
  // And through the adapter's strict restore.
  Net gpu2 = make_net(9, 1024);
  gpu2->to(torch::kCUDA);
  load_file(dir_ / "w.safetensors", *gpu2);
  auto pc = gpu2->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(same_bits(pa[i], pc[i])) << i;
}

}  // namespace
}  // namespace cairn::libtorch
