// The MPI launcher with real mpirun (OpenMPI) processes on this machine:
// a run across MPI processes, restarts, a SIGKILLed worker, hang detection,
// refusals (a num_workers mismatch, storage not every rank reaches), and,
// as root, distinct host names and node-local storage made with Linux
// namespaces, as on a multi-node run.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/manager.h"
#include "support/mpirun.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_all_verify;
using testing::slurp;
using testing::TempDir;

using Launch = testing::MpirunResult;
using Started = testing::MpirunStarted;

// The environment of an mpirun: `env`, and for the sanitizer build what
// keeps Open MPI's own allocations from counting as Cairn's leaks (unless
// `env` has LSAN_OPTIONS of its own).
std::vector<std::string> mpi_env(const std::vector<std::string>& env = {}) {
  std::vector<std::string> vars = {"OMPI_MCA_mca_base_component_disable_dlclose=1"};
  bool own_lsan = false;
  for (const auto& e : env) own_lsan |= e.rfind("LSAN_OPTIONS=", 0) == 0;
  if (!own_lsan) {
    vars.push_back(fmt::format("LSAN_OPTIONS=suppressions={}:fast_unwind_on_malloc=0",
                               CAIRN_MPI_LSAN_SUPPRESSIONS));
  }
  vars.insert(vars.end(), env.begin(), env.end());
  return vars;
}

// Starts `mpirun -np <np> [wrapper...] program scenario storage out` in its
// own process group, output to out/mpirun.log.
Started start_mpirun(const std::string& scenario, const std::string& storage, const fs::path& out,
                     const std::vector<std::string>& wrapper = {},
                     const std::vector<std::string>& env = {}, int np = 2) {
  const std::vector<std::string> vars = mpi_env(env);
  std::vector<std::string> command = wrapper;
  for (const std::string& a : {std::string(CAIRN_MPI_PROGRAM), scenario, storage, out.string()}) {
    command.push_back(a);
  }
  return testing::start_mpirun(np, vars, command, out / "mpirun.log");
}

// Waits for a started mpirun, bounded: its process group is killed after 180 s.
Launch finish(const Started& s) { return testing::finish_mpirun(s, 180s); }

Launch mpirun(const std::string& scenario, const std::string& storage, const fs::path& out,
              const std::vector<std::string>& wrapper = {},
              const std::vector<std::string>& env = {}) {
  return finish(start_mpirun(scenario, storage, out, wrapper, env));
}

nlohmann::json process_result(const fs::path& out, int mpi_rank) {
  const fs::path p = out / fmt::format("process-{}.json", mpi_rank);
  if (!fs::exists(p)) return nullptr;
  return nlohmann::json::parse(slurp(p));
}

nlohmann::json worker_context(const fs::path& out, int rank, int attempt) {
  const fs::path p = out / fmt::format("ctx-{}-{}.json", rank, attempt);
  if (!fs::exists(p)) return nullptr;
  return nlohmann::json::parse(slurp(p));
}

// Both MPI processes returned the same Result; returns rank 0's.
nlohmann::json same_result_everywhere(const fs::path& out, const Launch& l) {
  nlohmann::json r0 = process_result(out, 0);
  nlohmann::json r1 = process_result(out, 1);
  EXPECT_TRUE(r0.is_object() && r1.is_object()) << l.log;
  if (!r0.is_object() || !r1.is_object()) return nullptr;
  EXPECT_FALSE(r0.contains("threw")) << r0.dump() << "\n" << l.log;
  EXPECT_EQ(r0, r1) << l.log;
  return r0;
}

// Both MPI processes threw the same error; returns its message.
std::string same_error_everywhere(const fs::path& out, const Launch& l, const std::string& code) {
  nlohmann::json r0 = process_result(out, 0);
  nlohmann::json r1 = process_result(out, 1);
  EXPECT_TRUE(r0.is_object() && r1.is_object()) << l.log;
  if (!r0.is_object() || !r1.is_object()) return "";
  EXPECT_EQ(r0.value("code", ""), code) << r0.dump(2) << "\n" << l.log;
  EXPECT_EQ(r1.value("code", ""), code) << r1.dump(2) << "\n" << l.log;
  return r0.value("threw", "") + "\n" + r1.value("threw", "");
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A temporary directory per test: OUT for what the processes write, and the
// storage path `results` holding the experiment `mpi_exp`.
class MpiLauncher : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(out_); }
  std::string results() const { return (dir_ / "results").string(); }
  std::string experiment() const { return (dir_ / "results" / "mpi_exp").string(); }
  // Runs `scenario` and expects mpirun to succeed and every process to
  // return the same Result; returns it (null if not) and the launch.
  nlohmann::json run_to_result(const std::string& scenario, Launch& l,
                               const std::vector<std::string>& wrapper = {},
                               const std::vector<std::string>& env = {}) {
    l = mpirun(scenario, results(), out_, wrapper, env);
    EXPECT_EQ(l.exit_status, 0) << l.log;
    return same_result_everywhere(out_, l);
  }

  TempDir dir_;
  fs::path out_ = dir_ / "out";
};

TEST_F(MpiLauncher, TwoProcessesTrainAsOneGroupAndEveryRanksShardLandsInOneCheckpoint) {
  const fs::path tmp = dir_ / "tmp";
  fs::create_directories(tmp);
  Launch l;
  nlohmann::json r = run_to_result("basic", l, {}, {"TMPDIR=" + tmp.string()});
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["metrics"]["epoch"], 2);
  EXPECT_EQ(r["path"], experiment());
  EXPECT_EQ(r["best"].size(), 2u);  // num_to_keep=2 through the manager
  // Every process gets the run's history (same_result_everywhere compared them).
  ASSERT_EQ(r["history"].size(), 3u) << r.dump(2);
  EXPECT_EQ(r["history"][2]["training_iteration"], 3);
  EXPECT_EQ(r["history"][2]["epoch"], 2);

  const std::string exp = experiment();
  EXPECT_EQ(expect_all_verify(exp), 2u);
  ExperimentListing listing = read_experiment(exp);
  ASSERT_FALSE(listing.checkpoints.empty());
  auto latest = listing.checkpoints.back().checkpoint.as_directory();
  EXPECT_EQ(slurp(latest.path() / "shard-0.bin"), "rank 0 epoch 2");
  EXPECT_EQ(slurp(latest.path() / "shard-1.bin"), "rank 1 epoch 2");
  EXPECT_EQ(slurp(latest.path() / "epoch.txt"), "2");

  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json c = worker_context(out_, rank, 0);
    ASSERT_TRUE(c.is_object()) << "rank " << rank << "\n" << l.log;
    EXPECT_EQ(c["world_rank"], rank);
    EXPECT_EQ(c["world_size"], 2);
    EXPECT_EQ(c["local_rank"], rank);
    EXPECT_EQ(c["local_world_size"], 2);
    EXPECT_EQ(c["node_rank"], 0);
    EXPECT_EQ(c["experiment_name"], "mpi_exp");
    EXPECT_EQ(c["experiment_path"], exp);
  }
  // Every node's scratch folder is gone, and so is the storage probe.
  for (const auto& e : fs::directory_iterator(tmp)) {
    EXPECT_FALSE(has(e.path().filename().string(), "cairn-train-")) << e.path();
  }
  for (const auto& e : fs::directory_iterator(exp)) {
    EXPECT_FALSE(has(e.path().filename().string(), "probe")) << e.path();
  }
}

TEST_F(MpiLauncher, WorkerThatThrowsOnAnotherProcessRestartsTheGroupFromTheLatestCheckpoint) {
  Launch l;
  nlohmann::json r = run_to_result("restart", l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["metrics"]["epoch"], 2);
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json again = worker_context(out_, rank, 1);
    ASSERT_TRUE(again.is_object()) << "rank " << rank << " was not restarted\n" << l.log;
    EXPECT_EQ(again["resumed_from_epoch"], 0) << again.dump();
  }
  EXPECT_TRUE(has(l.log, "intentional error at epoch 1")) << l.log;
  EXPECT_EQ(expect_all_verify(experiment()), 2u);
}

// Both MPI processes on this host: the memory tier under OUT/tiers serves
// the restart, and the end persists the newest and frees it.
TEST_F(MpiLauncher, OnOneHostTheMemoryTierServesTheRestartAndIsFreedAtTheEnd) {
  Launch l;
  nlohmann::json r = run_to_result("tier_restart", l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["metrics"]["epoch"], 2);
  EXPECT_EQ(r["restores"], nlohmann::json::parse(R"([{"attempt": 1, "checkpoint":
      "checkpoint_000000", "tier": "memory", "world_size": 2, "rank_tiers": []}])"))
      << r.dump(2);
  EXPECT_EQ(expect_all_verify(experiment()), 1u);  // the newest, persisted at the end
  const fs::path tiers = out_ / "tiers" / fmt::format("cairn-tier-{}", ::getuid());
  EXPECT_TRUE(fs::is_empty(tiers)) << "the end left the memory tier";
}

TEST_F(MpiLauncher, SigkilledRemoteWorkerFailsTheRunNamingRankSignalAndStderrKeepingCommits) {
  Launch l;
  nlohmann::json r = run_to_result("killed", l);
  ASSERT_TRUE(r.is_object());
  ASSERT_TRUE(r["error"].is_string()) << r.dump(2);
  const std::string error = r["error"];
  EXPECT_TRUE(has(error, "rank 1")) << error;
  EXPECT_TRUE(has(error, "signal 9 (SIGKILL)")) << error;
  EXPECT_TRUE(has(error, "rank 1 is about to die")) << error;  // the stderr tail
  EXPECT_TRUE(has(error, "max_failures=0")) << error;
  // Epoch 0's checkpoint was committed before the kill and is intact.
  EXPECT_EQ(r["metrics"]["epoch"], 0);
  EXPECT_EQ(expect_all_verify(experiment()), 1u);
}

TEST_F(MpiLauncher, RankThatStopsReportingIsATimeoutAndItsWorkerIsStopped) {
  Launch l;
  nlohmann::json r = run_to_result("hang", l);
  ASSERT_TRUE(r.is_object());
  ASSERT_TRUE(r["error"].is_string()) << r.dump(2);
  const std::string error = r["error"];
  EXPECT_TRUE(has(error, "timeout")) << error;
  EXPECT_TRUE(has(error, "rank(s) 1 did not call report() within 2 s")) << error;
  // The hung worker sleeps 60 s; the job ended long before, so it was killed.
  EXPECT_LT(l.seconds, 45) << l.log;
  EXPECT_EQ(expect_all_verify(experiment()), 1u);
}

// Under mpirun a lost process ends the whole job; an elastic run goes on
// under a smaller mpirun: Trainer::restore takes any world size within
// ScalingConfig's range, and the ranks read their shares of the checkpoint
// the larger job saved (mpi_program.cc, elastic_fn).
TEST_F(MpiLauncher, AnElasticJobThatLostAProcessIsRestoredByASmallerMpirunWithItsStateReSharded) {
  Started s = start_mpirun("elastic", results(), out_, {}, {}, 4);
  const auto limit = std::chrono::steady_clock::now() + 120s;
  while (!fs::exists(out_ / "kill-me") && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(fs::exists(out_ / "kill-me")) << slurp(out_ / "mpirun.log");
  // The job dies whole, as mpirun ends it when a process is lost (its
  // SIGTERM then SIGKILL would race with the elastic restart the driver
  // starts meanwhile): the driver first, then rank 3's process, whose worker
  // waits at epoch 3, so checkpoint_000002 is the newest, saved by 4 ranks.
  ASSERT_EQ(::kill(std::stoi(slurp(out_ / "pid-0")), SIGKILL), 0);
  ASSERT_EQ(::kill(std::stoi(slurp(out_ / "pid-3")), SIGKILL), 0);
  Launch l = finish(s);
  EXPECT_NE(l.exit_status, 0) << "mpirun should report the killed process\n" << l.log;

  const fs::path out2 = dir_ / "out2";
  fs::create_directories(out2);
  Started smaller = start_mpirun("elastic_restore", results(), out2, {}, {}, 3);
  Launch again = finish(smaller);
  EXPECT_EQ(again.exit_status, 0) << again.log;
  nlohmann::json r = same_result_everywhere(out2, again);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["restores"], nlohmann::json::parse(R"([{"attempt": 0, "checkpoint":
      "checkpoint_000002", "tier": "persistent", "world_size": 3, "rank_tiers": []}])"))
      << r.dump(2);
  std::vector<int64_t> state;
  for (int rank = 0; rank < 3; ++rank) {
    nlohmann::json c = worker_context(out2, rank, 0);
    ASSERT_TRUE(c.is_object()) << again.log;
    EXPECT_EQ(c["saved_by"], 4);
    const nlohmann::json f =
        nlohmann::json::parse(slurp(out2 / fmt::format("final-{}.json", rank)));
    EXPECT_EQ(f["world_size"], 3);
    for (const auto& v : f["w"]) state.push_back(v.get<int64_t>());
  }
  EXPECT_EQ(state, testing::elastic_expected_state());
  // Outside the range: a job of 5 is refused on every process.
  const fs::path out3 = dir_ / "out3";
  fs::create_directories(out3);
  Launch five = finish(start_mpirun("elastic_restore", results(), out3, {}, {}, 5));
  const nlohmann::json refused = process_result(out3, 4);
  ASSERT_TRUE(refused.is_object()) << five.log;
  EXPECT_NE(refused.value("threw", "")
                .find("the MPI job has 5 process(es), outside "
                      "ScalingConfig's elastic range of 2 to 4"),
            std::string::npos)
      << refused.dump(2);
}

TEST_F(MpiLauncher, DriverKilledBySigkillEndsTheJobAndARestoredJobContinuesItsHistory) {
  const fs::path out2 = dir_ / "out2";
  fs::create_directories(out2);
  const std::string exp = experiment();
  Started s = start_mpirun("slow", results(), out_);
  // Kill MPI rank 0 (the driver) once two checkpoints were committed.
  std::set<std::string> committed;
  const auto limit = std::chrono::steady_clock::now() + 60s;
  while (committed.size() < 2 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(50ms);
    committed.clear();
    if (!fs::exists(exp)) continue;
    for (const auto& rec : read_experiment(exp).checkpoints) committed.insert(rec.name);
  }
  ASSERT_GE(committed.size(), 2u) << "no checkpoints within 60 s";
  const pid_t driver = std::stoi(slurp(out_ / "pid-0"));
  ASSERT_EQ(::kill(driver, SIGKILL), 0);
  Launch l = finish(s);
  EXPECT_NE(l.exit_status, 0) << "mpirun should report the killed process\n" << l.log;
  EXPECT_LT(l.seconds, 90) << l.log;
  // Every worker of the killed job is gone (they die with their agent).
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json c = worker_context(out_, rank, 0);
    ASSERT_TRUE(c.is_object());
    EXPECT_TRUE(testing::wait_gone(c["pid"].get<pid_t>(), 10s)) << "rank " << rank;
  }
  // Nothing committed is lost: the newest checkpoint seen before the kill is
  // still there (retention keeps the two with the lowest loss: the newest).
  ExperimentListing before = read_experiment(exp);
  bool kept = false;
  for (const auto& rec : before.checkpoints) kept |= rec.name == *committed.rbegin();
  EXPECT_TRUE(kept) << *committed.rbegin();
  expect_all_verify(exp);

  Launch again = mpirun("restore", results(), out2);
  EXPECT_EQ(again.exit_status, 0) << again.log;
  nlohmann::json r = same_result_everywhere(out2, again);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["metrics"]["epoch"], 7);
  nlohmann::json resumed = worker_context(out2, 1, 0);
  ASSERT_TRUE(resumed.is_object()) << again.log;
  EXPECT_TRUE(resumed["resumed_from_epoch"].is_number()) << resumed.dump();
  // Numbering continued: the restored run's checkpoints come after the first's.
  ExperimentListing after = read_experiment(exp);
  ASSERT_FALSE(after.checkpoints.empty());
  EXPECT_GT(after.checkpoints.back().name, before.checkpoints.back().name);
  EXPECT_EQ(expect_all_verify(exp), 2u);
}

TEST_F(MpiLauncher, AsynchronousReportsCommitEveryRanksShardInReportOrder) {
  Launch l;
  nlohmann::json r = run_to_result("async", l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["metrics"]["epoch"], 2);
  ExperimentListing listing = read_experiment(experiment());
  ASSERT_EQ(listing.checkpoints.size(), 2u);  // num_to_keep=2: epochs 1 and 2
  for (size_t i = 0; i < 2; ++i) {
    const int epoch = static_cast<int>(i) + 1;
    EXPECT_EQ(listing.checkpoints[i].metrics["epoch"], epoch);
    auto view = listing.checkpoints[i].checkpoint.as_directory();
    EXPECT_EQ(slurp(view.path() / "shard-0.bin"), fmt::format("rank 0 epoch {}", epoch));
    EXPECT_EQ(slurp(view.path() / "shard-1.bin"), fmt::format("rank 1 epoch {}", epoch));
  }
  EXPECT_EQ(expect_all_verify(experiment()), 2u);
}

// SIGTERM to MPI process 1 (an agent, not the driver): its worker's next
// report carries the notice, every rank saves at the same report, and every
// process returns the same preempted Result.
TEST_F(MpiLauncher, SigtermToAnAgentPreemptsTheRunWithOneEmergencyCheckpoint) {
  Started s = start_mpirun("preempt", results(), out_);
  const auto limit = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(out_ / "ctx-1-0.json") && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(fs::exists(out_ / "ctx-1-0.json")) << "rank 1 never started";
  std::this_thread::sleep_for(300ms);  // a few epochs in
  const pid_t agent = std::stoi(slurp(out_ / "pid-1"));
  ASSERT_EQ(::kill(agent, SIGTERM), 0);
  Launch l = finish(s);
  EXPECT_EQ(l.exit_status, 0) << l.log;
  nlohmann::json r = same_result_everywhere(out_, l);
  ASSERT_TRUE(r.is_object()) << l.log;
  EXPECT_EQ(r["preempted"], true) << r.dump(2);
  ASSERT_TRUE(r["error"].is_string()) << r.dump(2);
  EXPECT_TRUE(has(r["error"], "preempt")) << r.dump(2);
  ASSERT_TRUE(r["checkpoint"].is_string()) << "no emergency checkpoint\n" << r.dump(2);
  EXPECT_LT(r["metrics"]["epoch"].get<int>(), 399) << "the run was not stopped early";
  ExperimentListing listing = read_experiment(experiment());
  ASSERT_EQ(listing.checkpoints.size(), 1u);
  auto view = listing.checkpoints[0].checkpoint.as_directory();
  const int epoch = std::stoi(slurp(view.path() / "epoch.txt"));
  EXPECT_EQ(slurp(view.path() / "shard-1.bin"), fmt::format("rank 1 epoch {}", epoch));
  EXPECT_EQ(expect_all_verify(experiment()), 1u);
}

TEST_F(MpiLauncher, NumWorkersThatIsNotTheMpiWorldSizeIsRefusedOnEveryProcess) {
  Launch l = mpirun("mismatch", results(), out_);
  const std::string errors = same_error_everywhere(out_, l, "invalid_argument");
  EXPECT_TRUE(has(errors, "num_workers is 3 but the MPI job has 2 process(es)")) << errors;
  EXPECT_FALSE(fs::exists(dir_ / "results" / "mpi_exp" / "trainer_state.json"));
}

TEST_F(MpiLauncher, StorageThatOtherProcessesCannotSeeIsRefusedBeforeTraining) {
  // memory:// lives in one process: like a path local to one node.
  Launch l = mpirun("basic", "memory://mpi-test", out_);
  const std::string errors = same_error_everywhere(out_, l, "invalid_argument");
  EXPECT_TRUE(has(errors, "is not shared: rank 1 on host")) << errors;
  EXPECT_FALSE(worker_context(out_, 0, 0).is_object()) << "training started";
}

// As root: every MPI process gets its own host name (a UTS namespace), as on
// separate nodes; the driver's address is pinned to loopback.
std::string root_only() {
  if (::geteuid() != 0) return "needs root for unshare(1) namespaces";
  if (std::system("unshare --uts --mount true 2>/dev/null") != 0) {
    return "unshare --uts --mount is not permitted here";
  }
  return "";
}

// An mpirun wrapper giving each process its own host name, as on separate
// nodes sharing the storage.
std::vector<std::string> own_host() {
  return {"unshare", "--uts", "sh", "-c", "hostname cairn-node$OMPI_COMM_WORLD_RANK && exec \"$@\"",
          "sh"};
}

// An mpirun wrapper giving each process its own host name and its own tmpfs
// mounted on `local`: node-local storage, as on separate nodes.
std::vector<std::string> own_host_and_local_mount(const fs::path& local) {
  return {
      "unshare",
      "--uts",
      "--mount",
      "sh",
      "-c",
      fmt::format("hostname cairn-node$OMPI_COMM_WORLD_RANK && mount -t tmpfs cairn-local {} && "
                  "exec \"$@\"",
                  local.string()),
      "sh"};
}

TEST_F(MpiLauncher, RanksOnDistinctHostsGetNodeRanksAndTrainOnSharedStorage) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> wrapper = own_host();
  Launch l;
  nlohmann::json r = run_to_result("basic", l, wrapper, {"CAIRN_MPI_ADDRESS=127.0.0.1"});
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json c = worker_context(out_, rank, 0);
    ASSERT_TRUE(c.is_object()) << l.log;
    EXPECT_EQ(c["node_rank"], rank);
    EXPECT_EQ(c["local_rank"], 0);
    EXPECT_EQ(c["local_world_size"], 1);
  }
  EXPECT_EQ(expect_all_verify(experiment()), 2u);
}

TEST_F(MpiLauncher, NodeLocalStorageOnAMultiNodeRunIsRefusedNamingRankAndHost) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const fs::path local = dir_ / "node-local";
  fs::create_directories(local);
  const std::vector<std::string> wrapper = own_host_and_local_mount(local);
  Launch l = mpirun("basic", local.string(), out_, wrapper, {"CAIRN_MPI_ADDRESS=127.0.0.1"});
  const std::string errors = same_error_everywhere(out_, l, "invalid_argument");
  EXPECT_TRUE(has(errors,
                  "is not shared: rank 1 on host cairn-node1 cannot see a file the "
                  "driver on host cairn-node0 wrote there"))
      << errors;
  EXPECT_TRUE(has(errors, "2 host(s)")) << errors;
  EXPECT_FALSE(worker_context(out_, 0, 0).is_object()) << "training started";
}

// The peer transport moves files between two MPI processes whole, in
// pieces, and refuses one whose bytes do not match the XXH3 announced,
// naming the file and the peer, leaving no temporary file.
TEST_F(MpiLauncher, PeerTransportMovesFilesCheckedAndRefusesAWrongChecksumNamingFileAndPeer) {
  Launch l = finish(testing::start_mpirun(2, mpi_env(), {CAIRN_MPI_PEER_PROGRAM, out_.string()},
                                          out_ / "mpirun.log"));
  EXPECT_EQ(l.exit_status, 0) << l.log;
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path p = out_ / fmt::format("result-{}.json", rank);
    ASSERT_TRUE(fs::exists(p)) << l.log;
    const nlohmann::json r = nlohmann::json::parse(slurp(p));
    EXPECT_EQ(r["code"], "corruption") << r.dump(2);
    const std::string e = r["error"].is_string() ? r["error"].get<std::string>() : "";
    EXPECT_TRUE(has(e, fmt::format("{}/in-bad", rank))) << e;
    EXPECT_TRUE(has(e, fmt::format("received from MPI rank {}", 1 - rank))) << e;
    EXPECT_EQ(r["good"], true) << r.dump(2);
    EXPECT_EQ(r["empty"], true) << r.dump(2);
    EXPECT_EQ(r["bad_exists"], false) << r.dump(2);
    EXPECT_EQ(r["leftover"], false) << r.dump(2);
  }
}

// An mpirun wrapper giving each process its own host name and, at
// OUT/tiers (the hosts_tier scenarios' memory tier root), its host's own
// memory: OUT/hosts/<host>, bind-mounted there. Like /dev/shm, it outlives
// the job's processes, and the test drops it to fail a host. `per_host`
// consecutive MPI ranks share a host.
std::vector<std::string> own_host_and_memory(const fs::path& out, int per_host = 1) {
  return {"unshare",
          "--uts",
          "--mount",
          "sh",
          "-c",
          fmt::format("h=cairn-node$((OMPI_COMM_WORLD_RANK / {1})) && hostname $h && mkdir -p "
                      "{0}/hosts/$h {0}/tiers && mount --bind {0}/hosts/$h {0}/tiers && "
                      "exec \"$@\"",
                      out.string(), per_host),
          "sh"};
}

// The checkpoints folder of the memory tier host `host` holds (none: "").
fs::path host_tier(const fs::path& out, int host) {
  const fs::path base =
      out / "hosts" / fmt::format("cairn-node{}", host) / fmt::format("cairn-tier-{}", ::getuid());
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return {};
  for (const auto& d : fs::directory_iterator(base)) return d.path() / "checkpoints";
  return {};
}

// What a freed host's memory holds: nothing of the run.
bool host_memory_freed(const fs::path& out, int host) {
  const fs::path base =
      out / "hosts" / fmt::format("cairn-node{}", host) / fmt::format("cairn-tier-{}", ::getuid());
  std::error_code ec;
  return !fs::is_directory(base, ec) || fs::is_empty(base, ec);
}

// Rank 1's shard and epoch.txt of the experiment's newest checkpoint: the
// state a run of 8 epochs that never failed ends with.
void expect_final_state(const std::string& exp) {
  ExperimentListing listing = read_experiment(exp);
  ASSERT_FALSE(listing.checkpoints.empty());
  Checkpoint last = listing.checkpoints.back().checkpoint;
  EXPECT_EQ(last.storage().get("epoch.txt"), "7");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(last.storage().get(fmt::format("shard-{}.bin", rank)),
              fmt::format("rank {} epoch 7", rank));
  }
}

// The first run of hosts_tier_crash (`np` processes, `per_host` to a host)
// up to its crash: rank 1's worker stops at epoch 5, with checkpoint 4
// committed; then every process of the job is SIGKILLed (the driver and the
// agents; their workers die with them).
void crash_at_epoch_5(const std::string& results, const fs::path& out,
                      const std::vector<std::string>& env, int np = 2, int per_host = 1,
                      const std::string& scenario = "hosts_tier_crash") {
  Started s = start_mpirun(scenario, results, out, own_host_and_memory(out, per_host), env, np);
  const auto limit = std::chrono::steady_clock::now() + 120s;
  while (!fs::exists(out / "crashed") && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(fs::exists(out / "crashed")) << slurp(out / "mpirun.log");
  for (int rank = 0; rank < np; ++rank) {
    ASSERT_EQ(::kill(std::stoi(slurp(out / fmt::format("pid-{}", rank))), SIGKILL), 0);
  }
  Launch l = finish(s);
  EXPECT_NE(l.exit_status, 0) << l.log;
}

// The job after crash_at_epoch_5 (Trainer::restore, with the stored
// configuration, the tier's root OUT/tiers included; its processes write
// their results over the first's): it restores `checkpoint` (its epoch
// `epoch`) from `tier`, ends with the state of a run that never failed, and
// frees every host's memory. Returns its Result and log.
std::pair<nlohmann::json, std::string> expect_restored_job(const std::string& results,
                                                           const fs::path& out,
                                                           const std::string& exp,
                                                           const std::string& checkpoint,
                                                           const std::string& tier, int epoch,
                                                           int np = 2, int per_host = 1) {
  Launch l =
      finish(start_mpirun("hosts_tier_restore", results, out, own_host_and_memory(out, per_host),
                          {"CAIRN_MPI_ADDRESS=127.0.0.1"}, np));
  EXPECT_EQ(l.exit_status, 0) << l.log;
  nlohmann::json r = same_result_everywhere(out, l);
  if (!r.is_object()) return {r, l.log};
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["restores"].size(), 1u) << r.dump(2);
  EXPECT_EQ(r["restores"][0]["checkpoint"], checkpoint) << r.dump(2);
  EXPECT_EQ(r["restores"][0]["tier"], tier) << r.dump(2);
  for (int rank = 0; rank < np; ++rank) {
    EXPECT_EQ(worker_context(out, rank, 0)["resumed_from_epoch"], epoch) << l.log;
  }
  EXPECT_EQ(r["metrics"]["epoch"], 7);
  expect_all_verify(exp);
  expect_final_state(exp);
  for (int host = 0; host < np / per_host; ++host) EXPECT_TRUE(host_memory_freed(out, host));
  return {r, l.log};
}

// Across hosts, the memory tier serves a restart: each host holds its ranks'
// files and a replica of the other host's; after a worker fails the ranks
// restore from their own host's memory; the end persists the newest and
// frees every host's memory.
TEST_F(MpiLauncher, RanksOnDistinctHostsRestartFromTheirHostsMemoryAfterAWorkerFails) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  Launch l;
  nlohmann::json r = run_to_result("hosts_tier_restart", l, own_host_and_memory(out_),
                                   {"CAIRN_MPI_ADDRESS=127.0.0.1"});
  ASSERT_TRUE(r.is_object()) << l.log;
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_TRUE(has(l.log, "the memory tier spans 2 hosts")) << l.log;
  ASSERT_EQ(r["restores"].size(), 1u) << r.dump(2);
  EXPECT_EQ(r["restores"][0]["checkpoint"], "checkpoint_000000");
  EXPECT_EQ(r["restores"][0]["tier"], "memory");
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"memory", "memory"}));
  EXPECT_TRUE(has(l.log, "rank 0 from memory, rank 1 from memory")) << l.log;
  EXPECT_EQ(worker_context(out_, 1, 1)["resumed_from_epoch"], 0);
  EXPECT_EQ(r["metrics"]["epoch"], 7);
  expect_all_verify(experiment());
  expect_final_state(experiment());
  EXPECT_TRUE(host_memory_freed(out_, 0));
  EXPECT_TRUE(host_memory_freed(out_, 1));
}

// A host lost with its memory: its ranks restore from the replica the other
// host holds, copied back to it, and the run ends as one that never failed.
TEST_F(MpiLauncher, AHostLostWithItsMemoryRestoresItsRanksFromThePeersReplica) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> env = {"CAIRN_MPI_ADDRESS=127.0.0.1"};
  crash_at_epoch_5(results(), out_, env);
  // Each host holds checkpoint 4 committed, with its own files and the
  // other host's replica.
  for (int host = 0; host < 2; ++host) {
    const fs::path c = host_tier(out_, host) / "checkpoint_000004";
    EXPECT_TRUE(fs::exists(c / ".cairn/manifest.json")) << c;
    EXPECT_EQ(slurp(c / "shard-0.bin"), "rank 0 epoch 4") << c;
    EXPECT_EQ(slurp(c / "shard-1.bin"), "rank 1 epoch 4") << c;
  }
  fs::remove_all(out_ / "hosts" / "cairn-node1");  // host 1 failed, its memory with it
  const auto [r, log] =
      expect_restored_job(results(), out_, experiment(), "checkpoint_000004", "memory", 4);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"memory", "peer"}));
  EXPECT_TRUE(has(log, "goes to host cairn-node1 from host cairn-node0's replica")) << log;
}

// Three hosts in a ring: host 1's replica is on host 2. With host 1 lost,
// its rank's file comes back from host 2; every host is completed (each
// lacked some file: the ranks may read any rank's files).
TEST_F(MpiLauncher, OnThreeHostsALostHostsFilesComeFromTheNextHostInTheRing) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  crash_at_epoch_5(results(), out_, {"CAIRN_MPI_ADDRESS=127.0.0.1"}, 3);
  // Host 1 holds its file and host 0's replica, host 2 its own and host 1's.
  EXPECT_TRUE(fs::exists(host_tier(out_, 1) / "checkpoint_000004/shard-0.bin"));
  EXPECT_FALSE(fs::exists(host_tier(out_, 1) / "checkpoint_000004/shard-2.bin"));
  EXPECT_TRUE(fs::exists(host_tier(out_, 2) / "checkpoint_000004/shard-1.bin"));
  EXPECT_FALSE(fs::exists(host_tier(out_, 2) / "checkpoint_000004/shard-0.bin"));
  fs::remove_all(out_ / "hosts" / "cairn-node1");
  const auto [r, log] = expect_restored_job(results(), out_, experiment(), "checkpoint_000004",
                                            "memory", 4, /*np=*/3);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"peer", "peer", "peer"}));
  EXPECT_TRUE(has(log,
                  "shard-1.bin of checkpoint_000004 goes to host cairn-node1 from host "
                  "cairn-node2's replica"))
      << log;
}

// With MemoryTierConfig::ranks_read_own_files, the manifest maps each file
// to the ranks that wrote it, and a lost host receives only its rank's files
// (its shard and epoch.txt, which every rank wrote) from the next host's
// replica; the other hosts receive nothing, where without the option every
// host is completed (the test above).
TEST_F(MpiLauncher, RanksThatReadOwnFilesMoveOnlyTheLostHostsFilesOnRestore) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  crash_at_epoch_5(results(), out_, {"CAIRN_MPI_ADDRESS=127.0.0.1"}, 3, 1, "hosts_tier_crash_own");
  const Manifest persisted =
      Checkpoint::from_directory((fs::path(experiment()) / "checkpoint_000003").string())
          .manifest();
  EXPECT_EQ(persisted.ranks["files"], nlohmann::json({{"0", {"epoch.txt", "shard-0.bin"}},
                                                      {"1", {"epoch.txt", "shard-1.bin"}},
                                                      {"2", {"epoch.txt", "shard-2.bin"}}}))
      << persisted.ranks.dump();
  fs::remove_all(out_ / "hosts" / "cairn-node1");
  const auto [r, log] = expect_restored_job(results(), out_, experiment(), "checkpoint_000004",
                                            "memory", 4, /*np=*/3);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"memory", "peer", "memory"}));
  for (const std::string file : {"shard-1.bin", "epoch.txt"}) {
    EXPECT_TRUE(has(log, file + " of checkpoint_000004 goes to host cairn-node1 from host "
                                "cairn-node2's replica"))
        << log;
  }
  EXPECT_FALSE(has(log, "goes to host cairn-node0")) << log;
  EXPECT_FALSE(has(log, "goes to host cairn-node2")) << log;
  EXPECT_TRUE(has(log, "(with its ranks' files) from the replicas: 2 file(s)")) << log;
}

// With two replicas on three hosts, each host's files are in the memory of
// both others: two hosts lost at once, the third serves every rank.
TEST_F(MpiLauncher, WithTwoReplicasTwoHostsLostAtOnceRestoreFromTheThirdsMemory) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  crash_at_epoch_5(results(), out_, {"CAIRN_MPI_ADDRESS=127.0.0.1"}, 3, 1, "hosts_tier_crash_r2");
  for (int host = 0; host < 3; ++host) {
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_TRUE(
          fs::exists(host_tier(out_, host) / fmt::format("checkpoint_000004/shard-{}.bin", rank)))
          << "host " << host << ", rank " << rank;
    }
  }
  fs::remove_all(out_ / "hosts" / "cairn-node1");
  fs::remove_all(out_ / "hosts" / "cairn-node2");
  const auto [r, log] = expect_restored_job(results(), out_, experiment(), "checkpoint_000004",
                                            "memory", 4, /*np=*/3);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"memory", "peer", "peer"}));
  EXPECT_TRUE(has(log, "replicated to the memory of the next 2 host(s)")) << log;
}

// Two ranks to a host: each host's leader (its lowest rank) replicates both
// ranks' files, and a lost host's two ranks restore from the replica.
TEST_F(MpiLauncher, TwoRanksToAHostRestoreBothFromThePeersReplicaWhenTheirHostIsLost) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  crash_at_epoch_5(results(), out_, {"CAIRN_MPI_ADDRESS=127.0.0.1"}, 4, /*per_host=*/2);
  fs::remove_all(out_ / "hosts" / "cairn-node1");
  const auto [r, log] = expect_restored_job(results(), out_, experiment(), "checkpoint_000004",
                                            "memory", 4, /*np=*/4, /*per_host=*/2);
  ASSERT_TRUE(r.is_object()) << log;
  EXPECT_EQ(r["restores"][0]["rank_tiers"], nlohmann::json({"memory", "memory", "peer", "peer"}));
}

// The memory bound counts every host: with host 1's memory a tmpfs of 3 MiB,
// the first checkpoint (1 MiB per rank, both on each host) fits, and the
// next ones fall back to persistent storage before anything is written.
TEST_F(MpiLauncher, AHostWithTooLittleMemoryTurnsTheSavesToPersistentStorage) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> wrapper = {
      "unshare",
      "--uts",
      "--mount",
      "sh",
      "-c",
      fmt::format("h=cairn-node$OMPI_COMM_WORLD_RANK && hostname $h && mkdir -p {0}/hosts/$h "
                  "{0}/tiers && if [ $h = cairn-node1 ]; then mount -t tmpfs -o size=3m "
                  "cairn-small {0}/tiers; else mount --bind {0}/hosts/$h {0}/tiers; fi && "
                  "exec \"$@\"",
                  out_.string()),
      "sh"};
  Launch l;
  nlohmann::json r = run_to_result("hosts_tier_small", l, wrapper, {"CAIRN_MPI_ADDRESS=127.0.0.1"});
  ASSERT_TRUE(r.is_object()) << l.log;
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_TRUE(has(l.log, "cannot hold the next checkpoint")) << l.log;
  EXPECT_TRUE(has(l.log, "saving to persistent storage only")) << l.log;
  EXPECT_EQ(r["metrics"]["epoch"], 7);
  expect_all_verify(experiment());
  const ExperimentListing listing = read_experiment(experiment());
  ASSERT_FALSE(listing.checkpoints.empty());
  EXPECT_EQ(listing.checkpoints.back().checkpoint.storage().get("epoch.txt"), "7");
  EXPECT_TRUE(host_memory_freed(out_, 0));
}

// A host and its replica holder lost (with two hosts: both): the run
// restores from the newest checkpoint persisted before the crash.
TEST_F(MpiLauncher, AHostAndItsReplicaHolderLostRestoreFromPersistentStorage) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> env = {"CAIRN_MPI_ADDRESS=127.0.0.1"};
  crash_at_epoch_5(results(), out_, env);
  // Both hosts lost their memory; here `cairn gc --memory-tier` frees what
  // the dead job left on each (no process holds either copy's lock).
  for (int host = 0; host < 2; ++host) {
    const GcReport gc =
        collect_memory_tiers((out_ / "hosts" / fmt::format("cairn-node{}", host)).string());
    EXPECT_EQ(gc.removed.size(), 1u) << "host " << host;
    EXPECT_TRUE(gc.skipped.empty()) << "host " << host;
    EXPECT_TRUE(host_memory_freed(out_, host));
  }
  // Every 2nd checkpoint is persisted, in the background; the crash came
  // once 3 was.
  ExperimentListing persisted = read_experiment(experiment());
  ASSERT_FALSE(persisted.checkpoints.empty());
  const std::string newest = persisted.checkpoints.back().name;
  EXPECT_EQ(newest, "checkpoint_000003");
  const int epoch = std::stoi(persisted.checkpoints.back().checkpoint.storage().get("epoch.txt"));
  expect_restored_job(results(), out_, experiment(), newest, "persistent", epoch);
}

// Every committed copy of a checkpoint in host `host`'s memory holds every
// file of its manifest, whole (with two hosts each holds its own files and
// the other's replica); returns the highest index committed there.
std::optional<uint64_t> expect_host_copies_whole(const fs::path& out, int host) {
  std::optional<uint64_t> newest;
  const fs::path root = host_tier(out, host);
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return newest;
  for (const auto& d : fs::directory_iterator(root)) {
    const auto index = parse_checkpoint_name(d.path().filename().string());
    if (!index || !fs::exists(d.path() / ".cairn/manifest.json")) continue;
    const Checkpoint c = Checkpoint::from_directory(d.path().string());
    const auto problems = c.verify();
    EXPECT_TRUE(problems.empty()) << d.path() << " on host " << host << ": "
                                  << (problems.empty()
                                          ? ""
                                          : problems[0].path + " " + problems[0].reason);
    newest = std::max(newest.value_or(0), *index);
  }
  return newest;
}

// SIGKILL at random moments of a run whose every step replicates 1 MiB per
// rank to the other host and persists every 2nd checkpoint in the
// background: after every kill, no tier shows a partial checkpoint (each
// host's committed copies and the persisted ones verify), nothing committed
// is lost, and the next run restores from the newest. CAIRN_HOSTS_KILLS sets
// the number of kills (6 here, whatever the other crash tests'
// CAIRN_CRASH_ITERATIONS; 500 by hand: docs/memory-tier.md).
TEST_F(MpiLauncher, SigkillsDuringReplicationAndPersistenceLeaveNoPartialCheckpointInAnyTier) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const char* n = std::getenv("CAIRN_HOSTS_KILLS");
  const int kills = n ? std::atoi(n) : 6;
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  std::mt19937 rng(seed);
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const std::vector<std::string> env = {"CAIRN_MPI_ADDRESS=127.0.0.1"};
  const std::string exp = experiment();
  uint64_t survived = 0;  // the newest index committed in either tier after a kill
  bool any = false;
  for (int i = 0; i < kills; ++i) {
    for (int rank = 0; rank < 2; ++rank) fs::remove(out_ / fmt::format("pid-{}", rank));
    Started s = start_mpirun("hosts_tier_soak", results(), out_, own_host_and_memory(out_), env);
    const auto limit = std::chrono::steady_clock::now() + 60s;
    while (!(fs::exists(out_ / "pid-0") && fs::exists(out_ / "pid-1")) &&
           std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(fs::exists(out_ / "pid-0") && fs::exists(out_ / "pid-1"))
        << slurp(out_ / "mpirun.log");
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 2500)(rng)));
    for (int rank = 0; rank < 2; ++rank) {
      ::kill(std::stoi(slurp(out_ / fmt::format("pid-{}", rank))), SIGKILL);  // ignore-error: ended
    }
    finish(s);
    std::optional<uint64_t> newest;
    for (int host = 0; host < 2; ++host) {
      if (auto h = expect_host_copies_whole(out_, host)) newest = std::max(newest.value_or(0), *h);
    }
    if (fs::exists(fs::path(exp) / "trainer_state.json")) {
      expect_all_verify(exp);
      const ExperimentListing persisted = read_experiment(exp);
      if (!persisted.checkpoints.empty()) {
        newest = std::max(newest.value_or(0), persisted.checkpoints.back().index);
      }
    }
    if (any) {
      ASSERT_TRUE(newest.has_value()) << "kill " << i << " lost every checkpoint";
      EXPECT_GE(*newest, survived) << "kill " << i << " lost a committed checkpoint";
    }
    if (newest) {
      survived = *newest;
      any = true;
    }
    if (::testing::Test::HasFailure()) return;
  }
  // A last run, not killed, restores from the newest and ends as one that
  // never failed.
  Launch l = mpirun("hosts_tier_soak_end", results(), out_, own_host_and_memory(out_), env);
  EXPECT_EQ(l.exit_status, 0) << l.log;
  nlohmann::json r = same_result_everywhere(out_, l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  const nlohmann::json resumed = worker_context(out_, 0, 0)["resumed_from_epoch"];
  const int last = (resumed.is_number() ? resumed.get<int>() : -1) + 20;
  EXPECT_EQ(r["metrics"]["epoch"], last) << l.log;
  const ExperimentListing end = read_experiment(exp);
  ASSERT_FALSE(end.checkpoints.empty());
  EXPECT_EQ(end.checkpoints.back().checkpoint.storage().get("epoch.txt"), std::to_string(last));
  if (any) {
    ASSERT_FALSE(r["restores"].empty()) << r.dump(2);
    const auto first = parse_checkpoint_name(r["restores"][0]["checkpoint"].get<std::string>());
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(*first, survived) << r.dump(2);
  }
  expect_all_verify(exp);
  EXPECT_TRUE(host_memory_freed(out_, 0));
  EXPECT_TRUE(host_memory_freed(out_, 1));
}

// S3 is storage every node reaches: the same run on s3://, first on one
// host, then with every process on its own host with node-local scratch.
TEST_F(MpiLauncher, TwoProcessesTrainOnS3Storage) {
  const std::string root = testing::S3Server::instance().fresh_uri("mpi");
  Launch l = mpirun("basic", root, out_);
  EXPECT_EQ(l.exit_status, 0) << l.log;
  nlohmann::json r = same_result_everywhere(out_, l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  EXPECT_EQ(r["path"], root + "/mpi_exp");
  EXPECT_EQ(expect_all_verify(root + "/mpi_exp"), 2u);
}

TEST_F(MpiLauncher, RanksOnDistinctHostsWithNodeLocalMountsTrainOnS3) {
  if (auto why = root_only(); !why.empty()) GTEST_SKIP() << why;
  const std::string root = testing::S3Server::instance().fresh_uri("mpi-nodes");
  const fs::path local = dir_ / "node-local";
  fs::create_directories(local);
  const std::vector<std::string> wrapper = own_host_and_local_mount(local);
  // In the sanitizer build, LeakSanitizer's exit-time tracer itself crashed
  // now and then in these processes (its own SIGSEGV, no leak report), which
  // run in namespaces of their own while S3 client threads wind down; the
  // leak check of MPI processes is left to the other MPI tests.
  Launch l = mpirun(
      "basic", root, out_, wrapper,
      {"CAIRN_MPI_ADDRESS=127.0.0.1", "TMPDIR=" + local.string(), "LSAN_OPTIONS=detect_leaks=0"});
  EXPECT_EQ(l.exit_status, 0) << l.log;
  nlohmann::json r = same_result_everywhere(out_, l);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["error"].is_null()) << r.dump(2);
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json c = worker_context(out_, rank, 0);
    ASSERT_TRUE(c.is_object()) << l.log;
    EXPECT_EQ(c["node_rank"], rank);
  }
  EXPECT_EQ(expect_all_verify(root + "/mpi_exp"), 2u);
}

}  // namespace
}  // namespace cairn
