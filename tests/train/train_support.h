// Helpers for the Trainer's process tests.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cairn/manager.h"
#include "cairn/train.h"

namespace cairn::testing {

// Writes `text` to file `name` in a new train::TemporaryDirectory-style dir
// and reports it with `metrics`.
inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every committed checkpoint of the experiment verifies; returns how many.
inline size_t expect_all_verify(const std::string& experiment) {
  ExperimentListing listing = read_experiment(experiment);
  for (const auto& rec : listing.checkpoints) {
    auto problems = rec.checkpoint.verify();
    EXPECT_TRUE(problems.empty()) << rec.name << ": " << problems.size() << " problem(s), first "
                                  << (problems.empty()
                                          ? ""
                                          : problems[0].path + " " + problems[0].reason);
  }
  return listing.checkpoints.size();
}

// The test process has no child left (no zombie, nothing running).
inline void expect_no_children() {
  errno = 0;
  pid_t r = ::waitpid(-1, nullptr, WNOHANG);
  EXPECT_EQ(r, -1) << "a child process is left (pid " << r << ")";
  EXPECT_EQ(errno, ECHILD);
}

// Whether `pid` is dead: gone, or a zombie (an orphan's zombie waits for
// init, which in a container may never reap it).
inline bool is_dead(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

// Waits (bounded) until `pid` is dead (see is_dead).
inline bool wait_gone(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (is_dead(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// What a worker sees of its rendezvous: TrainContext::master_addr/port and
// the torchrun-style environment the worker exports ("<unset>" if missing).
inline nlohmann::json rendezvous_seen(const TrainContext& c) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string("<unset>");
  };
  return {{"master_addr", c.master_addr},
          {"master_port", c.master_port},
          {"MASTER_ADDR", env("MASTER_ADDR")},
          {"MASTER_PORT", env("MASTER_PORT")},
          {"RANK", env("RANK")},
          {"WORLD_SIZE", env("WORLD_SIZE")},
          {"LOCAL_RANK", env("LOCAL_RANK")},
          {"LOCAL_WORLD_SIZE", env("LOCAL_WORLD_SIZE")},
          {"GROUP_RANK", env("GROUP_RANK")}};
}

// What the elastic scenarios of train_mpi_program compute in 10 epochs,
// whatever the world sizes (mpi_program.cc, elastic_fn): element i gains
// (i + 1) * (epoch + 1) each epoch.
inline std::vector<int64_t> elastic_expected_state() {
  std::vector<int64_t> w(24, 0);
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (size_t i = 0; i < w.size(); ++i) w[i] += static_cast<int64_t>((i + 1) * (epoch + 1));
  }
  return w;
}

}  // namespace cairn::testing
