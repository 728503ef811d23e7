#include "adapter_tensors.h"

#include <memory>
#include <sstream>

#include "cairn/error.h"

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

void check_cpu(const torch::Tensor& t, const std::string& name) {
  if (!t.defined()) throw Error(ErrorCode::kInvalidArgument, name + ": tensor is undefined");
  if (!t.device().is_cpu()) {
    throw Error(ErrorCode::kInvalidArgument,
                name + ": tensor is on " + t.device().str() + "; only CPU tensors are supported");
  }
  if (!to_cairn(t.scalar_type())) {
    throw Error(ErrorCode::kInvalidArgument, name + ": dtype " +
                                                 std::string(c10::toString(t.scalar_type())) +
                                                 " has no safetensors equivalent");
  }
}

void add_tensor(StateDict& state, const std::string& name, const torch::Tensor& t) {
  check_cpu(t, name);
  torch::Tensor c = t.is_contiguous() ? t : t.contiguous();
  // The entry shares ownership of the storage, so it stays valid even if the
  // module drops the tensor.
  auto owner = std::make_shared<torch::Tensor>(c);
  state.add_shared(name, *to_cairn(c.scalar_type()), shape_of(c), bytes_of(c), owner, true);
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

std::vector<std::pair<std::string, torch::Tensor>> module_tensors(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : m.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace cairn::libtorch_internal
