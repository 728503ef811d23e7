// The binding of cairn.torch (python/cairn/torch.py): StateCheckpointManager,
// AsyncSaver and sharded saves over the C++ state engine. Python hands each
// tensor's memory over by address, as (name, dtype, shape, address, nbytes)
// tuples; the caller keeps the tensors alive for the call. Entries are
// read-only for saves and writable for restores and loads, which copy into
// the caller's tensors in place. Public headers only; the GIL is released
// for every call that does I/O or waits.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "binding.h"
#include "cairn/async_save.h"
#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/sharded.h"
#include "cairn/state.h"
#include "cairn/state_manager.h"

namespace py = pybind11;

namespace cairn::python {
namespace {

using nlohmann::json;

// {name: (global_shape, offsets)} -> ShardSpecs.
std::map<std::string, ShardSpec> specs_from(const py::dict& specs) {
  std::map<std::string, ShardSpec> out;
  for (auto [name, spec] : specs) {
    auto t = spec.cast<py::tuple>();
    out[name.cast<std::string>()] = ShardSpec{t[0].cast<Shape>(), t[1].cast<Shape>()};
  }
  return out;
}

WhenBusy when_busy_from(const std::string& s) {
  if (s == "wait") return WhenBusy::kWait;
  if (s == "extra_buffer") return WhenBusy::kExtraBuffer;
  if (s == "skip") return WhenBusy::kSkip;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("when_busy \"{}\": \"wait\", \"extra_buffer\" or \"skip\"", s));
}

py::tuple report_tuple(const LoadReport& r) {
  return py::make_tuple(r.loaded, r.missing, r.unexpected, r.mismatched);
}

// StateCheckpointManager with close(): its directory's lock is released when
// it is closed, not when Python's collector gets to the object.
class PyStateManager {
 public:
  PyStateManager(const std::string& uri, StateCheckpointOptions options) {
    py::gil_scoped_release release;
    impl_ = std::make_unique<StateCheckpointManager>(uri, std::move(options));
  }
  StateCheckpointManager& get() const {
    if (!impl_) {
      throw Error(ErrorCode::kFailedPrecondition,
                  "the StateCheckpointManager is closed; open a new one");
    }
    return *impl_;
  }
  // Waits for async saves (throwing an error not yet seen), then releases
  // the lock.
  void close() {
    if (!impl_) return;
    {
      py::gil_scoped_release release;
      impl_->wait();
    }
    std::unique_ptr<StateCheckpointManager> m = std::move(impl_);
    py::gil_scoped_release release;
    m.reset();
  }
  bool closed() const { return impl_ == nullptr; }

 private:
  std::unique_ptr<StateCheckpointManager> impl_;
};

// AsyncSaver, keeping the CheckpointManagers of its pending saves alive (the
// C++ saver needs them until each save commits).
class PyAsyncSaver {
 public:
  explicit PyAsyncSaver(AsyncSaveOptions options) : saver_(std::move(options)) {}

  SaveHandle save(StateDict state, const Checkpoint& dest, const json& metrics) {
    state = same_as_last(std::move(state));
    py::gil_scoped_release release;
    prune();
    return saver_.save(state, dest, metrics);
  }
  SaveHandle save(StateDict state, PyManager& manager, const json& metrics) {
    state = same_as_last(std::move(state));
    std::shared_ptr<CheckpointManager> m = manager.share();
    py::gil_scoped_release release;
    prune();
    SaveHandle h = saver_.save(state, *m, metrics);
    std::lock_guard lock(mu_);
    held_.emplace_back(h, std::move(m));
    return h;
  }
  void reserve(const StateDict& state, unsigned buffers, bool background) {
    py::gil_scoped_release release;
    saver_.reserve(state, buffers,
                   background ? AsyncSaver::Reserve::kBackground : AsyncSaver::Reserve::kNow);
  }
  void wait_all() {
    py::gil_scoped_release release;
    saver_.wait_all();
    prune();
  }
  void close() {
    py::gil_scoped_release release;
    saver_.close();
    std::lock_guard lock(mu_);
    held_.clear();
  }
  AsyncSaver::Stats stats() const { return saver_.stats(); }

 private:
  // Python builds a new StateDict for every save, which would cost the
  // saver its reuse of the last save's layout (StateDict::entries_version).
  // A state with the same tensors (names, dtypes, shapes, addresses) as the
  // last one is given the last one's entries, so the version matches.
  StateDict same_as_last(StateDict state) {
    std::lock_guard lock(mu_);
    const auto same = [](const StateDict::Entry& a, const StateDict::Entry& b) {
      return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data && a.nbytes == b.nbytes;
    };
    if (last_ && last_->size() == state.size() &&
        std::equal(last_->entries().begin(), last_->entries().end(), state.entries().begin(),
                   [&](const auto& a, const auto& b) {
                     return a.first == b.first && same(a.second, b.second);
                   })) {
      StateDict reused = *last_;  // shares the entries: same version
      reused.metadata = std::move(state.metadata);
      reused.string_metadata = std::move(state.string_metadata);
      return reused;
    }
    last_ = state;
    return state;
  }
  std::optional<StateDict> last_;  // guarded by mu_

  void prune() {
    std::lock_guard lock(mu_);
    std::erase_if(held_, [](const auto& h) { return h.first.done(); });
  }
  std::mutex mu_;  // guards held_ (calls come from any Python thread)
  // Declared before saver_, so destroyed after it: the saver's destructor
  // waits for the saves that use these managers.
  std::vector<std::pair<SaveHandle, std::shared_ptr<CheckpointManager>>> held_;
  AsyncSaver saver_;
};

// cairn.torch.StateCheckpointManager and its save handles.
void bind_state_manager(py::module_& m) {
  py::class_<SaveHandle>(m, "SaveHandle")
      .def("done", &SaveHandle::done)
      .def("skipped", &SaveHandle::skipped)
      .def("wait",
           [](const SaveHandle& h) {
             py::gil_scoped_release release;
             h.wait();
           })
      .def_property_readonly("checkpoint", &SaveHandle::checkpoint)
      .def_property_readonly("record", &SaveHandle::record);

  py::class_<PyStateManager>(m, "StateCheckpointManager")
      .def(py::init([](py::handle directory, std::optional<int> max_to_keep,
                       std::optional<double> keep_checkpoint_every_n_hours,
                       std::optional<uint64_t> checkpoint_interval, std::string best_metric,
                       std::string best_mode, unsigned max_in_flight, const std::string& when_busy,
                       bool prepare_async_on_restore) {
             StateCheckpointOptions o;
             o.prepare_async_on_restore = prepare_async_on_restore;
             o.max_to_keep = max_to_keep;
             o.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours;
             o.checkpoint_interval = checkpoint_interval;
             o.best_metric = std::move(best_metric);
             o.best_mode = std::move(best_mode);
             o.async.max_in_flight = max_in_flight;
             o.async.when_busy = when_busy_from(when_busy);
             return std::make_unique<PyStateManager>(path_arg(directory), std::move(o));
           }),
           py::arg("directory"), py::arg("max_to_keep"), py::arg("keep_checkpoint_every_n_hours"),
           py::arg("checkpoint_interval"), py::arg("best_metric"), py::arg("best_mode"),
           py::arg("max_in_flight"), py::arg("when_busy"),
           py::arg("prepare_async_on_restore") = true)
      .def(
          "save",
          [](PyStateManager& m, const py::list& tensors, py::handle metadata,
             std::optional<uint64_t> step, py::handle metrics, bool force) {
            const StateDict state = state_from(tensors, metadata, /*writable=*/false);
            const json j = metrics.is_none() ? json::object() : to_json(metrics);
            StateCheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            return manager.save(state, step, j, force);
          },
          py::arg("tensors"), py::arg("metadata"), py::arg("step"), py::arg("metrics"),
          py::arg("force"))
      .def(
          "save_async",
          [](PyStateManager& m, const py::list& tensors, py::handle metadata,
             std::optional<uint64_t> step, py::handle metrics, bool force) {
            const StateDict state = state_from(tensors, metadata, /*writable=*/false);
            const json j = metrics.is_none() ? json::object() : to_json(metrics);
            StateCheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            return manager.save_async(state, step, j, force);
          },
          py::arg("tensors"), py::arg("metadata"), py::arg("step"), py::arg("metrics"),
          py::arg("force"))
      .def(
          "reserve",
          [](PyStateManager& m, const py::list& tensors, py::handle metadata) {
            const StateDict state = state_from(tensors, metadata, /*writable=*/false);
            StateCheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            manager.reserve(state);
          },
          py::arg("tensors"), py::arg("metadata"))
      .def("wait",
           [](PyStateManager& m) {
             StateCheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             manager.wait();
           })
      .def(
          "restore",
          [](PyStateManager& m, const py::list& tensors, std::optional<CheckpointRecord> which) {
            StateDict state = state_from(tensors, py::none(), /*writable=*/true);
            StateCheckpointManager& manager = m.get();
            std::optional<RestoreResult> r;
            {
              py::gil_scoped_release release;
              r = which ? manager.restore(state, *which) : manager.restore(state);
            }
            return py::make_tuple(r->step, from_json(r->metadata), r->record);
          },
          py::arg("tensors"), py::arg("which"))
      // These wait for the manager's lock, which a background commit holds.
      .def("latest",
           [](PyStateManager& m) {
             StateCheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.latest();
           })
      .def("checkpoints",
           [](PyStateManager& m) {
             StateCheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.checkpoints();
           })
      .def("best",
           [](PyStateManager& m) {
             StateCheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.best();
           })
      .def_property_readonly("last_step", [](PyStateManager& m) { return m.get().last_step(); })
      .def_property_readonly("uri", [](PyStateManager& m) { return m.get().base().uri(); })
      .def_property_readonly("closed", &PyStateManager::closed)
      .def("close", &PyStateManager::close);
}

// cairn.torch.AsyncSaver.
void bind_async_saver(py::module_& m) {
  py::class_<PyAsyncSaver>(m, "AsyncSaver")
      .def(py::init([](unsigned max_in_flight, const std::string& when_busy,
                       unsigned max_staging_buffers) {
             AsyncSaveOptions o;
             o.max_in_flight = max_in_flight;
             o.when_busy = when_busy_from(when_busy);
             o.max_staging_buffers = max_staging_buffers;
             return std::make_unique<PyAsyncSaver>(std::move(o));
           }),
           py::arg("max_in_flight"), py::arg("when_busy"), py::arg("max_staging_buffers"))
      .def(
          "save",
          [](PyAsyncSaver& s, const py::list& tensors, py::handle metadata,
             const std::map<std::string, std::string>& string_metadata, const Checkpoint& dest,
             py::handle metrics) {
            StateDict state = state_from(tensors, metadata, /*writable=*/false);
            state.string_metadata = string_metadata;
            return s.save(std::move(state), dest,
                          metrics.is_none() ? json::object() : to_json(metrics));
          },
          py::arg("tensors"), py::arg("metadata"), py::arg("string_metadata"), py::arg("dest"),
          py::arg("metrics"))
      .def(
          "save_to_manager",
          [](PyAsyncSaver& s, const py::list& tensors, py::handle metadata,
             const std::map<std::string, std::string>& string_metadata, PyManager& manager,
             py::handle metrics) {
            StateDict state = state_from(tensors, metadata, /*writable=*/false);
            state.string_metadata = string_metadata;
            return s.save(std::move(state), manager,
                          metrics.is_none() ? json::object() : to_json(metrics));
          },
          py::arg("tensors"), py::arg("metadata"), py::arg("string_metadata"), py::arg("manager"),
          py::arg("metrics"))
      .def(
          "reserve",
          [](PyAsyncSaver& s, const py::list& tensors, py::handle metadata,
             const std::map<std::string, std::string>& string_metadata, unsigned buffers,
             bool background) {
            StateDict state = state_from(tensors, metadata, /*writable=*/false);
            state.string_metadata = string_metadata;
            s.reserve(state, buffers, background);
          },
          py::arg("tensors"), py::arg("metadata"), py::arg("string_metadata"), py::arg("buffers"),
          py::arg("background"))
      .def("wait_all", &PyAsyncSaver::wait_all)
      .def("close", &PyAsyncSaver::close)
      .def("stats", [](const PyAsyncSaver& s) {
        const AsyncSaver::Stats st = s.stats();
        py::dict d;
        d["saves"] = st.saves;
        d["skipped"] = st.skipped;
        d["waits"] = st.waits;
        d["staging_bytes"] = st.staging_bytes;
        d["staging_pinned_bytes"] = st.staging_pinned_bytes;
        d["staging_allocations"] = st.staging_allocations;
        d["last_stall_seconds"] = st.last_stall_seconds;
        d["max_stall_seconds"] = st.max_stall_seconds;
        return d;
      });
}

// Sharded saves: even_split, save_rank_shards, commit_sharded, ShardedReader.
void bind_sharded(py::module_& m) {
  m.def(
      "even_split",
      [](const Shape& global_shape, size_t dim, int rank, int world_size) {
        const Box b = even_split(global_shape, dim, rank, world_size);
        return py::make_tuple(b.offsets, b.shape);
      },
      py::arg("global_shape"), py::arg("dim"), py::arg("rank"), py::arg("world_size"));

  m.def(
      "save_rank_shards",
      [](const py::list& tensors, const py::dict& specs, const Checkpoint& dest, int rank) {
        const StateDict state = state_from(tensors, py::none(), /*writable=*/false);
        const std::map<std::string, ShardSpec> s = specs_from(specs);
        json report;
        {
          py::gil_scoped_release release;
          report = save_rank_shards(state, s, dest, rank).to_json();
        }
        return from_json(report);
      },
      py::arg("tensors"), py::arg("specs"), py::arg("dest"), py::arg("rank"));

  m.def(
      "commit_sharded",
      [](const Checkpoint& dest, const py::list& reports, py::handle metrics) {
        std::vector<RankShards> ranks;
        for (py::handle r : reports) ranks.push_back(RankShards::from_json(to_json(r)));
        const json j = metrics.is_none() ? json::object() : to_json(metrics);
        py::gil_scoped_release release;
        return commit_sharded(dest, ranks, j).to_json();
      },
      py::arg("dest"), py::arg("reports"), py::arg("metrics"));

  py::class_<ShardedReader>(m, "ShardedReader")
      .def(py::init([](const Checkpoint& checkpoint) {
             py::gil_scoped_release release;
             return std::make_unique<ShardedReader>(checkpoint);
           }),
           py::arg("checkpoint"))
      .def_property_readonly("world_size", &ShardedReader::world_size)
      .def("tensors",
           [](const ShardedReader& r) {
             py::list out;
             for (const auto& t : r.tensors()) {
               out.append(py::make_tuple(t.name, std::string(dtype_name(t.dtype)), t.shape));
             }
             return out;
           })
      .def(
          "load",
          [](const ShardedReader& r, const py::list& tensors, const py::dict& specs, bool strict) {
            StateDict state = state_from(tensors, py::none(), /*writable=*/true);
            const std::map<std::string, ShardSpec> s = specs_from(specs);
            LoadReport report;
            {
              py::gil_scoped_release release;
              report = r.load(state, s, strict);
            }
            return report_tuple(report);
          },
          py::arg("tensors"), py::arg("specs"), py::arg("strict"));
}

}  // namespace

void bind_state(py::module_& m) {
  bind_state_manager(m);
  bind_async_saver(m);
  bind_sharded(m);
}

}  // namespace cairn::python
