// Every optimizer LibTorch ships, with an LR scheduler and the random
// generator: train, save, restore into a differently initialized model and
// optimizer with a disturbed generator, and check that the following steps
// are bit-for-bit those the original takes.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "support/temp_dir.h"
#include "torch/torch_support.h"

namespace cairn::libtorch {
namespace {

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, double lr)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
};

std::ostream& operator<<(std::ostream& o, const OptimizerCase& c) { return o << c.name; }

std::vector<OptimizerCase> cases() {
  using namespace torch::optim;
  return {
      {"SGD", [](auto p, double lr) { return std::make_unique<SGD>(p, SGDOptions(lr)); }},
      {"SGDNesterov",
       [](auto p, double lr) {
         return std::make_unique<SGD>(
             p, SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(1e-4));
       }},
      {"SGDDampened",
       [](auto p, double lr) {
         return std::make_unique<SGD>(p, SGDOptions(lr).momentum(0.5).dampening(0.1));
       }},
      {"Adam", [](auto p, double lr) { return std::make_unique<Adam>(p, AdamOptions(lr)); }},
      {"AdamAmsgrad",
       [](auto p, double lr) {
         return std::make_unique<Adam>(p, AdamOptions(lr).amsgrad(true).weight_decay(1e-3));
       }},
      {"AdamW", [](auto p, double lr) { return std::make_unique<AdamW>(p, AdamWOptions(lr)); }},
      {"AdamWAmsgrad",
       [](auto p, double lr) {
         return std::make_unique<AdamW>(p, AdamWOptions(lr).amsgrad(true).betas({0.8, 0.99}));
       }},
      {"RMSprop",
       [](auto p, double lr) { return std::make_unique<RMSprop>(p, RMSpropOptions(lr)); }},
      {"RMSpropCenteredMomentum",
       [](auto p, double lr) {
         return std::make_unique<RMSprop>(p, RMSpropOptions(lr).centered(true).momentum(0.9));
       }},
      {"Adagrad",
       [](auto p, double lr) {
         return std::make_unique<Adagrad>(
             p, AdagradOptions(lr).lr_decay(0.01).initial_accumulator_value(0.1));
       }},
      {"LBFGS",
       [](auto p, double lr) {
         return std::make_unique<LBFGS>(p, LBFGSOptions(lr).max_iter(3).history_size(4));
       }},
      {"LBFGSStrongWolfe",
       [](auto p, double lr) {
         return std::make_unique<LBFGS>(
             p, LBFGSOptions(lr).max_iter(3).history_size(4).line_search_fn("strong_wolfe"));
       }},
  };
}

// One step on a batch drawn from the default generator (so the generator's
// state decides the data), then one scheduler step. Returns the loss.
float train_step(Net& net, torch::optim::Optimizer& opt, torch::optim::LRScheduler& sched) {
  torch::Tensor x = torch::randn({16, 8});
  torch::Tensor y = torch::randn({16, 4});
  auto closure = [&] {
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(net->forward(x), y);
    loss.backward();
    return loss;
  };
  const float loss = opt.step(closure).item<float>();
  sched.step();
  return loss;
}

class OptimizerResumeTest : public ::testing::TestWithParam<OptimizerCase> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  cairn::testing::TempDir dir_;
};

// The generator is global, so the original's steps run before the restore.
TEST_P(OptimizerResumeTest, NextStepsAreBitwiseIdenticalAfterRestore) {
  const auto file = dir_ / "state.safetensors";
  Net a = make_net(1);
  auto opt_a = GetParam().make(a->parameters(), 0.05);
  torch::optim::StepLR sched_a(*opt_a, /*step_size=*/2, /*gamma=*/0.5);
  for (int s = 0; s < 5; ++s) train_step(a, *opt_a, sched_a);
  save_file(file, *a, {opt_a.get(), &sched_a, true}, {{"epoch", 5}});
  const size_t states = opt_a->state().size();
  std::vector<uint32_t> losses;
  for (int s = 5; s < 9; ++s) losses.push_back(float_bits(train_step(a, *opt_a, sched_a)));

  Net b = make_net(2);
  auto opt_b = GetParam().make(b->parameters(), 0.7);  // other options, no state
  torch::optim::StepLR sched_b(*opt_b, 2, 0.5);
  torch::manual_seed(999);  // another generator state
  nlohmann::json meta = load_file(file, *b, {opt_b.get(), &sched_b, true});
  EXPECT_EQ(meta, (nlohmann::json{{"epoch", 5}}));
  EXPECT_EQ(opt_b->state().size(), states);
  for (int s = 5; s < 9; ++s) {
    ASSERT_EQ(losses[s - 5], float_bits(train_step(b, *opt_b, sched_b))) << "loss at step " << s;
  }
  expect_same_module(a, b);
  // The scheduler's step count came back too: both decayed at the same steps.
  EXPECT_EQ(opt_a->param_groups()[0].options().get_lr(),
            opt_b->param_groups()[0].options().get_lr());
}

TEST_P(OptimizerResumeTest, ManagerRestoreResumesBitwise) {
  Net a = make_net(1);
  auto opt_a = GetParam().make(a->parameters(), 0.05);
  torch::optim::StepLR sched_a(*opt_a, 3, 0.5);
  StateCheckpointManager mgr((dir_ / "exp").string(), {});
  for (int s = 0; s < 4; ++s) train_step(a, *opt_a, sched_a);
  ASSERT_TRUE(save(mgr, *a, {opt_a.get(), &sched_a, true}, 4).has_value());
  std::vector<uint32_t> losses;
  for (int s = 4; s < 7; ++s) losses.push_back(float_bits(train_step(a, *opt_a, sched_a)));

  Net b = make_net(2);
  auto opt_b = GetParam().make(b->parameters(), 0.7);
  torch::optim::StepLR sched_b(*opt_b, 3, 0.5);
  torch::manual_seed(5);
  nlohmann::json meta = restore(mgr, *b, {opt_b.get(), &sched_b, true});
  EXPECT_EQ(meta.value("step", -1), 4);
  for (int s = 4; s < 7; ++s) {
    ASSERT_EQ(losses[s - 4], float_bits(train_step(b, *opt_b, sched_b))) << "loss at step " << s;
  }
  expect_same_module(a, b);
}

INSTANTIATE_TEST_SUITE_P(EveryLibTorchOptimizer, OptimizerResumeTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

class OptimizerStateTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  cairn::testing::TempDir dir_;
};

TEST_F(OptimizerStateTest, RestoringIntoAnotherOptimizerTypeNamesBoth) {
  Net a = make_net(1);
  torch::optim::AdamW adamw(a->parameters());
  torch::optim::StepLR sched(adamw, 2);
  train_step(a, adamw, sched);
  const auto file = dir_ / "state.safetensors";
  save_file(file, *a, &adamw);
  Net b = make_net(2);
  torch::optim::SGD sgd(b->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor before = b->fc1->weight.clone();
  try {
    load_file(file, *b, &sgd);
    FAIL() << "AdamW state into SGD";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("AdamW optimizer, not SGD"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(bits_equal(before, b->fc1->weight));  // nothing changed
}

TEST_F(OptimizerStateTest, AnOptimizerLibTorchDoesNotShipIsRefusedByType) {
  struct Custom : torch::optim::Optimizer {
    explicit Custom(std::vector<torch::Tensor> p)
        : Optimizer({torch::optim::OptimizerParamGroup(std::move(p))},
                    std::make_unique<torch::optim::SGDOptions>(0.1)) {}
    torch::Tensor step(LossClosure) override { return {}; }
  };
  Net a = make_net(1);
  Custom custom(a->parameters());
  try {
    state_dict(*a, &custom);
    FAIL() << "unknown optimizer type";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Custom"), std::string::npos) << e.what();
  }
}

TEST_F(OptimizerStateTest, ASchedulerOrGeneratorMissingFromTheFileIsAnError) {
  Net a = make_net(1);
  const auto file = dir_ / "model.safetensors";
  save_file(file, *a);
  Net b = make_net(2);
  torch::optim::SGD sgd(b->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::StepLR sched(sgd, 2);
  EXPECT_THROW(load_file(file, *b, {nullptr, &sched, false}), Error);
  try {
    load_file(file, *b, {nullptr, nullptr, true});
    FAIL() << "no generator state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rng.cpu is missing"), std::string::npos) << e.what();
  }
}

TEST_F(OptimizerStateTest, AModelAloneRestoresFromAFullTrainingStateThroughTheManager) {
  Net a = make_net(1);
  torch::optim::RMSprop opt(a->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.5));
  torch::optim::StepLR sched(opt, 2);
  train_step(a, opt, sched);
  StateCheckpointManager mgr((dir_ / "exp").string(), {});
  ASSERT_TRUE(save(mgr, *a, {&opt, &sched, true}, 1).has_value());
  Net b = make_net(2);
  restore(mgr, *b);  // the optimizer's and generator's entries are read and dropped
  expect_same_module(a, b);
}

TEST_F(OptimizerStateTest, DamagedOptimizerStateNamesTheField) {
  Net a = make_net(1);
  torch::optim::Adam adam(a->parameters());
  torch::optim::StepLR sched(adam, 2);
  train_step(a, adam, sched);
  StateDict state = state_dict(*a, &adam);
  state.remove("optim.fc2.bias.exp_avg_sq");
  const auto file = dir_ / "damaged.safetensors";
  cairn::save_file(state, file);
  Net b = make_net(2);
  torch::optim::Adam adam_b(b->parameters());
  try {
    load_file(file, *b, &adam_b);
    FAIL() << "a missing field";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("optim.fc2.bias.exp_avg_sq: is missing"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(adam_b.state().empty());
}

}  // namespace
}  // namespace cairn::libtorch
