// What the parts of the Python binding (python/*.cc, one module: _cairn)
// share: Python values <-> JSON, path arguments, and each part's bind
// function. Public headers only.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state.h"

namespace cairn::python {

// Python object -> JSON. Keys must be strings; anything else that is not a
// JSON value is a TypeError naming its type (raised before any I/O).
nlohmann::json to_json(pybind11::handle h, int depth = 0);
// JSON -> Python dicts, lists, str, int, float, bool and None.
pybind11::object from_json(const nlohmann::json& j);
// A path-like (str, os.PathLike) or URI as a string.
std::string path_arg(pybind11::handle h);

// A StateDict of the tensors Python describes as (name, safetensors dtype,
// shape, address, nbytes) tuples (cairn/_tensors.py), viewing the caller's
// memory: read-only for a save, writable for a restore or load. The caller
// keeps the tensors alive while the StateDict is used. kInvalidArgument
// naming the tensor for an unknown dtype or a size that does not match.
StateDict state_from(const pybind11::list& tensors, pybind11::handle metadata, bool writable);

// cairn.CheckpointManager's core (_cairn.cc), shared with the async saves
// of _state.cc. close() releases the experiment's lock when it is called,
// not when Python's collector gets to the object; an async save still
// writing into the manager holds it (share()) until that save finishes.
class PyManager {
 public:
  PyManager(std::string uri, CheckpointConfig config) {
    pybind11::gil_scoped_release release;
    manager_ = std::make_shared<CheckpointManager>(uri, std::move(config));
  }
  CheckpointManager& get() { return *share(); }
  // The manager, kept alive by the caller as long as it needs it.
  // kFailedPrecondition once closed.
  std::shared_ptr<CheckpointManager> share() {
    if (!manager_) {
      throw Error(ErrorCode::kFailedPrecondition,
                  "the CheckpointManager is closed; open a new one");
    }
    return manager_;
  }
  void close() {
    std::shared_ptr<CheckpointManager> m = std::move(manager_);
    pybind11::gil_scoped_release release;
    m.reset();
  }
  bool closed() const { return manager_ == nullptr; }

 private:
  std::shared_ptr<CheckpointManager> manager_;
};

// cairn.save / cairn.load's core (_tensors.cc).
void bind_tensors(pybind11::module_& m);
// cairn.torch's core (_state.cc): StateCheckpointManager, AsyncSaver and
// sharded saves.
void bind_state(pybind11::module_& m);
// cairn.train's core (_train.cc): the Trainer and the worker-side calls.
void bind_train(pybind11::module_& m);

}  // namespace cairn::python
