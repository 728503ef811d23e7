// The reference texts' PyTorch fault-tolerance example in C++ with LibTorch:
// a linear model trained with MSE and Adam on two workers under
// data-parallel training (cairn/torch_distributed.h: each rank trains on its
// half of the data, gradients are averaged over a Gloo process group); every
// rank saves the model and optimizer every epoch (through Cairn's LibTorch
// adapter, as safetensors) and reports that same checkpoint; an intentional
// error at epoch 1 makes the group restart from the latest checkpoint
// (max_failures = 1) with a new process group, and the run finishes every
// epoch.
//
//   cairn_train_torch_example [storage_path] [num_epochs]
//
// DDP keeps the ranks' models and optimizer states bitwise identical, so the
// files every rank saves are identical byte for byte and pass the Trainer's
// check that ranks reporting one file name agree on its contents.
#include <cstdio>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "cairn/torch_distributed.h"
#include "cairn/train.h"

namespace {

void train_func(const nlohmann::json& config) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const int64_t n = 100;
  // A toy dataset: X (n, 4), Y (n, 1), the same on every rank; each rank
  // trains on its shard of the rows.
  torch::Tensor X = torch::randn({n, 4});
  torch::Tensor Y = torch::rand({n, 1});
  const torch::Tensor rows = cairn::libtorch::shard_indices(n);
  X = X.index_select(0, rows);
  Y = Y.index_select(0, rows);
  // A one-layer network, prepared for data-parallel training: rank 0's
  // initial weights are broadcast to every rank.
  torch::nn::Linear model(4, 1);
  cairn::libtorch::DistributedDataParallel ddp = cairn::libtorch::prepare_model(*model);
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
    ddp.backward(loss);  // loss.backward(), then the gradients averaged over the ranks
    optimizer.step();

    // The loss over the whole dataset: the mean of the ranks' (equal) shards'.
    torch::Tensor mean_loss = loss.detach().clone();
    ddp.group().all_reduce(mean_loss);
    mean_loss /= ddp.group().size();
    nlohmann::json metrics = {{"loss", mean_loss.item<double>()}, {"epoch", epoch}};
    cairn::train::TemporaryDirectory temp_checkpoint_dir;
    std::optional<cairn::Checkpoint> checkpoint;
    const bool should_checkpoint = epoch % config.value("checkpoint_freq", 1) == 0;
    // Every rank holds the same model and reports the same checkpoint.
    if (should_checkpoint) {
      cairn::libtorch::save_file(
          std::filesystem::path(temp_checkpoint_dir.path()) / "state.safetensors", *model,
          &optimizer, {{"epoch", epoch}});
      checkpoint = cairn::Checkpoint::from_directory(temp_checkpoint_dir.path());
    }
    cairn::train::report(metrics, checkpoint);
    std::printf("rank %d epoch %d loss %.6f (own shard %.6f)\n", rank, epoch,
                mean_loss.item<double>(), loss.item<double>());
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
