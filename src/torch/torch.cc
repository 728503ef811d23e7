// LibTorch adapter (include/cairn/torch.h).
//
// Restoring works in two phases so that a mismatch changes nothing: first
// every target tensor is paired with its file tensor and checked (dtype,
// shape, presence both ways), collecting every problem into one error; only
// then are bytes copied and the optimizer's state and options replaced.
#include "cairn/torch.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/string_utils.h>
#include <torch/torch.h>

#include "cairn/error.h"

namespace cairn::libtorch {
namespace {

constexpr std::string_view kTorchMetaKey = "cairn.torch";

std::optional<DType> to_cairn(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return DType::kF32;
    case c10::kDouble:
      return DType::kF64;
    case c10::kHalf:
      return DType::kF16;
    case c10::kBFloat16:
      return DType::kBF16;
    case c10::kLong:
      return DType::kI64;
    case c10::kInt:
      return DType::kI32;
    case c10::kShort:
      return DType::kI16;
    case c10::kChar:
      return DType::kI8;
    case c10::kByte:
      return DType::kU8;
    case c10::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
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
  return std::string(prefix) + "." + std::string(name);
}

// The state key LibTorch's Adam uses for a parameter (adam.cpp).
std::string adam_key(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
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

// Adds `t` as a writable entry viewing its memory (or a contiguous copy kept
// alive by the entry).
void add_tensor(StateDict& state, const std::string& name, const torch::Tensor& t) {
  check_cpu(t, name);
  torch::Tensor c = t.is_contiguous() ? t : t.contiguous();
  auto* data = static_cast<std::byte*>(c.data_ptr());
  std::span<std::byte> bytes(data, static_cast<size_t>(c.numel()) * c.element_size());
  // The entry shares ownership of the storage, so it stays valid even if the
  // module drops the tensor.
  auto owner = std::make_shared<torch::Tensor>(c);
  state.add_shared(name, *to_cairn(c.scalar_type()), shape_of(c), bytes, owner, true);
}

// Every parameter and buffer of a module, with its dotted name.
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

// TensorImpl -> parameter name in `module` (empty map for no module).
std::unordered_map<const void*, std::string> param_names(const torch::nn::Module* module) {
  std::unordered_map<const void*, std::string> names;
  if (module == nullptr) return names;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  return names;
}

// The adapter's name for each parameter of each group, in order.
std::vector<std::vector<std::string>> optimizer_param_names(const torch::optim::Adam& optimizer,
                                                            const torch::nn::Module* module) {
  const auto names = param_names(module);
  std::vector<std::vector<std::string>> out;
  std::set<std::string> seen;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    out.emplace_back();
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = names.find(params[i].unsafeGetTensorImpl());
      std::string name = it != names.end()
                             ? it->second
                             : "group" + std::to_string(g) + ".param" + std::to_string(i);
      if (!seen.insert(name).second) {
        throw Error(ErrorCode::kInvalidArgument,
                    "optimizer: parameter " + name + " appears twice in its param groups");
      }
      out.back().push_back(std::move(name));
    }
  }
  return out;
}

const torch::optim::AdamOptions& adam_options(const torch::optim::OptimizerParamGroup& g) {
  return static_cast<const torch::optim::AdamOptions&>(g.options());
}

// One tensor to restore: where its bytes go and what the file must hold.
struct Target {
  std::string name;     // full entry name
  std::string subject;  // for messages: "parameter model.fc1.weight"
  DType dtype;
  Shape shape;
  torch::Tensor tensor;    // contiguous CPU tensor receiving the bytes
  torch::Tensor original;  // the module's tensor when `tensor` is a copy (non-contiguous)
};

// Pairs targets with the file; throws one kInvalidArgument listing every
// problem (missing, shape or dtype mismatch, unexpected under `prefixes`).
void check_targets(const MappedState& file, const std::vector<Target>& targets,
                   const std::vector<std::string>& prefixes) {
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const Target& t : targets) {
    wanted.insert(t.name);
    const TensorInfo* info = file.header().find(t.name);
    if (info == nullptr) {
      problems.push_back(t.subject + " is missing from the file");
    } else if (info->dtype != t.dtype || info->shape != t.shape) {
      problems.push_back(t.subject + " is " + shape_str(info->dtype, info->shape) +
                         " in the file but " + shape_str(t.dtype, t.shape) + " here");
    }
  }
  for (const TensorInfo& info : file.header().tensors) {
    if (wanted.count(info.name)) continue;
    for (const std::string& p : prefixes) {
      if (info.name.rfind(p + ".", 0) == 0) {
        problems.push_back(info.name + " is in the file but not in the module or optimizer");
        break;
      }
    }
  }
  if (!problems.empty()) {
    std::string msg = "restoring from " + file.source() + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw Error(ErrorCode::kInvalidArgument, msg);
  }
}

torch::Tensor empty_like_param(const torch::Tensor& p) {
  return torch::empty(p.sizes(), p.options().requires_grad(false));
}

}  // namespace

void add_module(StateDict& state, torch::nn::Module& module, const TorchNames& names) {
  for (const auto& [name, t] : module_tensors(module))
    add_tensor(state, join(names.model, name), t);
}

void add_adam(StateDict& state, torch::optim::Adam& optimizer, const torch::nn::Module* module,
              const TorchNames& names) {
  const auto pnames = optimizer_param_names(optimizer, module);
  nlohmann::json groups = nlohmann::json::array();
  const auto& param_groups = optimizer.param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const auto& opts = adam_options(param_groups[g]);
    nlohmann::json group = {{"lr", opts.lr()},
                            {"betas", {std::get<0>(opts.betas()), std::get<1>(opts.betas())}},
                            {"eps", opts.eps()},
                            {"weight_decay", opts.weight_decay()},
                            {"amsgrad", opts.amsgrad()},
                            {"params", pnames[g]},
                            {"has_state", nlohmann::json::array()}};
    const auto& params = param_groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = optimizer.state().find(adam_key(params[i]));
      const bool has_state = it != optimizer.state().end();
      group["has_state"].push_back(has_state);
      if (!has_state) continue;
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      const std::string base = join(names.optim, pnames[g][i]);
      int64_t step = s.step();
      std::vector<std::byte> step_bytes(sizeof step);
      std::memcpy(step_bytes.data(), &step, sizeof step);
      state.add_owned(base + ".step", DType::kI64, {}, std::move(step_bytes));
      add_tensor(state, base + ".exp_avg", s.exp_avg());
      add_tensor(state, base + ".exp_avg_sq", s.exp_avg_sq());
      if (opts.amsgrad()) add_tensor(state, base + ".max_exp_avg_sq", s.max_exp_avg_sq());
    }
    groups.push_back(std::move(group));
  }
  state.metadata[std::string(kTorchMetaKey)] = {
      {"optimizer", {{"type", "Adam"}, {"param_groups", groups}}},
      {"model_prefix", names.model},
      {"optim_prefix", names.optim}};
}

StateDict state_dict(torch::nn::Module& module, torch::optim::Adam* optimizer,
                     const nlohmann::json& metadata, const TorchNames& names) {
  StateDict state;
  if (!metadata.is_object()) {
    throw Error(ErrorCode::kInvalidArgument, "state_dict: metadata must be a JSON object");
  }
  state.metadata = metadata;
  add_module(state, module, names);
  if (optimizer != nullptr) add_adam(state, *optimizer, &module, names);
  return state;
}

namespace {

struct AdamSlot {
  torch::Tensor param;
  torch::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  size_t step_target = 0;  // index of the step's Target
};

// Phase 1 of a restore: every tensor to fill, checked against the file.
struct Plan {
  std::vector<Target> targets;
  std::vector<AdamSlot> slots;
  nlohmann::json saved_groups;
  nlohmann::json metadata;  // the file's, without kTorchMetaKey
};

Plan plan_restore(const MappedState& file, torch::nn::Module& module, torch::optim::Adam* optimizer,
                  const TorchNames& names) {
  Plan plan;
  plan.metadata = file.metadata();
  auto& targets = plan.targets;
  for (const auto& [name, t] : module_tensors(module)) {
    const std::string full = join(names.model, name);
    check_cpu(t, full);
    const bool contiguous = t.is_contiguous();
    targets.push_back({full, "parameter or buffer " + full, *to_cairn(t.scalar_type()), shape_of(t),
                       contiguous ? t : t.contiguous(), contiguous ? torch::Tensor() : t});
  }

  std::vector<std::string> prefixes = {names.model};
  if (optimizer != nullptr) {
    prefixes.push_back(names.optim);
    const std::string where = "restoring the optimizer from " + file.source();
    auto tm = plan.metadata.find(std::string(kTorchMetaKey));
    if (tm == plan.metadata.end() || !tm->contains("optimizer")) {
      throw Error(ErrorCode::kInvalidArgument, where + ": the file holds no optimizer state");
    }
    try {
      const auto& opt = (*tm)["optimizer"];
      if (opt.at("type") != "Adam") {
        throw Error(ErrorCode::kInvalidArgument, where + ": the file holds a " +
                                                     opt.at("type").get<std::string>() +
                                                     " optimizer, not Adam");
      }
      plan.saved_groups = opt.at("param_groups");
      const auto pnames = optimizer_param_names(*optimizer, &module);
      const auto& groups = optimizer->param_groups();
      if (plan.saved_groups.size() != groups.size()) {
        throw Error(ErrorCode::kInvalidArgument,
                    where + ": the file has " + std::to_string(plan.saved_groups.size()) +
                        " param groups, the optimizer " + std::to_string(groups.size()));
      }
      for (size_t g = 0; g < groups.size(); ++g) {
        const auto& sg = plan.saved_groups[g];
        const auto saved_names = sg.at("params").get<std::vector<std::string>>();
        const auto has_state = sg.at("has_state").get<std::vector<bool>>();
        if (saved_names != pnames[g] || has_state.size() != saved_names.size()) {
          throw Error(ErrorCode::kInvalidArgument,
                      where + ": param group " + std::to_string(g) + " has " +
                          std::to_string(pnames[g].size()) + " parameters here and " +
                          std::to_string(saved_names.size()) +
                          " in the file, or they are named differently");
        }
        const bool amsgrad = sg.at("amsgrad").get<bool>();
        const auto& params = groups[g].params();
        for (size_t i = 0; i < params.size(); ++i) {
          if (!has_state[i]) continue;
          const std::string base = join(names.optim, pnames[g][i]);
          const torch::Tensor& p = params[i];
          check_cpu(p, base);
          AdamSlot slot;
          slot.param = p;
          slot.exp_avg = empty_like_param(p);
          slot.exp_avg_sq = empty_like_param(p);
          const DType dt = *to_cairn(p.scalar_type());
          const std::string subj = "optimizer state " + base;
          targets.push_back(
              {base + ".exp_avg", subj + ".exp_avg", dt, shape_of(p), slot.exp_avg, {}});
          targets.push_back(
              {base + ".exp_avg_sq", subj + ".exp_avg_sq", dt, shape_of(p), slot.exp_avg_sq, {}});
          if (amsgrad) {
            slot.max_exp_avg_sq = empty_like_param(p);
            targets.push_back({base + ".max_exp_avg_sq",
                               subj + ".max_exp_avg_sq",
                               dt,
                               shape_of(p),
                               slot.max_exp_avg_sq,
                               {}});
          }
          slot.step_target = targets.size();
          targets.push_back({base + ".step",
                             subj + ".step",
                             DType::kI64,
                             {},
                             torch::empty(at::IntArrayRef{}, torch::kInt64),
                             {}});
          plan.slots.push_back(std::move(slot));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kCorruption, where + ": malformed \"" + std::string(kTorchMetaKey) +
                                              "\" metadata: " + e.what());
    }
  }
  check_targets(file, targets, prefixes);
  plan.metadata.erase(std::string(kTorchMetaKey));
  return plan;
}

// Phase 2, after the bytes are in the targets: copies into non-contiguous
// module tensors and installs the optimizer's state and options.
void finish_restore(Plan& plan, torch::optim::Adam* optimizer) {
  {
    torch::NoGradGuard no_grad;
    for (Target& t : plan.targets) {
      if (t.original.defined()) t.original.copy_(t.tensor);
    }
  }
  if (optimizer == nullptr) return;
  auto& groups = optimizer->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& sg = plan.saved_groups[g];
    auto& opts = static_cast<torch::optim::AdamOptions&>(groups[g].options());
    opts.lr(sg.at("lr").get<double>());
    opts.betas({sg.at("betas").at(0).get<double>(), sg.at("betas").at(1).get<double>()});
    opts.eps(sg.at("eps").get<double>());
    opts.weight_decay(sg.at("weight_decay").get<double>());
    opts.amsgrad(sg.at("amsgrad").get<bool>());
  }
  optimizer->state().clear();
  for (AdamSlot& slot : plan.slots) {
    auto s = std::make_unique<torch::optim::AdamParamState>();
    s->step(plan.targets[slot.step_target].tensor.item<int64_t>());
    s->exp_avg(slot.exp_avg);
    s->exp_avg_sq(slot.exp_avg_sq);
    if (slot.max_exp_avg_sq.defined()) s->max_exp_avg_sq(slot.max_exp_avg_sq);
    optimizer->state()[adam_key(slot.param)] = std::move(s);
  }
}

}  // namespace

nlohmann::json restore(const MappedState& file, torch::nn::Module& module,
                       torch::optim::Adam* optimizer, const TorchNames& names) {
  Plan plan = plan_restore(file, module, optimizer, names);
  for (Target& t : plan.targets) {
    TensorView v = file.tensor(t.name);
    std::memcpy(t.tensor.data_ptr(), v.bytes.data(), v.bytes.size());
  }
  finish_restore(plan, optimizer);
  return std::move(plan.metadata);
}

void save_file(const std::filesystem::path& path, torch::nn::Module& module,
               torch::optim::Adam* optimizer, const nlohmann::json& metadata,
               const SaveOptions& options) {
  cairn::save_file(state_dict(module, optimizer, metadata), path, options);
}

nlohmann::json load_file(const std::filesystem::path& path, torch::nn::Module& module,
                         torch::optim::Adam* optimizer) {
  return restore(MappedState::open(path), module, optimizer);
}

Manifest save_checkpoint(const Checkpoint& dest, torch::nn::Module& module,
                         torch::optim::Adam* optimizer, const nlohmann::json& metrics,
                         const nlohmann::json& metadata) {
  return cairn::save_checkpoint(state_dict(module, optimizer, metadata), dest, metrics);
}

nlohmann::json restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& module,
                                  torch::optim::Adam* optimizer) {
  return restore(MappedState::open(checkpoint.storage(), kStateFileName), module, optimizer);
}

std::optional<CheckpointRecord> save(StateCheckpointManager& manager, torch::nn::Module& module,
                                     torch::optim::Adam* optimizer, std::optional<uint64_t> step,
                                     const nlohmann::json& metrics,
                                     const nlohmann::json& metadata) {
  return manager.save(state_dict(module, optimizer, metadata), step, metrics);
}

std::optional<SaveHandle> save_async(StateCheckpointManager& manager, torch::nn::Module& module,
                                     torch::optim::Adam* optimizer, std::optional<uint64_t> step,
                                     const nlohmann::json& metrics,
                                     const nlohmann::json& metadata) {
  return manager.save_async(state_dict(module, optimizer, metadata), step, metrics);
}

nlohmann::json restore(const StateCheckpointManager& manager, torch::nn::Module& module,
                       torch::optim::Adam* optimizer, const CheckpointRecord* which) {
  std::optional<CheckpointRecord> record;
  if (which != nullptr) {
    record = *which;
  } else {
    record = manager.latest();
    if (!record) {
      throw Error(ErrorCode::kNotFound, "restoring the module: the manager has no checkpoint");
    }
  }
  Plan plan = plan_restore(manager.open(*record), module, optimizer, TorchNames{});
  StateDict state;
  for (Target& t : plan.targets) {
    std::span<std::byte> bytes(static_cast<std::byte*>(t.tensor.data_ptr()),
                               static_cast<size_t>(t.tensor.numel()) * t.tensor.element_size());
    state.add_mutable(t.name, t.dtype, t.shape, bytes);
  }
  // The engine's copying load: checks the manifest checksum and that every
  // saved tensor was consumed.
  manager.restore(state, *record);
  finish_restore(plan, optimizer);
  return std::move(plan.metadata);
}

}  // namespace cairn::libtorch
