// cairn.tune's core: cairn::tune::Tuner over Python trainables (a function
// run as each trial's training function, or a class driven step by step),
// the search-space functions and the schedulers. Public headers only.
//
// Trials run in processes forked by the Tuner (a runner per trial, which
// forks the trial's workers): the forks are prepared as for cairn.train
// (_train.cc, "Forking an interpreter"), and a class trainable's methods
// are called with the GIL in the worker that runs it.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "binding.h"
#include "cairn/tuner.h"

namespace py = pybind11;

namespace cairn::python {
namespace {

// A Python object of cairn.tune.Trainable's shape behind the C++ interface.
// Lives in the worker process that runs the trial.
class PyTrainable final : public tune::Trainable {
 public:
  explicit PyTrainable(py::object obj) : obj_(std::move(obj)) {}
  ~PyTrainable() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  void setup(const nlohmann::json& config) override { call("_cairn_setup", from_json(config)); }
  nlohmann::json step() override {
    py::gil_scoped_acquire gil;
    return to_json(guarded([&] { return obj_.attr("_cairn_step")(); }));
  }
  void save_checkpoint(const std::string& dir) override {
    call("_cairn_save_checkpoint", py::str(dir));
  }
  void load_checkpoint(const std::string& dir) override {
    call("_cairn_load_checkpoint", py::str(dir));
  }
  void cleanup() override { call("cleanup"); }
  bool reset_config(const nlohmann::json& config) override {
    py::gil_scoped_acquire gil;
    return guarded([&] { return obj_.attr("_cairn_reset_config")(from_json(config)); })
        .cast<bool>();
  }

 private:
  template <typename... Args>
  void call(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    guarded([&] { return obj_.attr(method)(std::forward<Args>(args)...); });
  }
  // A Python exception is printed (the worker's stderr reaches Result.error)
  // and ends the trial's attempt as a failure naming its type.
  template <typename F>
  py::object guarded(F&& f) {
    try {
      return f();
    } catch (py::error_already_set& e) {
      std::string what = python_error_text(e);
      e.restore();
      PyErr_Print();
      py::module_::import("sys").attr("stderr").attr("flush")();
      throw std::runtime_error(what);
    }
  }

  py::object obj_;
};

py::dict info_dict(const tune::TrialInfo& t) {
  py::dict d;
  d["trial_id"] = t.trial_id;
  d["index"] = t.index;
  d["config"] = from_json(t.config);
  d["status"] = std::string(tune::to_string(t.status));
  d["last_result"] = from_json(t.last_result);
  d["path"] = t.path;
  d["num_failures"] = t.num_failures;
  d["error"] = t.error ? py::object(py::str(*t.error)) : py::object(py::none());
  d["latest_checkpoint"] =
      t.latest_checkpoint ? py::object(py::str(*t.latest_checkpoint)) : py::object(py::none());
  return d;
}

// Calls `f` (Python code of a Tune hook: a callback or a stopper, `obj`),
// turning a Python exception into an Error naming the hook's kind, its class
// and `what` it was doing. The GIL is held.
template <typename F>
py::object call_hook(const char* kind, const py::object& obj, const char* what, F&& f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("the Tune ") + kind + " " +
                    std::string(py::str(py::type::of(obj).attr("__name__"))) + " failed in " +
                    what + ": " + python_error_text(e));
  }
}

// A cairn.tune.Callback behind the C++ interface: called on the Tuner's
// thread, with the GIL. A Python exception ends fit() with an Error naming
// the callback and the exception.
class PyCallback final : public tune::Callback {
 public:
  explicit PyCallback(py::object obj) : ref_(std::make_shared<PyRef>(std::move(obj))) {}
  void on_trial_start(const tune::TrialInfo& t) override { call("_cairn_event", "start", t); }
  void on_trial_result(const tune::TrialInfo& t, nlohmann::json& result) override {
    py::gil_scoped_acquire gil;
    py::object out = guarded("on_trial_result", [&] {
      return ref_->object.attr("_cairn_result")(info_dict(t), from_json(result));
    });
    result = to_json(out);
  }
  void on_trial_complete(const tune::TrialInfo& t) override { call("_cairn_event", "complete", t); }
  void on_trial_error(const tune::TrialInfo& t) override { call("_cairn_event", "error", t); }
  void on_checkpoint(const tune::TrialInfo& t, const std::string& checkpoint) override {
    py::gil_scoped_acquire gil;
    guarded("on_checkpoint", [&] {
      return ref_->object.attr("_cairn_checkpoint")(info_dict(t), py::str(checkpoint));
    });
  }
  void on_experiment_end(const std::vector<tune::TrialInfo>& trials) override {
    py::gil_scoped_acquire gil;
    guarded("on_experiment_end", [&] {
      py::list infos;
      for (const auto& t : trials) infos.append(info_dict(t));
      return ref_->object.attr("_cairn_end")(infos);
    });
  }

 private:
  void call(const char* method, const char* event, const tune::TrialInfo& t) {
    py::gil_scoped_acquire gil;
    guarded(event, [&] { return ref_->object.attr(method)(event, info_dict(t)); });
  }
  template <typename F>
  py::object guarded(const char* what, F&& f) {
    return call_hook("callback", ref_->object, what, std::forward<F>(f));
  }

  std::shared_ptr<PyRef> ref_;
};

// A Ray stopper (cairn.tune.Stopper, or a FunctionStopper around a
// function) behind the C++ interface: called on the Tuner's thread, with the
// GIL. A Python exception ends fit() with an Error naming the stopper.
class PyStopper final : public tune::Stopper {
 public:
  explicit PyStopper(py::object obj) : ref_(std::make_shared<PyRef>(std::move(obj))) {}
  bool operator()(const std::string& trial_id, const nlohmann::json& result) override {
    py::gil_scoped_acquire gil;
    return guarded("__call__", [&] { return ref_->object(trial_id, from_json(result)); });
  }
  bool stop_all() override {
    py::gil_scoped_acquire gil;
    if (!py::hasattr(ref_->object, "stop_all")) return false;
    return guarded("stop_all", [&] { return ref_->object.attr("stop_all")(); });
  }

 private:
  template <typename F>
  bool guarded(const char* what, F&& f) {
    return py::bool_(call_hook("stopper", ref_->object, what, std::forward<F>(f)));
  }

  std::shared_ptr<PyRef> ref_;
};

tune::TrainableFactory factory_of(py::object cls) {
  auto hold = std::make_shared<PyRef>(std::move(cls));
  return [hold]() -> std::unique_ptr<tune::Trainable> {
    python_worker_starts();
    py::gil_scoped_acquire gil;
    return std::make_unique<PyTrainable>(hold->object());
  };
}

// cairn.tune.sample_from's functions behind the C++ interface, by name: each
// a Python callable config -> (ready, value) (cairn/tune/_space.py), called
// on the Tuner's thread with the GIL. A Python exception is an Error naming
// it; ParamSpace puts the key path in front.
tune::SampleFunctions sample_functions_arg(const py::dict& functions) {
  tune::SampleFunctions out;
  for (const auto& [name, fn] : functions) {
    auto ref = std::make_shared<PyRef>(py::reinterpret_borrow<py::object>(fn));
    out[name.cast<std::string>()] = [ref](const nlohmann::json& config,
                                          tune::Rng&) -> std::optional<nlohmann::json> {
      py::gil_scoped_acquire gil;
      try {
        auto [ready, value] = ref->object(from_json(config)).cast<std::pair<bool, py::object>>();
        if (!ready) return std::nullopt;
        return to_json(value);
      } catch (py::error_already_set& e) {
        throw Error(ErrorCode::kInvalidArgument, "the function raised " + python_error_text(e));
      }
    };
  }
  return out;
}

tune::TuneConfig tune_config_arg(const py::dict& d) {
  tune::TuneConfig c;
  c.metric = d["metric"].cast<std::string>();
  c.mode = d["mode"].cast<std::string>();
  c.num_samples = d["num_samples"].cast<int>();
  c.max_concurrent_trials = d["max_concurrent_trials"].cast<int>();
  if (!d["scheduler"].is_none()) {
    c.scheduler = d["scheduler"].cast<std::shared_ptr<tune::TrialScheduler>>();
  }
  c.seed = d["seed"].cast<std::uint64_t>();
  c.stop = to_json(d["stop"]);
  if (!d["stopper"].is_none()) {
    c.stopper = std::make_shared<PyStopper>(py::reinterpret_borrow<py::object>(d["stopper"]));
  }
  c.time_budget_s = d["time_budget_s"].cast<double>();
  const py::dict resources = d["resources_per_trial"].cast<py::dict>();
  c.resources_per_trial.cpu = resources["cpu"].cast<double>();
  c.resources_per_trial.gpu = resources["gpu"].cast<double>();
  for (py::handle cb : d["callbacks"].cast<py::list>()) {
    c.callbacks.push_back(std::make_shared<PyCallback>(py::reinterpret_borrow<py::object>(cb)));
  }
  c.sample_functions = sample_functions_arg(d["sample_functions"].cast<py::dict>());
  return c;
}

struct Trainables {
  TrainFn fn;
  tune::TrainableFactory cls;
};

Trainables trainables_of(py::object fn, py::object cls) {
  Trainables t;
  if (!cls.is_none()) t.cls = factory_of(std::move(cls));
  if (!fn.is_none()) t.fn = python_train_fn(std::move(fn));
  return t;
}

template <typename Options>
void set_common(Options& o, const std::string& time_attr, const std::string& metric,
                const std::string& mode) {
  o.time_attr = time_attr;
  o.metric = metric;
  o.mode = mode;
}

// The search-space functions (tune.grid_search, choice, ...).
void bind_search_space(py::module_& m) {
  const auto lo = py::arg("lo"), hi = py::arg("hi"), q = py::arg("q");
  m.def(
      "tune_grid_search", [](py::handle v) { return from_json(tune::grid_search(to_json(v))); },
      py::arg("values"));
  m.def(
      "tune_choice", [](py::handle v) { return from_json(tune::choice(to_json(v))); },
      py::arg("values"));
  m.def(
      "tune_uniform", [](double l, double h) { return from_json(tune::uniform(l, h)); }, lo, hi);
  m.def(
      "tune_loguniform", [](double l, double h) { return from_json(tune::loguniform(l, h)); }, lo,
      hi);
  m.def(
      "tune_randint", [](std::int64_t l, std::int64_t h) { return from_json(tune::randint(l, h)); },
      lo, hi);
  m.def(
      "tune_quniform",
      [](double l, double h, double s) { return from_json(tune::quniform(l, h, s)); }, lo, hi, q);
  m.def(
      "tune_qloguniform",
      [](double l, double h, double s) { return from_json(tune::qloguniform(l, h, s)); }, lo, hi,
      q);
  m.def(
      "tune_qrandint",
      [](std::int64_t l, std::int64_t h, std::int64_t s) {
        return from_json(tune::qrandint(l, h, s));
      },
      lo, hi, q);
  m.def(
      "tune_lograndint",
      [](std::int64_t l, std::int64_t h) { return from_json(tune::lograndint(l, h)); }, lo, hi);
  m.def(
      "tune_qlograndint",
      [](std::int64_t l, std::int64_t h, std::int64_t s) {
        return from_json(tune::qlograndint(l, h, s));
      },
      lo, hi, q);
  m.def(
      "tune_randn", [](double mean, double sd) { return from_json(tune::randn(mean, sd)); },
      py::arg("mean"), py::arg("sd"));
  m.def(
      "tune_qrandn",
      [](double mean, double sd, double s) { return from_json(tune::qrandn(mean, sd, s)); },
      py::arg("mean"), py::arg("sd"), q);
  m.def(
      "tune_sample_from",
      [](const std::string& name) { return from_json(tune::sample_from(name)); }, py::arg("name"));
}

// The schedulers: FIFO, ASHA, PBT.
void bind_schedulers(py::module_& m) {
  py::class_<tune::TrialScheduler, std::shared_ptr<tune::TrialScheduler>>(m, "TrialScheduler");
  py::class_<tune::FIFOScheduler, tune::TrialScheduler, std::shared_ptr<tune::FIFOScheduler>>(
      m, "FIFOScheduler")
      .def(py::init<>());
  py::class_<tune::ASHAScheduler, tune::TrialScheduler, std::shared_ptr<tune::ASHAScheduler>>(
      m, "ASHAScheduler")
      .def(py::init([](const std::string& time_attr, const std::string& metric,
                       const std::string& mode, double max_t, double grace_period,
                       double reduction_factor, int brackets) {
             tune::ASHAOptions o;
             set_common(o, time_attr, metric, mode);
             o.max_t = max_t;
             o.grace_period = grace_period;
             o.reduction_factor = reduction_factor;
             o.brackets = brackets;
             return std::make_shared<tune::ASHAScheduler>(o);
           }),
           py::arg("time_attr"), py::arg("metric"), py::arg("mode"), py::arg("max_t"),
           py::arg("grace_period"), py::arg("reduction_factor"), py::arg("brackets"));
  py::class_<tune::PopulationBasedTraining, tune::TrialScheduler,
             std::shared_ptr<tune::PopulationBasedTraining>>(m, "PopulationBasedTraining")
      .def(py::init([](const std::string& time_attr, const std::string& metric,
                       const std::string& mode, double perturbation_interval,
                       py::handle hyperparam_mutations, double quantile_fraction,
                       double resample_probability, std::uint64_t seed,
                       const py::dict& sample_functions, double burn_in_period,
                       double perturbation_factor_up, double perturbation_factor_down) {
             tune::PBTOptions o;
             set_common(o, time_attr, metric, mode);
             o.perturbation_interval = perturbation_interval;
             o.hyperparam_mutations = to_json(hyperparam_mutations);
             o.quantile_fraction = quantile_fraction;
             o.resample_probability = resample_probability;
             o.seed = seed;
             o.sample_functions = sample_functions_arg(sample_functions);
             o.burn_in_period = burn_in_period;
             o.perturbation_factor_up = perturbation_factor_up;
             o.perturbation_factor_down = perturbation_factor_down;
             return std::make_shared<tune::PopulationBasedTraining>(o);
           }),
           py::arg("time_attr"), py::arg("metric"), py::arg("mode"),
           py::arg("perturbation_interval"), py::arg("hyperparam_mutations"),
           py::arg("quantile_fraction"), py::arg("resample_probability"), py::arg("seed"),
           py::arg("sample_functions"), py::arg("burn_in_period") = 0.0,
           py::arg("perturbation_factor_up") = 1.2, py::arg("perturbation_factor_down") = 0.8)
      .def(
          "explore",
          [](tune::PopulationBasedTraining& pbt, py::handle config) {
            return from_json(pbt.explore(to_json(config)));
          },
          py::arg("config"));
}

// TrialResult and ResultGrid.
void bind_results(py::module_& m) {
  py::class_<tune::TrialResult, Result>(m, "TrialResult")
      .def_readonly("trial_id", &tune::TrialResult::trial_id)
      .def_property_readonly("config",
                             [](const tune::TrialResult& r) { return from_json(r.config); })
      .def_property_readonly("status", [](const tune::TrialResult& r) {
        return std::string(tune::to_string(r.status));
      });

  py::class_<tune::ResultGrid>(m, "ResultGrid")
      .def("__len__", &tune::ResultGrid::size)
      .def(
          "__getitem__",
          [](const tune::ResultGrid& g, std::size_t i) {
            if (i >= g.size()) throw py::index_error("ResultGrid index out of range");
            return g[i];
          },
          py::arg("i"))
      .def_property_readonly("num_errors", &tune::ResultGrid::num_errors)
      .def_property_readonly("num_terminated", &tune::ResultGrid::num_terminated)
      .def_property_readonly("experiment_path", &tune::ResultGrid::experiment_path)
      .def_property_readonly("preempted", &tune::ResultGrid::preempted)
      .def(
          "get_best_result",
          [](const tune::ResultGrid& g, const std::string& metric, const std::string& mode,
             const std::string& scope) { return g.get_best_result(metric, mode, scope); },
          py::arg("metric"), py::arg("mode"), py::arg("scope"));
}

// The Tuner: fit, can_restore, restore.
void bind_tuner(py::module_& m) {
  py::class_<tune::Tuner>(m, "Tuner")
      .def(py::init([](py::object fn, py::object cls, py::handle param_space,
                       const py::dict& tune_config, const py::dict& run, int num_workers,
                       const std::string& launcher) {
             Trainables t = trainables_of(std::move(fn), std::move(cls));
             ScalingConfig scaling{.num_workers = num_workers, .launcher = launcher_arg(launcher)};
             nlohmann::json space = to_json(param_space);
             if (t.cls) {
               return tune::Tuner(std::move(t.cls), std::move(space), tune_config_arg(tune_config),
                                  run_config_arg(run), scaling);
             }
             return tune::Tuner(std::move(t.fn), std::move(space), tune_config_arg(tune_config),
                                run_config_arg(run), scaling);
           }),
           py::arg("fn"), py::arg("cls"), py::arg("param_space"), py::arg("tune_config"),
           py::arg("run"), py::arg("num_workers"), py::arg("launcher"))
      .def("get_results",
           [](const tune::Tuner& tuner) {
             py::gil_scoped_release release;
             return tuner.get_results();
           })
      .def("fit",
           [](tune::Tuner& tuner) {
             std::optional<tune::ResultGrid> grid;
             run_forking([&] { grid = tuner.fit(); });
             return std::move(*grid);
           })
      .def_static(
          "can_restore",
          [](py::handle path) {
            std::string p = path_arg(path);
            py::gil_scoped_release release;
            return tune::Tuner::can_restore(p);
          },
          py::arg("path"))
      .def_static(
          "restore",
          [](py::handle path, py::object fn, py::object cls, bool resume_unfinished,
             bool resume_errored, bool restart_errored, py::object scheduler,
             const py::list& callbacks, const py::dict& sample_functions, py::object stopper) {
            std::string p = path_arg(path);
            Trainables t = trainables_of(std::move(fn), std::move(cls));
            tune::RestoreOptions options{.resume_unfinished = resume_unfinished,
                                         .resume_errored = resume_errored,
                                         .restart_errored = restart_errored};
            tune::TuneConfig code;
            if (!scheduler.is_none()) {
              code.scheduler = scheduler.cast<std::shared_ptr<tune::TrialScheduler>>();
            }
            for (py::handle cb : callbacks) {
              code.callbacks.push_back(
                  std::make_shared<PyCallback>(py::reinterpret_borrow<py::object>(cb)));
            }
            code.sample_functions = sample_functions_arg(sample_functions);
            if (!stopper.is_none()) code.stopper = std::make_shared<PyStopper>(std::move(stopper));
            py::gil_scoped_release release;
            if (t.cls) return tune::Tuner::restore(p, std::move(t.cls), options, code);
            return tune::Tuner::restore(p, std::move(t.fn), options, code);
          },
          py::arg("path"), py::arg("fn"), py::arg("cls"), py::arg("resume_unfinished"),
          py::arg("resume_errored"), py::arg("restart_errored"), py::arg("scheduler"),
          py::arg("callbacks"), py::arg("sample_functions"), py::arg("stopper") = py::none());
}

}  // namespace

void bind_tune(py::module_& m) {
  bind_search_space(m);
  bind_schedulers(m);
  bind_results(m);
  bind_tuner(m);
}

}  // namespace cairn::python
