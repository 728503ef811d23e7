// Preemption with real SIGTERM: to the driver (this test process, which runs
// fit()) or to a worker. Every rank hears the notice at the same report, an
// emergency checkpoint is committed, the group stops, and the run resumes
// from that checkpoint with Trainer::restore.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/control/group.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::expect_all_verify;
using testing::expect_no_children;
using testing::TempDir;

RunConfig run_in(const TempDir& dir, double grace_s = 60.0) {
  RunConfig r;
  r.name = "exp";
  r.storage_path = dir.str();
  r.failure_config.max_failures = 3;  // a preemption must not be retried
  r.failure_config.preemption_grace_s = grace_s;
  return r;
}

// Reports every step; checkpoints only when asked to by should_checkpoint()
// (then returns) or at the last step. config: steps, step_ms, and
// sigterm_rank/sigterm_step to SIGTERM one worker itself.
void preemptible_loop(const nlohmann::json& config) {
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) start = ckpt->to_dict().at("step").get<int>() + 1;
  const int rank = train::get_context().world_rank;
  const int steps = config.at("steps").get<int>();
  for (int step = start; step < steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.value("step_ms", 20)));
    if (rank == config.value("sigterm_rank", -1) && step == config.value("sigterm_step", -1) &&
        train::get_context().attempt == 0 && start == 0) {
      ::kill(::getpid(), SIGTERM);  // as a platform signalling this process would
    }
    if (train::should_checkpoint() || step == steps - 1) {
      train::report(
          {{"step", step}, {"rank", rank}},
          Checkpoint::from_dict({{"step", step}, {"preempted", train::should_checkpoint()}}));
      if (train::should_checkpoint()) return;
    } else {
      train::report({{"step", step}});
    }
  }
}

// Sends SIGTERM to this process once the experiment has reported `reports`
// rounds (bounded wait; the driver's handler is installed by then).
std::thread sigterm_driver_after_first_reports(const fs::path& experiment) {
  return std::thread([experiment] {
    for (int i = 0; i < 600; ++i) {  // at most 30 s
      if (fs::exists(experiment / "trainer_state.json")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few steps in
    ::kill(::getpid(), SIGTERM);
  });
}

TEST(Preemption, SigtermToTheDriverEndsWithAnEmergencyCheckpointAndTheRunResumes) {
  TempDir dir;
  const nlohmann::json config = {{"steps", 100000}, {"step_ms", 20}};
  std::thread signaller = sigterm_driver_after_first_reports(dir.path() / "exp");
  Trainer t(preemptible_loop, config, ScalingConfig{.num_workers = 2}, run_in(dir));
  Result r = t.fit();
  signaller.join();
  ASSERT_TRUE(r.preempted) << r.error.value_or("no error");
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("preempted"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("Trainer::restore"), std::string::npos) << *r.error;
  ASSERT_TRUE(r.checkpoint);
  const nlohmann::json saved = r.checkpoint->to_dict();
  EXPECT_TRUE(saved.at("preempted").get<bool>());
  const int step = saved.at("step").get<int>();
  EXPECT_GT(step, 0);
  EXPECT_EQ(expect_all_verify(r.path), 1u);  // only the emergency checkpoint
  EXPECT_TRUE(Result::from_path(r.path).preempted);
  expect_no_children();

  // The next job continues from the emergency checkpoint to the end.
  Trainer again = Trainer::restore(r.path, preemptible_loop,
                                   nlohmann::json{{"steps", step + 5}, {"step_ms", 1}});
  Result done = again.fit();
  ASSERT_FALSE(done.error) << *done.error;
  EXPECT_FALSE(done.preempted);
  EXPECT_EQ(done.checkpoint->to_dict().at("step"), step + 4);
  EXPECT_EQ(done.metrics.at("step"), step + 4);
  expect_no_children();
}

// SIGTERM and a failure at once (mpirun signals the other processes after
// one of them died): the driver does not start a group only to stop it; the
// run ends preempted at once, to be restored from the newest checkpoint.
void sigterm_the_driver_then_fail(const nlohmann::json& config) {
  const int rank = train::get_context().world_rank;
  if (auto ckpt = train::get_checkpoint()) {
    throw std::runtime_error("restarted after a preemption notice");
  }
  train::report({{"step", 0}}, Checkpoint::from_dict({{"step", 0}}));
  if (rank == 0) {
    ::kill(config.at("driver").get<pid_t>(), SIGTERM);
    throw std::runtime_error("lost with its node");
  }
  for (int i = 0; i < 6000; ++i) {  // until the group is stopped (at most 60 s)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(Preemption, ASigtermThatComesWithAFailureEndsTheRunWithoutARestart) {
  TempDir dir;
  Trainer t(sigterm_the_driver_then_fail, {{"driver", ::getpid()}}, ScalingConfig{.num_workers = 2},
            run_in(dir));
  Result r = t.fit();
  ASSERT_TRUE(r.preempted) << r.error.value_or("no error");
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("came while the group failed"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("lost with its node"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("Trainer::restore"), std::string::npos) << *r.error;
  EXPECT_TRUE(r.restores.empty()) << "a group was started again";
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->to_dict().at("step"), 0);
  expect_no_children();
}

TEST(Preemption, AWorkersOwnSigtermReachesEveryRankAtTheSameReport) {
  TempDir dir;
  const nlohmann::json config = {
      {"steps", 100000}, {"step_ms", 5}, {"sigterm_rank", 1}, {"sigterm_step", 3}};
  Trainer t(preemptible_loop, config, ScalingConfig{.num_workers = 3}, run_in(dir));
  Result r = t.fit();
  ASSERT_TRUE(r.preempted) << r.error.value_or("no error");
  ASSERT_TRUE(r.checkpoint);
  // Rank 1 reports its SIGTERM with step 3's report; every rank hears it in
  // that report's release and checkpoints at step 4.
  EXPECT_EQ(r.checkpoint->to_dict().at("step"), 4);
  EXPECT_NE(r.error->find("emergency checkpoint"), std::string::npos) << *r.error;
  expect_no_children();
}

// Asynchronous reports: each step waits until its upload thread has received
// the release of every report so far, then asks should_checkpoint() again.
// The notice may arrive at any moment in between, on the upload thread; the
// answer must not change there, only at a report() call, and at the same one
// on every rank, so all ranks save their emergency checkpoint at one step.
void async_preemptible_loop(const nlohmann::json&) {
  const int rank = train::get_context().world_rank;
  int reports = 0;
  for (int step = 0; step < 100000; ++step) {
    if (rank == 1 && step == 3) ::raise(SIGTERM);  // reported with this step's report
    const bool before = train::should_checkpoint();
    for (int i = 0; i < 6000 && train_internal::released_round() < reports; ++i) {  // <= 60 s
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (train_internal::released_round() < reports) {
      throw Error(ErrorCode::kTimeout,
                  fmt::format("rank {}: report #{} not released", rank, reports));
    }
    if (train::should_checkpoint() != before) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("rank {}: should_checkpoint() changed between two reports, at "
                              "step {}",
                              rank, step));
    }
    ++reports;
    if (before) {
      train::TemporaryDirectory dir;
      std::ofstream(fs::path(dir.path()) / fmt::format("rank-{}.json", rank))
          << nlohmann::json{{"step", step}}.dump();
      train::report({{"step", step}}, Checkpoint::from_directory(dir.path()), {.async = true});
      return;
    }
    train::report({{"step", step}}, std::nullopt, {.async = true});
  }
}

TEST(Preemption, WithAsyncReportsTheNoticeChangesOnlyAtAReportAndEveryRankSavesTheSameStep) {
  TempDir dir;
  Trainer t(async_preemptible_loop, {}, ScalingConfig{.num_workers = 4}, run_in(dir));
  Result r = t.fit();
  ASSERT_TRUE(r.preempted) << r.error.value_or("no error");
  EXPECT_EQ(r.error->find("changed between two reports"), std::string::npos) << *r.error;
  ASSERT_TRUE(r.checkpoint) << *r.error;
  // Rank 1's SIGTERM rides on report #4 (step 3), whose release carries the
  // notice; with one report in flight, report #5 (step 4) is the first call
  // that has surely seen that release, so every rank saves at step 5.
  const fs::path ck = r.checkpoint->as_directory().path();
  for (int rank = 0; rank < 4; ++rank) {
    const fs::path file = ck / fmt::format("rank-{}.json", rank);
    ASSERT_TRUE(fs::exists(file)) << file;
    EXPECT_EQ(nlohmann::json::parse(testing::read_text(file)).at("step"), 5) << file;
  }
  const Manifest m = r.checkpoint->manifest();
  EXPECT_EQ(m.ranks, (nlohmann::json{{"world_size", 4},
                                     {"contributed", {0, 1, 2, 3}},
                                     {"files",
                                      {{"0", {"rank-0.json"}},
                                       {"1", {"rank-1.json"}},
                                       {"2", {"rank-2.json"}},
                                       {"3", {"rank-3.json"}}}}}));
  EXPECT_EQ(expect_all_verify(r.path), 1u);
  expect_no_children();
}

TEST(Preemption, WhenNoCheckpointComesTheGraceTimeEndsTheRunWithoutRetrying) {
  TempDir dir;
  // This loop never looks at should_checkpoint().
  auto stubborn = [](const nlohmann::json&) {
    for (int step = 0; step < 100000; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      train::report({{"step", step}});
    }
  };
  std::thread signaller = sigterm_driver_after_first_reports(dir.path() / "exp");
  Trainer t(stubborn, {}, ScalingConfig{.num_workers = 2}, run_in(dir, /*grace_s=*/0.5));
  const auto start = std::chrono::steady_clock::now();
  Result r = t.fit();
  signaller.join();
  ASSERT_TRUE(r.preempted) << r.error.value_or("no error");
  EXPECT_NE(r.error->find("preemption_grace_s"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("no checkpoint was committed"), std::string::npos) << *r.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  expect_no_children();
}

TEST(Preemption, ShouldCheckpointOutsideAWorkerIsAPreconditionError) {
  EXPECT_THROW(train::should_checkpoint(), Error);
}

}  // namespace
}  // namespace cairn
