// The Python binding: cairn._cairn, wrapped by the pure-Python package
// python/cairn/. It uses only Cairn's public headers and adds no behaviour of
// its own: every call goes to the C++ core, with the GIL released for the
// call's I/O. JSON values (metrics, metadata) cross as Python dicts, lists,
// strings, numbers, booleans and None; cairn::Error becomes the matching
// cairn.errors class with the C++ message unchanged.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "binding.h"
#include "cairn/checkpoint.h"
#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "cairn/version.h"
#include "error_translator.h"

namespace py = pybind11;

namespace {

using cairn::python::from_json;
using cairn::python::path_arg;
using cairn::python::PyManager;
using cairn::python::to_json;
using nlohmann::json;

// Checkpoint.as_directory()'s context manager: holds the view until __exit__.
class DirectoryView {
 public:
  explicit DirectoryView(cairn::Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}
  std::string enter() {
    if (!view_) {
      py::gil_scoped_release release;
      view_ = checkpoint_.as_directory();
    }
    return view_->path().string();
  }
  void exit() { view_.reset(); }

 private:
  cairn::Checkpoint checkpoint_;
  std::optional<cairn::LocalDirectory> view_;
};

}  // namespace

PYBIND11_MODULE(_cairn, m) {
  m.doc() = "Cairn's C++ core (use the cairn package, which wraps this module).";
  m.attr("__version__") = CAIRN_VERSION_STRING;
  m.attr("CUDA") = cairn::python::built_with_cuda();
  cairn::python::bind_tensors(m);

  cairn::python::register_error_translator();

  py::class_<cairn::VerifyProblem>(m, "VerifyProblem",
                                   "A file of a checkpoint that failed verification.")
      .def_readonly("path", &cairn::VerifyProblem::path, "The file, relative to the checkpoint.")
      .def_readonly("reason", &cairn::VerifyProblem::reason,
                    "What is wrong: 'missing', 'size 10, manifest says 12', ...")
      .def("__repr__", [](const cairn::VerifyProblem& v) {
        return "VerifyProblem(path=" + py::repr(py::str(v.path)).cast<std::string>() +
               ", reason=" + py::repr(py::str(v.reason)).cast<std::string>() + ")";
      });

  py::class_<DirectoryView>(m, "DirectoryView")
      .def("__enter__", &DirectoryView::enter)
      .def("__exit__", [](DirectoryView& v, py::args) { v.exit(); });

  py::class_<cairn::Checkpoint>(m, "Checkpoint")
      .def_static(
          "from_directory",
          [](py::handle path) { return cairn::Checkpoint::from_directory(path_arg(path)); },
          py::arg("path"))
      .def_static(
          "from_dict", [](py::handle d) { return cairn::Checkpoint::from_dict(to_json(d)); },
          py::arg("data"))
      .def_static(
          "from_files",
          [](const py::dict& files) {
            cairn::Checkpoint c = cairn::Checkpoint::in_memory();
            for (const auto& [name, data] : files) {
              const std::string key = py::cast<std::string>(name);
              const std::string bytes = py::cast<py::bytes>(data);
              c.storage().put(key, bytes);
            }
            return c;
          },
          py::arg("files"))
      .def(
          "read_file",
          [](const cairn::Checkpoint& c, const std::string& name) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = c.storage().get(name);
            }
            return py::bytes(bytes);
          },
          py::arg("name"))
      .def("to_dict",
           [](const cairn::Checkpoint& c) {
             json j;
             {
               py::gil_scoped_release release;
               j = c.to_dict();
             }
             return from_json(j);
           })
      .def_property_readonly("path", &cairn::Checkpoint::uri)
      .def("as_directory", [](const cairn::Checkpoint& c) { return DirectoryView(c); })
      .def(
          "to_directory",
          [](const cairn::Checkpoint& c, py::handle path) {
            const std::string dest = path.is_none() ? std::string() : path_arg(path);
            py::gil_scoped_release release;
            return c.to_directory(dest).string();
          },
          py::arg("path") = py::none())
      .def("get_metadata",
           [](const cairn::Checkpoint& c) {
             json j;
             {
               py::gil_scoped_release release;
               j = c.get_metadata();
             }
             return from_json(j);
           })
      .def(
          "set_metadata",
          [](const cairn::Checkpoint& c, py::handle metadata) {
            const json j = to_json(metadata);
            py::gil_scoped_release release;
            c.set_metadata(j);
          },
          py::arg("metadata"))
      .def(
          "update_metadata",
          [](const cairn::Checkpoint& c, py::handle patch) {
            const json j = to_json(patch);
            py::gil_scoped_release release;
            c.update_metadata(j);
          },
          py::arg("metadata"))
      .def("is_committed",
           [](const cairn::Checkpoint& c) {
             py::gil_scoped_release release;
             return c.is_committed();
           })
      .def("files",
           [](const cairn::Checkpoint& c) {
             std::vector<cairn::ObjectInfo> files;
             {
               py::gil_scoped_release release;
               files = c.files();
             }
             py::list out;
             for (const auto& f : files) out.append(py::make_tuple(f.key, f.size));
             return out;
           })
      .def("verify",
           [](const cairn::Checkpoint& c) {
             py::gil_scoped_release release;
             return c.verify();
           })
      .def("manifest_json",
           [](const cairn::Checkpoint& c) {
             py::gil_scoped_release release;
             return c.manifest().to_json();
           })
      .def("__repr__", [](const cairn::Checkpoint& c) {
        return "Checkpoint(path=" + py::repr(py::str(c.uri())).cast<std::string>() + ")";
      });

  py::class_<cairn::MemoryTierConfig>(m, "MemoryTierConfig")
      .def(py::init([](int num_to_keep, int persist_every_n, double persist_every_minutes,
                       uint64_t max_bytes, std::string on_insufficient_memory,
                       std::optional<std::string> root, int replicas, bool ranks_read_own_files) {
             cairn::MemoryTierConfig t;
             t.enabled = true;
             t.num_to_keep = num_to_keep;
             t.persist_every_n = persist_every_n;
             t.persist_every_minutes = persist_every_minutes;
             t.max_bytes = max_bytes;
             t.on_insufficient_memory = std::move(on_insufficient_memory);
             t.root = root.value_or("");
             t.replicas = replicas;
             t.ranks_read_own_files = ranks_read_own_files;
             cairn::CheckpointConfig c;
             c.memory_tier = t;
             c.validate();
             return t;
           }),
           py::kw_only(), py::arg("num_to_keep") = 2, py::arg("persist_every_n") = 10,
           py::arg("persist_every_minutes") = 0.0, py::arg("max_bytes") = 0,
           py::arg("on_insufficient_memory") = "error", py::arg("root") = py::none(),
           py::arg("replicas") = 1, py::arg("ranks_read_own_files") = false)
      .def_readonly("num_to_keep", &cairn::MemoryTierConfig::num_to_keep)
      .def_readonly("persist_every_n", &cairn::MemoryTierConfig::persist_every_n)
      .def_readonly("persist_every_minutes", &cairn::MemoryTierConfig::persist_every_minutes)
      .def_readonly("max_bytes", &cairn::MemoryTierConfig::max_bytes)
      .def_readonly("on_insufficient_memory", &cairn::MemoryTierConfig::on_insufficient_memory)
      .def_readonly("replicas", &cairn::MemoryTierConfig::replicas)
      .def_readonly("ranks_read_own_files", &cairn::MemoryTierConfig::ranks_read_own_files)
      .def_property_readonly("root", [](const cairn::MemoryTierConfig& t) {
        return t.root.empty() ? std::optional<std::string>() : std::optional<std::string>(t.root);
      });

  py::class_<cairn::CheckpointConfig>(m, "CheckpointConfig")
      .def(py::init([](std::optional<int> num_to_keep,
                       std::optional<std::string> checkpoint_score_attribute,
                       std::string checkpoint_score_order,
                       std::optional<double> keep_checkpoint_every_n_hours,
                       int checkpoint_frequency, std::optional<bool> checkpoint_at_end,
                       std::optional<cairn::MemoryTierConfig> memory_tier) {
             cairn::CheckpointConfig c;
             if (memory_tier) c.memory_tier = *memory_tier;
             c.num_to_keep = num_to_keep;
             c.checkpoint_score_attribute = checkpoint_score_attribute.value_or("");
             c.checkpoint_score_order = std::move(checkpoint_score_order);
             c.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours;
             c.checkpoint_frequency = checkpoint_frequency;
             c.checkpoint_at_end = checkpoint_at_end;
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("num_to_keep") = py::none(),
           py::arg("checkpoint_score_attribute") = py::none(),
           py::arg("checkpoint_score_order") = "max",
           py::arg("keep_checkpoint_every_n_hours") = py::none(),
           py::arg("checkpoint_frequency") = 0, py::arg("checkpoint_at_end") = py::none(),
           py::arg("memory_tier") = py::none())
      .def_property_readonly("memory_tier",
                             [](const cairn::CheckpointConfig& c) {
                               return c.memory_tier.enabled
                                          ? std::optional<cairn::MemoryTierConfig>(c.memory_tier)
                                          : std::nullopt;
                             })
      .def_readonly("num_to_keep", &cairn::CheckpointConfig::num_to_keep)
      .def_property_readonly("checkpoint_score_attribute",
                             [](const cairn::CheckpointConfig& c) -> std::optional<std::string> {
                               if (c.checkpoint_score_attribute.empty()) return std::nullopt;
                               return c.checkpoint_score_attribute;
                             })
      .def_readonly("checkpoint_score_order", &cairn::CheckpointConfig::checkpoint_score_order)
      .def_readonly("keep_checkpoint_every_n_hours",
                    &cairn::CheckpointConfig::keep_checkpoint_every_n_hours)
      .def_readonly("checkpoint_frequency", &cairn::CheckpointConfig::checkpoint_frequency)
      .def_readonly("checkpoint_at_end", &cairn::CheckpointConfig::checkpoint_at_end)
      .def("to_dict", [](const cairn::CheckpointConfig& c) { return from_json(c.to_json()); });

  py::class_<cairn::CheckpointRecord>(m, "CheckpointRecord")
      .def_readonly("index", &cairn::CheckpointRecord::index)
      .def_readonly("name", &cairn::CheckpointRecord::name)
      .def_property_readonly("metrics",
                             [](const cairn::CheckpointRecord& r) { return from_json(r.metrics); })
      .def_readonly("created_at", &cairn::CheckpointRecord::created_at)
      .def_readonly("pinned", &cairn::CheckpointRecord::pinned)
      .def_readonly("checkpoint", &cairn::CheckpointRecord::checkpoint)
      .def_readonly("tier", &cairn::CheckpointRecord::tier)
      .def_readonly("persisted", &cairn::CheckpointRecord::persisted)
      .def("__repr__", [](const cairn::CheckpointRecord& r) {
        return "CheckpointRecord(name=" + py::repr(py::str(r.name)).cast<std::string>() +
               ", metrics=" + py::repr(from_json(r.metrics)).cast<std::string>() + ")";
      });

  py::class_<PyManager>(m, "CheckpointManager")
      .def(py::init([](py::handle uri, const cairn::CheckpointConfig& config) {
             return std::make_unique<PyManager>(path_arg(uri), config);
           }),
           py::arg("experiment_uri"), py::arg("config"))
      .def(
          "register_checkpoint",
          [](PyManager& m, py::handle metrics, const cairn::Checkpoint& checkpoint) {
            const json j = to_json(metrics);
            cairn::CheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            return manager.register_checkpoint(j, checkpoint);
          },
          py::arg("metrics"), py::arg("checkpoint"))
      // These wait for the manager's lock, which an async save's commit
      // (cairn.torch.AsyncSaver) holds while it writes.
      .def("latest",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.latest();
           })
      .def("best",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.best();
           })
      .def("history",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.history();
           })
      .def("wait_for_deletes",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             manager.wait_for_deletes();
           })
      .def("wait_for_persistence",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             manager.wait_for_persistence();
           })
      .def("release_memory_tier",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             manager.release_memory_tier();
           })
      // A checkpoint other processes write into (cairn.torch.dcp): reserved,
      // then committed from its files' entries (path, size, XXH3-64) or
      // abandoned.
      .def("reserve_next",
           [](PyManager& m) {
             cairn::CheckpointManager& manager = m.get();
             py::gil_scoped_release release;
             return manager.reserve_next();
           })
      .def(
          "commit_reserved",
          [](PyManager& m, const cairn::Checkpoint& reserved, py::handle metrics,
             const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& entries,
             py::handle metadata) {
            const json jm = to_json(metrics);
            std::optional<json> jd;
            if (!metadata.is_none()) jd = to_json(metadata);
            std::vector<cairn::ManifestEntry> files;
            for (const auto& [path, size, xxh3] : entries) files.push_back({path, size, xxh3});
            cairn::CheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            return manager.commit_reserved(reserved, jm, files, nullptr, jd ? &*jd : nullptr);
          },
          py::arg("reserved"), py::arg("metrics"), py::arg("entries"), py::arg("metadata"))
      .def(
          "abandon_reserved",
          [](PyManager& m, const cairn::Checkpoint& reserved) {
            cairn::CheckpointManager& manager = m.get();
            py::gil_scoped_release release;
            manager.abandon_reserved(reserved);
          },
          py::arg("reserved"))
      .def_property_readonly("uri", [](PyManager& m) { return m.get().uri(); })
      .def_property_readonly("closed", &PyManager::closed)
      .def("close", &PyManager::close);
  // The files of a save several processes write into one checkpoint
  // (cairn.torch.dcp): each streamed in pieces, its entry (path, size,
  // XXH3-64) sent to the one process that commits them all.
  py::class_<cairn::CheckpointFileWriter>(m, "CheckpointFileWriter")
      .def(py::init([](const cairn::Checkpoint& dest, const std::string& path) {
             py::gil_scoped_release release;
             return std::make_unique<cairn::CheckpointFileWriter>(dest, path);
           }),
           py::arg("dest"), py::arg("path"))
      .def(
          "append",
          [](cairn::CheckpointFileWriter& f, py::handle data) {
            Py_buffer view;  // PyBUF_SIMPLE: C-contiguous bytes, else a TypeError
            if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) {
              throw py::error_already_set();
            }
            struct Held {
              Py_buffer* view;
              ~Held() { PyBuffer_Release(view); }
            } held{&view};
            const std::span<const std::byte> bytes(static_cast<const std::byte*>(view.buf),
                                                   static_cast<size_t>(view.len));
            py::gil_scoped_release release;
            f.append(bytes);
          },
          py::arg("data"))
      .def_property_readonly("size", &cairn::CheckpointFileWriter::size)
      .def("commit", [](cairn::CheckpointFileWriter& f) {
        cairn::ManifestEntry e;
        {
          py::gil_scoped_release release;
          e = f.commit();
        }
        return py::make_tuple(e.path, e.size, e.xxh3);
      });
  m.def(
      "commit_files",
      [](const cairn::Checkpoint& dest,
         const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& entries,
         py::handle metrics, py::handle metadata) {
        const json jm = metrics.is_none() ? json() : to_json(metrics);
        std::optional<json> jd;
        if (!metadata.is_none()) jd = to_json(metadata);
        std::vector<cairn::ManifestEntry> files;
        for (const auto& [path, size, xxh3] : entries) files.push_back({path, size, xxh3});
        py::gil_scoped_release release;
        cairn::CheckpointWriter w(dest);
        w.add_written(files);
        const double now =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        return w.commit(jm, now, jd ? &*jd : nullptr).to_json();
      },
      py::arg("dest"), py::arg("entries"), py::arg("metrics"), py::arg("metadata"));
  // Deletes the experiment at `uri` so that none of its checkpoints is ever
  // seen half-deleted: each committed one goes manifest first
  // (delete_checkpoint), then every object left under the root.
  m.def(
      "delete_experiment",
      [](const std::string& uri) {
        py::gil_scoped_release release;
        for (const cairn::CheckpointRecord& r : cairn::read_experiment(uri).checkpoints) {
          cairn::delete_checkpoint(r.checkpoint);
        }
        cairn::open_storage(uri)->remove_prefix("");
      },
      py::arg("uri"));
  m.def("s3_endpoint", [] {
    const cairn::S3Endpoint e = cairn::s3_endpoint();
    return py::make_tuple(e.url, e.region, e.custom);
  });
  // Copies the files of the local folder `source` into the uncommitted
  // checkpoint `dest` and commits it with `metrics` (cairn.ray's upload).
  m.def(
      "commit_directory",
      [](const std::string& source, const cairn::Checkpoint& dest, py::handle metrics,
         py::handle metadata) {
        const json jm = metrics.is_none() ? json::object() : to_json(metrics);
        std::optional<json> jd;
        if (!metadata.is_none()) jd = to_json(metadata);
        py::gil_scoped_release release;
        cairn::CheckpointWriter w(dest);
        w.copy_from(cairn::Checkpoint::from_directory(source));
        const double now =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        w.commit(jm, now, jd ? &*jd : nullptr);
      },
      py::arg("source"), py::arg("dest"), py::arg("metrics"), py::arg("metadata") = py::none());
  // Deletes a checkpoint so that it is never seen half-deleted (the
  // manifest goes first); a missing one is a no-op.
  m.def(
      "delete_checkpoint",
      [](const cairn::Checkpoint& checkpoint) {
        py::gil_scoped_release release;
        cairn::delete_checkpoint(checkpoint);
      },
      py::arg("checkpoint"));
  cairn::python::bind_state(m);
  cairn::python::bind_train(m);
  cairn::python::bind_tune(m);
}
