// cairn.train's core: cairn::Trainer running a Python function in the
// worker processes it forks, and the worker-side calls (report,
// get_checkpoint, get_context, should_checkpoint). Public headers only.
//
// Forking an interpreter. The Trainer's driver forks its workers (and a
// reaper) from the thread that called fit(), with the GIL released while the
// run goes on. A fork that copies an interpreter another thread may be
// using leaves the child with a GIL, import lock and thread states it can
// never take. So for the forks of fit() (and only those: a flag on the
// calling thread says so), handlers registered with pthread_atfork do what
// os.fork() does: take the GIL and run PyOS_BeforeFork before, and
// PyOS_AfterFork_Parent / PyOS_AfterFork_Child after. The child leaves its
// handler holding the GIL on the one thread it has, the one that then runs
// train_fn, so the Python function runs as in any forked Python process.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "binding.h"
#include "cairn/train.h"

namespace py = pybind11;

namespace cairn::python {
namespace {

thread_local bool t_forking_for_fit = false;
PyGILState_STATE g_fork_gil;

void before_fork() {
  if (!t_forking_for_fit) return;
  g_fork_gil = PyGILState_Ensure();
  PyOS_BeforeFork();
}

void after_fork_in_parent() {
  if (!t_forking_for_fit) return;
  PyOS_AfterFork_Parent();
  PyGILState_Release(g_fork_gil);
}

// The flag stays set in the child: a Tuner's trial runner forks its own
// workers from it. A worker clears it before it runs Python code
// (python_train_fn), whose forks (a DataLoader's workers) are Python's own.
void after_fork_in_child() {
  if (!t_forking_for_fit) return;
  PyOS_AfterFork_Child();
}

// Ctrl-C while fit() runs. Python's own handler would only set a flag that
// nobody reads until the run ends; instead SIGINT becomes the preemption
// notice (SIGTERM to this process, which the C++ driver turns into an
// emergency checkpoint and a stop: docs/train.md, "Preemption"), and fit()
// raises KeyboardInterrupt once the run has stopped.
volatile sig_atomic_t g_interrupted = 0;

void on_sigint(int) {
  g_interrupted = 1;
  ::kill(::getpid(), SIGTERM);
}

py::dict context_dict(const TrainContext& c) {
  py::dict d;
  d["world_rank"] = c.world_rank;
  d["world_size"] = c.world_size;
  d["local_rank"] = c.local_rank;
  d["local_world_size"] = c.local_world_size;
  d["node_rank"] = c.node_rank;
  d["experiment_name"] = c.experiment_name;
  d["storage_path"] = c.storage_path;
  d["experiment_path"] = c.experiment_path;
  d["attempt"] = c.attempt;
  d["master_addr"] = c.master_addr;
  d["master_port"] = c.master_port;
  return d;
}

}  // namespace

// The worker's train_fn: calls `fn(config)` with the run's configuration as
// the C++ Trainer holds it (JSON) (cairn/train/_trainer.py's closure around
// the user's function, which prints a Python exception's traceback
// on the worker's stderr, whose tail the driver keeps for Result.error) with
// the GIL. A Python exception ends the worker as a failure naming its type.
TrainFn python_train_fn(py::object fn) {
  auto ref = std::make_shared<PyRef>(std::move(fn));
  return [ref](const nlohmann::json& config) {
    python_worker_starts();
    py::gil_scoped_acquire gil;
    try {
      ref->object(from_json(config));
    } catch (py::error_already_set& e) {
      throw std::runtime_error(python_error_text(e));
    }
  };
}

Launcher launcher_arg(const std::string& name) {
  if (name == "auto") return Launcher::kAuto;
  if (name == "local") return Launcher::kLocal;
  if (name == "mpi") return Launcher::kMpi;
  if (name == "env") return Launcher::kEnv;
  throw Error(ErrorCode::kInvalidArgument,
              "ScalingConfig.launcher \"" + name + "\": \"auto\", \"local\", \"mpi\" or \"env\"");
}

RunConfig run_config_arg(const py::dict& d) {
  RunConfig run;
  run.name = d["name"].cast<std::string>();
  run.storage_path = d["storage_path"].cast<std::string>();
  run.resume_existing = d["resume_existing"].cast<bool>();
  run.checkpoint_config = d["checkpoint_config"].cast<CheckpointConfig>();
  run.failure_config.max_failures = d["max_failures"].cast<int>();
  run.failure_config.report_timeout_s = d["report_timeout_s"].cast<double>();
  run.failure_config.preemption_grace_s = d["preemption_grace_s"].cast<double>();
  return run;
}

std::string python_error_text(const py::error_already_set& e) {
  return std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value()));
}

void python_worker_starts() { t_forking_for_fit = false; }

void run_forking(const std::function<void()>& body) {
  struct Guard {
    struct sigaction previous {};
    bool main_thread;
    explicit Guard(bool main) : main_thread(main) {
      t_forking_for_fit = true;
      g_interrupted = 0;
      if (main_thread) {
        struct sigaction sa {};
        sa.sa_handler = on_sigint;
        ::sigemptyset(&sa.sa_mask);
        ::sigaction(SIGINT, &sa, &previous);
      }
    }
    ~Guard() {
      t_forking_for_fit = false;
      if (main_thread) ::sigaction(SIGINT, &previous, nullptr);
    }
  };
  py::module_ threading = py::module_::import("threading");
  const bool main = threading.attr("current_thread")().is(threading.attr("main_thread")());
  {
    Guard guard(main);
    py::gil_scoped_release release;
    body();
  }
  if (g_interrupted) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
}

void bind_train(py::module_& m) {
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    if (::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) != 0) {
      throw std::runtime_error("pthread_atfork failed");
    }
  });

  py::class_<BestCheckpoint>(m, "BestCheckpoint")
      .def_readonly("checkpoint", &BestCheckpoint::checkpoint)
      .def_property_readonly("metrics",
                             [](const BestCheckpoint& b) { return from_json(b.metrics); });

  py::class_<Result>(m, "TrainResult")
      .def_property_readonly("metrics", [](const Result& r) { return from_json(r.metrics); })
      .def_readonly("checkpoint", &Result::checkpoint)
      .def_readonly("best_checkpoints", &Result::best_checkpoints)
      .def_readonly("path", &Result::path)
      .def_readonly("error", &Result::error)
      .def_readonly("preempted", &Result::preempted)
      .def_property_readonly("restores",
                             [](const Result& r) {
                               py::list out;
                               for (const auto& x : r.restores) {
                                 py::dict d;
                                 d["attempt"] = x.attempt;
                                 d["checkpoint"] = x.checkpoint;
                                 d["tier"] = x.tier;
                                 d["world_size"] = x.world_size;
                                 d["rank_tiers"] = x.rank_tiers;
                                 d["damaged"] = x.damaged;
                                 out.append(d);
                               }
                               return out;
                             })
      .def_property_readonly("metrics_history",
                             [](const Result& r) {
                               py::list rows;
                               for (const auto& row : r.metrics_history)
                                 rows.append(from_json(row));
                               return rows;
                             })
      .def_static(
          "from_path",
          [](py::handle path) {
            std::string p = path_arg(path);
            py::gil_scoped_release release;
            return Result::from_path(p);
          },
          py::arg("path"));

  py::class_<Trainer>(m, "Trainer")
      .def(py::init([](py::object fn, py::handle config, int num_workers,
                       const std::string& launcher, const py::dict& run,
                       std::optional<Checkpoint> resume_from, int min_workers) {
             ScalingConfig scaling{.num_workers = num_workers,
                                   .launcher = launcher_arg(launcher),
                                   .min_workers = min_workers};
             return Trainer(python_train_fn(std::move(fn)), to_json(config), scaling,
                            run_config_arg(run), std::move(resume_from));
           }),
           py::arg("fn"), py::arg("config"), py::arg("num_workers"), py::arg("launcher"),
           py::arg("run"), py::arg("resume_from"), py::arg("min_workers") = 0)
      .def("fit",
           [](Trainer& trainer) {
             std::optional<Result> result;
             run_forking([&] { result = trainer.fit(); });
             return std::move(*result);
           })
      .def_static(
          "can_restore",
          [](py::handle path) {
            std::string p = path_arg(path);
            py::gil_scoped_release release;
            return Trainer::can_restore(p);
          },
          py::arg("path"))
      .def_static(
          "restore",
          [](py::handle path, py::object fn, py::handle config) {
            std::optional<nlohmann::json> c;
            if (!config.is_none()) c = to_json(config);
            std::string p = path_arg(path);
            TrainFn train_fn = python_train_fn(std::move(fn));
            py::gil_scoped_release release;
            return Trainer::restore(p, std::move(train_fn), std::move(c));
          },
          py::arg("path"), py::arg("fn"), py::arg("config"))
      .def_property_readonly("config", [](const Trainer& t) {
        py::dict d;
        d["name"] = t.run_config().name;
        d["storage_path"] = t.run_config().storage_path;
        d["num_workers"] = t.scaling_config().num_workers;
        d["min_workers"] = t.scaling_config().min_workers;
        return d;
      });

  m.def(
      "train_report",
      [](py::handle metrics, std::optional<Checkpoint> checkpoint, bool async, int max_in_flight) {
        nlohmann::json j = to_json(metrics);
        py::gil_scoped_release release;
        train::report(j, checkpoint,
                      train::ReportOptions{.async = async, .max_in_flight = max_in_flight});
      },
      py::arg("metrics"), py::arg("checkpoint"), py::arg("async_"), py::arg("max_in_flight"));
  m.def("train_get_checkpoint", [] {
    py::gil_scoped_release release;
    return train::get_checkpoint();
  });
  m.def("train_get_context", [] { return context_dict(train::get_context()); });
  m.def("train_should_checkpoint", [] { return train::should_checkpoint(); });
  // A variable of the C environment: os.environ is a copy made at start-up,
  // and the runtime sets some in a forked worker after that.
  m.def(
      "train_environment_value",
      [](const std::string& name) { return train::environment_value(name); }, py::arg("name"));
  m.def("train_wait_for_reports", [] {
    py::gil_scoped_release release;
    train::wait_for_reports();
  });
}

}  // namespace cairn::python
