// LibTorch adapter (include/cairn/torch.h): whole training state.
//
// Restoring works in two phases so that a mismatch changes nothing: first
// every target tensor is paired with its file tensor and checked (dtype,
// shape, presence both ways), the optimizer's state is decoded once from
// tensors not yet filled to check its fields and options, and every problem
// is collected into one error; only then are bytes copied and the
// optimizer's state and options, the scheduler and the generators replaced.
#include "cairn/torch.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "adapter_tensors.h"
#include "cairn/error.h"
#include "optimizer_codecs.h"

namespace cairn::libtorch {
namespace {

using namespace libtorch_internal;  // NOLINT: the adapter's own internals

constexpr std::string_view kTorchMetaKey = "cairn.torch";

nlohmann::json& torch_meta(StateDict& state) {
  nlohmann::json& tm = state.metadata[std::string(kTorchMetaKey)];
  if (!tm.is_object()) tm = nlohmann::json::object();
  return tm;
}

void record_names(StateDict& state, const TorchNames& names) {
  nlohmann::json& tm = torch_meta(state);
  tm["model_prefix"] = names.model;
  tm["optim_prefix"] = names.optim;
  tm["rng_prefix"] = names.rng;
}

// A scheduler's step count is protected; a derived type may name it.
struct SchedulerAccess : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& s) {
    return s.*(&SchedulerAccess::step_count_);
  }
};

// A CUDA device's default generator: getDefaultGenerator() in LibTorch 2.x,
// getDefaultCUDAGenerator() in 1.x (the int/long tag prefers the first).
template <class Hooks>
auto default_cuda_generator(const Hooks& hooks, c10::DeviceIndex i, int)
    -> decltype(hooks.getDefaultGenerator(i)) {
  return hooks.getDefaultGenerator(i);
}
template <class Hooks>
auto default_cuda_generator(const Hooks& hooks, c10::DeviceIndex i, long)
    -> decltype(hooks.getDefaultCUDAGenerator(i)) {
  return hooks.getDefaultCUDAGenerator(i);
}

// The default generators whose state add_rng() saves, with their entry
// names: the CPU's, then each CUDA device's when CUDA is available.
std::vector<std::pair<std::string, at::Generator>> generators(const TorchNames& names) {
  std::vector<std::pair<std::string, at::Generator>> out;
  out.emplace_back(join(names.rng, "cpu"), at::detail::getDefaultCPUGenerator());
  if (torch::cuda::is_available()) {
    const auto n = static_cast<int64_t>(torch::cuda::device_count());
    for (int64_t i = 0; i < n; ++i) {
      out.emplace_back(
          join(names.rng, "cuda." + std::to_string(i)),
          default_cuda_generator(at::detail::getCUDAHooks(), static_cast<c10::DeviceIndex>(i), 0));
    }
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
std::vector<std::vector<std::string>> optimizer_param_names(
    const torch::optim::Optimizer& optimizer, const torch::nn::Module* module) {
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

}  // namespace

void add_module(StateDict& state, torch::nn::Module& module, const TorchNames& names) {
  for (const auto& [name, t] : module_tensors(module)) {
    if (names.model.empty() && (has_prefix(name, names.optim) || has_prefix(name, names.rng))) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: a module weight under the optimizer's or generators' prefix "
                              "(\"{}\", \"{}\"); set TorchNames::model or rename them",
                              name, names.optim, names.rng));
    }
    add_tensor(state, join(names.model, name), t);
  }
  record_names(state, names);
}

void add_optimizer(StateDict& state, torch::optim::Optimizer& optimizer,
                   const torch::nn::Module* module, const TorchNames& names) {
  const OptimizerCodec& codec = codec_of(optimizer);
  const auto pnames = optimizer_param_names(optimizer, module);
  nlohmann::json groups = nlohmann::json::array();
  const auto& param_groups = optimizer.param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    nlohmann::json group = codec.options(param_groups[g].options());
    group["params"] = pnames[g];
    group["has_state"] = nlohmann::json::array();
    const auto& params = param_groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = optimizer.state().find(state_key(params[i]));
      const bool has_state = it != optimizer.state().end();
      group["has_state"].push_back(has_state);
      if (!has_state) continue;
      const std::string base = join(names.optim, pnames[g][i]);
      for (const auto& [field, t] : codec.fields(*it->second))
        add_tensor(state, base + "." + field, t);
    }
    groups.push_back(std::move(group));
  }
  nlohmann::json& tm = torch_meta(state);
  tm["optimizer"] = {{"type", codec.type}, {"param_groups", std::move(groups)}};
  record_names(state, names);
}

void add_scheduler(StateDict& state, torch::optim::LRScheduler& scheduler) {
  torch_meta(state)["scheduler"] = {{"step_count", SchedulerAccess::step_count(scheduler)}};
}

void add_rng(StateDict& state, const TorchNames& names) {
  nlohmann::json devices = nlohmann::json::array();
  for (auto& [name, gen] : generators(names)) {
    torch::Tensor s;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      s = gen.get_state();
    }
    add_tensor(state, name, s);
    devices.push_back(name);
  }
  torch_meta(state)["rng"] = std::move(devices);
  record_names(state, names);
}

StateDict state_dict(torch::nn::Module& module, const TrainState& train,
                     const nlohmann::json& metadata, const TorchNames& names) {
  if (!metadata.is_object() && !metadata.is_null()) {
    throw Error(ErrorCode::kInvalidArgument, "state_dict: metadata must be a JSON object");
  }
  StateDict state;
  if (metadata.is_object()) state.metadata = metadata;
  state.string_metadata["format"] = "pt";
  add_module(state, module, names);
  if (train.optimizer != nullptr) add_optimizer(state, *train.optimizer, &module, names);
  if (train.scheduler != nullptr) add_scheduler(state, *train.scheduler);
  if (train.rng) add_rng(state, names);
  return state;
}

namespace {

// One tensor to restore: where its bytes go and what the file must hold.
struct Target {
  std::string name;     // full entry name
  std::string subject;  // for messages: "parameter fc1.weight"
  DType dtype;
  Shape shape;
  torch::Tensor tensor;    // contiguous CPU tensor receiving the bytes
  torch::Tensor original;  // the module's tensor when `tensor` is a copy (non-contiguous)
};

// A parameter's optimizer state: its fields' targets.
struct OptimSlot {
  torch::Tensor param;
  std::string where;                                   // "optim.fc1.weight"
  std::vector<std::pair<std::string, size_t>> fields;  // field -> target index
};

// Phase 1 of a restore: every tensor to fill, checked against the file.
struct Plan {
  std::vector<Target> targets;
  const OptimizerCodec* codec = nullptr;
  std::vector<OptimSlot> slots;
  nlohmann::json saved_groups;
  std::optional<unsigned> scheduler_steps;
  std::vector<std::pair<at::Generator, size_t>> generators;  // -> target index
  nlohmann::json metadata;                                   // the file's, without kTorchMetaKey
};

// The file's tensors whose names start with `prefix`.
std::vector<const TensorInfo*> entries_under(const SafetensorsHeader& header,
                                             const std::string& prefix) {
  std::vector<const TensorInfo*> out;
  if (header.by_name.size() == header.tensors.size()) {
    auto it = std::lower_bound(
        header.by_name.begin(), header.by_name.end(), prefix,
        [&](size_t pos, const std::string& p) { return header.tensors[pos].name < p; });
    for (; it != header.by_name.end(); ++it) {
      const TensorInfo& info = header.tensors[*it];
      if (info.name.compare(0, prefix.size(), prefix) != 0) break;
      out.push_back(&info);
    }
  } else {
    for (const TensorInfo& info : header.tensors) {
      if (info.name.compare(0, prefix.size(), prefix) == 0) out.push_back(&info);
    }
  }
  return out;
}

// A target for a file tensor, of its dtype and shape. Scalars are read at
// once: decoding the optimizer's state in phase 1 needs its counts.
size_t add_target_for(Plan& plan, const MappedState& file, const TensorInfo& info,
                      std::string subject) {
  if (!to_torch(info.dtype)) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: dtype {} has no LibTorch equivalent",
                                                         info.name, dtype_name(info.dtype)));
  }
  torch::Tensor t = empty_for(info.dtype, info.shape);
  if (t.numel() == 1) {
    TensorView v = file.tensor(info.name);
    std::memcpy(t.data_ptr(), v.bytes.data(), v.bytes.size());
  }
  plan.targets.push_back({info.name, std::move(subject), info.dtype, info.shape, t, {}});
  return plan.targets.size() - 1;
}

// Decodes a slot's state from its targets' tensors (filled or not); with
// `install`, on the parameter's device (the state the optimizer gets).
std::unique_ptr<torch::optim::OptimizerParamState> decode_slot(const Plan& plan,
                                                               const OptimSlot& slot,
                                                               bool install = false) {
  std::map<std::string, torch::Tensor> fields;
  for (const auto& [field, index] : slot.fields) fields.emplace(field, plan.targets[index].tensor);
  FieldReader reader(std::move(fields), slot.where, slot.param, install);
  auto state = plan.codec->from_fields(reader);
  reader.finish();
  return state;
}

// Adds the optimizer's slots to the plan; a slot whose fields do not fit
// goes into `problems`, with the module's.
void plan_optimizer(Plan& plan, const MappedState& file, const nlohmann::json& tm,
                    const std::string& where, torch::nn::Module& module,
                    torch::optim::Optimizer& optimizer, const std::string& optim_prefix,
                    std::vector<std::string>& problems) {
  const OptimizerCodec& mine = codec_of(optimizer);
  const SafetensorsHeader& header = file.header();
  if (!tm.contains("optimizer")) {
    throw Error(ErrorCode::kInvalidArgument, where + ": the file holds no optimizer state");
  }
  try {
    const auto& opt = tm.at("optimizer");
    const std::string type = opt.at("type").get<std::string>();
    if (type != mine.type) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the file holds a {} optimizer, not {}", where, type, mine.type));
    }
    plan.codec = &mine;
    plan.saved_groups = opt.at("param_groups");
    const auto pnames = optimizer_param_names(optimizer, &module);
    const auto& groups = optimizer.param_groups();
    if (plan.saved_groups.size() != groups.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the file has {} param groups, the optimizer {}", where,
                              plan.saved_groups.size(), groups.size()));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& sg = plan.saved_groups[g];
      // The options must decode (checked on a copy).
      mine.set_options(*groups[g].options().clone(), sg);
      const auto saved_names = sg.at("params").get<std::vector<std::string>>();
      const auto has_state = sg.at("has_state").get<std::vector<bool>>();
      if (saved_names != pnames[g] || has_state.size() != saved_names.size()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{}: param group {} has {} parameters here and {} in the file, "
                                "or they are named differently",
                                where, g, pnames[g].size(), saved_names.size()));
      }
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        if (!has_state[i]) continue;
        OptimSlot slot;
        slot.param = params[i];
        slot.where = join(optim_prefix, pnames[g][i]);
        check_tensor(slot.param, slot.where);
        const std::string prefix = slot.where + ".";
        for (const TensorInfo* info : entries_under(header, prefix)) {
          slot.fields.emplace_back(
              info->name.substr(prefix.size()),
              add_target_for(plan, file, *info, "optimizer state " + info->name));
        }
        try {
          decode_slot(plan, slot);  // checks fields, dtypes and shapes
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kInvalidArgument) throw;
          problems.push_back(e.what());
        }
        plan.slots.push_back(std::move(slot));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: malformed \"{}\" metadata: {}", where, kTorchMetaKey, e.what()));
  }
}

// `consume_all`: every file tensor becomes a target (the manager's copying
// load checks that each is consumed); entries of parts not restored are
// read and dropped.
Plan plan_restore(const MappedState& file, torch::nn::Module& module, const TrainState& train,
                  const TorchNames& fallback, bool consume_all) {
  const SafetensorsHeader& header = file.header();
  Plan plan;
  plan.metadata = file.metadata();
  nlohmann::json tm = nlohmann::json::object();
  if (auto it = plan.metadata.find(std::string(kTorchMetaKey));
      it != plan.metadata.end() && it->is_object()) {
    tm = *it;
  }
  auto prefix = [&](const char* key, const std::string& fallback_value) {
    auto it = tm.find(key);
    return it != tm.end() && it->is_string() ? it->get<std::string>() : fallback_value;
  };
  const std::string model_prefix = prefix("model_prefix", fallback.model);
  const std::string optim_prefix = prefix("optim_prefix", fallback.optim);
  const std::string rng_prefix = prefix("rng_prefix", fallback.rng);

  std::vector<std::string> problems;
  auto& targets = plan.targets;
  for (const auto& [name, t] : module_tensors(module)) {
    const std::string full = join(model_prefix, name);
    check_tensor(t, full);
    const bool contiguous = t.is_contiguous();
    targets.push_back({full, "parameter or buffer " + full, *to_cairn(t.scalar_type()), shape_of(t),
                       contiguous ? t : t.contiguous(), contiguous ? torch::Tensor() : t});
  }
  for (const Target& t : targets) {
    const TensorInfo* info = header.find(t.name);
    if (info == nullptr) {
      problems.push_back(t.subject + " is missing from the file");
    } else if (info->dtype != t.dtype || info->shape != t.shape) {
      problems.push_back(t.subject + " is " + shape_str(info->dtype, info->shape) +
                         " in the file but " + shape_str(t.dtype, t.shape) + " here");
    }
  }

  if (train.optimizer != nullptr) {
    plan_optimizer(plan, file, tm, "restoring the optimizer from " + file.source(), module,
                   *train.optimizer, optim_prefix, problems);
  }
  if (train.scheduler != nullptr) {
    auto it = tm.find("scheduler");
    if (it == tm.end() || !it->is_object() || !it->contains("step_count") ||
        !(*it)["step_count"].is_number_unsigned()) {
      throw Error(ErrorCode::kInvalidArgument, "restoring the scheduler from " + file.source() +
                                                   ": the file holds no scheduler state");
    }
    plan.scheduler_steps = (*it)["step_count"].get<unsigned>();
  }
  if (train.rng) {
    for (auto& [name, gen] : generators({model_prefix, optim_prefix, rng_prefix})) {
      const TensorInfo* info = header.find(name);
      if (info == nullptr) {
        problems.push_back("generator state " + name + " is missing from the file");
        continue;
      }
      if (info->dtype != DType::kU8 || info->shape.size() != 1) {
        problems.push_back("generator state " + name + " is " +
                           shape_str(info->dtype, info->shape) + " in the file, not U8[n]");
        continue;
      }
      plan.generators.emplace_back(gen,
                                   add_target_for(plan, file, *info, "generator state " + name));
    }
  }

  // Every file tensor not claimed: a weight the module lacks, or a part not
  // restored.
  std::set<std::string_view> claimed;
  for (const Target& t : targets) claimed.insert(t.name);
  std::vector<const TensorInfo*> dropped;
  for (const TensorInfo& info : header.tensors) {
    if (claimed.count(info.name)) continue;
    const bool optim = has_prefix(info.name, optim_prefix);
    const bool rng = has_prefix(info.name, rng_prefix);
    const bool weight = model_prefix.empty() ? !optim && !rng : has_prefix(info.name, model_prefix);
    if (weight || (optim && train.optimizer != nullptr)) {
      problems.push_back(info.name + " is in the file but not in the " +
                         (weight ? "module" : "optimizer's state"));
    } else {
      dropped.push_back(&info);
    }
  }
  if (!problems.empty()) {
    std::string msg = "restoring from " + file.source() + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw Error(ErrorCode::kInvalidArgument, msg);
  }
  if (consume_all) {
    for (const TensorInfo* info : dropped) add_target_for(plan, file, *info, info->name);
  }
  plan.metadata.erase(std::string(kTorchMetaKey));
  return plan;
}

// Phase 2, after the bytes are in the targets: copies into non-contiguous
// module tensors and installs the optimizer's state and options, the
// scheduler's step count and the generators' state.
void finish_restore(Plan& plan, const TrainState& train) {
  {
    torch::NoGradGuard no_grad;
    for (Target& t : plan.targets) {
      if (t.original.defined()) t.original.copy_(t.tensor);
    }
  }
  if (train.optimizer != nullptr) {
    auto& groups = train.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      plan.codec->set_options(groups[g].options(), plan.saved_groups[g]);
    }
    train.optimizer->state().clear();
    for (const OptimSlot& slot : plan.slots) {
      train.optimizer->state()[state_key(slot.param)] = decode_slot(plan, slot, /*install=*/true);
    }
  }
  if (train.scheduler != nullptr) {
    SchedulerAccess::step_count(*train.scheduler) = *plan.scheduler_steps;
  }
  for (auto& [gen, index] : plan.generators) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(plan.targets[index].tensor);
  }
}

}  // namespace

nlohmann::json restore(const MappedState& file, torch::nn::Module& module, const TrainState& train,
                       const TorchNames& names) {
  Plan plan = plan_restore(file, module, train, names, /*consume_all=*/false);
  for (Target& t : plan.targets) {
    copy_into(t.tensor, file.tensor(t.name));
  }
  finish_restore(plan, train);
  return std::move(plan.metadata);
}

void save_file(const std::filesystem::path& path, torch::nn::Module& module,
               const TrainState& train, const nlohmann::json& metadata,
               const SaveOptions& options) {
  cairn::save_file(state_dict(module, train, metadata), path, options);
}

nlohmann::json load_file(const std::filesystem::path& path, torch::nn::Module& module,
                         const TrainState& train) {
  return restore(MappedState::open(path), module, train);
}

Manifest save_checkpoint(const Checkpoint& dest, torch::nn::Module& module, const TrainState& train,
                         const nlohmann::json& metrics, const nlohmann::json& metadata) {
  return cairn::save_checkpoint(state_dict(module, train, metadata), dest, metrics);
}

nlohmann::json restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& module,
                                  const TrainState& train) {
  return restore(MappedState::open(checkpoint.storage(), kStateFileName), module, train);
}

std::optional<CheckpointRecord> save(StateCheckpointManager& manager, torch::nn::Module& module,
                                     const TrainState& train, std::optional<uint64_t> step,
                                     const nlohmann::json& metrics,
                                     const nlohmann::json& metadata) {
  return manager.save(state_dict(module, train, metadata), step, metrics);
}

std::optional<SaveHandle> save_async(StateCheckpointManager& manager, torch::nn::Module& module,
                                     const TrainState& train, std::optional<uint64_t> step,
                                     const nlohmann::json& metrics,
                                     const nlohmann::json& metadata) {
  return manager.save_async(state_dict(module, train, metadata), step, metrics);
}

nlohmann::json restore(const StateCheckpointManager& manager, torch::nn::Module& module,
                       const TrainState& train, const CheckpointRecord* which) {
  std::optional<CheckpointRecord> record;
  if (which != nullptr) {
    record = *which;
  } else {
    record = manager.latest();
    if (!record) {
      throw Error(ErrorCode::kNotFound, "restoring the module: the manager has no checkpoint");
    }
  }
  Plan plan = plan_restore(manager.open(*record), module, train, TorchNames{},
                           /*consume_all=*/true);
  StateDict state;
  // Writable entries viewing the targets: CUDA ones load straight into the
  // device through pinned bounce buffers.
  for (Target& t : plan.targets) add_tensor(state, t.name, t.tensor);
  // The engine's copying load: checks the manifest checksum and that every
  // saved tensor was consumed.
  manager.restore(state, *record);
  finish_restore(plan, train);
  return std::move(plan.metadata);
}

}  // namespace cairn::libtorch
