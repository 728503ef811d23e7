// SIGKILL on S3, aimed at the small metadata writes: a CheckpointManager
// saving to s3:// (checkpoints of small files: the manifest and history PUTs
// are a large share of its requests) and `cairn cp` of an experiment to
// s3://, killed at random moments against moto (and a sample against
// radosgw). After every kill, without anyone's
// help:
//   - every checkpoint listed as committed verifies and loads (its files are
//     byte for byte what was saved) and its metadata is whole (the worker
//     updates it after some commits);
//   - the next CheckpointManager open succeeds, and what it holds verifies;
//   - a `cairn cp` run again to the same destination finishes (it never
//     refuses what an interrupted copy left).
// CAIRN_S3_KILL_ITERATIONS sets the number of kills (default 200).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "checkpoint/crash_pattern.h"
#include "support/child.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

using testing::S3Server;
using testing::TempDir;

constexpr int kNumToKeep = 2;

CheckpointConfig crash_config() {
  // As the crash worker configures its manager.
  CheckpointConfig c;
  c.num_to_keep = kNumToKeep;
  c.checkpoint_score_attribute = "score";
  return c;
}

ManagerOptions quiet() {
  ManagerOptions o;
  o.warn = [](const std::string&) {};
  return o;
}

// Starts `argv` with its stdout on a pipe (the crash worker writes 'r' there
// once its experiment is open); returns its pid.
pid_t spawn(const std::vector<std::string>& argv, int& out_fd) {
  return testing::spawn_with_stdout_pipe(argv, out_fd);
}

bool wait_ready(int fd) { return testing::wait_byte(fd, 30000); }

// The crash worker's checkpoint `r` loads: each file is exactly what the
// worker wrote for the seed in its metrics.
void expect_loads_as_saved(const Checkpoint& cp, const nlohmann::json& metrics) {
  const Manifest m = cp.manifest();
  ASSERT_TRUE(metrics.contains("seed")) << cp.uri();
  const uint64_t seed = metrics.at("seed").get<uint64_t>();
  for (const auto& f : m.files) {
    const int file = std::stoi(f.path.substr(1));  // "f<n>.bin"
    EXPECT_EQ(cp.storage().get(f.path), testing::crash_pattern(seed, file, f.size))
        << cp.storage().uri_of(f.path);
  }
}

// Metadata objects a kill left empty under `uri` (manifests, the history's
// snapshot and log records, the lease): what the test is about, counted to
// show how often the kills produced it.
int empty_metadata(const std::string& uri) {
  int n = 0;
  for (const auto& o : open_storage(uri)->list("")) {
    const std::string_view k = o.key;
    if (o.size == 0 && (k.ends_with(kManifestKey) || k.ends_with("checkpoint_manager.json") ||
                        k.ends_with(".rec") || k.ends_with(".cairn.lock"))) {
      ++n;
    }
  }
  return n;
}

std::set<uint64_t> indices(const std::vector<CheckpointRecord>& records) {
  std::set<uint64_t> out;
  for (const auto& r : records) out.insert(r.index);
  return out;
}

// What a reader sees of the experiment the crash worker writes, then what
// the next manager opening it holds.
void check_worker_experiment(const std::string& exp) {
  ExperimentListing listing = read_experiment(exp);
  for (const auto& r : listing.checkpoints) {
    auto problems = r.checkpoint.verify();
    EXPECT_TRUE(problems.empty()) << r.checkpoint.uri() << ": " << problems[0].path << " "
                                  << problems[0].reason;
    expect_loads_as_saved(r.checkpoint, r.checkpoint.manifest().metrics);
    if (auto problem = testing::crash_metadata_problem(r.checkpoint)) ADD_FAILURE() << *problem;
  }
  const std::set<uint64_t> listed = indices(listing.checkpoints);
  {
    CheckpointManager m(exp, crash_config(), quiet());
    // Everything it holds was listed, so it verified and loaded above.
    for (uint64_t i : indices(m.history())) EXPECT_TRUE(listed.count(i)) << checkpoint_name(i);
  }
  // The open removed what the kill left: no leftover, torn or not.
  EXPECT_TRUE(read_experiment(exp).uncommitted.empty());
}

// A copy's destination: every checkpoint listed as committed is the source's
// (same manifest, verified), and a manager opens it.
void check_copy(const std::string& src, const std::string& dst) {
  auto from = open_storage(src);
  ExperimentListing listing = read_experiment(dst);
  for (const auto& r : listing.checkpoints) {
    EXPECT_TRUE(r.checkpoint.verify().empty()) << r.checkpoint.uri();
    EXPECT_EQ(r.checkpoint.storage().get(kManifestKey), from->get(join_key(r.name, kManifestKey)))
        << r.checkpoint.uri();
  }
  const std::set<uint64_t> listed = indices(listing.checkpoints);
  CheckpointManager m(dst, {}, quiet());
  for (uint64_t i : indices(m.history())) EXPECT_TRUE(listed.count(i)) << checkpoint_name(i);
}

// A local experiment for `cairn cp` to copy: a few checkpoints of a small
// file and one that takes the multipart path (256 KiB parts in the tests).
std::string make_copy_source(const TempDir& dir) {
  const std::string src = (dir / "source").string();
  CheckpointManager m(src, {}, quiet());
  for (uint64_t i = 0; i < 3; ++i) {
    auto staged = Checkpoint::from_directory((dir / fmt::format("stage-{}", i)).string());
    staged.storage().put("f0.bin", testing::crash_pattern(i, 0, 3000 + i));
    staged.storage().put("f1.bin", testing::crash_pattern(i, 1, i == 1 ? 300'000 : 100));
    m.register_checkpoint({{"seed", i}}, staged);
  }
  return src;
}

TEST(S3Kills, KilledSavesAndCopiesNeverLeaveMetadataThatNeedsAPerson) {
  const char* env = std::getenv("CAIRN_S3_KILL_ITERATIONS");
  // The long loop runs against moto, a bounded sample against radosgw.
  const bool radosgw = S3Server::instance().kind() == S3Server::Kind::kRadosgw;
  const int kills_wanted = env ? std::atoi(env) : radosgw ? 20 : 200;
  const std::string root = S3Server::instance().fresh_uri("kills");
  const std::string exp = root + "/exp";
  TempDir dir;
  const std::string copy_source = make_copy_source(dir);
  std::mt19937_64 rng(20261126);

  // How long a whole copy takes here, to aim the kills inside it.
  int copies = 0;
  std::string copy_dst = fmt::format("{}/copy-{}", root, copies);
  auto started = std::chrono::steady_clock::now();
  int fd = -1;
  pid_t pid = spawn({CAIRN_CLI_PATH, "cp", "--no-progress", copy_source, copy_dst}, fd);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(fd);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  uint64_t copy_us = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count();
  check_copy(copy_source, copy_dst);
  copy_dst = fmt::format("{}/copy-{}", root, ++copies);

  int kills = 0, worker_kills = 0, copy_kills = 0, copies_finished = 0, empty_left = 0;
  // Bounded: a copy that finishes before its kill is no kill, and is rare.
  for (int round = 0; kills < kills_wanted && round < 3 * kills_wanted; ++round) {
    SCOPED_TRACE(fmt::format("round {} ({} kills)", round, kills));
    const bool copy_round = round % 2 == 1;
    if (copy_round) {
      pid = spawn({CAIRN_CLI_PATH, "cp", "--no-progress", copy_source, copy_dst}, fd);
      ASSERT_GT(pid, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (copy_us + copy_us / 4)));
    } else {
      pid = spawn({CRASH_WORKER, exp, std::to_string(rng()), std::to_string(kNumToKeep)}, fd);
      ASSERT_GT(pid, 0);
      ASSERT_TRUE(wait_ready(fd)) << "the worker never opened the experiment";
      // Small checkpoints take a few requests each: kills land all over the
      // save, its manifest, its history record and retention.
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    }
    kill(pid, SIGKILL);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    close(fd);
    if (WIFSIGNALED(status)) {
      ++kills;
      ++(copy_round ? copy_kills : worker_kills);
    } else {
      // A copy that finished before its kill: run again to the same
      // destination, it must have succeeded, whatever the kills before left.
      ASSERT_TRUE(copy_round) << "the worker exited by itself, status " << status;
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "cairn cp to " << copy_dst << " failed after earlier kills: status " << status;
      ++copies_finished;
      // The first copy (cold) overstated how long one takes: aim shorter.
      copy_us = std::max<uint64_t>(copy_us * 3 / 4, 1000);
    }
    empty_left += empty_metadata(copy_round ? copy_dst : exp);
    if (copy_round) {
      check_copy(copy_source, copy_dst);
      if (!WIFSIGNALED(status)) copy_dst = fmt::format("{}/copy-{}", root, ++copies);
    } else {
      check_worker_experiment(exp);
    }
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
  std::printf(
      "%d kills (%d of the saver, %d of cp; %d copies finished); %d empty metadata objects "
      "found after them\n",
      kills, worker_kills, copy_kills, copies_finished, empty_left);
  EXPECT_GE(kills, kills_wanted);
  EXPECT_GT(worker_kills, 0);
  EXPECT_GT(copy_kills, 0);

  // The last copy's destination, however its copies ended: one more run
  // finishes it.
  pid = spawn({CAIRN_CLI_PATH, "cp", "--no-progress", copy_source, copy_dst}, fd);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  check_copy(copy_source, copy_dst);
  EXPECT_EQ(read_experiment(copy_dst).checkpoints.size(), 3u);
}

}  // namespace
}  // namespace cairn
