// The optimizers LibTorch ships, each as a codec between its options and
// per-parameter state and Cairn's entries: options as JSON (in the file's
// "cairn.torch" metadata), state as named tensors (scalars as 0-d tensors,
// lists as "<field>.count" plus "<field>.<i>").
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

namespace cairn::libtorch_internal {

// One parameter's state as (field, tensor) pairs, in a fixed order.
using Fields = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads a parameter's state back from its fields. Every accessor throws
// cairn::Error(kInvalidArgument) naming "<where>.<field>" when the field is
// missing or has the wrong dtype or shape.
class FieldReader {
 public:
  // `fields`: field name -> tensor; `where`: the entries' common name
  // ("optim.fc1.weight"); `param`: the parameter the state belongs to.
  // With `on_param_device`, tensors are returned on the parameter's device
  // (state read into CPU memory for a CUDA parameter is moved there).
  FieldReader(std::map<std::string, torch::Tensor> fields, std::string where, torch::Tensor param,
              bool on_param_device = false);

  torch::Tensor like_param(const std::string& field);           // param's dtype and shape
  torch::Tensor optional_like_param(const std::string& field);  // undefined when absent
  torch::Tensor optional_tensor(const std::string& field);      // any shape, param's dtype
  int64_t i64(const std::string& field);                        // I64, shape []
  double f64(const std::string& field);                         // F64, shape []
  // "<field>.count" items; an item not stored is an undefined tensor.
  std::deque<torch::Tensor> list(const std::string& field);
  std::optional<std::vector<torch::Tensor>> optional_list(const std::string& field);
  // Throws naming the fields no accessor asked for.
  void finish();

 private:
  torch::Tensor take(const std::string& field, bool required);
  torch::Tensor placed(torch::Tensor t) const;
  [[noreturn]] void fail(const std::string& field, const std::string& why) const;

  std::map<std::string, torch::Tensor> fields_;
  std::string where_;
  torch::Tensor param_;
  bool on_param_device_ = false;
};

struct OptimizerCodec {
  std::string_view type;  // "Adam"
  bool (*is)(const torch::optim::Optimizer&);
  nlohmann::json (*options)(const torch::optim::OptimizerOptions&);
  // Throws nlohmann::json exceptions for malformed options.
  void (*set_options)(torch::optim::OptimizerOptions&, const nlohmann::json&);
  Fields (*fields)(const torch::optim::OptimizerParamState&);
  std::unique_ptr<torch::optim::OptimizerParamState> (*from_fields)(FieldReader&);
};

// The codec of `optimizer`'s type; kInvalidArgument naming the type if
// LibTorch does not ship it.
const OptimizerCodec& codec_of(const torch::optim::Optimizer& optimizer);
// The codec named `type`, or nullptr.
const OptimizerCodec* codec_named(std::string_view type);

// The key LibTorch's optimizers file a parameter's state under (a string
// in LibTorch 1.x, the TensorImpl's address in 2.x).
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
StateKey state_key(const torch::Tensor& param);

}  // namespace cairn::libtorch_internal
