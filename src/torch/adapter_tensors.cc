#include "adapter_tensors.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#ifdef CAIRN_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cairn/cuda.h"
#endif
#include "cairn/error.h"
#include "util/fork_safe.h"

namespace cairn::libtorch_internal {

namespace {

// Every dtype both sides have, once.
constexpr std::pair<c10::ScalarType, DType> kDtypes[] = {
    {c10::kFloat, DType::kF32},     {c10::kDouble, DType::kF64}, {c10::kHalf, DType::kF16},
    {c10::kBFloat16, DType::kBF16}, {c10::kLong, DType::kI64},   {c10::kInt, DType::kI32},
    {c10::kShort, DType::kI16},     {c10::kChar, DType::kI8},    {c10::kByte, DType::kU8},
    {c10::kBool, DType::kBool},
};

}  // namespace

std::optional<DType> to_cairn(c10::ScalarType t) {
  for (const auto& [torch_type, dtype] : kDtypes) {
    if (torch_type == t) return dtype;
  }
  return std::nullopt;
}

std::optional<c10::ScalarType> to_torch(DType t) {
  for (const auto& [torch_type, dtype] : kDtypes) {
    if (dtype == t) return torch_type;
  }
  return std::nullopt;
}

Shape shape_of(const torch::Tensor& t) {
  Shape s;
  for (int64_t d : t.sizes()) s.push_back(static_cast<uint64_t>(d));
  return s;
}

std::string shape_str(DType dtype, const Shape& shape) {
  std::ostringstream o;
  o << dtype_name(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) o << (i ? ", " : "") << shape[i];
  o << "]";
  return o.str();
}

std::string join(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  return std::string(prefix) + "." + std::string(name);
}

bool has_prefix(std::string_view name, std::string_view prefix) {
  return !prefix.empty() && name.size() > prefix.size() && name[prefix.size()] == '.' &&
         name.substr(0, prefix.size()) == prefix;
}

namespace {
#ifdef CAIRN_TORCH_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif
}  // namespace

void check_tensor(const torch::Tensor& t, const std::string& name) {
  if (!t.defined()) throw Error(ErrorCode::kInvalidArgument, name + ": tensor is undefined");
  if (!t.device().is_cpu() && !(kCuda && t.device().is_cuda())) {
    throw Error(ErrorCode::kInvalidArgument,
                name + ": tensor is on " + t.device().str() +
                    (kCuda ? "; only CPU and CUDA tensors are supported"
                           : "; only CPU tensors are supported (CUDA tensors need a Cairn "
                             "built with CAIRN_CUDA)"));
  }
  if (!to_cairn(t.scalar_type())) {
    throw Error(ErrorCode::kInvalidArgument, name + ": dtype " +
                                                 std::string(c10::toString(t.scalar_type())) +
                                                 " has no safetensors equivalent");
  }
}

std::shared_ptr<const Device> engine_device_of(const torch::Tensor& t) {
  if (!t.device().is_cuda()) return nullptr;
#ifdef CAIRN_TORCH_CUDA
  // One engine device per CUDA device, whose producer is the current stream
  // of whichever thread saves or loads.
  static ForkSafeMutex mu(30);
  static std::map<int, std::shared_ptr<const Device>> devices;
  const int index = t.device().index();
  std::lock_guard<ForkSafeMutex> g(mu);
  std::shared_ptr<const Device>& d = devices[index];
  if (!d) {
    d = cuda::device(index, [index] {
      return static_cast<void*>(
          c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).stream());
    });
  }
  return d;
#else
  throw Error(ErrorCode::kInvalidArgument,
              "a CUDA tensor needs a Cairn built with CAIRN_CUDA (" + t.device().str() + ")");
#endif
}

void add_tensor(StateDict& state, const std::string& name, const torch::Tensor& t) {
  check_tensor(t, name);
  torch::Tensor c = t.is_contiguous() ? t : t.contiguous();
  // The entry shares ownership of the storage, so it stays valid even if the
  // module drops the tensor.
  auto owner = std::make_shared<torch::Tensor>(c);
  if (std::shared_ptr<const Device> device = engine_device_of(c)) {
    state.add_device(name, *to_cairn(c.scalar_type()), shape_of(c), bytes_of(c), device, owner,
                     true);
    return;
  }
  state.add_shared(name, *to_cairn(c.scalar_type()), shape_of(c), bytes_of(c), owner, true);
}

void copy_into(const torch::Tensor& dst, const TensorView& v) {
  if (dst.device().is_cpu()) {
    std::memcpy(dst.data_ptr(), v.bytes.data(), v.bytes.size());
    return;
  }
  // torch copies host to device; the view is only read.
  std::vector<int64_t> sizes(v.shape.begin(), v.shape.end());
  torch::Tensor host = torch::from_blob(const_cast<std::byte*>(v.bytes.data()), sizes,
                                        torch::TensorOptions().dtype(dst.scalar_type()));
  torch::NoGradGuard no_grad;
  dst.copy_(host);
}

torch::Tensor empty_for(DType dtype, const Shape& shape) {
  std::vector<int64_t> sizes(shape.begin(), shape.end());
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  auto options = torch::TensorOptions().dtype(*to_torch(dtype));
  return n <= 1 ? torch::zeros(sizes, options) : torch::empty(sizes, options);
}

std::span<std::byte> bytes_of(const torch::Tensor& t) {
  return {static_cast<std::byte*>(t.data_ptr()),
          static_cast<size_t>(t.numel()) * static_cast<size_t>(t.element_size())};
}

namespace {

void collect_tensors(const torch::nn::Module& m, const std::string& prefix,
                     std::vector<std::pair<std::string, torch::Tensor>>& out) {
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false)) {
    out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& child : m.named_children()) {
    collect_tensors(*child.value(), prefix + child.key() + ".", out);
  }
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> module_tensors(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  collect_tensors(m, "", out);
  return out;
}

uint64_t storage_id(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return 0;
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl()));
}

}  // namespace cairn::libtorch_internal
