// Helpers shared by the LibTorch adapter's parts: dtype and shape
// conversion, CPU checks, and tensors viewed by StateDict entries.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "cairn/state.h"

namespace cairn::libtorch_internal {

std::optional<DType> to_cairn(c10::ScalarType t);
std::optional<c10::ScalarType> to_torch(DType t);

Shape shape_of(const torch::Tensor& t);
// "F32[2, 3]"
std::string shape_str(DType dtype, const Shape& shape);
// "prefix.name", or `name` alone for an empty prefix.
std::string join(std::string_view prefix, std::string_view name);
// Whether `name` lies under `prefix` ("optim" holds "optim.x", not "optimx").
bool has_prefix(std::string_view name, std::string_view prefix);

// Throws kInvalidArgument naming `name` for an undefined tensor, one on a
// device the adapter does not handle (anything but the CPU, and CUDA in a
// build with CAIRN_CUDA), or one whose dtype safetensors cannot hold.
void check_tensor(const torch::Tensor& t, const std::string& name);

// The engine's device for a CUDA tensor (its caller's current stream is the
// producer), null for a CPU tensor.
std::shared_ptr<const Device> engine_device_of(const torch::Tensor& t);

// Adds `t` as a writable entry viewing its memory (or a contiguous copy kept
// alive by the entry); the entry shares ownership of the storage. A CUDA
// tensor becomes a device entry.
void add_tensor(StateDict& state, const std::string& name, const torch::Tensor& t);

// Copies a host view's bytes (of `dst`'s dtype and size) into the
// contiguous tensor `dst`, on the CPU or its device.
void copy_into(const torch::Tensor& dst, const TensorView& v);

// A new CPU tensor of the entry's dtype and shape (zeroed when it holds at
// most one element, so scalars read before they are filled are defined).
torch::Tensor empty_for(DType dtype, const Shape& shape);

// The bytes of a contiguous CPU tensor.
std::span<std::byte> bytes_of(const torch::Tensor& t);

// Every parameter and buffer of a module, with its dotted name, in the order
// of PyTorch's state_dict(): module by module (depth first, in registration
// order), each module's own parameters, then its own buffers, then its
// children.
std::vector<std::pair<std::string, torch::Tensor>> module_tensors(const torch::nn::Module& m);

// An id of the storage `t` views (tensors sharing storage have the same);
// 0 for an undefined tensor or one without storage.
uint64_t storage_id(const torch::Tensor& t);

}  // namespace cairn::libtorch_internal
