// Distributed checkpointing: every rank owns a shard of a global parameter
// vector and saves only its shard, as a safetensors file through Cairn's
// state engine, named by rank. All shards land in one checkpoint directory,
// uploaded by their ranks in parallel (no gathering through rank 0), and each
// rank restores its own shard after a failure.
//
//   cairn_train_sharded_example [storage_path] [num_workers] [num_epochs]
//   mpirun -np N cairn_train_sharded_example [storage_path] N [num_epochs]
//
// Under mpirun every MPI process runs one rank, and every process's fit()
// returns the same Result, so each prints the same summary.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/train.h"

namespace {

void train_func(const nlohmann::json& config) {
  const cairn::TrainContext& ctx = cairn::train::get_context();
  const uint64_t global = config.at("global_size").get<uint64_t>();
  const uint64_t per_rank = global / ctx.world_size;
  const uint64_t offset = per_rank * ctx.world_rank;
  const std::string shard_name = fmt::format("shard-rank={}.safetensors", ctx.world_rank);

  std::vector<float> w(per_rank, 0.0f);  // this rank's slice [offset, offset + per_rank)
  int start_epoch = 0;
  if (auto checkpoint = cairn::train::get_checkpoint()) {
    auto dir = checkpoint->as_directory();
    auto file = cairn::MappedState::open(dir.path() / shard_name);
    auto saved = file.tensor("w").as<float>();
    if (saved.size() != w.size()) throw std::runtime_error(shard_name + ": wrong shard size");
    std::copy(saved.begin(), saved.end(), w.begin());
    start_epoch = file.metadata().at("epoch").get<int>() + 1;
  }

  for (int epoch = start_epoch; epoch < config.at("num_epochs").get<int>(); ++epoch) {
    // A toy update: move every element towards its global index.
    double loss = 0.0;
    for (uint64_t i = 0; i < per_rank; ++i) {
      const float target = static_cast<float>(offset + i) / static_cast<float>(global);
      loss += (w[i] - target) * (w[i] - target);
      w[i] -= 0.5f * (w[i] - target);
    }
    cairn::train::TemporaryDirectory tmp;
    cairn::StateDict state;
    state.add<float>("w", {per_rank}, std::span<const float>(w));
    state.metadata = {{"epoch", epoch}, {"offset", offset}, {"global_size", global}};
    cairn::save_file(state, std::filesystem::path(tmp.path()) / shard_name);
    // Metrics come from rank 0; every rank passes its shard.
    cairn::train::report({{"epoch", epoch}, {"shard_loss", loss}},
                         cairn::Checkpoint::from_directory(tmp.path()));
    if (epoch == 1 && ctx.attempt == 0 && ctx.world_rank == ctx.world_size - 1) {
      throw std::runtime_error("intentional failure of the last rank at epoch 1");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  cairn::RunConfig run;
  run.name = "sharded";
  run.storage_path = argc > 1 ? argv[1] : "cairn_results";
  run.failure_config.max_failures = 1;
  run.checkpoint_config.num_to_keep = 2;
  const int workers = argc > 2 ? std::stoi(argv[2]) : 4;
  const int epochs = argc > 3 ? std::stoi(argv[3]) : 4;
  cairn::Trainer trainer(train_func, {{"num_epochs", epochs}, {"global_size", 4096}},
                         cairn::ScalingConfig{.num_workers = workers}, run);
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
  const cairn::Manifest m = result.checkpoint->manifest();
  std::printf("latest checkpoint %s holds:\n", result.checkpoint->uri().c_str());
  for (const auto& f : m.files)
    std::printf("  %s (%llu bytes)\n", f.path.c_str(), (unsigned long long)f.size);
  if (static_cast<int>(m.files.size()) != workers || !result.checkpoint->verify().empty()) {
    std::fprintf(stderr, "expected %d whole shards\n", workers);
    return 1;
  }
  return result.metrics.at("epoch").get<int>() == epochs - 1 ? 0 : 1;
}
