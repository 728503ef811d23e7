// Population Based Training over a small LibTorch model: 8 trials of a
// two-layer MLP fitted by SGD with momentum to a synthetic regression (data
// from a fixed seed), searching the learning rate (loguniform) and momentum.
// Every few iterations PBT replaces the worst trials by copies of the best:
// the Tuner restarts such a trial from a copy of the better trial's latest
// checkpoint with a perturbed learning rate. The trainable saves the model
// and the optimizer with Cairn's LibTorch adapter into a checkpoint every
// iteration and restores them from get_checkpoint(); after a restore it
// takes the learning rate and momentum from its (new) config, not from the
// checkpoint, which is what makes PBT's explore step take effect.
//
//   cairn_tune_pbt_torch_example --storage DIR --name NAME
//                                [--crash-after-results N] [--restore]
//
// --crash-after-results N kills the driver itself with SIGKILL at the N-th
// result any trial reports (a callback raises it: a realistic crash, no
// clean-up runs; the trials' processes die with the driver). --restore
// continues the experiment with Tuner::restore: finished trials stay
// finished, interrupted ones resume from their latest checkpoints, pending
// ones start. Exit status: 0 when every trial is TERMINATED, 1 otherwise
// (or on an error), 2 for a bad command line.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "cairn/train.h"
#include "cairn/tuner.h"

namespace {

namespace tune = cairn::tune;

constexpr int kNumTrials = 8;
constexpr int kIterations = 12;         // training iterations per trial (TuneConfig::stop)
constexpr int kStepsPerIteration = 10;  // SGD steps between two reports
constexpr double kPerturbationInterval = 3;
constexpr const char* kStateFile = "state.safetensors";

// y = sin(x . w) + 0.5 * (x . v) + noise, x in R^8: the same data in every
// trial and every process (a fixed seed).
struct Data {
  torch::Tensor x_train, y_train, x_val, y_val;
};

Data make_data() {
  torch::manual_seed(1234);
  const torch::Tensor x = torch::randn({640, 8});
  const torch::Tensor w = torch::randn({8, 1});
  const torch::Tensor v = torch::randn({8, 1});
  const torch::Tensor y =
      torch::sin(x.matmul(w)) + 0.5 * x.matmul(v) + 0.05 * torch::randn({640, 1});
  return {x.slice(0, 0, 512), y.slice(0, 0, 512), x.slice(0, 512), y.slice(0, 512)};
}

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// Sets the hyperparameters of `config` on every param group (after a restore
// the optimizer holds the checkpoint's, which PBT's explore just changed).
void apply_config(torch::optim::SGD& optimizer, const nlohmann::json& config) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
    options.lr(config.at("lr").get<double>());
    options.momentum(config.at("momentum").get<double>());
  }
}

// The function trainable: one trial. Each iteration runs kStepsPerIteration
// full-batch SGD steps, saves the model and the optimizer as a checkpoint and
// reports the validation loss with it. The Tuner ends the trial at
// training_iteration kIterations (TuneConfig::stop; a clone goes on from its
// source's iteration); the bound below only guards against a runaway loop.
void train_mlp(const nlohmann::json& config) {
  torch::set_num_threads(1);
  const Data data = make_data();
  torch::manual_seed(42);  // the same initial weights in every trial
  Mlp model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));

  int step = 0;  // SGD iterations done so far (carried through checkpoints and clones)
  if (auto checkpoint = cairn::train::get_checkpoint()) {
    auto dir = checkpoint->as_directory();
    const nlohmann::json meta =
        cairn::libtorch::load_file(dir.path() / kStateFile, *model, &optimizer);
    step = meta.at("step").get<int>();
    std::printf("%s: resumed from %s at step %d with lr %.5f, momentum %.3f\n",
                cairn::train::get_context().experiment_name.c_str(),
                std::filesystem::path(checkpoint->uri()).filename().c_str(), step,
                config.at("lr").get<double>(), config.at("momentum").get<double>());
    std::fflush(stdout);
  }
  apply_config(optimizer, config);

  for (int iteration = 0; iteration < 10 * kIterations; ++iteration) {
    model->train();
    for (int i = 0; i < kStepsPerIteration; ++i) {
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(model->forward(data.x_train), data.y_train);
      loss.backward();
      // Large learning rates (PBT multiplies them by 1.2, unclamped) stay
      // finite: a diverged trial's NaN loss would count for nothing in PBT.
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      ++step;
    }
    double val_loss = 0;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      val_loss = torch::mse_loss(model->forward(data.x_val), data.y_val).item<double>();
    }
    cairn::train::TemporaryDirectory tmp;
    cairn::libtorch::save_file(std::filesystem::path(tmp.path()) / kStateFile, *model, &optimizer,
                               {{"step", step}});
    cairn::train::report({{"loss", val_loss},
                          {"lr", config.at("lr")},
                          {"momentum", config.at("momentum")},
                          {"step", step}},
                         cairn::Checkpoint::from_directory(tmp.path()));
  }
}

// The scheduler, built the same way for a new experiment and for a restore
// (Tuner::restore restores the saved PBT state into it).
std::shared_ptr<tune::PopulationBasedTraining> make_pbt() {
  tune::PBTOptions options;
  options.perturbation_interval = kPerturbationInterval;
  options.hyperparam_mutations = {{"lr", tune::loguniform(1e-3, 0.3)}};
  options.quantile_fraction = 0.25;
  options.resample_probability = 0.25;
  options.seed = 7;
  return std::make_shared<tune::PopulationBasedTraining>(options);
}

// Kills the driver at the N-th result: the way a real driver dies (OOM
// killer, node loss), with no destructor or handler running.
class CrashAfterResults : public tune::Callback {
 public:
  explicit CrashAfterResults(int n) : n_(n) {}
  void on_trial_result(const tune::TrialInfo& trial, nlohmann::json&) override {
    if (++seen_ == n_) {
      std::printf("driver: result %d (trial %s): killing the driver with SIGKILL\n", seen_,
                  trial.trial_id.c_str());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }

 private:
  int n_;
  int seen_ = 0;
};

std::string number_or_dash(const nlohmann::json& j, const char* key, const char* format) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_number()) return "-";
  return fmt::format(fmt::runtime(format), j.at(key).get<double>());
}

// One line per finished trial, as the experiment goes.
class Progress : public tune::Callback {
 public:
  void on_trial_complete(const tune::TrialInfo& trial) override {
    std::printf("%s: done, loss %s, lr %s\n", trial.trial_id.c_str(),
                number_or_dash(trial.last_result, "loss", "{:.5f}").c_str(),
                number_or_dash(trial.config, "lr", "{:.5f}").c_str());
    std::fflush(stdout);
  }
};

int print_grid(const tune::ResultGrid& grid) {
  std::printf("\n%-12s %-10s %10s %9s %8s %7s\n", "trial", "status", "loss", "lr", "momentum",
              "results");
  bool all_terminated = true;
  for (const tune::TrialResult& t : grid) {
    all_terminated &= t.status == tune::TrialStatus::kTerminated;
    std::printf("%-12s %-10s %10s %9s %8s %7zu\n", t.trial_id.c_str(),
                std::string(tune::to_string(t.status)).c_str(),
                number_or_dash(t.metrics, "loss", "{:.5f}").c_str(),
                number_or_dash(t.config, "lr", "{:.5f}").c_str(),
                number_or_dash(t.config, "momentum", "{:.3f}").c_str(), t.metrics_history.size());
    if (t.error) std::printf("  error: %s\n", t.error->c_str());
  }
  try {
    const tune::TrialResult& best = grid.get_best_result("loss", "min");
    std::printf("\nbest trial: %s, loss %s, lr %s, momentum %s\n", best.trial_id.c_str(),
                number_or_dash(best.metrics, "loss", "{:.5f}").c_str(),
                number_or_dash(best.config, "lr", "{:.5f}").c_str(),
                number_or_dash(best.config, "momentum", "{:.3f}").c_str());
  } catch (const cairn::Error& e) {
    std::printf("\nno best trial: %s\n", e.what());
  }
  if (!all_terminated) {
    std::fprintf(stderr, "not every trial is TERMINATED\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cairn_tune_pbt_torch_example: Population Based Training of a LibTorch MLP (8 trials); "
      "--crash-after-results kills the driver on purpose, --restore continues the experiment",
      "cairn_tune_pbt_torch_example"};
  std::string storage;
  std::string name = "pbt_torch";
  int crash_after = 0;
  bool restore = false;
  app.add_option("--storage", storage, "storage root (a path or URI)")->required();
  app.add_option("--name", name, "experiment name (a folder under --storage)")
      ->capture_default_str();
  app.add_option("--crash-after-results", crash_after,
                 "kill the driver with SIGKILL at the N-th trial result")
      ->check(CLI::PositiveNumber);
  app.add_flag("--restore", restore,
               "continue the experiment (Tuner::restore) instead of "
               "starting a new one");
  app.footer("Exit codes: 0 every trial TERMINATED, 1 otherwise or an error, 2 bad command line.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "cairn_tune_pbt_torch_example: error: " << e.what() << " (see --help)\n";
    return 2;
  }

  std::vector<std::shared_ptr<tune::Callback>> callbacks{std::make_shared<Progress>()};
  if (crash_after > 0) callbacks.push_back(std::make_shared<CrashAfterResults>(crash_after));

  try {
    std::optional<tune::Tuner> tuner;
    if (restore) {
      const std::string path = storage + "/" + name;
      std::printf("restoring the experiment at %s\n", path.c_str());
      tune::TuneConfig code;
      code.scheduler = make_pbt();  // the same scheduler: its saved state is restored into it
      code.callbacks = callbacks;
      tuner.emplace(tune::Tuner::restore(path, train_mlp, {}, code));
    } else {
      tune::TuneConfig tc;
      tc.metric = "loss";
      tc.mode = "min";
      tc.num_samples = kNumTrials;
      tc.max_concurrent_trials = 2;
      tc.scheduler = make_pbt();
      tc.seed = 2024;
      tc.stop = {{"training_iteration", kIterations}};
      tc.callbacks = callbacks;
      cairn::RunConfig run;
      run.name = name;
      run.storage_path = storage;
      run.checkpoint_config.num_to_keep = 2;
      const nlohmann::json space = {{"lr", tune::loguniform(1e-3, 0.3)},
                                    {"momentum", tune::uniform(0.5, 0.9)}};
      std::printf("PBT: %d trials of %d iterations, 2 at a time, perturbation every %g\n",
                  kNumTrials, kIterations, kPerturbationInterval);
      tuner.emplace(train_mlp, space, tc, run);
    }
    std::fflush(stdout);
    const tune::ResultGrid grid = tuner->fit();
    return print_grid(grid);
  } catch (const cairn::Error& e) {
    std::fprintf(stderr, "cairn_tune_pbt_torch_example: error: %s\n", e.what());
    if (!restore && e.code() == cairn::ErrorCode::kAlreadyExists) {
      std::fprintf(stderr, "(continue it with --restore, or choose another --name)\n");
    }
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn_tune_pbt_torch_example: error: %s\n", e.what());
    return 1;
  }
}
