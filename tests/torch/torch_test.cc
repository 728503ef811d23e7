// LibTorch adapter: train, save, restore into a fresh model and optimizer, and
// check that the next step is bit-for-bit the one the original takes.
#include "cairn/torch.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cairn/error.h"
#include "support/temp_dir.h"
#include "torch/torch_support.h"

namespace cairn::libtorch {
namespace {

// One training step on batch `step` (the batch depends only on the step, so
// two processes, or two models, see the same data). Returns the loss.
float train_step(Net& net, torch::optim::Adam& adam, int step) {
  torch::manual_seed(1000 + step);
  torch::Tensor x = torch::randn({32, 8});
  torch::Tensor y = torch::randn({32, 4});
  net->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss = torch::mse_loss(net->forward(x), y);
  loss.backward();
  adam.step();
  return loss.item<float>();
}

void expect_same_adam(Net& na, torch::optim::Adam& a, Net& nb, torch::optim::Adam& b) {
  auto pa = na->parameters(), pb = nb->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    auto key = [](const torch::Tensor& p) { return static_cast<void*>(p.unsafeGetTensorImpl()); };
    ASSERT_TRUE(a.state().count(key(pa[i]))) << i;
    ASSERT_TRUE(b.state().count(key(pb[i]))) << i;
    const auto& sa = static_cast<const torch::optim::AdamParamState&>(*a.state().at(key(pa[i])));
    const auto& sb = static_cast<const torch::optim::AdamParamState&>(*b.state().at(key(pb[i])));
    EXPECT_EQ(sa.step(), sb.step()) << i;
    EXPECT_TRUE(bits_equal(sa.exp_avg(), sb.exp_avg())) << i;
    EXPECT_TRUE(bits_equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << i;
    EXPECT_EQ(sa.max_exp_avg_sq().defined(), sb.max_exp_avg_sq().defined()) << i;
    if (sa.max_exp_avg_sq().defined()) {
      EXPECT_TRUE(bits_equal(sa.max_exp_avg_sq(), sb.max_exp_avg_sq())) << i;
    }
  }
}

class TorchAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  cairn::testing::TempDir dir_;
};

// The heart of it: train A, save, restore into a differently initialized B
// with different optimizer options, and take the same next steps on both.
void check_bitwise_resume(const std::filesystem::path& file, torch::optim::AdamOptions options) {
  Net a = make_net(1);
  torch::optim::Adam adam_a(a->parameters(), options);
  for (int s = 0; s < 5; ++s) train_step(a, adam_a, s);
  save_file(file, *a, &adam_a, {{"epoch", 7}});

  Net b = make_net(2);  // different weights
  torch::optim::Adam adam_b(b->parameters(), torch::optim::AdamOptions(0.5));
  ASSERT_FALSE(bits_equal(a->fc1->weight, b->fc1->weight));
  nlohmann::json meta = load_file(file, *b, &adam_b);
  EXPECT_EQ(meta, (nlohmann::json{{"epoch", 7}}));
  expect_same_module(a, b);
  expect_same_adam(a, adam_a, b, adam_b);
  const auto& oa =
      static_cast<const torch::optim::AdamOptions&>(adam_a.param_groups()[0].options());
  const auto& ob =
      static_cast<const torch::optim::AdamOptions&>(adam_b.param_groups()[0].options());
  EXPECT_TRUE(oa == ob);

  for (int s = 5; s < 8; ++s) {
    const float la = train_step(a, adam_a, s);
    const float lb = train_step(b, adam_b, s);
    EXPECT_EQ(float_bits(la), float_bits(lb)) << "loss at step " << s;
  }
  expect_same_module(a, b);
  expect_same_adam(a, adam_a, b, adam_b);
}

TEST_F(TorchAdapterTest, NextStepIsBitwiseIdenticalAfterRestore) {
  check_bitwise_resume(
      dir_ / "state.safetensors",
      torch::optim::AdamOptions(1e-2).betas({0.8, 0.99}).eps(1e-7).weight_decay(1e-3));
}

TEST_F(TorchAdapterTest, AmsgradStateIsRestoredBitwise) {
  check_bitwise_resume(dir_ / "state.safetensors",
                       torch::optim::AdamOptions(3e-3).amsgrad(true).weight_decay(0.01));
}

TEST_F(TorchAdapterTest, ParamGroupsKeepTheirOwnOptions) {
  Net a = make_net(1);
  std::vector<torch::optim::OptimizerParamGroup> groups_a;
  groups_a.emplace_back(a->fc1->parameters(),
                        std::make_unique<torch::optim::AdamOptions>(
                            torch::optim::AdamOptions(1e-2).betas({0.5, 0.9})));
  groups_a.emplace_back(a->fc2->parameters());
  torch::optim::Adam adam_a(groups_a, torch::optim::AdamOptions(2e-3));
  for (int s = 0; s < 3; ++s) train_step(a, adam_a, s);
  const auto file = dir_ / "groups.safetensors";
  save_file(file, *a, &adam_a);

  Net b = make_net(2);
  std::vector<torch::optim::OptimizerParamGroup> groups_b;
  groups_b.emplace_back(b->fc1->parameters());
  groups_b.emplace_back(b->fc2->parameters());
  torch::optim::Adam adam_b(groups_b, torch::optim::AdamOptions(0.1));
  load_file(file, *b, &adam_b);
  for (size_t g = 0; g < 2; ++g) {
    const auto& oa =
        static_cast<const torch::optim::AdamOptions&>(adam_a.param_groups()[g].options());
    const auto& ob =
        static_cast<const torch::optim::AdamOptions&>(adam_b.param_groups()[g].options());
    EXPECT_TRUE(oa == ob) << "group " << g;
  }
  EXPECT_EQ(adam_b.param_groups()[0].options().get_lr(), 1e-2);
  EXPECT_EQ(adam_b.param_groups()[1].options().get_lr(), 2e-3);
  // bn's parameters are in no group: they are not trained, and stay as saved.
  const float la = train_step(a, adam_a, 3);
  const float lb = train_step(b, adam_b, 3);
  EXPECT_EQ(float_bits(la), float_bits(lb));
  expect_same_module(a, b);
}

TEST_F(TorchAdapterTest, FileHoldsPlainPyTorchNamesAndFormatPt) {
  Net a = make_net(1);
  torch::optim::Adam adam(a->parameters(), torch::optim::AdamOptions(1e-3));
  train_step(a, adam, 0);
  const auto file = dir_ / "named.safetensors";
  save_file(file, *a, &adam);
  MappedState m = MappedState::open(file);
  for (const char* name :
       {"fc1.weight", "fc1.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
        "optim.fc1.weight.exp_avg", "optim.fc1.weight.exp_avg_sq", "optim.fc1.weight.step",
        "optim.fc2.bias.exp_avg"}) {
    EXPECT_TRUE(m.contains(name)) << name;
  }
  EXPECT_FALSE(m.contains("optim.fc1.weight.max_exp_avg_sq"));
  EXPECT_EQ(m.header().metadata.at("format"), "pt");
  EXPECT_EQ(m.tensor("bn.num_batches_tracked").dtype, DType::kI64);
  EXPECT_EQ(m.tensor("optim.fc1.weight.step").as<int64_t>()[0], 1);
  EXPECT_EQ(m.tensor("fc1.weight").shape, (Shape{16, 8}));
  EXPECT_TRUE(bits_equal(
      torch::from_blob(const_cast<std::byte*>(m.tensor("fc1.weight").bytes.data()), {16, 8}),
      a->fc1->weight));
}

TEST_F(TorchAdapterTest, AFileWithPrefixedNamesRestoresAsItRecordsThem) {
  Net a = make_net(1);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 0);
  const auto file = dir_ / "prefixed.safetensors";
  StateDict state = state_dict(*a, &adam_a, {}, TorchNames{.model = "model", .optim = "opt"});
  cairn::save_file(state, file);
  MappedState m = MappedState::open(file);
  EXPECT_TRUE(m.contains("model.fc1.weight"));
  EXPECT_TRUE(m.contains("opt.fc1.weight.exp_avg"));

  Net b = make_net(2);
  torch::optim::Adam adam_b(b->parameters());
  load_file(file, *b, &adam_b);  // no names given: the file's are used
  expect_same_module(a, b);
  expect_same_adam(a, adam_a, b, adam_b);
}

TEST_F(TorchAdapterTest, AWeightUnderTheOptimizerPrefixIsRefusedWithoutAModelPrefix) {
  struct Clash : torch::nn::Module {
    Clash() { optim = register_module("optim", torch::nn::Linear(2, 2)); }
    torch::nn::Linear optim{nullptr};
  };
  Clash clash;
  try {
    state_dict(clash);
    FAIL() << "optim.weight would read as optimizer state";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("optim.weight"), std::string::npos) << e.what();
  }
  StateDict ok = state_dict(clash, {}, {}, TorchNames{.model = "model"});
  EXPECT_TRUE(ok.contains("model.optim.weight"));
}

TEST_F(TorchAdapterTest, ShapeMismatchNamesTheParameterAndChangesNothing) {
  Net a = make_net(1, /*hidden=*/16);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 0);
  const auto file = dir_ / "state.safetensors";
  save_file(file, *a, &adam_a);

  Net b = make_net(2, /*hidden=*/32);
  torch::optim::Adam adam_b(b->parameters());
  const torch::Tensor before = b->fc1->weight.clone();
  try {
    load_file(file, *b, &adam_b);
    FAIL() << "restoring into a different shape must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parameter or buffer fc1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("F32[16, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("F32[32, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  }
  EXPECT_TRUE(bits_equal(before, b->fc1->weight));
  EXPECT_TRUE(adam_b.state().empty());
}

TEST_F(TorchAdapterTest, MissingAndUnexpectedTensorsAreErrors) {
  struct Small : torch::nn::Module {
    Small() { fc1 = register_module("fc1", torch::nn::Linear(8, 16)); }
    torch::nn::Linear fc1{nullptr};
  };
  Net a = make_net(1);
  const auto file = dir_ / "state.safetensors";
  save_file(file, *a, nullptr);
  Small small;
  try {
    load_file(file, small, nullptr);
    FAIL() << "a file with more tensors than the module must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("fc2.weight is in the file but not in the module"),
              std::string::npos)
        << e.what();
  }

  const auto small_file = dir_ / "small.safetensors";
  save_file(small_file, small, nullptr);
  Net b = make_net(2);
  try {
    load_file(small_file, *b, nullptr);
    FAIL() << "a file missing tensors must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bn.running_var is missing"), std::string::npos)
        << e.what();
  }
}

TEST_F(TorchAdapterTest, RestoringAnOptimizerFromAModelOnlyFileFails) {
  Net a = make_net(1);
  const auto file = dir_ / "model-only.safetensors";
  save_file(file, *a, nullptr);
  Net b = make_net(2);
  torch::optim::Adam adam_b(b->parameters());
  try {
    load_file(file, *b, &adam_b);
    FAIL() << "no optimizer state in the file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no optimizer state"), std::string::npos) << e.what();
  }
  // The model alone restores.
  load_file(file, *b, nullptr);
  expect_same_module(a, b);
}

TEST_F(TorchAdapterTest, OptimizerWithFewerParametersFails) {
  Net a = make_net(1);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 0);
  const auto file = dir_ / "state.safetensors";
  save_file(file, *a, &adam_a);
  Net b = make_net(2);
  torch::optim::Adam adam_b(b->fc1->parameters());
  EXPECT_THROW(load_file(file, *b, &adam_b), Error);
  EXPECT_TRUE(adam_b.state().empty());
}

TEST_F(TorchAdapterTest, ManagerSaveAndRestoreResumesBitwise) {
  const std::string exp = (dir_ / "exp").string();
  Net a = make_net(1);
  torch::optim::Adam adam_a(a->parameters(), torch::optim::AdamOptions(1e-2));
  float loss_a4 = 0;
  {
    StateCheckpointOptions o;
    o.max_to_keep = 2;
    StateCheckpointManager mgr(exp, o);
    for (int s = 0; s < 4; ++s) {
      const float loss = train_step(a, adam_a, s);
      auto handle = save_async(mgr, *a, &adam_a, s, {{"loss", loss}}, {{"note", "async"}});
      ASSERT_TRUE(handle.has_value());
    }
    // save_async returned after the snapshot: training on while the last save
    // is still being written must not change what it writes.
    loss_a4 = train_step(a, adam_a, 4);
    mgr.wait();
    EXPECT_EQ(mgr.checkpoints().size(), 2u);
  }
  // The latest checkpoint holds the state after step 3; B resumes from it and
  // takes step 4, which must be bit-for-bit A's step 4.
  StateCheckpointManager mgr(exp, {});
  Net b = make_net(2);
  torch::optim::Adam adam_b(b->parameters());
  nlohmann::json meta = restore(mgr, *b, &adam_b);
  EXPECT_EQ(meta.value("note", ""), "async");
  EXPECT_EQ(meta.value("step", -1), 3);
  const float lb = train_step(b, adam_b, 4);
  EXPECT_EQ(float_bits(loss_a4), float_bits(lb));
  expect_same_module(a, b);
  expect_same_adam(a, adam_a, b, adam_b);
}

TEST_F(TorchAdapterTest, ManagerRestoreRejectsADifferentShape) {
  const std::string exp = (dir_ / "exp").string();
  Net a = make_net(1, 16);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 0);
  StateCheckpointManager mgr(exp, {});
  ASSERT_TRUE(save(mgr, *a, &adam_a, 0).has_value());
  Net b = make_net(2, 24);
  torch::optim::Adam adam_b(b->parameters());
  try {
    restore(mgr, *b, &adam_b);
    FAIL() << "shape mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("fc1.weight is F32[16, 8] in the file but F32[24, 8]"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TorchAdapterTest, CheckpointSaveAndRestore) {
  Net a = make_net(1);
  torch::optim::Adam adam_a(a->parameters());
  train_step(a, adam_a, 0);
  Checkpoint ckpt = Checkpoint::from_directory((dir_ / "ckpt").string());
  save_checkpoint(ckpt, *a, &adam_a, {{"loss", 1.5}}, {{"epoch", 1}});
  ASSERT_TRUE(ckpt.is_committed());
  Net b = make_net(2);
  torch::optim::Adam adam_b(b->parameters());
  nlohmann::json meta = restore_checkpoint(ckpt, *b, &adam_b);
  EXPECT_EQ(meta.value("epoch", 0), 1);
  expect_same_module(a, b);
  expect_same_adam(a, adam_a, b, adam_b);
}

}  // namespace
}  // namespace cairn::libtorch
