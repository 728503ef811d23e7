// Shared by the LibTorch adapter's tests: a small network and bitwise
// comparisons of modules.
#pragma once

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace cairn::libtorch {

// A small network with parameters and buffers of two dtypes (BatchNorm's
// running_mean/running_var are F32, num_batches_tracked is I64).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(8, hidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(bn->forward(fc1->forward(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

inline Net make_net(uint64_t seed, int64_t hidden = 16) {
  torch::manual_seed(seed);
  return Net(hidden);
}

inline bool bits_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every parameter and buffer of `a` and `b` is bitwise equal.
inline void expect_same_module(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    EXPECT_TRUE(bits_equal(item.value(), pb[item.key()])) << "parameter " << item.key();
  }
  auto ba = a.named_buffers(), bb = b.named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (const auto& item : ba) {
    EXPECT_TRUE(bits_equal(item.value(), bb[item.key()])) << "buffer " << item.key();
  }
}

inline void expect_same_module(Net& a, Net& b) { expect_same_module(*a, *b); }

}  // namespace cairn::libtorch
