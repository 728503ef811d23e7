// What the parts of the Python binding (python/*.cc, one module: _cairn)
// share: Python values <-> JSON, path arguments, and each part's bind
// function. Public headers only.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state.h"
#include "cairn/train.h"

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
// A tuple of 7, (..., CUDA device index, producer stream as an int), is a
// tensor in that GPU's memory (cairn/cuda.h): its copies follow the work
// queued on that stream; kInvalidArgument naming it in a build without CUDA.
StateDict state_from(const pybind11::list& tensors, pybind11::handle metadata, bool writable);
// Whether this module was built with CAIRN_CUDA (CUDA tensors by address).
bool built_with_cuda();

// Python's cyclic garbage collector off while this lives, and as it was
// after: for code that makes many tracked objects (the tuples describing
// 100,000 tensors), none of them cyclic garbage, which would otherwise run
// collections over every object alive. Hold the GIL; never across I/O.
class GcPause {
 public:
#if PY_VERSION_HEX >= 0x030A0000
  GcPause() : was_enabled_(PyGC_Disable() != 0) {}
  ~GcPause() {
    if (was_enabled_) PyGC_Enable();
  }
#else
  GcPause() = default;  // no C API for it before Python 3.10: a pause of nothing
#endif
  GcPause(const GcPause&) = delete;
  GcPause& operator=(const GcPause&) = delete;

 private:
  [[maybe_unused]] bool was_enabled_ = false;
};

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
// cairn.tune's core (_tune.cc): the Tuner, search spaces and schedulers.
void bind_tune(pybind11::module_& m);

// A Python object whose last owner may be a C++ thread without the GIL.
struct PyRef {
  pybind11::object object;
  explicit PyRef(pybind11::object o) : object(std::move(o)) {}
  ~PyRef() {
    if (!Py_IsInitialized()) {
      object.release();  // the interpreter is gone; so is what it owned
      return;
    }
    pybind11::gil_scoped_acquire gil;
    object = pybind11::object();
  }
};

// Shared by _train.cc and _tune.cc (defined in _train.cc).
//
// A TrainFn that calls the Python callable `fn(config)` with the GIL in a
// worker; a Python exception fails the worker naming its type.
TrainFn python_train_fn(pybind11::object fn);
// Runs `body` (a fit() that forks the runtime's processes) with the GIL
// released, the forks of this thread prepared for the interpreter and, on
// the main thread, Ctrl-C turned into a preemption notice; raises
// KeyboardInterrupt afterwards if Ctrl-C was pressed.
void run_forking(const std::function<void()>& body);
// "TypeName: message" of a Python exception, for the C++ error it becomes.
std::string python_error_text(const pybind11::error_already_set& e);
// Called in a worker before it runs Python code: its own forks are Python's.
void python_worker_starts();
// ScalingConfig.launcher and RunConfig from cairn.train's Python values.
Launcher launcher_arg(const std::string& name);
RunConfig run_config_arg(const pybind11::dict& d);

}  // namespace cairn::python
