// Data-parallel training under mpirun, one rank per MPI process, for
// tests/torch/distributed_test.cc: every MPI process calls Trainer::fit();
// each rank trains a linear model on its shard under DistributedDataParallel,
// reports the same checkpoint every step, and writes its final weights to
// OUT/final-<rank>.safetensors and its rendezvous to OUT/ctx-<rank>.json.
//
//   torch_ddp_mpi_program STORAGE_PATH OUT_DIR
//
// Exits 0 when fit() returned without error on this process.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "cairn/torch_distributed.h"
#include "cairn/train.h"

namespace fs = std::filesystem;

namespace {

void train_fn(const nlohmann::json& config) {
  torch::set_num_threads(1);
  const cairn::TrainContext& ctx = cairn::train::get_context();
  const fs::path out = config.at("out").get<std::string>();
  {
    std::ofstream f(out / fmt::format("ctx-{}.json", ctx.world_rank));
    f << nlohmann::json({{"master_addr", ctx.master_addr}, {"master_port", ctx.master_port}})
             .dump();
  }
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({8, 4});
  torch::Tensor y = torch::randn({8, 1});
  const torch::Tensor rows = cairn::libtorch::shard_indices(8);
  x = x.index_select(0, rows);
  y = y.index_select(0, rows);
  torch::manual_seed(100 + ctx.world_rank);  // different until DDP broadcasts rank 0's
  torch::nn::Linear model(4, 1);
  auto ddp = cairn::libtorch::prepare_model(*model);
  torch::optim::SGD opt(model->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    ddp.backward(torch::mse_loss(model->forward(x), y));
    opt.step();
    cairn::train::TemporaryDirectory tmp;
    cairn::libtorch::save_file(fs::path(tmp.path()) / "state.safetensors", *model, &opt,
                               {{"step", step}});
    cairn::train::report({{"step", step}}, cairn::Checkpoint::from_directory(tmp.path()));
  }
  cairn::libtorch::save_file(out / fmt::format("final-{}.safetensors", ctx.world_rank), *model);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s STORAGE_PATH OUT_DIR\n", argv[0]);
    return 2;
  }
  cairn::RunConfig run;
  run.name = "ddp_mpi";
  run.storage_path = argv[1];
  cairn::Trainer trainer(train_fn, {{"out", std::string(argv[2])}},
                         cairn::ScalingConfig{.num_workers = 0, .launcher = cairn::Launcher::kMpi},
                         run);
  try {
    const cairn::Result result = trainer.fit();
    if (result.error) {
      std::fprintf(stderr, "training failed: %s\n", result.error->c_str());
      return 1;
    }
  } catch (const cairn::Error& e) {
    std::fprintf(stderr, "fit() threw: %s\n", e.what());
    return 1;
  }
  return 0;
}
