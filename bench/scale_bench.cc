// How a report round grows with the number of ranks (docs/scale.md).
//
// For each N of --ranks, a run of N worker processes (each a small state:
// one file of --file-kib KiB) reports a checkpoint every round for
// --rounds rounds into --storage (a file:// folder: a tmpfs such as /dev/shm
// for the driver's own costs without a disk, a disk folder, or an s3:// URI).
// One rank is killed with SIGKILL in round --fail-round (0: none), and the
// group restarts from the latest checkpoint. Each N runs in a process of
// its own, so its memory figures are its own.
//
// --launcher local (the default) forks the N workers from the driver
// (ScalingConfig's local launcher). --launcher env starts them the way
// torchrun or a shell loop does: N processes of this program, each with
// RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT set, running the
// Trainer's torchrun-style launch (fit_env, train/env_launch.h): rank 0 is
// the driver and forks its own worker, every other process an agent that
// connects to it over TCP and forks its rank's worker. The per-rank work is
// the same; the figures are rank 0's (the driver's), and agent_rss_mib the
// largest agent's peak, mem_used_mib what the machine's available memory
// fell by at most while the N processes and their workers ran.
// --launcher mpi starts the same N processes with `mpirun -np N
// --oversubscribe` (fit_mpi: MPI bootstraps, then the same driver, agents
// and protocol), with the same figures.
//
// Printed for each N (medians over the rounds after the first):
//   commit_s        the last rank's "uploaded" to the commit returning
//                   (CheckpointManager::commit_reserved: manifest, history)
//   release_s       the last "uploaded" to every rank released (commit, the
//                   run's history files, N release messages)
//   round_s         the first rank's report() to the last rank's return
//   gather_s        the first rank's report to the last rank's (skew)
//   upload_s        "upload" sent to the last "uploaded" (the ranks' writes)
//   driver_cpu_s    the driver process's CPU time per round (user + system)
//   driver_rss_mib  the driver's peak resident memory (VmHWM) at the end
//   manifest_kib, history_kib  the last manifest; the manager's history and
//                   the run's result files (result.json, progress.csv, events)
//   requests        storage requests per checkpoint (S3 only: every HTTP
//                   request any process sent, divided by the checkpoints)
//   restart_s       the SIGKILL to the last rank's first step after restoring
//                   its file from the checkpoint (restart_first_s: the first
//                   rank's, in the JSON)
//
// The driver's times come from its own clock (DriverSpec::on_round_timing);
// the ranks' times from a steady clock that every process on the machine
// shares, written into memory shared with the workers.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cairn/checkpoint.h"
#include "cairn/storage.h"
#include "cairn/train.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "manager/layout.h"
#include "storage/s3/http.h"
#include "train/control/driver.h"
#include "train/control/group.h"
#include "train/env_launch.h"
#include "train/mpi.h"
#include "util/settings.h"

namespace {

using cairn::bench::median;
using cairn::bench::now_seconds;

namespace fs = std::filesystem;

struct Args {
  std::vector<int> ranks = {8, 64, 256, 1024};
  int rounds = 5;
  int fail_round = 3;
  uint64_t file_kib = 64;
  std::string storage;
  std::string json;
  std::string launcher = "local";
  // One rank of an env or MPI launch (started by --launcher env or mpi).
  bool env_process = false;
  bool mpi_process = false;
  std::string times_file;
  std::string run_name;
  bool keep_log = false;
  double time_limit_s = 1800;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("A Trainer report round and restart at N ranks (docs/scale.md)", "scale_bench");
  app.add_option("--storage", a.storage, "a folder or URI to run the experiments in")->required();
  app.add_option("--ranks", a.ranks, "rank counts, comma separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rounds", a.rounds, "reports per run (>= 2)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--fail-round", a.fail_round, "the round a rank is killed in (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--file-kib", a.file_kib, "each rank's file")->capture_default_str();
  app.add_option("--json", a.json, "write the figures here");
  app.add_option("--launcher", a.launcher,
                 "local: the driver forks the workers; env: N processes started as torchrun "
                 "starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); mpi: N processes "
                 "started by mpirun")
      ->check(CLI::IsMember({"local", "env", "mpi"}))
      ->capture_default_str();
  app.add_option("--time-limit-s", a.time_limit_s,
                 "env, mpi: stop the N processes if they have not ended after this long")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Internal: a process of an env launch (rank from RANK) or an MPI one.
  app.add_flag("--env-process", a.env_process)->group("");
  app.add_flag("--mpi-process", a.mpi_process)->group("");
  app.add_option("--times-file", a.times_file)->group("");
  app.add_option("--run-name", a.run_name)->group("");
  app.add_flag("--keep-log", a.keep_log, "env, mpi: keep the processes' log (in $TMPDIR)");
  cairn::bench::parse_or_exit(app, argc, argv);
  if (a.fail_round > a.rounds) {
    std::fprintf(stderr, "scale_bench: --fail-round must be in 0..rounds\n");
    std::exit(2);
  }
  return a;
}

double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The ranks' clocks, in memory the workers share with the driver: an
// anonymous mapping the forked workers inherit (local), or a file every
// process of an env launch maps (its agents' workers inherit that).
// Per rank and round: entering report() and leaving it (attempt 0's rounds
// are overwritten by the restarted attempt's), and the S3 requests its
// process had sent by then; the kill; per rank: the first step after
// restoring, and (env) its agent's peak resident memory.
class SharedTimes {
 public:
  static size_t bytes_for(int n, int rounds) {
    return sizeof(double) * (1 + static_cast<size_t>(n) * (3 * rounds + 2));
  }
  // `file` empty: anonymous; else that file, created at the size when `create`.
  SharedTimes(int n, int rounds, const std::string& file = "", bool create = false)
      : n_(n), rounds_(rounds), bytes_(bytes_for(n, rounds)) {
    int fd = -1;
    if (!file.empty()) {
      fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0600);
      if (fd < 0 || (create && ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0)) {
        throw std::runtime_error("scale_bench: cannot open the shared times " + file);
      }
    }
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (fd < 0 ? MAP_ANONYMOUS : 0), fd, 0);
    if (fd >= 0) ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error("scale_bench: mmap of the shared times failed");
    base_ = static_cast<double*>(p);
  }
  ~SharedTimes() { munmap(base_, bytes_); }
  SharedTimes(const SharedTimes&) = delete;
  SharedTimes& operator=(const SharedTimes&) = delete;
  double& fail_at() { return base_[0]; }
  double& enter(int rank, int round) { return base_[1 + rank * rounds_ + round]; }
  double& leave(int rank, int round) {
    return base_[1 + static_cast<size_t>(n_) * rounds_ + rank * rounds_ + round];
  }
  double& restored(int rank) { return base_[1 + 2 * static_cast<size_t>(n_) * rounds_ + rank]; }
  // The S3 requests the rank's process had sent when it left report().
  double& requests(int rank, int round) {
    return base_[1 + 2 * static_cast<size_t>(n_) * rounds_ + n_ + rank * rounds_ + round];
  }
  // The peak resident memory of the agent serving `rank`, in KiB (env).
  double& agent_hwm_kib(int rank) {
    return base_[1 + 3 * static_cast<size_t>(n_) * rounds_ + n_ + rank];
  }

 private:
  int n_, rounds_;
  size_t bytes_ = 0;
  double* base_ = nullptr;
};

SharedTimes* g_times = nullptr;  // set before the workers are forked

// A rank: one file of its own per checkpoint; after a restart, reads its
// file back from the checkpoint before its first step.
void train_loop(const nlohmann::json& config) {
  const cairn::TrainContext& ctx = cairn::train::get_context();
  const int rounds = config.at("rounds");
  const int fail_round = config.at("fail_round");
  const int fail_rank = config.at("fail_rank");
  const std::string file = fmt::format("rank-{}.bin", ctx.world_rank);
  std::vector<char> data(config.at("bytes").get<size_t>(), static_cast<char>(ctx.world_rank));
  int first = 0;
  if (auto ckpt = cairn::train::get_checkpoint()) {
    const cairn::Checkpoint c = *ckpt;
    std::string bytes = c.storage().get(file);
    if (bytes.size() != data.size()) throw std::runtime_error("restored file has the wrong size");
    first = c.get_metadata().value("round", 0) + 1;
  }
  // Restored (or, killed before the first commit, started again from scratch).
  if (ctx.attempt > 0) g_times->restored(ctx.world_rank) = now_seconds();
  cairn::train::TemporaryDirectory tmp;
  for (int round = first; round < rounds; ++round) {
    if (ctx.attempt == 0 && round + 1 == fail_round && ctx.world_rank == fail_rank) {
      g_times->fail_at() = now_seconds();
      std::raise(SIGKILL);
    }
    data[0] = static_cast<char>(round);
    {
      std::ofstream out(fs::path(tmp.path()) / file, std::ios::binary | std::ios::trunc);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    cairn::Checkpoint ckpt = cairn::Checkpoint::from_directory(tmp.path());
    ckpt.set_metadata({{"round", round}});
    g_times->enter(ctx.world_rank, round) = now_seconds();
    cairn::train::report({{"round", round}}, ckpt);
    g_times->leave(ctx.world_rank, round) = now_seconds();
    g_times->requests(ctx.world_rank, round) = static_cast<double>(cairn::s3::requests_sent());
  }
}

// The sizes of the experiment's manager history and result files.
uint64_t history_bytes(cairn::Storage& s) {
  namespace layout = cairn::experiment;
  uint64_t total = 0;
  for (const auto& o : s.list("")) {
    const std::string& k = o.key;
    if (k.find('/') != std::string::npos) continue;
    if (k == layout::kManagerHistoryKey || k.rfind(layout::kManagerLogPrefix, 0) == 0 ||
        k == layout::kResultJsonKey || k == layout::kProgressCsvKey ||
        k.rfind(layout::kEventFilePrefix, 0) == 0) {
      total += o.size;
    }
  }
  return total;
}

// This process's peak resident memory (VmHWM), in KiB.
long peak_rss_kib() {
  long hwm_kib = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) hwm_kib = std::stol(line.substr(6));
  }
  return hwm_kib;
}

namespace ti = cairn::train_internal;

// Runs the driver of `spec`: the local launcher's, or rank 0's of an env launch.
using DriveFn = std::function<cairn::Result(const ti::DriverSpec&)>;

// The DriverSpec's part that every process of a run shares.
ti::DriverSpec base_spec(const Args& a, int n) {
  ti::DriverSpec spec;
  spec.train_fn = train_loop;
  const int fail_rank = n / 2;
  spec.train_loop_config = {{"rounds", a.rounds},
                            {"fail_round", a.fail_round},
                            {"fail_rank", fail_rank},
                            {"bytes", a.file_kib << 10}};
  spec.world_size = n;
  spec.run.name = a.run_name.empty() ? fmt::format("scale-{}-{}", n, getpid()) : a.run_name;
  spec.run.storage_path = a.storage;
  spec.run.checkpoint_config.num_to_keep = 2;
  spec.run.failure_config.max_failures = a.fail_round > 0 ? 1 : 0;
  spec.run.failure_config.report_timeout_s = 600;
  return spec;
}

// One N, in this process (the driver), with `times` shared with the
// workers. Returns its figures.
nlohmann::json measure(const Args& a, int n, SharedTimes& times, const DriveFn& drive) {
  g_times = &times;
  ti::DriverSpec spec = base_spec(a, n);
  auto loc = cairn::experiment::locate_experiment(spec.run.storage_path, spec.run.name);
  // The run's objects go at the end, also when the measurement fails.
  struct RemoveExperiment {
    const cairn::experiment::ExperimentLocation& loc;
    ~RemoveExperiment() {
      try {
        cairn::open_storage(loc.uri)->remove_prefix("");
        if (loc.uri.rfind("file://", 0) == 0) fs::remove_all(loc.path);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "scale_bench: could not remove %s: %s\n", loc.uri.c_str(), e.what());
      }
    }
  } remove_experiment{loc};
  spec.run.name = loc.name;
  spec.run.storage_path = loc.storage_path;
  spec.experiment_uri = loc.uri;
  spec.experiment_path = loc.path;

  std::vector<ti::RoundTiming> timings;
  std::vector<double> cpu_per_round;
  std::vector<uint64_t> driver_requests;  // sent by the driver when each round was released
  double cpu_last = cpu_s();
  spec.on_round_timing = [&](const ti::RoundTiming& t) {
    timings.push_back(t);
    driver_requests.push_back(cairn::s3::requests_sent());
    const double c = cpu_s();
    cpu_per_round.push_back(c - cpu_last);
    cpu_last = c;
  };
  const double t0 = now_seconds();
  cairn::Result r = drive(spec);
  const double wall = now_seconds() - t0;
  if (r.error)
    throw std::runtime_error(fmt::format("the run with {} ranks failed: {}", n, *r.error));

  // The rounds of the last attempt after its first (which carries the
  // restore's skew); with no failure, every round after the first.
  const int last_attempt = timings.empty() ? 0 : timings.back().attempt;
  std::vector<double> commit, release, gather, upload, cpu;
  for (size_t i = 0; i < timings.size(); ++i) {
    const ti::RoundTiming& t = timings[i];
    if (t.attempt != last_attempt || t.round == 1) continue;
    commit.push_back(t.committed - t.last_uploaded);
    release.push_back(t.released - t.last_uploaded);
    gather.push_back(t.last_report - t.first_report);
    upload.push_back(t.last_uploaded - t.upload_begun);
    cpu.push_back(cpu_per_round[i]);
  }
  // The rounds' span as the ranks saw it, over the same rounds: the last
  // attempt's rounds after its first (a failure makes it start at the
  // round after the last committed one).
  std::vector<double> round;
  const int first_round = a.rounds - static_cast<int>(commit.size());
  for (int k = first_round; k < a.rounds; ++k) {
    double first_enter = 1e300, last_leave = 0;
    for (int rank = 0; rank < n; ++rank) {
      first_enter = std::min(first_enter, times.enter(rank, k));
      last_leave = std::max(last_leave, times.leave(rank, k));
    }
    round.push_back(last_leave - first_enter);
  }
  double restart = 0, restart_first = 0;
  if (a.fail_round > 0) {
    double first = 1e300, last = 0;
    for (int rank = 0; rank < n; ++rank) {
      first = std::min(first, times.restored(rank));
      last = std::max(last, times.restored(rank));
    }
    restart = last - times.fail_at();
    restart_first = first - times.fail_at();
  }

  auto storage = cairn::open_storage(loc.uri);
  uint64_t manifest = 0;
  if (r.checkpoint) {
    if (auto info = r.checkpoint->storage().stat(cairn::kManifestKey)) manifest = info->size;
  }
  const uint64_t history = history_bytes(*storage);
  // Requests per checkpoint in the steady state: every process's requests
  // from the end of the first measured round to the end of the last, over
  // the rounds between (a worker's start-up requests are not in them).
  double requests = 0;
  if (round.size() >= 2) {
    const int from = first_round, to = a.rounds - 1;
    double sent = static_cast<double>(driver_requests.back() -
                                      driver_requests[driver_requests.size() - round.size()]);
    for (int rank = 0; rank < n; ++rank)
      sent += times.requests(rank, to) - times.requests(rank, from);
    requests = sent / (to - from);
  }

  // Peak resident memory of this process, the driver.
  const long hwm_kib = peak_rss_kib();
  g_times = nullptr;
  return {{"ranks", n},
          {"rounds_measured", commit.size()},
          {"commit_s", median(commit)},
          {"release_s", median(release)},
          {"round_s", median(round)},
          {"gather_s", median(gather)},
          {"upload_s", median(upload)},
          {"driver_cpu_s", median(cpu)},
          {"driver_rss_mib", static_cast<double>(hwm_kib) / 1024},
          {"manifest_kib", static_cast<double>(manifest) / 1024},
          {"history_kib", static_cast<double>(history) / 1024},
          {"requests_per_checkpoint", requests},
          {"restart_s", restart},
          {"restart_first_s", restart_first},
          {"wall_s", wall}};
}

// ------------------------------------------------------------ --launcher env

// MemAvailable of /proc/meminfo, in MiB.
double available_mib() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stod(line.substr(13)) / 1024;
  }
  return 0;
}

// A free TCP port on 127.0.0.1 for the driver's control port (the kernel's
// pick, released at once: a shell loop's MASTER_PORT is chosen as freely).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("scale_bench: no free port on 127.0.0.1");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// One process of an env or MPI launch (--env-process, --mpi-process): rank
// 0 drives and writes the figures to --json; every other rank is an agent.
int launched_process(const Args& a) {
  const int n = a.ranks.at(0);
  SharedTimes times(n, a.rounds, a.times_file);
  g_times = &times;
  cairn::ScalingConfig scaling;
  scaling.num_workers = n;
  int rank = 0;
  DriveFn fit;
  std::optional<ti::EnvLaunch> launch;
  if (a.mpi_process) {
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
    if (r == nullptr) {
      std::fprintf(stderr, "scale_bench: --mpi-process outside mpirun (no OMPI_COMM_WORLD_RANK)\n");
      return 2;
    }
    rank = std::stoi(r);
    scaling.launcher = cairn::Launcher::kMpi;
    fit = [&](const ti::DriverSpec& spec) { return ti::fit_mpi(spec, scaling); };
  } else {
    launch = ti::env_launch_from(cairn::Settings::from(cairn::Environment::process()));
    if (!launch) {
      std::fprintf(stderr,
                   "scale_bench: --env-process without RANK, WORLD_SIZE, MASTER_ADDR, "
                   "MASTER_PORT\n");
      return 2;
    }
    rank = launch->rank;
    scaling.launcher = cairn::Launcher::kEnv;
    fit = [&](const ti::DriverSpec& spec) { return ti::fit_env(spec, scaling, *launch); };
  }
  if (rank == 0) {
    const nlohmann::json j = measure(a, n, times, fit);
    std::ofstream(a.json) << j.dump() << "\n";
    return 0;
  }
  const cairn::Result r = fit(base_spec(a, n));
  times.agent_hwm_kib(rank) = static_cast<double>(peak_rss_kib());
  return r.error ? 1 : 0;
}

// One N of --launcher env or mpi: starts N processes of this program as a
// shell loop would, or one mpirun that starts them, waits for them, and
// returns rank 0's figures with the agents' and the machine's memory. Stops
// them all if the machine's available memory falls below 4 GiB, or if they
// have not ended after --time-limit-s.
nlohmann::json measure_launched(const Args& a, const char* self, int n) {
  const bool mpi = a.launcher == "mpi";
  const std::string stem = fmt::format("scale-bench-{}-{}", getpid(), n);
  const std::string times_file = "/dev/shm/" + stem + ".times";
  const std::string json_file = "/dev/shm/" + stem + ".json";
  const std::string log_file = (fs::temp_directory_path() / (stem + ".log")).string();
  struct Remove {
    std::vector<std::string> files;
    ~Remove() {
      for (const auto& f : files) ::unlink(f.c_str());
    }
  } remove{{times_file, json_file}};
  SharedTimes times(n, a.rounds, times_file, /*create=*/true);
  const int port = free_port();
  const int log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) throw std::runtime_error("scale_bench: cannot write " + log_file);
  std::vector<std::string> args = {self,           mpi ? "--mpi-process" : "--env-process",
                                   "--storage",    a.storage,
                                   "--ranks",      std::to_string(n),
                                   "--rounds",     std::to_string(a.rounds),
                                   "--fail-round", std::to_string(a.fail_round),
                                   "--file-kib",   std::to_string(a.file_kib),
                                   "--times-file", times_file,
                                   "--run-name",   stem,
                                   "--json",       json_file};
  if (mpi) {
    // Every process on this machine, as tests/support/mpirun.h starts them.
    std::vector<std::string> mpirun = {
        "mpirun",    "-np",  std::to_string(n), "--oversubscribe",
        "--bind-to", "none", "--mca",           "btl_vader_single_copy_mechanism",
        "none"};
    if (::geteuid() == 0) mpirun.push_back("--allow-run-as-root");
    args[0] = fs::canonical("/proc/self/exe").string();
    args.insert(args.begin(), mpirun.begin(), mpirun.end());
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const double base_mib = available_mib();
  const double t0 = now_seconds();
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int rank = 0; rank < (mpi ? 1 : n); ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(fmt::format("scale_bench: fork of rank {}", rank));
    if (pid == 0 && mpi) {
      ::setpgid(0, 0);  // a group of its own, killed as one if it hangs
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      ::execvp("mpirun", argv.data());
      ::_exit(127);
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      for (const char* v : {"CAIRN_CONTROL_PORT", "TORCHELASTIC_USE_AGENT_STORE", "CAIRN_WORKER"})
        ::unsetenv(v);
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  ::close(log_fd);
  double least_mib = base_mib;
  int left = static_cast<int>(pids.size());
  bool failed = false, out_of_memory = false, out_of_time = false;
  double kill_group_at = 0;  // mpi: when to kill mpirun if SIGTERM did not end it
  int first_status = 0;      // rank 0's (env) or mpirun's wait status
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
      if (pid == pids.at(0)) first_status = status;
      continue;
    }
    least_mib = std::min(least_mib, available_mib());
    const bool stop = (!out_of_time && !out_of_memory) &&
                      (now_seconds() - t0 > a.time_limit_s || least_mib < 4096);
    if (stop) {
      (least_mib < 4096 ? out_of_memory : out_of_time) = true;
      if (mpi) {
        // mpirun stops its processes (those it has started end once they
        // lose it) and removes its shared-memory files; it is killed if it
        // has not ended 10 s later.
        ::kill(pids.at(0), SIGTERM);
        kill_group_at = now_seconds() + 10;
      } else {
        for (pid_t p : pids) ::kill(p, SIGKILL);  // their workers die with their agents
      }
    }
    if (kill_group_at > 0 && now_seconds() > kill_group_at) {
      ::kill(-pids.at(0), SIGKILL);
      kill_group_at = 0;
    }
    ::usleep(100'000);
  }
  const double total = now_seconds() - t0;
  std::ifstream in(json_file);
  if (failed || out_of_memory || out_of_time || !in) {
    std::string tail;
    std::ifstream log(log_file);
    for (std::string line; std::getline(log, line);) {
      tail += line + "\n";
      if (tail.size() > 8000) tail.erase(0, tail.size() - 4000);
    }
    throw std::runtime_error(fmt::format(
        "{} processes of an {} launch {} ({} {}; log {}):\n{}", n, a.launcher,
        out_of_memory ? "stopped: the machine's available memory fell below 4 GiB"
        : out_of_time
            ? fmt::format("stopped: not ended after {} s (--time-limit-s)", a.time_limit_s)
            : std::string("failed"),
        mpi ? "mpirun" : "rank 0",
        WIFSIGNALED(first_status) ? fmt::format("was killed by signal {}", WTERMSIG(first_status))
                                  : fmt::format("exited with status {}", WEXITSTATUS(first_status)),
        log_file, tail));
  }
  if (a.keep_log) {
    std::fprintf(stderr, "scale_bench: the log of %d ranks: %s\n", n, log_file.c_str());
  } else {
    ::unlink(log_file.c_str());
  }
  nlohmann::json j = nlohmann::json::parse(in);
  double agent_kib = 0;
  for (int rank = 1; rank < n; ++rank) agent_kib = std::max(agent_kib, times.agent_hwm_kib(rank));
  j["agent_rss_mib"] = agent_kib / 1024;
  j["mem_used_mib"] = base_mib - least_mib;
  j["launch_wall_s"] = total;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.env_process || a.mpi_process) {
    try {
      return launched_process(a);
    } catch (const std::exception& e) {
      const char* rank = std::getenv(a.mpi_process ? "OMPI_COMM_WORLD_RANK" : "RANK");
      std::fprintf(stderr, "scale_bench: rank %s: %s\n", rank != nullptr ? rank : "?", e.what());
      return 1;
    }
  }
  nlohmann::json all = nlohmann::json::array();
  std::printf("%7s %9s %9s %9s %9s %9s %10s %9s %9s %9s %9s %9s\n", "ranks", "commit_s",
              "release_s", "round_s", "gather_s", "upload_s", "drv_cpu_s", "drv_MiB", "manif_KiB",
              "hist_KiB", "req/ckpt", "restart_s");
  for (int n : a.ranks) {
    // Each N in a child of its own: its memory figures are its own, and a
    // failure of one N does not hide the others.
    int fds[2];
    if (pipe(fds) != 0) return 1;
    std::fflush(stdout);  // or the child's copy of the buffer prints it again
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string out;
      int rc = 0;
      try {
        if (a.launcher != "local") {
          out = measure_launched(a, argv[0], n).dump();
        } else {
          SharedTimes times(n, a.rounds);
          out = measure(a, n, times, [](const ti::DriverSpec& spec) {
                  return ti::run_driver(spec, ti::start_local_group);
                }).dump();
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "scale_bench: %d ranks: %s\n", n, e.what());
        rc = 1;
      }
      for (size_t off = 0; off < out.size();) {
        const ssize_t w = write(fds[1], out.data() + off, out.size() - off);
        if (w <= 0) _exit(1);
        off += static_cast<size_t>(w);
      }
      _exit(rc);
    }
    close(fds[1]);
    std::string text;
    char buf[4096];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, got);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty()) {
      std::fprintf(stderr, "scale_bench: the measurement with %d ranks failed\n", n);
      return 1;
    }
    const nlohmann::json j = nlohmann::json::parse(text);
    std::printf("%7d %9.4f %9.4f %9.4f %9.4f %9.4f %10.4f %9.1f %9.1f %9.1f %9.1f %9.3f\n", n,
                j["commit_s"].get<double>(), j["release_s"].get<double>(),
                j["round_s"].get<double>(), j["gather_s"].get<double>(),
                j["upload_s"].get<double>(), j["driver_cpu_s"].get<double>(),
                j["driver_rss_mib"].get<double>(), j["manifest_kib"].get<double>(),
                j["history_kib"].get<double>(), j["requests_per_checkpoint"].get<double>(),
                j["restart_s"].get<double>());
    if (j.contains("agent_rss_mib")) {
      std::printf(
          "        %s launch: agents' peak %.1f MiB each, the machine's memory %.0f MiB "
          "more at most, %.1f s from the first process started to the last ended\n",
          a.launcher.c_str(), j["agent_rss_mib"].get<double>(), j["mem_used_mib"].get<double>(),
          j["launch_wall_s"].get<double>());
    }
    std::fflush(stdout);
    all.push_back(j);
  }
  if (!a.json.empty()) std::ofstream(a.json) << all.dump(2) << "\n";
  return 0;
}
