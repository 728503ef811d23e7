// The Trainer's step time with a checkpoint every step: asynchronous report,
// synchronous report, and no checkpoint, on the same training loop, in one
// run (docs/benchmarks.md, "Trainer step time").
//
// The loop: each step updates a float32 state of --state-mib MiB for about
// --step-ms milliseconds of work (calibrated once in this process, then the
// same number of passes in every mode), then reports. The work streams
// through the whole state (--work memory, the default: memory bound, as a
// model trained on the CPU is) or repeats on a cache-resident block and then
// updates the state once (--work compute: the host side of a step whose
// work runs on an accelerator, which leaves the host's memory bandwidth to
// the checkpoint). With a checkpoint, the
// step also writes the state into a train::TemporaryDirectory as a
// safetensors file (save_file, not made durable: the upload makes its copy
// durable) and reports that directory, synchronously or with {.async = true};
// or ("async_memory") copies the state into an in-memory checkpoint built in
// reused memory (StateStager) and reports that asynchronously (the snapshot of
// an in-memory checkpoint copies nothing). "tier_sync", "tier_async" and
// "tier_async_memory" are "sync", "async" and "async_memory" with the memory
// tier on (CheckpointConfig::memory_tier
// under --tier-root, default /dev/shm; every --tier-persist-every-th
// checkpoint persisted to --dir in the background): the step's cost of
// checkpointing every step to memory.
// Rank 0 times every step from its start to report()'s return (and, apart,
// the save into the directory and the report() call); the first --warmup
// steps are left out. Modes run interleaved, --rounds times each,
// and each figure is the median of the rounds' mean step times.
//
// Prints a table and, with --json FILE, writes the figures. The goal (issue:
// CheckFreq reports <= 3.5%): async step time <= 1.05x the no-checkpoint step
// time where the state's upload fits in a step (state / disk bandwidth <
// step time).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cairn/state.h"
#include "cairn/train.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Args {
  uint64_t state_mib = 64;
  double step_ms = 200;
  int steps = 20;
  int warmup = 2;
  std::string tier_root = "/dev/shm";
  int tier_persist_every = 10;
  int rounds = 3;
  int workers = 1;
  std::string work = "memory";  // "memory" | "compute" (work_pass)
  std::string dir;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("The Trainer's step time with a checkpoint every step", "train_step_bench");
  app.add_option("--dir", a.dir, "the experiments' folder")->required();
  app.add_option("--state-mib", a.state_mib)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--step-ms", a.step_ms, "the work of a step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", a.steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", a.warmup, "steps left out of the figures")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rounds", a.rounds)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--workers", a.workers)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--json", a.json, "write the figures here");
  app.add_option("--tier-root", a.tier_root, "the memory tier's root")->capture_default_str();
  app.add_option("--tier-persist-every", a.tier_persist_every)
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--work", a.work, "what a step's work is bound by")
      ->check(CLI::IsMember({"memory", "compute"}))
      ->capture_default_str();
  cairn::bench::parse_or_exit(app, argc, argv);
  if (a.steps <= a.warmup) {
    std::fprintf(stderr, "train_step_bench: --steps must exceed --warmup\n");
    std::exit(2);
  }
  return a;
}

// One pass of "training" over the state: a cheap update of every element.
void train_pass(std::span<float> w, int step) {
  const float decay = 0.9999f;
  const float push = 1e-4f * static_cast<float>(step % 7);
  for (float& x : w) x = x * decay + push;
}

// The floats of a --work compute step's cache-resident block (256 KiB).
constexpr size_t kComputeBlock = 64 * 1024;

// The work of one pass: `memory` streams through the whole state (memory
// bound, as a CPU-trained model is), `compute` repeats the update on a
// block that stays in cache (compute bound, like the host side of a step
// whose work runs on an accelerator).
void work_pass(std::vector<float>& w, const std::string& work, int step) {
  if (work == "compute") {
    std::span<float> block(w.data(), std::min(w.size(), kComputeBlock));
    for (int i = 0; i < 32; ++i) train_pass(block, step + i);
  } else {
    train_pass(w, step);
  }
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Config: mode ("none" | "sync" | "async" | "async_memory" | "tier_sync" |
// "tier_async" | "tier_async_memory"), numel, passes,
// steps, warmup.
void train_loop(const nlohmann::json& config) {
  const std::string mode = config.at("mode");
  const int steps = config.at("steps");
  const int warmup = config.at("warmup");
  const int passes = config.at("passes");
  const std::string work = config.at("work");
  std::vector<float> w(config.at("numel").get<size_t>(), 0.5f);
  cairn::StateStager stager;
  cairn::StateDict state;  // views `w`, which every step updates in place
  state.add("w", {w.size()}, std::span<const float>(w));
  double total = 0, saving = 0, reporting = 0;
  int timed = 0;
  for (int step = 0; step < steps; ++step) {
    const Clock::time_point start = Clock::now();
    for (int p = 0; p < passes; ++p) work_pass(w, work, step);
    if (work == "compute") train_pass(w, step);  // every step changes the whole state
    nlohmann::json metrics = {{"step", step}};
    const Clock::time_point trained = Clock::now();
    Clock::time_point saved = trained;
    if (mode == "none") {
      cairn::train::report(metrics);
    } else if (mode.ends_with("async_memory")) {
      cairn::Checkpoint ckpt = stager.stage(state);  // the one copy, into reused memory
      saved = Clock::now();
      cairn::train::report(metrics, ckpt, {.async = true});
    } else {
      cairn::train::TemporaryDirectory tmp;
      cairn::save_file(state, fs::path(tmp.path()) / "model.safetensors", {.durable = false});
      saved = Clock::now();
      cairn::train::report(metrics, cairn::Checkpoint::from_directory(tmp.path()),
                           {.async = mode.ends_with("async")});
    }
    if (step >= warmup) {
      total += seconds_since(start);
      saving += std::chrono::duration<double>(saved - trained).count();
      reporting += seconds_since(saved);
      ++timed;
    }
  }
  // The means ride on a last report without a checkpoint.
  cairn::train::report({{"mean_step_s", total / timed},
                        {"mean_save_s", saving / timed},
                        {"mean_report_s", reporting / timed},
                        {"steps_timed", timed}});
}

// Passes of work_pass() that take about `ms` on this machine.
int calibrate(size_t numel, const std::string& work, double ms) {
  std::vector<float> w(numel, 0.5f);
  train_pass(w, 0);  // first touch
  const Clock::time_point t = Clock::now();
  const int probe = work == "compute" ? 200 : 3;
  for (int i = 0; i < probe; ++i) work_pass(w, work, i);
  const double per_pass = seconds_since(t) / probe;
  return std::max(1, static_cast<int>(std::lround(ms / 1000.0 / per_pass)));
}

using cairn::bench::median;

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const size_t numel = static_cast<size_t>(a.state_mib << 20) / sizeof(float);
  const int passes = calibrate(numel, a.work, a.step_ms);
  fs::create_directories(a.dir);
  const std::vector<std::string> modes = {
      "none", "sync", "async", "async_memory", "tier_sync", "tier_async", "tier_async_memory"};
  std::map<std::string, std::vector<double>> means, saves, reports;
  for (int round = 0; round < a.rounds; ++round) {
    for (const std::string& mode : modes) {
      cairn::RunConfig run;
      run.name = fmt::format("{}-{}", mode, round);
      run.storage_path = a.dir;
      run.checkpoint_config.num_to_keep = 2;  // bounds the disk used
      if (mode.starts_with("tier_")) {
        run.checkpoint_config.memory_tier.enabled = true;
        run.checkpoint_config.memory_tier.root = a.tier_root;
        run.checkpoint_config.memory_tier.num_to_keep = 2;
        run.checkpoint_config.memory_tier.persist_every_n = a.tier_persist_every;
      }
      cairn::Trainer trainer(train_loop,
                             {{"mode", mode},
                              {"numel", numel},
                              {"passes", passes},
                              {"work", a.work},
                              {"steps", a.steps},
                              {"warmup", a.warmup}},
                             cairn::ScalingConfig{.num_workers = a.workers}, run);
      cairn::Result r = trainer.fit();
      if (r.error) {
        std::fprintf(stderr, "train_step_bench: %s run failed: %s\n", mode.c_str(),
                     r.error->c_str());
        return 1;
      }
      means[mode].push_back(r.metrics.at("mean_step_s").get<double>());
      saves[mode].push_back(r.metrics.at("mean_save_s").get<double>());
      reports[mode].push_back(r.metrics.at("mean_report_s").get<double>());
      // Under mpirun every process of the launch returns from fit() and
      // removes the run; one of them does, the others find it gone.
      std::error_code ec;
      fs::remove_all(fs::path(a.dir) / run.name, ec);  // ignore-error: see above
    }
  }
  const double none = median(means["none"]);
  nlohmann::json out = {{"state_mib", a.state_mib}, {"workers", a.workers}, {"passes", passes},
                        {"work", a.work},           {"steps", a.steps},     {"warmup", a.warmup},
                        {"rounds", a.rounds}};
  std::printf(
      "Trainer step time, %d worker(s), %llu MiB state, %s-bound steps, checkpoint every "
      "step\n",
      a.workers, static_cast<unsigned long long>(a.state_mib), a.work.c_str());
  std::printf("%-18s %14s %18s %10s %10s  %s\n", "mode", "step (median)", "vs no checkpoint",
              "save", "report()", "step, each round");
  for (const std::string& mode : modes) {
    const double m = median(means[mode]);
    std::string rounds;
    for (double v : means[mode]) rounds += fmt::format("{:.4f} ", v);
    const double save = median(saves[mode]), report = median(reports[mode]);
    std::printf("%-18s %12.4f s %17.3fx %8.4f s %8.4f s  %s\n", mode.c_str(), m, m / none, save,
                report, rounds.c_str());
    out["modes"][mode] = {{"median_step_s", m},
                          {"ratio", m / none},
                          {"median_save_s", save},
                          {"median_report_s", report},
                          {"rounds", means[mode]}};
  }
  out["goal_async_ratio"] = 1.05;
  for (const char* mode : {"async", "async_memory", "tier_async", "tier_async_memory"}) {
    const double ratio = median(means[mode]) / none;
    std::printf("goal: %s <= 1.05x no checkpoint: %.3fx %s\n", mode, ratio,
                ratio <= 1.05 ? "PASS" : "MISS");
    out["modes"][mode]["pass"] = ratio <= 1.05;
  }
  if (!a.json.empty()) std::ofstream(a.json) << out.dump(2) << "\n";
  return 0;
}
