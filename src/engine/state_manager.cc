// StateCheckpointManager: tf.train.CheckpointManager's interface over the
// foundation's CheckpointManager. This file adds only the step counter, the
// interval check and the state file; numbering, commit, retention, locking
// and crash clean-up are CheckpointManager's (reserve_next/commit_reserved).
#include "cairn/state_manager.h"

#include <limits>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "util/log.h"

namespace cairn {

namespace {

const nlohmann::json* find_nested(const nlohmann::json& j, std::string_view path) {
  const nlohmann::json* cur = &j;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string key(
        path.substr(start, slash == std::string_view::npos ? path.npos : slash - start));
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
    if (slash == std::string_view::npos) return cur;
    start = slash + 1;
  }
}

}  // namespace

struct StateCheckpointManager::Impl {
  StateCheckpointOptions options;
  std::unique_ptr<CheckpointManager> base;
  std::unique_ptr<AsyncSaver> saver;  // created by the first save_async
  // The saver exists only because restore() prepared it: a synchronous
  // save() frees it (the run saves synchronously).
  bool only_prepared = false;
  mutable std::mutex mu;
  std::optional<uint64_t> last_step;

  // The step this save records, or nullopt if the interval says skip.
  std::optional<uint64_t> next_step(std::optional<uint64_t> step, bool force) const {
    const uint64_t s = step.value_or(last_step ? *last_step + 1 : 0);
    if (!force && options.checkpoint_interval && last_step && s >= *last_step &&
        s - *last_step < *options.checkpoint_interval) {
      return std::nullopt;
    }
    return s;
  }

  nlohmann::json checked_metrics(const nlohmann::json& metrics, uint64_t step) const {
    if (!metrics.is_null() && !metrics.is_object()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: metrics must be a JSON object, got {}", base->uri(),
                              metrics.type_name()));
    }
    nlohmann::json m = metrics.is_null() ? nlohmann::json::object() : metrics;
    if (!options.best_metric.empty()) {
      const nlohmann::json* v = find_nested(m, options.best_metric);
      if (v && !v->is_number()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{}: metric \"{}\" is {}, not a number", base->uri(),
                                options.best_metric, v->dump()));
      }
    }
    m["step"] = step;
    return m;
  }

  static StateDict with_step(const StateDict& state, uint64_t step) {
    StateDict copy = state;  // views and shared owners only; no tensor bytes are copied
    if (!copy.metadata.is_object()) {
      throw Error(ErrorCode::kInvalidArgument, "state metadata must be a JSON object");
    }
    copy.metadata["step"] = step;
    return copy;
  }

  void wait_async() {
    if (saver) saver->wait_all();
  }

  // Readies the saver's staging for `state` on its own thread. Call with mu.
  void prepare(const StateDict& state) {
    // The largest step makes the largest header: every later image fits.
    StateDict sized = with_step(state, std::numeric_limits<uint64_t>::max());
    if (!saver) saver = std::make_unique<AsyncSaver>(options.async);
    saver->reserve(sized, 1, AsyncSaver::Reserve::kBackground);
  }
};

StateCheckpointManager::StateCheckpointManager(std::string_view directory_or_uri,
                                               StateCheckpointOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (options.checkpoint_interval && *options.checkpoint_interval == 0) {
    throw Error(ErrorCode::kInvalidArgument, "checkpoint_interval must be >= 1 step");
  }
  CheckpointConfig config;
  config.num_to_keep = options.max_to_keep;
  config.keep_checkpoint_every_n_hours = options.keep_checkpoint_every_n_hours;
  config.checkpoint_score_attribute = options.best_metric;
  config.checkpoint_score_order = options.best_mode;
  config.memory_tier = options.memory_tier;
  config.validate();
  impl_->options = std::move(options);
  impl_->base =
      std::make_unique<CheckpointManager>(directory_or_uri, config, impl_->options.manager);
  uint64_t last = 0;
  bool any = false;
  for (const auto& r : impl_->base->history()) {
    if (r.metrics.is_object() && r.metrics.contains("step") &&
        r.metrics["step"].is_number_unsigned()) {
      last = std::max<uint64_t>(last, r.metrics["step"].get<uint64_t>());
      any = true;
    }
  }
  if (any) impl_->last_step = last;
}

StateCheckpointManager::~StateCheckpointManager() {
  // AsyncSaver's destructor waits and logs an error no one has seen.
  impl_->saver.reset();
}

std::optional<CheckpointRecord> StateCheckpointManager::save(const StateDict& state,
                                                             std::optional<uint64_t> step,
                                                             const nlohmann::json& metrics,
                                                             bool force) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->wait_async();  // commits stay in call order; an async error surfaces here
  if (impl_->only_prepared) {
    impl_->saver.reset();  // prepared by restore(), but this run saves synchronously
    impl_->only_prepared = false;
  }
  auto s = impl_->next_step(step, force);
  if (!s) return std::nullopt;
  nlohmann::json m = impl_->checked_metrics(metrics, *s);
  StateDict copy = Impl::with_step(state, *s);
  CheckpointManager& base = *impl_->base;
  Checkpoint dest = base.reserve_next();
  std::optional<CheckpointRecord> record;
  try {
    ManifestEntry entry = cairn::save(copy, dest.storage(), kStateFileName, impl_->options.write);
    dest.set_metadata(copy.metadata);
    record = base.commit_reserved(dest, m, {entry});
  } catch (const Error& e) {
    try {
      if (!dest.is_committed()) remove_uncommitted(dest);
    } catch (const Error& cleanup) {
      // ignore-error: the leftover is removed when the directory is next opened.
      log::warn(fmt::format("could not clean up {}: {}", dest.uri(), cleanup.what()));
    }
    throw with_context(e, fmt::format("saving step {} into {}", *s, dest.uri()));
  }
  impl_->last_step = *s;
  return record;
}

std::optional<SaveHandle> StateCheckpointManager::save_async(const StateDict& state,
                                                             std::optional<uint64_t> step,
                                                             const nlohmann::json& metrics,
                                                             bool force) {
  std::lock_guard<std::mutex> g(impl_->mu);
  auto s = impl_->next_step(step, force);
  if (!s) return std::nullopt;
  nlohmann::json m = impl_->checked_metrics(metrics, *s);
  StateDict copy = Impl::with_step(state, *s);
  if (!impl_->saver) impl_->saver = std::make_unique<AsyncSaver>(impl_->options.async);
  impl_->only_prepared = false;
  SaveHandle h = impl_->saver->save(copy, *impl_->base, std::move(m));
  // A save skipped by WhenBusy::kSkip saved nothing: the interval still
  // counts from the last step taken.
  if (!h.skipped()) impl_->last_step = *s;
  return h;
}

void StateCheckpointManager::reserve(const StateDict& state) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->prepare(state);
  impl_->only_prepared = false;
}

std::optional<AsyncSaver::Stats> StateCheckpointManager::async_stats() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  if (!impl_->saver) return std::nullopt;
  return impl_->saver->stats();
}

void StateCheckpointManager::wait() {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->wait_async();
  // What retention removed is gone too once this returns, its space freed
  // (ManagerOptions::background_delete, the default, frees it later).
  impl_->base->wait_for_deletes();
}

std::optional<CheckpointRecord> StateCheckpointManager::latest() const {
  return impl_->base->latest();
}

std::vector<CheckpointRecord> StateCheckpointManager::best() const { return impl_->base->best(); }

std::vector<CheckpointRecord> StateCheckpointManager::checkpoints() const {
  return impl_->base->history();
}

std::optional<uint64_t> StateCheckpointManager::last_step() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->last_step;
}

RestoreResult StateCheckpointManager::restore(StateDict& state) const {
  auto rec = latest();
  if (!rec) {
    // A fresh run's restore-or-start: the state it will save is known now.
    prepare_after_restore(state, "finding no checkpoint");
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: no checkpoint to restore from", impl_->base->uri()));
  }
  return restore(state, *rec);
}

RestoreResult StateCheckpointManager::restore(StateDict& state,
                                              const CheckpointRecord& which) const {
  try {
    Manifest manifest = which.checkpoint.manifest();
    const ManifestEntry* file = nullptr;
    for (const auto& f : manifest.files) {
      if (f.path == kStateFileName) file = &f;
    }
    if (!file) {
      throw Error(ErrorCode::kCorruption, fmt::format("{}: the manifest lists no {}",
                                                      which.checkpoint.uri(), kStateFileName));
    }
    LoadOptions lo;
    lo.strict = true;
    lo.expect(*file);
    load_into(which.checkpoint.storage(), kStateFileName, state, lo);
  } catch (const Error& e) {
    throw with_context(e, fmt::format("restoring {}", which.name));
  }
  RestoreResult out{which, 0, state.metadata};
  if (state.metadata.contains("step") && state.metadata["step"].is_number_unsigned()) {
    out.step = state.metadata["step"].get<uint64_t>();
  }
  prepare_after_restore(state, "restoring " + which.name);
  return out;
}

void StateCheckpointManager::prepare_after_restore(const StateDict& state,
                                                   const std::string& after) const {
  if (!impl_->options.prepare_async_on_restore) return;
  std::lock_guard<std::mutex> g(impl_->mu);
  if (impl_->saver) return;
  try {
    impl_->prepare(state);
    impl_->only_prepared = true;
  } catch (const Error& e) {
    // ignore-error: what the restore does goes on; save_async() allocates as usual
    log::warn(fmt::format("{}: preparing the async saves' staging after {} failed: {}",
                          impl_->base->uri(), after, e.what()));
    impl_->saver.reset();
  }
}

MappedState StateCheckpointManager::open(const CheckpointRecord& which) const {
  return MappedState::open(which.checkpoint.storage(), kStateFileName);
}

CheckpointManager& StateCheckpointManager::base() { return *impl_->base; }

}  // namespace cairn
