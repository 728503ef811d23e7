// Trials on several hosts (tune/trial_hosts.h): real processes started by a
// shell loop with torchrun's variables, or by mpirun, each running
// tests/tune/hosts_program.cc; as root each process gets a host name of its
// own (a UTS namespace), and node-local storage a tmpfs of its own.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/shell.h"
#include "support/temp_dir.h"
#if CAIRN_TEST_MPI
#include "support/mpirun.h"
#endif

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Why the namespace tests cannot run here, or "".
std::string no_namespaces() {
  if (::geteuid() != 0) return "needs root for unshare(1) namespaces";
  if (std::system("unshare --uts --mount true 2>/dev/null") != 0) {
    return "unshare --uts --mount is not permitted here";
  }
  return "";
}

class TunerOnHosts : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(out_); }

  std::string results() const { return (dir_ / "results").string(); }

  // The command of the process of rank `r` in a shell loop of `world`
  // processes; with `own_host` in a UTS namespace named cairn-host<r>,
  // with `local_mount` also a tmpfs of its own mounted there.
  std::string rank_command(int r, int world, int port, const std::string& scenario,
                           const std::string& storage, bool own_host,
                           const std::string& local_mount = "") const {
    std::string wrap;
    if (own_host) {
      wrap = fmt::format(
          "unshare --uts {} sh -c 'hostname cairn-host{} {}&& exec \"$@\"' sh ",
          local_mount.empty() ? "" : "--mount", r,
          local_mount.empty() ? "" : fmt::format("&& mount -t tmpfs cairn-local {} ", local_mount));
    }
    return fmt::format(
        "CAIRN_TEST_PLACE={} RANK={} WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} {}'{}' "
        "{} '{}' '{}'",
        r, r, world, port, wrap, CAIRN_TUNE_HOSTS_PROGRAM, scenario, storage, out_.string());
  }

  // Starts `world` processes as a shell loop would.
  pid_t start_loop(const std::string& scenario, bool own_host, int world = 2,
                   const std::string& storage = "", const std::string& local_mount = "") {
    const int port = testing::free_port();
    std::string script;
    for (int r = 0; r < world; ++r) {
      script += rank_command(r, world, port, scenario, storage.empty() ? results() : storage,
                             own_host, local_mount) +
                " & ";
    }
    script += "wait";
    return testing::start_shell(script, out_ / "launch.log");
  }

  testing::ShellRun loop(const std::string& scenario, bool own_host, int world = 2) {
    return testing::wait_shell(start_loop(scenario, own_host, world), out_ / "launch.log");
  }

  nlohmann::json process_result(int rank) const {
    const fs::path p = out_ / fmt::format("process-{}.json", rank);
    return fs::exists(p) ? nlohmann::json::parse(slurp(p)) : nlohmann::json();
  }

  // Every process of the launch returned the same grid; returns it.
  nlohmann::json same_grid_everywhere(const std::string& log, int world = 2) const {
    const nlohmann::json g0 = process_result(0);
    EXPECT_TRUE(g0.is_object() && !g0.contains("threw")) << g0.dump(2) << "\n" << log;
    for (int r = 1; r < world; ++r) EXPECT_EQ(process_result(r), g0) << log;
    return g0;
  }

  // Checks every trial of a spread run ended after 3 steps, and returns the
  // places they ran on.
  std::set<std::string> check_spread(const nlohmann::json& grid, const std::string& log,
                                     bool own_host) const {
    std::set<std::string> places;
    EXPECT_EQ(grid.at("trials").size(), 6u) << log;
    for (const auto& t : grid.at("trials")) {
      EXPECT_EQ(t.at("status"), "TERMINATED") << t.dump(2) << "\n" << log;
      EXPECT_EQ(t.at("metrics").value("step", 0), 3) << t.dump(2);
      const std::string place = t.at("metrics").value("place", "?");
      places.insert(place);
      if (own_host) {
        EXPECT_EQ(t.at("metrics").value("host", ""), "cairn-host" + place);
      }
    }
    return places;
  }

  // The gpus scenario's grid (4 one-GPU trials, fake ids "0" and "1" on
  // every process): every trial ended, both places ran trials, and no GPU
  // was held by two trials at once, per host (`per_host`: each process a
  // host of its own) or across both processes (one host). Returns the GPUs
  // each place handed out.
  std::map<std::string, std::set<std::string>> check_gpus(const testing::ShellRun& run,
                                                          bool per_host) const {
    std::map<std::string, std::set<std::string>> used;
    const nlohmann::json grid = same_grid_everywhere(run.log);
    EXPECT_TRUE(grid.is_object());
    if (!grid.is_object()) return used;
    struct Span {
      double start, end;
      std::string where;  // [place/]gpu
    };
    std::vector<Span> spans;
    for (const auto& t : grid.at("trials")) {
      EXPECT_EQ(t.at("status"), "TERMINATED") << t.dump(2) << "\n" << run.log;
      const nlohmann::json& m = t.at("metrics");
      const std::string gpu = m.value("gpus", "?");
      const std::string place = m.value("place", "?");
      EXPECT_TRUE(gpu == "0" || gpu == "1") << gpu;
      used[place].insert(gpu);
      spans.push_back(
          {m.value("start", 0.0), m.value("end", 0.0), per_host ? place + "/" + gpu : gpu});
    }
    EXPECT_EQ(used.size(), 2u) << grid.dump(2);
    for (const Span& a : spans) {
      for (const Span& b : spans) {
        if (&a == &b || a.where != b.where) continue;
        EXPECT_FALSE(b.start <= a.start && a.start < b.end) << "GPU " << a.where << " overbooked";
      }
    }
    return used;
  }

  TempDir dir_;
  fs::path out_ = dir_ / "out";
};

TEST_F(TunerOnHosts, TrialsSpreadOverTheProcessesOfAShellLoopAndEveryProcessGetsTheGrid) {
  const bool own_host = no_namespaces().empty();
  const testing::ShellRun run = loop("spread", own_host);
  EXPECT_EQ(run.exit_status, 0) << run.log;
  const nlohmann::json grid = same_grid_everywhere(run.log);
  ASSERT_TRUE(grid.is_object());
  EXPECT_EQ(check_spread(grid, run.log, own_host), (std::set<std::string>{"0", "1"}));
  EXPECT_TRUE(has(run.log, "offers")) << run.log;
}

#if CAIRN_TEST_MPI
TEST_F(TunerOnHosts, UnderMpirunTrialsRunOnEveryProcess) {
  const testing::MpirunStarted s = testing::start_mpirun(
      2, {"OMPI_MCA_mca_base_component_disable_dlclose=1", "LSAN_OPTIONS=detect_leaks=0"},
      {"sh", "-c", "CAIRN_TEST_PLACE=$OMPI_COMM_WORLD_RANK exec \"$@\"", "sh",
       CAIRN_TUNE_HOSTS_PROGRAM, "spread", results(), out_.string()},
      out_ / "mpirun.log");
  const testing::MpirunResult l = testing::finish_mpirun(s, 180s);
  EXPECT_EQ(l.exit_status, 0) << l.log;
  const nlohmann::json grid = same_grid_everywhere(l.log);
  ASSERT_TRUE(grid.is_object());
  EXPECT_EQ(check_spread(grid, l.log, false), (std::set<std::string>{"0", "1"}));
}
#endif

// Slurm for real: two nodes of a cluster on this machine (Debian's slurmd,
// one per node in a UTS namespace named for the node; slurm_cluster.sh),
// srun starting one process on each.
TEST_F(TunerOnHosts, UnderSrunOnTwoSlurmNodesTrialsRunOnBothNodes) {
  const std::string script = fmt::format(
      "NODES=2 MASTER_ADDR=127.0.0.1 exec '{}' '{}' srun --nodes=2 --ntasks=2 "
      "--ntasks-per-node=1 --overcommit sh -c 'CAIRN_TEST_PLACE=$SLURM_PROCID exec \"$@\"' sh "
      "'{}' spread '{}' '{}'",
      CAIRN_SLURM_CLUSTER, (dir_ / "slurm").string(), CAIRN_TUNE_HOSTS_PROGRAM, results(),
      out_.string());
  const testing::ShellRun run =
      testing::wait_shell(testing::start_shell(script, out_ / "launch.log"), out_ / "launch.log");
  if (run.exit_status == 77) GTEST_SKIP() << run.log;
  EXPECT_EQ(run.exit_status, 0) << run.log;
  const nlohmann::json grid = same_grid_everywhere(run.log);
  ASSERT_TRUE(grid.is_object());
  EXPECT_EQ(check_spread(grid, run.log, false), (std::set<std::string>{"0", "1"}));
  for (const auto& t : grid.at("trials")) {
    const nlohmann::json& m = t.at("metrics");
    EXPECT_EQ(m.value("host", ""), "cairn-slurm" + m.value("place", "?")) << t.dump(2);
  }
}

// Runs the gpus scenario (4 one-GPU trials, fake ids "0" and "1" on every
// process) and checks that every trial ends, both places run trials, and
// no GPU is held by two trials at once: per host when `own_host` (each
// process a host of its own), across both processes otherwise (one host:
// its GPUs are shared out between them). Returns each place's GPUs.
// Two hosts of two GPUs each run four one-GPU trials, two on each host at
// once, never two on one GPU of one host.
TEST_F(TunerOnHosts, EachHostDividesItsOwnGpusAndNoneIsOverbooked) {
  if (auto why = no_namespaces(); !why.empty()) GTEST_SKIP() << why;
  const testing::ShellRun run = loop("gpus", true);
  EXPECT_EQ(run.exit_status, 0) << run.log;
  check_gpus(run, /*per_host=*/true);
}

// Two processes on one host (as `mpirun -np 2` on one node) see the same
// two GPUs: each gets one of them, so no GPU is handed out twice.
TEST_F(TunerOnHosts, ProcessesOnOneHostShareItsGpusOutBetweenThem) {
  const testing::ShellRun run = loop("gpus", false);
  EXPECT_EQ(run.exit_status, 0) << run.log;
  const std::map<std::string, std::set<std::string>> got = check_gpus(run, /*per_host=*/false);
  EXPECT_EQ(got.at("0"), (std::set<std::string>{"0"}));
  EXPECT_EQ(got.at("1"), (std::set<std::string>{"1"}));
}

// A host whose process dies (its node fails) takes its trials' runners with
// it; those trials resume on another host from their latest checkpoints,
// and the loss is not counted as their failure (max_failures is 0).
TEST_F(TunerOnHosts, ATrialOfALostHostResumesOnAnotherFromItsLatestCheckpoint) {
  const pid_t launch = start_loop("lose", false);
  // Wait (bounded) until place 1 holds a trial before its step 2.
  bool held = false;
  std::string trial;
  for (int i = 0; i < 1200 && !held; ++i) {
    for (const auto& e : fs::directory_iterator(out_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("held-", 0) == 0 && name.find(".tmp") == std::string::npos) {
        held = true;
        trial = name.substr(5);
      }
    }
    if (!held) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(held) << slurp(out_ / "launch.log");
  const pid_t host1 = std::stoi(slurp(out_ / "pid-1"));
  ASSERT_EQ(::kill(host1, SIGKILL), 0);
  std::ofstream(out_ / "go") << "go";
  const testing::ShellRun run = testing::wait_shell(launch, out_ / "launch.log");
  const nlohmann::json grid = process_result(0);
  ASSERT_TRUE(grid.is_object() && !grid.contains("threw")) << grid.dump(2) << "\n" << run.log;
  EXPECT_FALSE(process_result(1).is_object()) << "the killed process wrote a result";
  ASSERT_EQ(grid.at("trials").size(), 2u);
  for (const auto& t : grid.at("trials")) {
    EXPECT_EQ(t.at("status"), "TERMINATED") << t.dump(2) << "\n" << run.log;
    const nlohmann::json& m = t.at("metrics");
    EXPECT_EQ(m.value("step", 0), 4) << t.dump(2);
    EXPECT_EQ(m.value("place", "?"), "0") << t.dump(2);
    if (t.at("id") == trial) {
      EXPECT_EQ(m.value("resumed_from", -1), 1) << t.dump(2);  // its step-1 checkpoint
    }
  }
  EXPECT_TRUE(has(run.log, "was lost; it resumes on another host")) << run.log;
}

// SIGTERM to one host's process alone (its node is being preempted): the
// driver moves that host's trial with a checkpoint made after the notice,
// and starts none there; the host stays to the end and gets the grid.
TEST_F(TunerOnHosts, AHostThatAloneReceivesSigtermHandsItsTrialToAnotherWithAFreshCheckpoint) {
  const pid_t launch = start_loop("drain", false);
  std::string trial;
  for (int i = 0; i < 1200 && trial.empty(); ++i) {
    for (const auto& e : fs::directory_iterator(out_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("held-", 0) == 0 && name.find(".tmp") == std::string::npos)
        trial = name.substr(5);
    }
    if (trial.empty()) std::this_thread::sleep_for(100ms);
  }
  ASSERT_FALSE(trial.empty()) << slurp(out_ / "launch.log");
  ASSERT_EQ(::kill(std::stoi(slurp(out_ / "pid-1")), SIGTERM), 0);
  // The held trial goes on once the driver knows (bounded wait).
  bool told = false;
  for (int i = 0; i < 1200 && !told; ++i) {
    told = has(slurp(out_ / "launch.log"), "received SIGTERM (its node is being preempted)");
    if (!told) std::this_thread::sleep_for(100ms);
  }
  std::ofstream(out_ / "go") << "go";
  const testing::ShellRun run = testing::wait_shell(launch, out_ / "launch.log");
  ASSERT_TRUE(told) << run.log;
  const nlohmann::json grid = same_grid_everywhere(run.log);
  ASSERT_TRUE(grid.is_object());
  ASSERT_EQ(grid.at("trials").size(), 2u);
  for (const auto& t : grid.at("trials")) {
    EXPECT_EQ(t.at("status"), "TERMINATED") << t.dump(2) << "\n" << run.log;
    const nlohmann::json& m = t.at("metrics");
    EXPECT_EQ(m.value("step", 0), 4) << t.dump(2);
    EXPECT_EQ(m.value("place", "?"), "0") << t.dump(2) << "\n" << run.log;
    if (t.at("id") == trial) {
      // Not its step-1 checkpoint: one reported after the notice.
      EXPECT_GE(m.value("resumed_from", -1), 2) << t.dump(2) << "\n" << run.log;
    }
  }
}

// A process started again for a lost host's rank is taken in and gets
// trials again.
TEST_F(TunerOnHosts, AProcessStartedAgainForALostHostGetsTrialsAgain) {
  const int port = testing::free_port();
  std::string script;
  for (int r = 0; r < 2; ++r)
    script += rank_command(r, 2, port, "rejoin", results(), false) + " & ";
  const pid_t launch = testing::start_shell(script + "wait", out_ / "launch.log");
  // Both places hold a trial before its step 2 (bounded wait).
  int held = 0;
  for (int i = 0; i < 1200 && held < 2; ++i) {
    held = 0;
    for (const auto& e : fs::directory_iterator(out_)) {
      const std::string name = e.path().filename().string();
      held += name.rfind("held-", 0) == 0 && name.find(".tmp") == std::string::npos ? 1 : 0;
    }
    if (held < 2) std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(held, 2) << slurp(out_ / "launch.log");
  ASSERT_EQ(::kill(std::stoi(slurp(out_ / "pid-1")), SIGKILL), 0);
  // Once the driver took it for lost (a process claiming a rank still held
  // is turned away), the same rank again, as a launcher restarting a lost
  // node's process would.
  bool lost = false;
  for (int i = 0; i < 1200 && !lost; ++i) {
    lost = has(slurp(out_ / "launch.log"), "is lost");
    if (!lost) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(lost) << slurp(out_ / "launch.log");
  std::string again = rank_command(1, 2, port, "rejoin", results(), false);
  again.replace(again.find("CAIRN_TEST_PLACE=1"), 18, "CAIRN_TEST_PLACE=1b");
  const pid_t back = testing::start_shell(again, out_ / "back.log");
  bool taken = false;
  for (int i = 0; i < 1200 && !taken; ++i) {
    taken = has(slurp(out_ / "launch.log"), "is back and offers");
    if (!taken) std::this_thread::sleep_for(100ms);
  }
  std::ofstream(out_ / "go") << "go";
  const testing::ShellRun run = testing::wait_shell(launch, out_ / "launch.log");
  const testing::ShellRun run_back = testing::wait_shell(back, out_ / "back.log");
  ASSERT_TRUE(taken) << run.log << run_back.log;
  const nlohmann::json grid = process_result(0);
  ASSERT_TRUE(grid.is_object() && !grid.contains("threw")) << grid.dump(2) << "\n" << run.log;
  EXPECT_EQ(process_result(1), grid) << run_back.log;  // the new process's
  std::set<std::string> places;
  for (const auto& t : grid.at("trials")) {
    EXPECT_EQ(t.at("status"), "TERMINATED") << t.dump(2) << "\n" << run.log;
    EXPECT_EQ(t.at("metrics").value("step", 0), 4) << t.dump(2);
    places.insert(t.at("metrics").value("place", "?"));
  }
  EXPECT_TRUE(places.count("1b") == 1) << grid.dump(2) << "\n" << run.log;
}

// Storage that only one node sees is refused before any trial starts, on
// every process, naming the host that cannot see it.
TEST_F(TunerOnHosts, NodeLocalStorageIsRefusedOnEveryProcessNamingTheHost) {
  if (auto why = no_namespaces(); !why.empty()) GTEST_SKIP() << why;
  const fs::path local = dir_ / "node-local";
  fs::create_directories(local);
  const pid_t launch = start_loop("spread", true, 2, local.string(), local.string());
  const testing::ShellRun run = testing::wait_shell(launch, out_ / "launch.log");
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json p = process_result(r);
    ASSERT_TRUE(p.is_object()) << run.log;
    EXPECT_EQ(p.value("code", ""), "invalid_argument") << p.dump(2);
    EXPECT_TRUE(has(p.value("threw", ""), "is not shared: rank 1 on host cairn-host1"))
        << p.dump(2);
  }
}

// A trial's memory tier would be in the memory of the host that runs it,
// out of reach of PBT's exploit and of a restore on process 0: refused
// before any trial starts, on every process.
TEST_F(TunerOnHosts, TheMemoryTierIsRefusedOnEveryProcess) {
  const testing::ShellRun run = loop("memory_tier", false);
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json p = process_result(r);
    ASSERT_TRUE(p.is_object()) << run.log;
    EXPECT_EQ(p.value("code", ""), "invalid_argument") << p.dump(2);
    EXPECT_TRUE(has(p.value("threw", ""), "CheckpointConfig.memory_tier")) << p.dump(2);
  }
  EXPECT_FALSE(fs::exists(dir_ / "results" / "hosts_exp" / "tuner_state.json"));
}

}  // namespace
}  // namespace cairn
