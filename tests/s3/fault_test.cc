// S3 under faults: a fault-injecting proxy (tests/support/s3_fault_proxy.py)
// between Cairn and the server, and SIGKILL in the middle of uploads and
// retention deletes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state_manager.h"
#include "cairn/train.h"
#include "support/env.h"
#include "support/errors.h"
#include "support/lease_race.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::FaultProxy;
using testing::S3Server;
using testing::ScopedEnv;
using testing::TempDir;

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A checkpoint folder whose model takes the multipart path (256 KiB parts).
fs::path make_source(const fs::path& dir, int i) {
  fs::path d = dir / fmt::format("src-{}", i);
  write_file(d / "model.bin", pattern(700'000 + i, i));
  write_file(d / "meta/step.txt", std::to_string(i));
  return d;
}

void epoch_loop(const nlohmann::json& config) {
  const auto& ctx = train::get_context();
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    start = std::stoi(ckpt->storage().get("epoch.txt")) + 1;
  }
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("shard-{}.bin", ctx.world_rank),
               pattern(300'000, ctx.world_rank + epoch));
    if (ctx.world_rank == 0) write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()));
  }
}

class S3Faults : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("CAIRN_CACHE_DIR", (dir.path() / "views").c_str(), 1); }
  void TearDown() override { ::unsetenv("CAIRN_CACHE_DIR"); }

  TempDir dir;
  FaultProxy proxy;
  std::string root = S3Server::instance().fresh_uri("faults");
};

TEST_F(S3Faults, AtTenPercentFaultsSavesLoadsRetentionAndAFitStillCommitEverything) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL_S3", proxy.endpoint());
  ScopedEnv attempts("CAIRN_S3_MAX_ATTEMPTS", "10");
  proxy.configure(R"({"rate": 0.1, "seed": 7, "delay_ms": 30,
    "faults": ["500", "503", "slowdown", "reset", "reset-request", "lost-reply", "delay"]})");

  CheckpointConfig config;
  config.num_to_keep = 2;
  {
    CheckpointManager m(root + "/exp", config);
    for (int i = 0; i < 6; ++i) {
      m.register_checkpoint({{"i", i}},
                            Checkpoint::from_directory(make_source(dir.path(), i).string()));
    }
  }
  CheckpointManager m(root + "/exp", config);
  auto history = m.history();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history.back().name, "checkpoint_000005");
  for (const auto& r : history) EXPECT_TRUE(r.checkpoint.verify().empty()) << r.name;
  fs::path copy = history.back().checkpoint.to_directory(dir.path() / "copy");
  std::ifstream in(copy / "model.bin", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), pattern(700'005, 5));
  EXPECT_TRUE(open_storage(root + "/exp")->list("checkpoint_000001").empty());

  RunConfig run;
  run.name = "fit";
  run.storage_path = root;
  Result r = Trainer(epoch_loop, {{"epochs", 3}}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_TRUE(r.checkpoint);
  EXPECT_TRUE(r.checkpoint->verify().empty());
  EXPECT_EQ(read_experiment(root + "/fit").checkpoints.size(), 3u);

  auto stats = nlohmann::json::parse(proxy.stats());
  int injected = 0;
  for (const auto& [kind, n] : stats["faults"].items()) injected += n.get<int>();
  EXPECT_GT(injected, 10) << stats.dump();
}

TEST_F(S3Faults, WhenEveryRequestFailsTheErrorIsClearAndNothingPartialIsVisible) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL_S3", proxy.endpoint());
  ScopedEnv attempts("CAIRN_S3_MAX_ATTEMPTS", "3");
  CheckpointManager m(root + "/exp", {});
  m.register_checkpoint({{"i", 0}},
                        Checkpoint::from_directory(make_source(dir.path(), 0).string()));
  // Every write fails from now on; reads still work, so what is visible can
  // be checked through the same proxy.
  proxy.configure(R"({"rate": 1.0, "faults": ["503", "slowdown", "reset-request"],
    "methods": ["PUT", "POST"]})");
  try {
    m.register_checkpoint({{"i", 1}},
                          Checkpoint::from_directory(make_source(dir.path(), 1).string()));
    FAIL() << "a save succeeded with every write failing";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_TRUE(e.retryable()) << what;
    EXPECT_NE(what.find(root + "/exp/checkpoint_000001"), std::string::npos) << what;
    EXPECT_NE(what.find("3 attempts"), std::string::npos) << what;
  }
  ExperimentListing listing = read_experiment(root + "/exp");
  ASSERT_EQ(listing.checkpoints.size(), 1u);
  EXPECT_EQ(listing.checkpoints[0].name, "checkpoint_000000");
  EXPECT_FALSE(Checkpoint::from_directory(root + "/exp/checkpoint_000001").is_committed());
  EXPECT_TRUE(listing.checkpoints[0].checkpoint.verify().empty());
}

// A server that refuses conditional writes (acted out by the proxy, which
// answers 501 to a write with If-Match or If-None-Match) is detected, and
// leases are taken by listing instead: a fresh lease and a lapsed one are
// taken, and of several racing takers of a lapsed lease at most one holds it.
TEST_F(S3Faults, AServerRefusingConditionalWritesStillGivesEachLeaseOneHolder) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL_S3", proxy.endpoint());
  proxy.configure(R"({"refuse_conditional_writes": true})");
  auto s = open_storage(root);
  {
    auto lock = s->try_lock("exp/.cairn.lock");
    EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
    EXPECT_EQ(testing::code_of([&] { open_storage(root)->try_lock("exp/.cairn.lock"); }),
              ErrorCode::kLocked);
  }
  EXPECT_FALSE(s->exists("exp/.cairn.lock"));
  s->put("exp/.cairn.lock", testing::foreign_lease(0));
  EXPECT_NO_THROW(open_storage(root)->try_lock("exp/.cairn.lock"));
  // Reads slowed at random widen the windows between a taker's write and
  // its reads: a write-and-read-back protocol lets two takers hold the lease
  // in about a third of such rounds.
  proxy.configure(R"({"rate": 0.5, "faults": ["delay"], "delay_ms": 40,
    "methods": ["GET", "HEAD"], "seed": 3})");
  int taken = 0;
  for (int round = 0; round < 10; ++round) {
    int holders = testing::race_for_lapsed_lease(root, fmt::format("race{}/.cairn.lock", round), 6);
    EXPECT_LE(holders, 1) << "round " << round;
    taken += holders;
  }
  EXPECT_GE(taken, 1);
  EXPECT_GT(nlohmann::json::parse(proxy.stats())["refused_conditional"].get<int>(), 0);
  // Writes slowed at random (the takers' objects and the lease's own PUT):
  // a write landing late must not let a second taker hold the lease.
  proxy.configure(R"({"refuse_conditional_writes": true, "rate": 0.5, "faults": ["delay"],
    "delay_ms": 60, "methods": ["PUT"], "seed": 5})");
  taken = 0;
  for (int round = 0; round < 10; ++round) {
    int holders =
        testing::race_for_lapsed_lease(root, fmt::format("slow-writes{}/.cairn.lock", round), 6);
    EXPECT_LE(holders, 1) << "round " << round;
    taken += holders;
  }
  EXPECT_GE(taken, 1);
  EXPECT_GT(nlohmann::json::parse(proxy.stats())["faults"]["delay"].get<int>(), 0);
  proxy.configure(R"({"rate": 0})");
  // A manager and its retention work the same behind such a server.
  CheckpointConfig config;
  config.num_to_keep = 1;
  CheckpointManager m(root + "/managed", config);
  for (int i = 0; i < 2; ++i) {
    m.register_checkpoint({{"i", i}},
                          Checkpoint::from_directory(make_source(dir.path(), i).string()));
  }
  EXPECT_EQ(m.history().size(), 1u);
}

// Without conditional writes a taker whose write of the lease is answered
// more than half a lifetime after it was sent cannot tell whether it landed
// after a later taker took the lease (that one would have seen its object
// as a dead taker's): it does not hand the lock out, and leaves the lease it
// wrote to lapse rather than delete what may be another's.
TEST_F(S3Faults, WithoutConditionalWritesATakeoverAnsweredPastHalfALifetimeIsNotHandedOut) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL_S3", proxy.endpoint());
  // Only the lease's own PUT is slowed (the tests' lease lives 6 s), not the
  // taker's object beside it, whose key ends in a token.
  proxy.configure(R"({"refuse_conditional_writes": true, "rate": 1, "faults": ["delay"],
    "delay_ms": 4000, "methods": ["PUT"], "budget": 1, "path_pattern": "/slow/\\.cairn\\.lock$"})");
  auto s = open_storage(root);
  std::string message =
      testing::error_message_of([&] { s->try_lock("slow/.cairn.lock"); }, ErrorCode::kLocked);
  EXPECT_NE(message.find("taking it over took longer than half its lifetime"), std::string::npos)
      << message;
  EXPECT_EQ(nlohmann::json::parse(proxy.stats())["faults"]["delay"].get<int>(), 1);
  // The lease written late stays until it lapses.
  EXPECT_TRUE(s->exists("slow/.cairn.lock"));
  EXPECT_EQ(testing::code_of([&] { open_storage(root)->try_lock("slow/.cairn.lock"); }),
            ErrorCode::kLocked);
}

// A conditional write of the lease that lands but whose answer is lost is
// retried, and the retry fails its own condition (the lease now exists, or
// has another ETag): that is this writer's lease, not another's.
TEST_F(S3Faults, ALeaseWriteWhoseAnswerIsLostIsStillTakenAndRenewed) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL_S3", proxy.endpoint());
  const std::string lost_lease_put = R"({"rate": 1, "faults": ["lost-reply"], "methods": ["PUT"],
    "budget": 1, "path_pattern": "/exp/\\.cairn\\.lock$"})";
  proxy.configure(lost_lease_put);
  auto s = open_storage(root);
  auto lock = s->try_lock("exp/.cairn.lock");
  EXPECT_EQ(nlohmann::json::parse(proxy.stats())["faults"]["lost-reply"].get<int>(), 1);
  // The heartbeat renews every third of the tests' 6 s lifetime: lose the
  // answer to one renewal, then write past half a lifetime, which confirms
  // the lease first.
  proxy.configure(lost_lease_put);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (nlohmann::json::parse(proxy.stats())["faults"]["lost-reply"].get<int>() < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(nlohmann::json::parse(proxy.stats())["faults"]["lost-reply"].get<int>(), 2);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  EXPECT_NO_THROW(s->put("exp/after.bin", "still the holder"));
  EXPECT_EQ(testing::code_of([&] { open_storage(root)->try_lock("exp/.cairn.lock"); }),
            ErrorCode::kLocked);
}

// Kills a process saving checkpoints (each through a multipart upload, with
// retention deleting the old ones) at random moments; after each kill,
// reopening the experiment finds every committed checkpoint whole and
// cleans up what the killed process left.
TEST_F(S3Faults, SigkillDuringUploadsAndRetentionDeletesLosesNothingAndLeavesNothing) {
  const std::string exp = root + "/crash";
  CheckpointConfig config;
  config.num_to_keep = 2;
  std::mt19937 rng(42);
  int kills = 0;
  // The long loop runs against moto, a sample against radosgw (CI time);
  // CAIRN_S3_KILL_ROUNDS sets either.
  int rounds = S3Server::instance().kind() == S3Server::Kind::kRadosgw ? 4 : 12;
  if (const char* n = std::getenv("CAIRN_S3_KILL_ROUNDS")) rounds = std::max(1, std::atoi(n));
  for (int round = 0; round < rounds; ++round) {
    pid_t pid = ::fork();
    if (pid == 0) {
      CheckpointManager m(exp, config);
      for (int i = 0;; ++i) {
        m.register_checkpoint({{"i", i}},
                              Checkpoint::from_directory(make_source(dir.path(), i % 3).string()));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 400));
    if (::kill(pid, SIGKILL) == 0) ++kills;
    ::waitpid(pid, nullptr, 0);
    // Should a server keep a killed PUT's partial body (S3 never does), a
    // kill in the middle of a history PUT could leave the history torn. The
    // manifests stay the truth: the next open rebuilds it from them by itself.
    // What the killed process committed is whole, and nothing partial shows.
    CheckpointManager m(exp, config);
    for (const auto& r : m.history()) {
      auto problems = r.checkpoint.verify();
      EXPECT_TRUE(problems.empty()) << "round " << round << ": " << r.name << " "
                                    << (problems.empty() ? "" : problems[0].reason);
    }
    // Opening removed the unfinished uploads and handed the leftover folders
    // to the deleter (S3 has no renames to move them aside), whose work the
    // manager's destructor would also wait for: no folder without a
    // manifest once it is done.
    m.wait_for_deletes();
    auto storage = open_storage(exp);
    EXPECT_TRUE(storage->list_incomplete("").empty()) << "round " << round;
    std::set<std::string> folders;
    for (const auto& o : storage->list("")) {
      // Checkpoint folders only: checkpoint_manager.log/ holds the history's log.
      std::string top = o.key.substr(0, o.key.find('/'));
      if (o.key.find('/') != std::string::npos && parse_checkpoint_name(top)) folders.insert(top);
    }
    for (const auto& f : folders) {
      if (Checkpoint(storage->child(f)).is_committed()) continue;
      std::string keys;  // what is there, for the report
      for (const auto& o : storage->list(f)) keys += " " + o.key;
      ADD_FAILURE() << "round " << round << ": " << f
                    << " holds no manifest after the open:" << keys;
    }
  }
  EXPECT_EQ(kills, rounds);
}

}  // namespace
}  // namespace cairn
