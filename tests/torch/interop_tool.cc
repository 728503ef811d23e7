// The C++ side of the PyTorch interop test (python_interop_test.py): the
// same network as the Python side, saved for PyTorch and loaded from it.
//
//   interop_tool save DIR        DIR/single/, DIR/sharded/ (save_pretrained),
//                                DIR/full.safetensors (weights + Adam + RNG),
//                                DIR/expected.json (the eval output on a fixed input)
//   interop_tool load PATH OUT   load_pretrained(PATH) strictly into a fresh
//                                network; OUT gets its eval output
//   interop_tool shard DIR SIZE  save_pretrained(DIR) of a fresh network with
//                                max_shard_size SIZE (how it splits)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/torch.h"

namespace {

// Python: fc1 = Linear(4, 8); bn = BatchNorm1d(8);
//         layers = Sequential(Linear(8, 8), ReLU(), Linear(8, 3))
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 8))),
        bn(register_module("bn", torch::nn::BatchNorm1d(8))),
        layers(register_module("layers",
                               torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::ReLU(),
                                                     torch::nn::Linear(8, 3)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return layers->forward(torch::relu(bn->forward(fc1->forward(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Sequential layers;
};
TORCH_MODULE(Net);

// The fixed input both sides use: arange(12).reshape(3, 4) / 7.
torch::Tensor fixed_input() { return torch::arange(12, torch::kFloat32).reshape({3, 4}) / 7.0; }

void write_output(Net& net, const std::string& path) {
  net->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor y = net->forward(fixed_input()).contiguous();
  std::vector<float> values(y.data_ptr<float>(), y.data_ptr<float>() + y.numel());
  std::ofstream(path) << nlohmann::json(values).dump() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  const std::string cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd == "save" && argc == 3) {
      const std::string dir = argv[2];
      torch::manual_seed(7);
      Net net;
      torch::optim::Adam adam(net->parameters());
      for (int i = 0; i < 3; ++i) {  // moves BatchNorm's running statistics
        adam.zero_grad();
        torch::mse_loss(net->forward(torch::randn({5, 4})), torch::randn({5, 3})).backward();
        adam.step();
      }
      cairn::libtorch::save_pretrained(dir + "/single", *net);
      cairn::libtorch::save_pretrained(dir + "/sharded", *net, {.max_shard_size = 300});
      cairn::libtorch::save_file(dir + "/full.safetensors", *net, {&adam, nullptr, true});
      write_output(net, dir + "/expected.json");
      return 0;
    }
    if (cmd == "load" && argc == 4) {
      torch::manual_seed(99);
      Net net;
      cairn::libtorch::load_pretrained(argv[2], *net);
      write_output(net, argv[3]);
      return 0;
    }
    if (cmd == "shard" && argc == 4) {
      Net net;
      cairn::libtorch::save_pretrained(argv[2], *net, {.max_shard_size = std::stoull(argv[3])});
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "interop_tool: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: interop_tool save DIR | load PATH OUT | shard DIR SIZE\n";
  return 2;
}
