// LibTorch adapter: a torch::nn::Module's parameters and buffers and a
// torch::optim::Adam's state, saved and restored through Cairn's state engine
// (StateDict, safetensors files, checkpoints and managers).
//
//   auto model = std::make_shared<Net>();
//   torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
//   ... train ...
//   cairn::libtorch::save_file("run/state.safetensors", *model, &adam, {{"epoch", 3}});
//   ... in a new process ...
//   nlohmann::json meta = cairn::libtorch::load_file("run/state.safetensors", *model, &adam);
//
// What is stored (names inside the safetensors file):
//   model.<name>                  every parameter and buffer, by the module's
//                                 own dotted names ("model.fc1.weight",
//                                 "model.bn.running_mean")
//   optim.<param>.step            Adam's step count (I64, shape [])
//   optim.<param>.exp_avg         first moment (the parameter's dtype and shape)
//   optim.<param>.exp_avg_sq      second moment
//   optim.<param>.max_exp_avg_sq  only with amsgrad
//   metadata["cairn.torch"]       the optimizer's param_groups (lr, betas, eps,
//                                 weight_decay, amsgrad and the names of their
//                                 parameters, in order)
// <param> is the parameter's name in the module given alongside the optimizer,
// or "group<g>.param<i>" for a parameter that module does not own. The prefixes
// "model" and "optim" can be changed (TorchNames). Everything else in
// StateDict::metadata is the caller's (epoch, loss, ...) and round-trips.
//
// Restoring is strict, like torch's load_state_dict(strict=true) and
// TensorFlow's assert_consumed: every parameter, buffer and optimizer slot must
// be in the file with the same dtype and shape, and the file must hold nothing
// else under the adapter's prefixes; otherwise restoring throws
// cairn::Error(kInvalidArgument) naming each parameter at fault and its two
// shapes, before any tensor is changed. The optimizer must have the same
// param groups with the same number of parameters as when saved.
//
// Bitwise resume: after a restore, the model's tensors and the optimizer's
// state hold exactly the saved bytes, and its options exactly the saved
// values, so the next optimizer step is bit-for-bit the step the saving
// process would have taken.
//
// Tensors must live on the CPU. Contiguous tensors are saved without a copy
// (the StateDict views their memory: keep the module alive and unchanged until
// the save returns; AsyncSaver::save copies them before returning) and
// restored in place. Only Adam is supported as an optimizer.
//
// Thread-safety: none of these functions may run while another thread uses
// the module or the optimizer.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <nlohmann/json.hpp>

#include "cairn/state.h"
#include "cairn/state_manager.h"

namespace cairn::libtorch {

// Name prefixes of the entries the adapter writes.
struct TorchNames {
  std::string model = "model";
  std::string optim = "optim";
};

// Adds every parameter and buffer of `module` to `state` as
// "<names.model>.<name>" (writable entries viewing the tensors' memory, so
// the same StateDict can be saved from and loaded into). A non-contiguous
// tensor is added as a contiguous copy (saving works; loading into it does not
// reach the module: use restore()). Throws kInvalidArgument naming a tensor
// that is not on the CPU or has a dtype safetensors cannot hold.
void add_module(StateDict& state, torch::nn::Module& module, const TorchNames& names = {});

// Adds `optimizer`'s per-parameter state and param_groups (see the file
// comment). `module` names the parameters; may be null (then every parameter
// is named "group<g>.param<i>"). Parameters without state yet (before the
// first step) are recorded as such and get no tensors.
void add_adam(StateDict& state, torch::optim::Adam& optimizer, const torch::nn::Module* module,
              const TorchNames& names = {});

// Both of the above in a new StateDict, with `metadata` as its metadata (plus
// "cairn.torch"). `optimizer` may be null.
StateDict state_dict(torch::nn::Module& module, torch::optim::Adam* optimizer,
                     const nlohmann::json& metadata = nlohmann::json::object(),
                     const TorchNames& names = {});

// Restores `module` (and `optimizer`, when not null) from a mapped file,
// strictly (see the file comment). Returns the file's metadata without
// "cairn.torch". Nothing is changed when an error is thrown for a mismatch.
nlohmann::json restore(const MappedState& file, torch::nn::Module& module,
                       torch::optim::Adam* optimizer, const TorchNames& names = {});

// Saves to / restores from a local safetensors file (durable and atomic:
// save_file in state.h).
void save_file(const std::filesystem::path& path, torch::nn::Module& module,
               torch::optim::Adam* optimizer,
               const nlohmann::json& metadata = nlohmann::json::object(),
               const SaveOptions& options = {});
nlohmann::json load_file(const std::filesystem::path& path, torch::nn::Module& module,
                         torch::optim::Adam* optimizer);

// Saves into the uncommitted checkpoint `dest` as kStateFileName and commits
// it with `metrics` (save_checkpoint in state.h); restores from a committed
// checkpoint's kStateFileName.
Manifest save_checkpoint(const Checkpoint& dest, torch::nn::Module& module,
                         torch::optim::Adam* optimizer,
                         const nlohmann::json& metrics = nlohmann::json::object(),
                         const nlohmann::json& metadata = nlohmann::json::object());
nlohmann::json restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& module,
                                  torch::optim::Adam* optimizer);

// Through a StateCheckpointManager (state_manager.h): save() and
// save_async() save the state as the manager's next checkpoint (subject to
// its checkpoint_interval; nullopt when skipped). save_async() returns once
// the module's and optimizer's tensors are copied, so training may go on;
// with the manager's async.when_busy = WhenBusy::kSkip its handle may report
// skipped() instead (async_save.h).
// restore() loads the latest checkpoint (or `which`) with the manager's
// checksum and assert_consumed checks, and returns its metadata (with the
// manager's "step").
std::optional<CheckpointRecord> save(StateCheckpointManager& manager, torch::nn::Module& module,
                                     torch::optim::Adam* optimizer,
                                     std::optional<uint64_t> step = std::nullopt,
                                     const nlohmann::json& metrics = nlohmann::json::object(),
                                     const nlohmann::json& metadata = nlohmann::json::object());
std::optional<SaveHandle> save_async(StateCheckpointManager& manager, torch::nn::Module& module,
                                     torch::optim::Adam* optimizer,
                                     std::optional<uint64_t> step = std::nullopt,
                                     const nlohmann::json& metrics = nlohmann::json::object(),
                                     const nlohmann::json& metadata = nlohmann::json::object());
nlohmann::json restore(const StateCheckpointManager& manager, torch::nn::Module& module,
                       torch::optim::Adam* optimizer, const CheckpointRecord* which = nullptr);

}  // namespace cairn::libtorch
