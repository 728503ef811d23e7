// cairn_demo: a small real training run that survives a crash.
//
// Logistic regression on generated data (2,000 samples of 10 features drawn
// from a known weight vector plus noise; 1,600 to train, 400 to validate),
// trained with Adam written by hand. After every epoch it writes the model
// weights (model.bin), the optimizer state (optimizer.bin) and the epoch
// (state.json) into a fresh local temporary directory, wraps it with
// cairn::Checkpoint::from_directory and hands it to
// cairn::CheckpointManager::register_checkpoint with the epoch's metrics.
//
// Started again on the same storage and experiment it resumes: it takes the
// manager's latest() checkpoint, reads it through as_directory() and carries
// on from the next epoch with the same weights and optimizer state. The data
// and each epoch's shuffle are functions of --seed and the epoch number only,
// so a run that failed and resumed ends with exactly the model an
// uninterrupted run would have produced.
//
// --fail-at-epoch E injects one failure: the run stops (exit code 3) right
// AFTER epoch E's checkpoint is committed, unless it resumed from a checkpoint
// of epoch E or later. Since that checkpoint is the latest, the next run
// resumes at epoch E + 1 and does not fail again.
//
// Exit codes: 0 finished, 1 error, 2 bad command line, 3 injected failure.
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInjectedFailure = 3;

constexpr size_t kSamples = 2000;
constexpr size_t kTrainSamples = 1600;
constexpr size_t kFeatures = 10;
constexpr size_t kBatch = 64;

struct Options {
  std::string storage;
  std::string experiment = "logreg";
  int epochs = 10;
  std::optional<int> num_to_keep;
  std::string score_attribute;
  std::string score_order = "max";
  std::optional<int> fail_at_epoch;
  uint64_t seed = 7;
  double learning_rate = 0.01;
};

// The injected failure, distinct from real errors.
struct InjectedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- data and model -----------------------------------------------------

struct Dataset {
  std::vector<double> x;  // row-major, kSamples x kFeatures
  std::vector<double> y;  // 0 or 1
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Labels drawn from a known model: logit = x . w_true + b_true + noise.
Dataset make_data(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> w_true(kFeatures);
  for (auto& w : w_true) w = 1.5 * normal(rng);
  const double b_true = 0.5;
  Dataset d;
  d.x.resize(kSamples * kFeatures);
  d.y.resize(kSamples);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (size_t i = 0; i < kSamples; ++i) {
    double logit = b_true + 0.5 * normal(rng);
    for (size_t j = 0; j < kFeatures; ++j) {
      d.x[i * kFeatures + j] = normal(rng);
      logit += d.x[i * kFeatures + j] * w_true[j];
    }
    d.y[i] = uniform(rng) < sigmoid(logit) ? 1.0 : 0.0;
  }
  return d;
}

// Parameters: kFeatures weights, then the bias.
using Params = std::vector<double>;

double logit_of(const Params& p, const Dataset& d, size_t i) {
  double z = p[kFeatures];
  for (size_t j = 0; j < kFeatures; ++j) z += p[j] * d.x[i * kFeatures + j];
  return z;
}

struct Eval {
  double loss = 0.0;
  double accuracy = 0.0;
};

// Mean binary cross-entropy and accuracy over samples [begin, end).
Eval evaluate(const Params& p, const Dataset& d, size_t begin, size_t end) {
  Eval e;
  for (size_t i = begin; i < end; ++i) {
    double z = logit_of(p, d, i);
    // log(1 + exp(z)) - y z, computed without overflow.
    e.loss += std::max(z, 0.0) - z * d.y[i] + std::log1p(std::exp(-std::abs(z)));
    e.accuracy += ((z > 0) == (d.y[i] > 0.5)) ? 1.0 : 0.0;
  }
  e.loss /= static_cast<double>(end - begin);
  e.accuracy /= static_cast<double>(end - begin);
  return e;
}

struct Adam {
  double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t t = 0;
  std::vector<double> m, v;

  void step(Params& p, const std::vector<double>& grad) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    const double c1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double c2 = 1.0 - std::pow(beta2, static_cast<double>(t));
    for (size_t k = 0; k < p.size(); ++k) {
      m[k] = beta1 * m[k] + (1.0 - beta1) * grad[k];
      v[k] = beta2 * v[k] + (1.0 - beta2) * grad[k] * grad[k];
      p[k] -= lr * (m[k] / c1) / (std::sqrt(v[k] / c2) + eps);
    }
  }
};

// One pass over the training samples in mini-batches. The shuffle depends on
// the seed and the epoch only, so a resumed run repeats it exactly.
double train_epoch(Params& p, Adam& adam, const Dataset& d, uint64_t seed, int epoch) {
  std::vector<size_t> order(kTrainSamples);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  double total = 0.0;
  std::vector<double> grad(p.size());
  for (size_t start = 0; start < order.size(); start += kBatch) {
    size_t end = std::min(start + kBatch, order.size());
    std::fill(grad.begin(), grad.end(), 0.0);
    for (size_t b = start; b < end; ++b) {
      size_t i = order[b];
      double z = logit_of(p, d, i);
      double err = sigmoid(z) - d.y[i];
      for (size_t j = 0; j < kFeatures; ++j) grad[j] += err * d.x[i * kFeatures + j];
      grad[kFeatures] += err;
      total += std::max(z, 0.0) - z * d.y[i] + std::log1p(std::exp(-std::abs(z)));
    }
    for (auto& g : grad) g /= static_cast<double>(end - start);
    adam.step(p, grad);
  }
  return total / static_cast<double>(order.size());
}

// ---- checkpoint files ---------------------------------------------------
// model.bin:     "LRMODEL1", u64 count, count doubles (weights then bias)
// optimizer.bin: "LRADAM01", u64 step, u64 count, doubles lr beta1 beta2 eps,
//                count doubles m, count doubles v
// state.json:    {"epoch": E, "seed": S, "metrics": {...}}
// Native byte order: the demo restores on the machine that saved.

class ByteWriter {
 public:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void f64s(const std::vector<double>& v) { raw(v.data(), v.size() * sizeof(double)); }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(std::string bytes, std::string name) : in_(std::move(bytes)), name_(std::move(name)) {}
  void magic(std::string_view m) {
    if (in_.compare(0, m.size(), m) != 0) fail(fmt::format("does not start with \"{}\"", m));
    pos_ = m.size();
  }
  uint64_t u64() { return take<uint64_t>(); }
  double f64() { return take<double>(); }
  std::vector<double> f64s(size_t n) {
    need(n * sizeof(double));
    std::vector<double> v(n);
    std::memcpy(v.data(), in_.data() + pos_, n * sizeof(double));
    pos_ += n * sizeof(double);
    return v;
  }
  void end() {
    if (pos_ != in_.size())
      fail(fmt::format("{} unexpected bytes at offset {}", in_.size() - pos_, pos_));
  }

 private:
  template <typename T>
  T take() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  void need(size_t n) {
    if (in_.size() - pos_ < n) fail(fmt::format("truncated at offset {}", pos_));
  }
  [[noreturn]] void fail(const std::string& why) {
    throw cairn::Error(cairn::ErrorCode::kCorruption, fmt::format("{}: {}", name_, why));
  }
  std::string in_;
  std::string name_;
  size_t pos_ = 0;
};

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out)
    throw cairn::Error(cairn::ErrorCode::kIO, fmt::format("{}: write failed", path.string()));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw cairn::Error(cairn::ErrorCode::kNotFound, fmt::format("{}: cannot open", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TrainingState {
  Params params;
  Adam adam;
  int epoch = 0;  // epochs completed
};

void save_state(const fs::path& dir, const TrainingState& s, uint64_t seed, const json& metrics) {
  ByteWriter model;
  model.raw("LRMODEL1", 8);
  model.u64(s.params.size());
  model.f64s(s.params);
  write_file(dir / "model.bin", model.bytes());

  ByteWriter opt;
  opt.raw("LRADAM01", 8);
  opt.u64(s.adam.t);
  opt.u64(s.adam.m.size());
  for (double h : {s.adam.lr, s.adam.beta1, s.adam.beta2, s.adam.eps}) opt.f64(h);
  opt.f64s(s.adam.m);
  opt.f64s(s.adam.v);
  write_file(dir / "optimizer.bin", opt.bytes());

  json state = {{"epoch", s.epoch}, {"seed", seed}, {"metrics", metrics}};
  write_file(dir / "state.json", state.dump(2) + "\n");
}

TrainingState load_state(const fs::path& dir, uint64_t seed) {
  TrainingState s;
  ByteReader model(read_file(dir / "model.bin"), (dir / "model.bin").string());
  model.magic("LRMODEL1");
  uint64_t n = model.u64();
  if (n != kFeatures + 1) {
    throw cairn::Error(cairn::ErrorCode::kCorruption,
                       fmt::format("{}: {} parameters, this model has {}",
                                   (dir / "model.bin").string(), n, kFeatures + 1));
  }
  s.params = model.f64s(n);
  model.end();

  ByteReader opt(read_file(dir / "optimizer.bin"), (dir / "optimizer.bin").string());
  opt.magic("LRADAM01");
  s.adam.t = opt.u64();
  uint64_t m = opt.u64();
  if (m != 0 && m != n) {
    throw cairn::Error(cairn::ErrorCode::kCorruption,
                       fmt::format("{}: moments for {} parameters, the model has {}",
                                   (dir / "optimizer.bin").string(), m, n));
  }
  s.adam.lr = opt.f64();
  s.adam.beta1 = opt.f64();
  s.adam.beta2 = opt.f64();
  s.adam.eps = opt.f64();
  s.adam.m = opt.f64s(m);
  s.adam.v = opt.f64s(m);
  opt.end();

  const fs::path state_path = dir / "state.json";
  json state = json::parse(read_file(state_path), nullptr, false);
  if (!state.is_object() || !state["epoch"].is_number_integer()) {
    throw cairn::Error(
        cairn::ErrorCode::kCorruption,
        fmt::format("{}: not a JSON object with an integer \"epoch\"", state_path.string()));
  }
  if (state.value("seed", seed) != seed) {
    throw cairn::Error(cairn::ErrorCode::kInvalidArgument,
                       fmt::format("{}: saved with --seed {}, this run has --seed {}",
                                   state_path.string(), state.value("seed", seed), seed));
  }
  s.epoch = state["epoch"].get<int>();
  return s;
}

// A fresh local directory, removed with everything in it when destroyed.
class ScratchDir {
 public:
  ScratchDir() {
    std::string templ = (fs::temp_directory_path() / "cairn-demo-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      throw cairn::errno_error(errno, "mkdtemp", templ);
    }
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);  // ignore-error: a stray temp dir must not mask the real outcome
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string experiment_uri(const Options& o) {
  std::string root = o.storage;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root + "/" + o.experiment;
}

int run(const Options& o) {
  cairn::CheckpointConfig config;
  config.num_to_keep = o.num_to_keep;
  config.checkpoint_score_attribute = o.score_attribute;
  config.checkpoint_score_order = o.score_order;
  config.validate();

  const Dataset data = make_data(o.seed);
  cairn::CheckpointManager manager(experiment_uri(o), config);
  fmt::print("experiment {}\n", manager.uri());

  TrainingState state;
  state.params.assign(kFeatures + 1, 0.0);
  state.adam.lr = o.learning_rate;
  if (auto latest = manager.latest()) {
    cairn::LocalDirectory view = latest->checkpoint.as_directory();
    state = load_state(view.path(), o.seed);
    fmt::print("resumed from {} (epoch {}): weights, optimizer step {} and epoch restored\n",
               latest->name, state.epoch, state.adam.t);
  } else {
    fmt::print("no checkpoint yet: starting at epoch 1\n");
  }
  // Injected once: a run that starts at or past the failing epoch has
  // already failed there (or never needed to).
  const bool fail_armed = o.fail_at_epoch && state.epoch < *o.fail_at_epoch;

  for (int epoch = state.epoch + 1; epoch <= o.epochs; ++epoch) {
    double train_loss = train_epoch(state.params, state.adam, data, o.seed, epoch);
    state.epoch = epoch;
    Eval val = evaluate(state.params, data, kTrainSamples, kSamples);
    json metrics = {{"epoch", epoch},
                    {"loss", val.loss},
                    {"accuracy", val.accuracy},
                    {"train_loss", train_loss}};
    std::string saved;
    {
      ScratchDir scratch;
      save_state(scratch.path(), state, o.seed, metrics);
      auto checkpoint = cairn::Checkpoint::from_directory(scratch.path().string());
      saved = manager.register_checkpoint(metrics, checkpoint).name;
    }
    fmt::print("epoch {:>3}/{}  train_loss {:.4f}  loss {:.4f}  accuracy {:.4f}  -> {}\n", epoch,
               o.epochs, train_loss, val.loss, val.accuracy, saved);
    std::cout.flush();
    if (fail_armed && epoch == *o.fail_at_epoch) {
      throw InjectedFailure(fmt::format(
          "injected failure after epoch {} ({} is committed); run the same command again to "
          "resume",
          epoch, saved));
    }
  }

  Eval final_eval = evaluate(state.params, data, kTrainSamples, kSamples);
  fmt::print("finished: epoch {}/{}  loss {:.4f}  accuracy {:.4f}\n", state.epoch, o.epochs,
             final_eval.loss, final_eval.accuracy);
  auto best = manager.best();
  if (!best.empty()) {
    fmt::print("latest {}, best {} ({} kept)\n", manager.latest()->name, best.front().name,
               best.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cairn_demo: logistic regression checkpointed every epoch with Cairn; fails once on "
      "purpose with --fail-at-epoch and resumes when run again",
      "cairn_demo"};
  Options o;
  int num_to_keep = 0;
  int fail_at = 0;
  app.add_option("--storage", o.storage, "storage root (a path, file:// or memory:// URI)")
      ->required();
  app.add_option("--experiment", o.experiment, "experiment name (a folder under --storage)")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "epochs to train in total")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  auto* keep = app.add_option("--num-to-keep", num_to_keep, "checkpoints to keep (default: all)")
                   ->check(CLI::PositiveNumber);
  app.add_option("--score-attribute", o.score_attribute,
                 "metric ranking checkpoints for --num-to-keep: loss, accuracy, train_loss or "
                 "epoch (default: keep the most recent)");
  app.add_option("--score-order", o.score_order, "max or min")
      ->capture_default_str()
      ->check(CLI::IsMember({"max", "min"}));
  auto* fail = app.add_option("--fail-at-epoch", fail_at,
                              "fail (exit 3) right after epoch E's checkpoint is committed, "
                              "unless resuming from epoch E or later")
                   ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the data and the shuffles")->capture_default_str();
  app.add_option("--learning-rate", o.learning_rate,
                 "Adam's learning rate (a resumed run keeps the one it saved)")
      ->capture_default_str();
  app.footer("Exit codes: 0 finished, 1 error, 2 bad command line, 3 injected failure.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "cairn_demo: error: " << e.what() << " (see --help)\n";
    return kExitUsage;
  }
  if (keep->count() > 0) o.num_to_keep = num_to_keep;
  if (fail->count() > 0) o.fail_at_epoch = fail_at;

  try {
    return run(o);
  } catch (const InjectedFailure& e) {
    std::cerr << "cairn_demo: " << e.what() << '\n';
    return kExitInjectedFailure;
  } catch (const cairn::Error& e) {
    std::cerr << "cairn_demo: error: " << e.what() << '\n';
    return e.code() == cairn::ErrorCode::kInvalidArgument ? kExitUsage : kExitError;
  } catch (const std::exception& e) {
    std::cerr << "cairn_demo: error: " << e.what() << '\n';
    return kExitError;
  }
}
