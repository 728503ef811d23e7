// The torchrun-style launcher (train/env_launch.h): what the launcher's
// variables mean, then real processes started by a plain shell loop and by
// torchrun itself, each running tests/train/mpi_program.cc's scenarios.
#include "train/env_launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "support/errors.h"
#include "support/shell.h"
#include "support/temp_dir.h"
#include "train/train_support.h"
#include "util/settings.h"

namespace cairn::train_internal {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::slurp;
using testing::TempDir;

Settings settings_of(std::map<std::string, std::string, std::less<>> vars) {
  return Settings::from(Environment::of(std::move(vars)));
}

TEST(EnvLaunch, TorchrunsFourVariablesPlaceTheProcess) {
  auto e = env_launch_from(settings_of(
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->master_addr, "node-a");
  EXPECT_EQ(e->control_port, 29500);
  EXPECT_EQ(e->bind, "");  // every interface: other nodes connect
  e = env_launch_from(settings_of(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "9"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->bind, "127.0.0.1");
}

TEST(EnvLaunch, APortTheLauncherHoldsIsLeftToItAndCairnControlPortOverridesBoth) {
  std::map<std::string, std::string, std::less<>> vars = {{"RANK", "0"},
                                                          {"WORLD_SIZE", "2"},
                                                          {"MASTER_ADDR", "localhost"},
                                                          {"MASTER_PORT", "29500"},
                                                          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(env_launch_from(settings_of(vars))->control_port, 29501);
  EXPECT_EQ(env_launch_from(settings_of(vars))->bind, "127.0.0.1");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(env_launch_from(settings_of(vars))->control_port, 29500);
  vars["CAIRN_CONTROL_PORT"] = "4000";
  EXPECT_EQ(env_launch_from(settings_of(vars))->control_port, 4000);
}

TEST(EnvLaunch, WithoutAllFourVariablesOrInsideAWorkerThereIsNoLaunch) {
  EXPECT_FALSE(env_launch_from(settings_of({})));
  auto some = settings_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
  EXPECT_FALSE(env_launch_from(some));
  EXPECT_EQ(missing_env_launch_variables(some), "MASTER_PORT");
  EXPECT_EQ(missing_env_launch_variables(settings_of({})),
            "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT");
  // A Trainer worker exports its own group's variables, and CAIRN_WORKER.
  EXPECT_FALSE(env_launch_from(settings_of({{"RANK", "0"},
                                            {"WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "h"},
                                            {"MASTER_PORT", "1"},
                                            {"CAIRN_WORKER", "1"}})));
}

// srun without MPI: the job step's variables place the process.
TEST(EnvLaunch, ASlurmStepsVariablesPlaceTheProcessWithoutTorchrunsOnes) {
  std::map<std::string, std::string, std::less<>> vars = {{"SLURM_PROCID", "3"},
                                                          {"SLURM_STEP_ID", "2"},
                                                          {"SLURM_STEP_NUM_TASKS", "8"},
                                                          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                                          {"SLURM_JOB_ID", "4711"}};
  auto e = env_launch_from(settings_of(vars));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->master_addr, "gpu07");
  EXPECT_EQ(e->control_port, slurm_control_port(4711, 2));
  EXPECT_EQ(e->bind, "");
  EXPECT_NE(e->world_size_source.find("SLURM_STEP_NUM_TASKS"), std::string::npos);
  // What the user sets wins.
  vars["MASTER_ADDR"] = "127.0.0.1";
  vars["MASTER_PORT"] = "29400";
  e = env_launch_from(settings_of(vars));
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_EQ(e->bind, "127.0.0.1");
  EXPECT_EQ(e->control_port, 29400);
  vars["CAIRN_CONTROL_PORT"] = "5000";
  EXPECT_EQ(env_launch_from(settings_of(vars))->control_port, 5000);
  // torchrun's four, when all are set, come first.
  vars["RANK"] = "1";
  vars["WORLD_SIZE"] = "2";
  EXPECT_EQ(env_launch_from(settings_of(vars))->world_size, 2);
}

TEST(EnvLaunch, ABatchScriptOutsideAStepIsNoLaunchAndBadStepVariablesAreNamed) {
  // sbatch's script has SLURM_PROCID and SLURM_NTASKS but no SLURM_STEP_*.
  EXPECT_FALSE(env_launch_from(
      settings_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "9"}})));
  std::map<std::string, std::string, std::less<>> vars = {{"SLURM_PROCID", "2"},
                                                          {"SLURM_STEP_ID", "0"},
                                                          {"SLURM_STEP_NUM_TASKS", "2"},
                                                          {"SLURM_STEP_NODELIST", "n1"}};
  auto launch = [&] { (void)env_launch_from(settings_of(vars)); };
  testing::expect_invalid_argument(launch, "SLURM_PROCID=\"2\"");
  vars["SLURM_PROCID"] = "1";
  vars["SLURM_STEP_NODELIST"] = "n[1-";
  testing::expect_invalid_argument(launch, "SLURM_STEP_NODELIST=\"n[1-\"");
  vars["SLURM_STEP_NODELIST"] = "n1";
  vars["SLURM_JOB_ID"] = "12x";
  testing::expect_invalid_argument(launch, "SLURM_JOB_ID=\"12x\"");
}

TEST(EnvLaunch, TheFirstHostOfASlurmHostList) {
  EXPECT_EQ(first_slurm_host("vm"), "vm");
  EXPECT_EQ(first_slurm_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(first_slurm_host("node[12,07-09]"), "node12");
  EXPECT_EQ(first_slurm_host("a,b[1-2]"), "a");
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[01-04]"), "rack1-n01");
  EXPECT_EQ(first_slurm_host("n-[001-100].cluster"), "n-001.cluster");
  for (const char* bad : {"", "[", "n[1-2", ",a"}) {
    EXPECT_THROW(first_slurm_host(bad), Error) << bad;
  }
}

TEST(EnvLaunch, ASlurmStepsControlPortIsTheSameEverywhereAndBelowTheEphemeralRange) {
  EXPECT_EQ(slurm_control_port(4711, 0), slurm_control_port(4711, 0));
  EXPECT_NE(slurm_control_port(4711, 0), slurm_control_port(4711, 1));
  EXPECT_NE(slurm_control_port(4711, 0), slurm_control_port(4712, 0));
  for (uint64_t job : {0ULL, 1ULL, 937ULL, 999'999ULL, ~0ULL}) {
    for (uint64_t step : {0ULL, 5ULL, 4'294'967'294ULL}) {
      const int port = slurm_control_port(job, step);
      EXPECT_GE(port, 15000);
      EXPECT_LT(port, 30000);
    }
  }
}

TEST(EnvLaunch, AVariableNoLauncherWouldSetIsRefusedNamingIt) {
  auto message = [](std::map<std::string, std::string, std::less<>> vars) {
    return testing::error_message_of([&] { env_launch_from(settings_of(vars)); },
                                     ErrorCode::kInvalidArgument);
  };
  std::map<std::string, std::string, std::less<>> ok = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& name, const std::string& value) {
    auto v = ok;
    v[name] = value;
    return v;
  };
  EXPECT_NE(message(with("RANK", "2")).find("RANK=\"2\""), std::string::npos);
  EXPECT_NE(message(with("RANK", "-1")).find("RANK"), std::string::npos);
  EXPECT_NE(message(with("WORLD_SIZE", "two")).find("WORLD_SIZE=\"two\""), std::string::npos);
  EXPECT_NE(message(with("MASTER_PORT", "70000")).find("MASTER_PORT"), std::string::npos);
  EXPECT_NE(message(with("MASTER_PORT", "1x")).find("MASTER_PORT"), std::string::npos);
  auto held = with("MASTER_PORT", "65535");
  held["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_NE(message(held).find("CAIRN_CONTROL_PORT"), std::string::npos);
}

using testing::bind_loopback;
using testing::free_port;
using testing::start_shell;
using testing::wait_shell;
using Launch = testing::ShellRun;

// A port nobody listens on, with the next one free too (torchrun's static
// rendezvous holds MASTER_PORT; the driver then takes MASTER_PORT + 1).
int free_port_pair() {
  for (int i = 0; i < 50; ++i) {
    const int port = free_port();
    if (port > 0 && port < 65535 && bind_loopback(port + 1) == port + 1) return port;
  }
  ADD_FAILURE() << "no two consecutive free ports";
  return 0;
}

// Runs `script` with /bin/sh in its own process group, output to `log`;
// after 180 s the group is killed and the test fails.
Launch run_shell(const std::string& script, const fs::path& log) {
  return wait_shell(start_shell(script, log), log);
}

// Waits (bounded: 120 s) until `p` exists; false if it never did, or if the
// process `running` (when given) ended first.
bool wait_for(const fs::path& p, pid_t running = 0) {
  for (int i = 0; i < 1200; ++i) {
    if (fs::exists(p)) return true;
    siginfo_t info{};
    if (running > 0 &&
        ::waitid(P_PID, static_cast<id_t>(running), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid != 0) {
      return fs::exists(p);  // it ended (left for wait_shell to reap)
    }
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// Waits (bounded: 120 s) until `text` is in the file at `p`.
bool wait_for_text(const fs::path& p, const std::string& text) {
  for (int i = 0; i < 1200; ++i) {
    if (fs::exists(p) && slurp(p).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

class EnvLauncher : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(out_); }
  std::string results() const { return (dir_ / "results").string(); }
  nlohmann::json process_result(int rank) const {
    const fs::path p = out_ / fmt::format("process-{}.json", rank);
    return fs::exists(p) ? nlohmann::json::parse(slurp(p)) : nlohmann::json();
  }
  nlohmann::json worker_context(int rank, int attempt) const {
    const fs::path p = out_ / fmt::format("ctx-{}-{}.json", rank, attempt);
    return fs::exists(p) ? nlohmann::json::parse(slurp(p)) : nlohmann::json();
  }
  // Two processes started by a shell loop, as a job script without any
  // launcher would start them.
  Launch shell_loop(const std::string& scenario, int world_size = 2) {
    const std::string script = fmt::format(
        "for r in $(seq 0 {}); do RANK=$r WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} "
        "'{}' {} '{}' '{}' & done; wait",
        world_size - 1, world_size, free_port(), CAIRN_TRAIN_PROGRAM, scenario, results(),
        out_.string());
    return run_shell(script, out_ / "launch.log");
  }
  // Both processes returned the same Result, without an error, and the
  // launch ended well; returns the Result (null if a process left none).
  nlohmann::json trained(const Launch& run) const {
    EXPECT_EQ(run.exit_status, 0) << run.log;
    const nlohmann::json r = same_result_everywhere(run);
    if (r.is_object()) {
      EXPECT_TRUE(r.at("error").is_null()) << r.dump(2);
    }
    return r;
  }
  // Both processes returned the same Result; returns it.
  nlohmann::json same_result_everywhere(const Launch& run) const {
    const nlohmann::json r0 = process_result(0);
    const nlohmann::json r1 = process_result(1);
    EXPECT_TRUE(r0.is_object() && r1.is_object()) << run.log;
    EXPECT_FALSE(r0.contains("threw")) << r0.dump(2) << "\n" << run.log;
    EXPECT_EQ(r0, r1) << run.log;
    return r0;
  }

  // The command starting the process of rank `rank` of a `world_size`
  // launch at control port `port`.
  std::string rank_command(const std::string& rank, int world_size, int port,
                           const std::string& scenario) const {
    return fmt::format(
        "RANK={} WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} '{}' {} '{}' '{}'", rank,
        world_size, port, CAIRN_TRAIN_PROGRAM, scenario, results(), out_.string());
  }
  // Four processes of an elastic group; once rank 3's worker is at epoch 3
  // of the first attempt, rank 3's process is SIGKILLed, as a node that is
  // lost. Returns the launch's shell, still running.
  // With `own_hosts` (as root) every process has a host name of its own
  // (a UTS namespace), as on separate nodes.
  pid_t start_and_lose_rank_3(const std::string& scenario, int port, bool own_hosts = false) {
    const std::string command = rank_command("$r", 4, port, scenario);
    const std::string script = own_hosts
                                   ? fmt::format(
                                         "for r in 0 1 2 3; do unshare --uts sh -c \"hostname "
                                         "cairn-node$r && exec env {}\" & done; wait",
                                         command)
                                   : fmt::format("for r in 0 1 2 3; do {} & done; wait", command);
    const pid_t shell = start_shell(script, out_ / "launch.log");
    EXPECT_TRUE(wait_for(out_ / "kill-me", shell)) << slurp(out_ / "launch.log");
    const pid_t rank3 = std::stoi(slurp(out_ / "pid-3"));
    EXPECT_EQ(::kill(rank3, SIGKILL), 0);
    return shell;
  }
  // The state the last attempt's ranks ended with, in global order, and
  // the number of ranks that wrote it.
  std::pair<std::vector<int64_t>, int> final_state() const {
    std::vector<int64_t> w;
    int world = 0;
    for (int rank = 0; fs::exists(out_ / fmt::format("final-{}.json", rank)); ++rank) {
      const nlohmann::json f =
          nlohmann::json::parse(slurp(out_ / fmt::format("final-{}.json", rank)));
      EXPECT_EQ(f.at("offset").get<size_t>(), w.size()) << f.dump();
      for (const auto& v : f.at("w")) w.push_back(v.get<int64_t>());
      world = f.at("world_size").get<int>();
    }
    return {w, world};
  }

  // Slurm for real: a cluster of Debian's slurmctld and slurmd
  // (slurm_cluster.sh) and srun starting the ranks without MPI; a worker's
  // failure restarts the group from the latest checkpoint. On `nodes` nodes
  // (more than one: a slurmd per node, each in a UTS namespace with the
  // node's host name) one rank runs on each; their names do not resolve
  // here, so the ranks reach rank 0 at MASTER_ADDR.
  void expect_srun_trains_and_restarts(int nodes) {
    const std::string placement =
        nodes > 1 ? fmt::format("--nodes={} --ntasks-per-node=1", nodes) : "";
    const std::string script = fmt::format(
        "NODES={} {} exec '{}' '{}' srun --ntasks=2 {} --overcommit '{}' restart '{}' '{}'", nodes,
        nodes > 1 ? "MASTER_ADDR=127.0.0.1" : "", CAIRN_SLURM_CLUSTER, (dir_ / "slurm").string(),
        placement, CAIRN_TRAIN_PROGRAM, results(), out_.string());
    const Launch run = run_shell(script, out_ / "launch.log");
    if (run.exit_status == 77) GTEST_SKIP() << run.log;
    const nlohmann::json r = trained(run);
    ASSERT_TRUE(r.is_object());
    for (int rank = 0; rank < 2; ++rank) {
      const nlohmann::json c = worker_context(rank, 0);
      ASSERT_TRUE(c.is_object()) << run.log;
      EXPECT_EQ(c.at("world_rank"), rank);
      EXPECT_EQ(c.at("world_size"), 2);
      EXPECT_EQ(c.at("node_rank"), nodes > 1 ? rank : 0);
    }
    const nlohmann::json again = worker_context(1, 1);
    ASSERT_TRUE(again.is_object()) << run.log;
    EXPECT_EQ(again.at("resumed_from_epoch"), 0);
    EXPECT_EQ(testing::expect_all_verify((dir_ / "results" / "mpi_exp").string()), 2u);
  }

  TempDir dir_;
  fs::path out_ = dir_ / "out";
};

TEST_F(EnvLauncher, ProcessesStartedByAShellLoopTrainAsOneGroup) {
  const Launch run = shell_loop("basic");
  const nlohmann::json r = trained(run);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("metrics").at("epoch"), 2);
  // One worker per process, placed by the variables; every rank's shard in
  // the last checkpoint.
  for (int rank = 0; rank < 2; ++rank) {
    const nlohmann::json c = worker_context(rank, 0);
    ASSERT_TRUE(c.is_object()) << run.log;
    EXPECT_EQ(c.at("world_rank"), rank);
    EXPECT_EQ(c.at("world_size"), 2);
    EXPECT_EQ(c.at("local_rank"), rank);  // one host
    EXPECT_EQ(c.at("node_rank"), 0);
  }
  ExperimentListing listing = read_experiment((dir_ / "results" / "mpi_exp").string());
  ASSERT_FALSE(listing.checkpoints.empty());
  auto latest = listing.checkpoints.back().checkpoint.as_directory();
  EXPECT_EQ(slurp(latest.path() / "shard-0.bin"), "rank 0 epoch 2");
  EXPECT_EQ(slurp(latest.path() / "shard-1.bin"), "rank 1 epoch 2");
  EXPECT_EQ(testing::expect_all_verify((dir_ / "results" / "mpi_exp").string()), 2u);
}

TEST_F(EnvLauncher, AWorkerThatThrowsOnAnotherProcessRestartsTheGroupFromTheLatestCheckpoint) {
  const Launch run = shell_loop("restart");
  const nlohmann::json r = trained(run);
  ASSERT_TRUE(r.is_object());
  const nlohmann::json again = worker_context(1, 1);
  ASSERT_TRUE(again.is_object()) << run.log;
  EXPECT_EQ(again.at("resumed_from_epoch"), 0);
}

// Elastic training: a lost process (its node gone) does not end the run;
// the group restarts with the three ranks left, each reading its share of
// the checkpoint four ranks saved, and ends with the state a run that never
// failed computes.
TEST_F(EnvLauncher, AnElasticGroupThatLosesOneOfFourRanksFinishesOnThreeWithTheStateReSharded) {
  const pid_t shell = start_and_lose_rank_3("elastic", free_port());
  const Launch run = wait_shell(shell, out_ / "launch.log");
  const nlohmann::json r0 = process_result(0);
  ASSERT_TRUE(r0.is_object()) << run.log;
  EXPECT_TRUE(r0.at("error").is_null()) << r0.dump(2) << run.log;
  EXPECT_EQ(r0, process_result(1));
  EXPECT_EQ(r0, process_result(2));
  const nlohmann::json& restores = r0.at("restores");
  ASSERT_EQ(restores.size(), 1u) << r0.dump(2);
  EXPECT_EQ(restores[0].at("attempt"), 1);
  EXPECT_EQ(restores[0].at("world_size"), 3);
  EXPECT_NE(run.log.find("the group restarts with 3 rank(s) (it had 4"), std::string::npos)
      << run.log;
  // Attempt 1's ranks read the checkpoint 4 ranks saved, as 3.
  for (int rank = 0; rank < 3; ++rank) {
    const nlohmann::json c = worker_context(rank, 1);
    ASSERT_TRUE(c.is_object()) << run.log;
    EXPECT_EQ(c.at("world_size"), 3);
    EXPECT_EQ(c.at("saved_by"), 4);
    EXPECT_EQ(c.at("resumed_from_epoch"), 2);
  }
  const auto [state, world] = final_state();
  EXPECT_EQ(world, 3);
  EXPECT_EQ(state, testing::elastic_expected_state());
  EXPECT_EQ(testing::expect_all_verify((dir_ / "results" / "mpi_exp").string()), 2u);
}

// A lost rank is a failure of the group, counted against max_failures as
// Ray Train counts a worker's or node's loss (docs/train.md, "Elastic
// groups"): with none allowed, the elastic group does not go on with three,
// and the run ends naming the lost rank and the spent budget.
TEST_F(EnvLauncher, AnElasticGroupWithNoFailuresAllowedEndsAtTheLossOfARank) {
  const pid_t shell = start_and_lose_rank_3("elastic_no_retries", free_port());
  const Launch run = wait_shell(shell, out_ / "launch.log");
  const nlohmann::json r0 = process_result(0);
  ASSERT_TRUE(r0.is_object()) << run.log;
  ASSERT_TRUE(r0.at("error").is_string()) << r0.dump(2) << run.log;
  const std::string error = r0.at("error").get<std::string>();
  EXPECT_NE(error.find("max_failures=0 spent"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 3"), std::string::npos) << error;
  EXPECT_TRUE(r0.at("restores").empty()) << r0.dump(2);
  EXPECT_EQ(run.log.find("the group restarts with 3 rank(s)"), std::string::npos) << run.log;
}

// The same with every process on a host of its own: the nodes are numbered
// again for the 3 that remain.
TEST_F(EnvLauncher, AnElasticGroupOnSeparateHostsThatLosesOneGoesOnWithTheOthersRenumbered) {
  if (::geteuid() != 0 || std::system("unshare --uts true 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs root and unshare(1) for UTS namespaces";
  }
  const pid_t shell = start_and_lose_rank_3("elastic", free_port(), /*own_hosts=*/true);
  const Launch run = wait_shell(shell, out_ / "launch.log");
  const nlohmann::json r0 = process_result(0);
  ASSERT_TRUE(r0.is_object()) << run.log;
  EXPECT_TRUE(r0.at("error").is_null()) << r0.dump(2) << run.log;
  EXPECT_NE(run.log.find("rank 3 on host cairn-node3"), std::string::npos) << run.log;
  for (int rank = 0; rank < 3; ++rank) {
    const nlohmann::json before = worker_context(rank, 0);
    const nlohmann::json after = worker_context(rank, 1);
    ASSERT_TRUE(before.is_object() && after.is_object()) << run.log;
    EXPECT_EQ(after.at("node_rank"), rank);
    EXPECT_EQ(after.at("world_size"), 3);
  }
  const auto [state, world] = final_state();
  EXPECT_EQ(world, 3);
  EXPECT_EQ(state, testing::elastic_expected_state());
}

// A process started again for the lost rank joins at the next restart.
TEST_F(EnvLauncher, ARankStartedAgainAfterItsLossJoinsTheElasticGroupAtTheNextRestart) {
  const int port = free_port();
  const pid_t shell = start_and_lose_rank_3("elastic_rejoin", port);
  // Once the group runs on 3, rank 3 is started again; it connects and waits.
  ASSERT_TRUE(wait_for(out_ / "ctx-0-1.json")) << slurp(out_ / "launch.log");
  const fs::path back_log = out_ / "rank-3-again.log";
  const pid_t back = start_shell(rank_command("3", 4, port, "elastic_rejoin"), back_log);
  ASSERT_TRUE(wait_for_text(back_log, "connected to the driver")) << slurp(back_log);
  std::ofstream(out_ / "rejoined").close();  // rank 1 fails now: attempt 2 takes rank 3 in
  const Launch run = wait_shell(shell, out_ / "launch.log");
  const Launch again = wait_shell(back, back_log);
  EXPECT_EQ(again.exit_status, 0) << again.log;
  const nlohmann::json r0 = process_result(0);
  ASSERT_TRUE(r0.is_object()) << run.log;
  EXPECT_TRUE(r0.at("error").is_null()) << r0.dump(2) << run.log;
  EXPECT_EQ(r0, process_result(3)) << again.log;  // the returned process ends with the run
  const nlohmann::json& restores = r0.at("restores");
  ASSERT_EQ(restores.size(), 2u) << r0.dump(2);
  EXPECT_EQ(restores[0].at("world_size"), 3);
  EXPECT_EQ(restores[1].at("world_size"), 4);
  const nlohmann::json c = worker_context(3, 2);
  ASSERT_TRUE(c.is_object()) << run.log;
  EXPECT_EQ(c.at("saved_by"), 3);
  const auto [state, world] = final_state();
  EXPECT_EQ(world, 4);
  EXPECT_EQ(state, testing::elastic_expected_state());
}

// A process started again on a node that does not see the experiment's
// storage (here: a mount namespace of its own, with a tmpfs over the results
// folder, as a node that came back without the shared mount) fails the
// storage probe the group passed before its first attempt: it is refused,
// naming its rank and host, and the group goes on without it.
TEST_F(EnvLauncher, ARankStartedAgainOnAHostThatDoesNotSeeTheStorageIsRefusedAndTheGroupGoesOn) {
  if (::geteuid() != 0 || std::system("unshare --uts --mount true 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs root and unshare(1) for UTS and mount namespaces";
  }
  const int port = free_port();
  const pid_t shell = start_and_lose_rank_3("elastic_rejoin", port);
  ASSERT_TRUE(wait_for(out_ / "ctx-0-1.json")) << slurp(out_ / "launch.log");
  const fs::path back_log = out_ / "rank-3-again.log";
  const std::string elsewhere = fmt::format(
      "unshare --uts --mount sh -c \"hostname cairn-elsewhere && mount -t tmpfs cairn-local "
      "'{}' && exec env {}\"",
      results(), rank_command("3", 4, port, "elastic_rejoin"));
  const pid_t back = start_shell(elsewhere, back_log);
  ASSERT_TRUE(wait_for_text(back_log, "connected to the driver")) << slurp(back_log);
  std::ofstream(out_ / "rejoined").close();  // rank 1 fails now: the restart probes rank 3
  const Launch run = wait_shell(shell, out_ / "launch.log");
  const Launch again = wait_shell(back, back_log);
  const nlohmann::json r0 = process_result(0);
  ASSERT_TRUE(r0.is_object()) << run.log;
  EXPECT_TRUE(r0.at("error").is_null()) << r0.dump(2) << run.log;
  EXPECT_NE(run.log.find("rank 3 on host cairn-elsewhere is back but cannot join the group"),
            std::string::npos)
      << run.log;
  const nlohmann::json r3 = process_result(3);
  ASSERT_TRUE(r3.is_object()) << again.log;
  EXPECT_EQ(r3.value("code", ""), "invalid_argument") << r3.dump(2);
  const std::string threw = r3.value("threw", "");
  EXPECT_NE(threw.find("the driver did not take this process in: storage path"), std::string::npos)
      << threw;
  EXPECT_NE(threw.find("rank 3 on host cairn-elsewhere cannot see a file"), std::string::npos)
      << threw;
  const nlohmann::json& restores = r0.at("restores");
  ASSERT_EQ(restores.size(), 2u) << r0.dump(2);
  EXPECT_EQ(restores[0].at("world_size"), 3);
  EXPECT_EQ(restores[1].at("world_size"), 3);
  const auto [state, world] = final_state();
  EXPECT_EQ(world, 3);
  EXPECT_EQ(state, testing::elastic_expected_state());
}

TEST_F(EnvLauncher, NumWorkersThatIsNotTheLaunchersWorldSizeIsRefusedOnEveryProcess) {
  const Launch run = shell_loop("mismatch");
  for (int rank = 0; rank < 2; ++rank) {
    const nlohmann::json r = process_result(rank);
    ASSERT_TRUE(r.is_object()) << run.log;
    EXPECT_EQ(r.value("code", ""), "invalid_argument") << r.dump(2);
    EXPECT_NE(r.value("threw", "").find("num_workers is 3 but the launcher's WORLD_SIZE has 2"),
              std::string::npos)
        << r.dump(2);
  }
}

// Slurm for real, on one node and on two (expect_srun_trains_and_restarts).
TEST_F(EnvLauncher, SrunStartsTheRanksOfASlurmStepAndAFailureRestartsTheGroup) {
  expect_srun_trains_and_restarts(1);
}

TEST_F(EnvLauncher, SrunAcrossTwoSlurmNodesTrainsAsOneGroupAndAFailureRestartsIt) {
  expect_srun_trains_and_restarts(2);
}

TEST_F(EnvLauncher, TorchrunStartsTheRanksAndHoldsMasterPortForItsOwnStore) {
  // The project venv's torchrun (scripts/install-deps.sh).
  ASSERT_TRUE(fs::exists(CAIRN_TORCHRUN)) << CAIRN_TORCHRUN << " is missing";
  // The static rendezvous: torchrun's store listens at MASTER_PORT and says
  // so (TORCHELASTIC_USE_AGENT_STORE=True), so the driver takes the next.
  const std::string script = fmt::format(
      "exec '{}' --nnodes=1 --nproc_per_node=2 --master_addr=127.0.0.1 "
      "--master_port={} --log_dir='{}' --no_python '{}' basic '{}' '{}'",
      CAIRN_TORCHRUN, free_port_pair(), (out_ / "torchrun-logs").string(), CAIRN_TRAIN_PROGRAM,
      results(), out_.string());
  const Launch run = run_shell(script, out_ / "launch.log");
  const nlohmann::json r = trained(run);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("metrics").at("epoch"), 2);
  EXPECT_EQ(worker_context(1, 0).at("world_size"), 2);
}

}  // namespace
}  // namespace cairn::train_internal
