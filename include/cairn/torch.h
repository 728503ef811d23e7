// LibTorch adapter: a torch::nn::Module's parameters and buffers, an
// optimizer's state, an LR scheduler's position and the random generators,
// saved and restored through Cairn's state engine (StateDict, safetensors
// files, checkpoints and managers), in files the PyTorch and Hugging Face
// world loads as they are.
//
//   auto model = std::make_shared<Net>();
//   torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   torch::optim::StepLR sched(opt, 10);
//   ... train ...
//   cairn::libtorch::save_file("run/state.safetensors", *model, {&opt, &sched, true},
//                              {{"epoch", 3}});
//   ... in a new process ...
//   nlohmann::json meta =
//       cairn::libtorch::load_file("run/state.safetensors", *model, {&opt, &sched, true});
//
//   // Weights alone, as Hugging Face's save_pretrained/from_pretrained:
//   cairn::libtorch::save_pretrained("out/", *model);   // model.safetensors or shards + index
//   auto report = cairn::libtorch::load_pretrained("out/", *model, {.strict = false});
//
// What is stored (names inside the safetensors file):
//   <name>                     every parameter and buffer, by the module's own
//                              dotted names ("fc1.weight", "bn.running_mean"),
//                              as PyTorch's state_dict() names them
//   optim.<param>.<field>      the optimizer's state for that parameter:
//                              tensors, and scalars as 0-d tensors (step: I64,
//                              LBFGS's t and prev_loss: F64); LBFGS's history
//                              lists as <field>.count and <field>.<i>
//   rng.cpu                    the default CPU generator's state (U8), and
//   rng.cuda.<device>          each CUDA device's, when asked for
//   metadata "format"          "pt", as transformers and safetensors expect
//   metadata "cairn.torch"     the optimizer's type and param groups (options
//                              and parameter names in order), the scheduler's
//                              step count, and the prefixes used
// <param> is the parameter's name in the module given alongside the optimizer,
// or "group<g>.param<i>" for a parameter that module does not own. The module
// prefix (none by default, so the weights load into PyTorch as they are) and
// the "optim" and "rng" prefixes are set with TorchNames; a file records them,
// so restoring reads it the way it was written. Everything else in
// StateDict::metadata is the caller's (epoch, loss, ...) and round-trips.
//
// Optimizers: every one LibTorch ships (SGD, Adam, AdamW, RMSprop, Adagrad,
// LBFGS). Others are kInvalidArgument naming their type. Schedulers: any
// torch::optim::LRScheduler; its step count is stored (the learning rates
// live in the optimizer's options); a scheduler subclass with state of its
// own must save that itself (in the metadata).
//
// restore() and friends are strict, like torch's load_state_dict(strict=true)
// and TensorFlow's assert_consumed: every parameter, buffer and optimizer
// slot must be in the file with the same dtype and shape, and the file must
// hold no other weights; otherwise they throw cairn::Error(kInvalidArgument)
// naming each tensor at fault and its two shapes, before any tensor is
// changed. The optimizer must be of the saved type, with the same param
// groups holding the same parameters. load_state_dict() / load_pretrained()
// load weights alone, strict or not, from any plain PyTorch or Hugging Face
// safetensors state dict, and report missing and unexpected keys.
//
// Bitwise resume: after a restore, the model's tensors and the optimizer's
// state hold exactly the saved bytes, its options exactly the saved values,
// the scheduler its step count and the generators their state, so the next
// step is bit-for-bit the step the saving process would have taken.
//
// Tensors must live on the CPU, or on a CUDA device when Cairn is built with
// CAIRN_CUDA and a CUDA LibTorch (docs/gpu.md): CUDA tensors become device
// entries (cairn/device.h) whose producer is the caller's current CUDA
// stream, saved through device-to-host copies ordered after the work queued
// on it, and restored into the same device (an optimizer's state is put on
// its parameter's device). Contiguous tensors are saved without a copy
// (the StateDict views their memory: keep the module alive and unchanged until
// the save returns; AsyncSaver::save copies them before returning) and
// restored in place.
//
// Thread-safety: none of these functions may run while another thread uses
// the module, the optimizer or the scheduler. RNG state is read and written
// under the generator's own lock.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim.h>  // every optimizer and scheduler the adapter handles
#include <nlohmann/json.hpp>

#include "cairn/state.h"
#include "cairn/state_manager.h"

namespace cairn::libtorch {

// Name prefixes of the entries the adapter writes. An empty model prefix
// stores weights under their plain names; otherwise "<model>.<name>".
struct TorchNames {
  std::string model;
  std::string optim = "optim";
  std::string rng = "rng";
};

// What is saved and restored alongside a module. Converts from an optimizer
// pointer, so `save_file(path, *net, &adam)` reads as before.
struct TrainState {
  TrainState(torch::optim::Optimizer* optimizer = nullptr,  // NOLINT: implicit on purpose
             torch::optim::LRScheduler* scheduler = nullptr, bool rng = false)
      : optimizer(optimizer), scheduler(scheduler), rng(rng) {}

  torch::optim::Optimizer* optimizer;    // its state, options and param groups
  torch::optim::LRScheduler* scheduler;  // its step count (needs the optimizer)
  bool rng;                              // the default generators' state
};

// Adds every parameter and buffer of `module` to `state` under its (prefixed)
// name (writable entries viewing the tensors' memory, so the same StateDict
// can be saved from and loaded into). A non-contiguous tensor is added as a
// contiguous copy (saving works; loading into it does not reach the module:
// use restore()). Throws kInvalidArgument naming a tensor that is not on the
// CPU (or CUDA, see above) or has a dtype safetensors cannot hold, or, with no model prefix, a
// weight whose name falls under the optim or rng prefix.
void add_module(StateDict& state, torch::nn::Module& module, const TorchNames& names = {});

// Adds `optimizer`'s per-parameter state and param groups (see the file
// comment). `module` names the parameters; may be null (then every parameter
// is named "group<g>.param<i>"). Parameters without state yet (before the
// first step) are recorded as such and get no tensors.
void add_optimizer(StateDict& state, torch::optim::Optimizer& optimizer,
                   const torch::nn::Module* module, const TorchNames& names = {});
// Records the scheduler's step count in the metadata.
void add_scheduler(StateDict& state, torch::optim::LRScheduler& scheduler);
// Adds the default CPU generator's state, and each CUDA device's where CUDA
// is available.
void add_rng(StateDict& state, const TorchNames& names = {});

// The module and `train` in a new StateDict, with `metadata` (a JSON object;
// null is none) as its metadata (plus "cairn.torch") and string metadata
// "format": "pt".
StateDict state_dict(torch::nn::Module& module, const TrainState& train = {},
                     const nlohmann::json& metadata = nlohmann::json::object(),
                     const TorchNames& names = {});

// Restores `module` and `train` from a mapped file, strictly (see the file
// comment). Returns the file's metadata without "cairn.torch". Nothing is
// changed when an error is thrown for a mismatch. `names` is used only for a
// file that does not record its prefixes (one not written by this adapter).
nlohmann::json restore(const MappedState& file, torch::nn::Module& module,
                       const TrainState& train = {}, const TorchNames& names = {});

// Saves to / restores from a local safetensors file (durable and atomic:
// save_file in state.h).
void save_file(const std::filesystem::path& path, torch::nn::Module& module,
               const TrainState& train = {},
               const nlohmann::json& metadata = nlohmann::json::object(),
               const SaveOptions& options = {});
nlohmann::json load_file(const std::filesystem::path& path, torch::nn::Module& module,
                         const TrainState& train = {});

// Saves into the uncommitted checkpoint `dest` as kStateFileName and commits
// it with `metrics` (save_checkpoint in state.h); restores from a committed
// checkpoint's kStateFileName.
Manifest save_checkpoint(const Checkpoint& dest, torch::nn::Module& module,
                         const TrainState& train = {},
                         const nlohmann::json& metrics = nlohmann::json::object(),
                         const nlohmann::json& metadata = nlohmann::json::object());
nlohmann::json restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& module,
                                  const TrainState& train = {});

// Through a StateCheckpointManager (state_manager.h): save() and
// save_async() save the state as the manager's next checkpoint (subject to
// its checkpoint_interval; nullopt when skipped). save_async() returns once
// the tensors are copied, so training may go on; with the manager's
// async.when_busy = WhenBusy::kSkip its handle may report skipped() instead
// (async_save.h). restore() loads the latest checkpoint (or `which`) with the
// manager's checksum and assert_consumed checks, and returns its metadata
// (with the manager's "step").
std::optional<CheckpointRecord> save(StateCheckpointManager& manager, torch::nn::Module& module,
                                     const TrainState& train = {},
                                     std::optional<uint64_t> step = std::nullopt,
                                     const nlohmann::json& metrics = nlohmann::json::object(),
                                     const nlohmann::json& metadata = nlohmann::json::object());
std::optional<SaveHandle> save_async(StateCheckpointManager& manager, torch::nn::Module& module,
                                     const TrainState& train = {},
                                     std::optional<uint64_t> step = std::nullopt,
                                     const nlohmann::json& metrics = nlohmann::json::object(),
                                     const nlohmann::json& metadata = nlohmann::json::object());
nlohmann::json restore(const StateCheckpointManager& manager, torch::nn::Module& module,
                       const TrainState& train = {}, const CheckpointRecord* which = nullptr);

// ---- Weights alone, PyTorch / Hugging Face style ----

struct LoadStateOptions {
  // Missing or unexpected keys are an error (nothing is changed), as in
  // load_state_dict(strict=True). Without it they are reported and the
  // matching tensors loaded.
  bool strict = true;
  // A tensor stored in another dtype is converted (as torch's copy_ does);
  // without it that is an error. A shape that differs is always an error.
  bool convert_dtype = false;
  // The file's names are "<prefix>.<module name>"; unset: the prefix the file
  // records (this adapter's files), else none. File tensors outside the
  // prefix are unexpected.
  std::optional<std::string> prefix = std::nullopt;
};

struct LoadStateReport {
  std::vector<std::string> missing_keys;     // module tensors not in the file (left as they were)
  std::vector<std::string> unexpected_keys;  // file tensors the module does not have
  std::vector<std::string> converted_keys;   // loaded with a dtype conversion
  std::map<std::string, std::string> metadata;  // the file's __metadata__ (first shard's)
};

// Loads a module's weights from a safetensors state dict (any writer:
// PyTorch, Hugging Face, this adapter; an optimizer's or generator's entries
// in this adapter's files are neither loaded nor unexpected). Shape or
// (without convert_dtype) dtype mismatches, and with strict missing or
// unexpected keys, are kInvalidArgument naming every tensor at fault, before
// any tensor is changed.
LoadStateReport load_state_dict(const MappedState& file, torch::nn::Module& module,
                                const LoadStateOptions& options = {});

struct PretrainedOptions {
  // Largest shard, in bytes of tensor data (Hugging Face's max_shard_size; a
  // tensor larger than this gets a shard of its own).
  uint64_t max_shard_size = 5'000'000'000;
  // File name of the unsharded weights; shards are "<stem>-00001-of-0000N<ext>"
  // and the index "<name>.index.json", as transformers names them.
  std::string weights_name = "model.safetensors";
  // More __metadata__ strings for every file ("format": "pt" is always set).
  std::map<std::string, std::string> metadata = {};
  SaveOptions write = {};
};

// Writes the module's weights (plain names) into the folder at a local path
// or URI (created if needed): one file `weights_name` when they fit one shard,
// else numbered shards and an index {"metadata": {"total_size": bytes},
// "weight_map": {name: file}}. Each file is durable when written and the
// index is written last; weights files of an earlier save that the new one
// does not use are removed after it. Returns the files written, in order.
std::vector<std::string> save_pretrained(std::string_view directory_or_uri,
                                         torch::nn::Module& module,
                                         const PretrainedOptions& options = {});

// Loads weights saved by save_pretrained or by Hugging Face: `path_or_uri`
// is a safetensors file, or a folder holding `weights_name`'s index (sharded)
// or `weights_name`. kNotFound naming the folder if it holds neither;
// kCorruption naming the index if it is malformed or names a missing shard.
LoadStateReport load_pretrained(std::string_view path_or_uri, torch::nn::Module& module,
                                const LoadStateOptions& options = {},
                                std::string_view weights_name = "model.safetensors");

}  // namespace cairn::libtorch
