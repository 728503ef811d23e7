// The reference texts' PyTorch fault-tolerance example in C++ with LibTorch:
// a linear model trained with MSE and Adam on two workers; rank 0 saves the
// model and optimizer every epoch (through Cairn's LibTorch adapter, as
// safetensors); an intentional error at epoch 1 makes the group restart from
// the latest checkpoint (max_failures = 1), and the run finishes every epoch.
//
//   cairn_train_torch_example [storage_path] [num_epochs]
//
// Both workers train the same model on the same data (the same seed), as
// DDP's replicas would after averaging gradients; LibTorch's C++ distributed
// package is not part of Debian's libtorch, so there is no all-reduce here.
#include <cstdio>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "cairn/train.h"

namespace {

void train_func(const nlohmann::json& config) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const int64_t n = 100;
  // A toy dataset: X (n, 4), Y (n, 1).
  torch::Tensor X = torch::randn({n, 4});
  torch::Tensor Y = torch::rand({n, 1});
  // A one-layer network.
  torch::nn::Linear model(4, 1);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(3e-4));

  // ====== Resume training state from the checkpoint. ======
  int start_epoch = 0;
  if (auto checkpoint = cairn::train::get_checkpoint()) {
    auto dir = checkpoint->as_directory();
    nlohmann::json meta =
        cairn::libtorch::load_file(dir.path() / "state.safetensors", *model, &optimizer);
    start_epoch = meta.at("epoch").get<int>() + 1;
  }
  // ========================================================

  const int rank = cairn::train::get_context().world_rank;
  for (int epoch = start_epoch; epoch < config.at("num_epochs").get<int>(); ++epoch) {
    torch::Tensor y = model->forward(X);
    torch::Tensor loss = torch::mse_loss(y, Y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();

    nlohmann::json metrics = {{"loss", loss.item<double>()}, {"epoch", epoch}};
    cairn::train::TemporaryDirectory temp_checkpoint_dir;
    std::optional<cairn::Checkpoint> checkpoint;
    const bool should_checkpoint = epoch % config.value("checkpoint_freq", 1) == 0;
    // Every rank holds the same model: only rank 0 saves and reports it.
    if (rank == 0 && should_checkpoint) {
      cairn::libtorch::save_file(
          std::filesystem::path(temp_checkpoint_dir.path()) / "state.safetensors", *model,
          &optimizer, {{"epoch", epoch}});
      checkpoint = cairn::Checkpoint::from_directory(temp_checkpoint_dir.path());
    }
    cairn::train::report(metrics, checkpoint);
    std::printf("rank %d epoch %d loss %.6f\n", rank, epoch, loss.item<double>());
    std::fflush(stdout);

    if (epoch == 1) throw std::runtime_error("Intentional error to showcase restoration!");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string storage = argc > 1 ? argv[1] : "cairn_results";
  const int num_epochs = argc > 2 ? std::stoi(argv[2]) : 5;
  cairn::RunConfig run;
  run.name = "torch_linear";
  run.storage_path = storage;
  run.failure_config.max_failures = 1;
  cairn::Trainer trainer(train_func, {{"num_epochs", num_epochs}},
                         cairn::ScalingConfig{.num_workers = 2}, run);
  cairn::Result result;
  try {
    result = trainer.fit();
  } catch (const cairn::Error& e) {  // e.g. the experiment exists: see Trainer::restore
    std::fprintf(stderr, "cannot train: %s\n", e.what());
    return 1;
  }
  if (result.error) {
    std::fprintf(stderr, "training failed: %s\n", result.error->c_str());
    return 1;
  }
  std::printf("finished: %s\n", result.metrics.dump().c_str());
  std::printf("latest checkpoint: %s\n", result.checkpoint->uri().c_str());
  std::printf("checkpoints kept: %zu\n", result.best_checkpoints.size());
  const int last = result.metrics.at("epoch").get<int>();
  if (last != num_epochs - 1) {
    std::fprintf(stderr, "expected the last epoch to be %d, got %d\n", num_epochs - 1, last);
    return 1;
  }
  return 0;
}
