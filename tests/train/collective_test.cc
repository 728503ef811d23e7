// The report round's state machine and the failure rules, without processes.
#include "train/control/collective.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "train/mpi.h"

namespace cairn::train_internal {
namespace {

using Action = ReportRound::Action;
const nlohmann::json kNoMeta = nlohmann::json::object();

ManifestEntry entry(const std::string& path, uint64_t size, uint64_t h) {
  ManifestEntry e;
  e.path = path;
  e.size = size;
  e.xxh3 = h;
  return e;
}

TEST(ReportRound, RoundWithoutCheckpointsIsAckedOnlyWhenEveryRankArrived) {
  ReportRound r(3, 10.0);
  EXPECT_EQ(r.on_report(1, 1, {{"loss", 9}}, false, 0.0).type, Action::kNone);
  EXPECT_EQ(r.on_report(0, 1, {{"loss", 1}}, false, 0.1).type, Action::kNone);
  Action a = r.on_report(2, 1, {{"loss", 7}}, false, 0.2);
  ASSERT_EQ(a.type, Action::kAck);
  EXPECT_EQ(a.round, 1);
  EXPECT_EQ(a.metrics, (nlohmann::json{{"loss", 1}})) << "metrics come from rank 0";
  r.on_released();
  EXPECT_EQ(r.completed_rounds(), 1);
}

TEST(ReportRound, CommitWaitsForEveryUploaderAndMergesTheirFiles) {
  ReportRound r(3, 10.0);
  r.on_report(0, 1, {{"epoch", 0}}, true, 0.0);
  r.on_report(1, 1, {{"epoch", 0}}, false, 0.0);
  Action begin = r.on_report(2, 1, {{"epoch", 0}}, true, 0.0);
  ASSERT_EQ(begin.type, Action::kBeginUpload);
  EXPECT_EQ(begin.uploaders, (std::vector<int>{0, 2}));
  EXPECT_EQ(r.on_uploaded(2, 1, {entry("b", 1, 2)}, kNoMeta, 0.5).type, Action::kNone);
  Action commit = r.on_uploaded(0, 1, {entry("a", 3, 4)}, {{"k", "v"}}, 0.6);
  ASSERT_EQ(commit.type, Action::kCommit);
  ASSERT_EQ(commit.files.size(), 2u);
  EXPECT_EQ(commit.files[0].path, "a");
  EXPECT_EQ(commit.files[1].path, "b");
  EXPECT_EQ(commit.metadata.size(), 1u);
  EXPECT_EQ(commit.metadata.at(0)["k"], "v");
  r.on_released();
  // The next round starts fresh.
  r.on_report(0, 2, {{"epoch", 1}}, false, 1.0);
  r.on_report(1, 2, {{"epoch", 1}}, false, 1.0);
  EXPECT_EQ(r.on_report(2, 2, {{"epoch", 1}}, false, 1.0).type, Action::kAck);
}

TEST(ReportRound, CommitSaysWhichRanksUploaded) {
  ReportRound r(3, 10.0);
  r.on_report(0, 1, {}, false, 0.0);
  r.on_report(1, 1, {}, true, 0.0);
  ASSERT_EQ(r.on_report(2, 1, {}, true, 0.0).type, Action::kBeginUpload);
  r.on_uploaded(2, 1, {entry("c", 1, 2)}, kNoMeta, 0.1);
  Action commit = r.on_uploaded(1, 1, {entry("b", 1, 3)}, kNoMeta, 0.1);
  ASSERT_EQ(commit.type, Action::kCommit);
  EXPECT_EQ(commit.uploaders, (std::vector<int>{1, 2}));
}

// The manifest keeps which rank passed which file (a file two ranks passed
// alike is under both), so a restore can give a host only its ranks' files.
TEST(ReportRound, CommitSaysWhichRankPassedWhichFileForTheManifest) {
  ReportRound r(3, 10.0);
  r.on_report(0, 1, {}, true, 0.0);
  r.on_report(1, 1, {}, false, 0.0);
  ASSERT_EQ(r.on_report(2, 1, {}, true, 0.0).type, Action::kBeginUpload);
  r.on_uploaded(2, 1, {entry("c", 1, 2), entry("shared", 1, 9)}, kNoMeta, 0.1);
  Action commit = r.on_uploaded(0, 1, {entry("a", 1, 3), entry("shared", 1, 9)}, kNoMeta, 0.1);
  ASSERT_EQ(commit.type, Action::kCommit);
  EXPECT_EQ(commit.files.size(), 3u);
  EXPECT_EQ(manifest_ranks(commit, 3),
            nlohmann::json({{"world_size", 3},
                            {"contributed", {0, 2}},
                            {"files", {{"0", {"a", "shared"}}, {"2", {"c", "shared"}}}}}));
}

// Ranks that saw different preemption notices are saving different steps
// (one its emergency checkpoint, another a step earlier): their files
// together would be a checkpoint of no step of the run.
TEST(ReportRound, RoundWithACheckpointWhoseRanksDisagreeOnTheNoticeFailsBeforeAnyUpload) {
  ReportRound r(4, 10.0);
  r.on_report(0, 1, {}, true, 0.0, /*notice=*/true);
  r.on_report(1, 1, {}, true, 0.0, /*notice=*/false);
  r.on_report(2, 1, {}, true, 0.0, /*notice=*/true);
  Action a = r.on_report(3, 1, {}, true, 0.0, /*notice=*/false);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kMismatch);
  EXPECT_FALSE(is_retryable(a.failure.kind));
  EXPECT_NE(a.failure.message.find("rank(s) 0, 2 saw should_checkpoint() true"), std::string::npos)
      << a.failure.message;
  EXPECT_NE(a.failure.message.find("rank(s) 1, 3 did not"), std::string::npos) << a.failure.message;
  EXPECT_NE(a.failure.message.find("not committed"), std::string::npos) << a.failure.message;
}

TEST(ReportRound, RanksThatAgreeOnTheNoticeCommitAndDisagreementWithoutFilesIsAcked) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, false, 0.0, /*notice=*/true);
  EXPECT_EQ(r.on_report(1, 1, {}, false, 0.0, /*notice=*/false).type, Action::kAck)
      << "nothing is committed, so nothing can be torn";
  r.on_released();
  r.on_report(0, 2, {}, true, 1.0, /*notice=*/true);
  EXPECT_EQ(r.on_report(1, 2, {}, true, 1.0, /*notice=*/true).type, Action::kBeginUpload);
}

TEST(ReportRound, RankThatReportsAgainAfterAnotherFinishedIsAMismatchNamingBoth) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, false, 0.0);
  r.on_report(1, 1, {}, false, 0.0);
  r.on_released();
  EXPECT_EQ(r.on_done(1, 1).type, Action::kNone);
  Action a = r.on_report(0, 2, {}, false, 0.1);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kMismatch);
  EXPECT_NE(a.failure.message.find("rank 0"), std::string::npos) << a.failure.message;
  EXPECT_NE(a.failure.message.find("rank 1"), std::string::npos) << a.failure.message;
  EXPECT_FALSE(is_retryable(a.failure.kind));
}

TEST(ReportRound, RankThatFinishesWhileOthersWaitInReportIsAMismatch) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, false, 0.0);
  Action a = r.on_done(1, 0);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kMismatch);
  EXPECT_NE(a.failure.message.find("after 0 report() calls"), std::string::npos)
      << a.failure.message;
}

TEST(ReportRound, EveryRankDoneWithEqualCountsFinishes) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, false, 0.0);
  r.on_report(1, 1, {}, false, 0.0);
  r.on_released();
  EXPECT_EQ(r.on_done(0, 1).type, Action::kNone);
  EXPECT_EQ(r.on_done(1, 1).type, Action::kFinished);
  EXPECT_EQ(r.on_exit(0, true, "exited with status 0").type, Action::kNone);
}

TEST(ReportRound, RankThatDoesNotArriveTimesOutOnlyAfterTheDeadline) {
  ReportRound r(3, 5.0);
  r.on_report(0, 1, {}, false, 100.0);
  r.on_report(2, 1, {}, false, 101.0);
  EXPECT_EQ(r.tick(104.9).type, Action::kNone);
  EXPECT_EQ(r.tick(105.0).type, Action::kNone);
  Action a = r.tick(105.1);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kTimeout);
  EXPECT_EQ(a.failure.rank, 1);
  EXPECT_NE(a.failure.message.find("rank(s) 1 did not call report()"), std::string::npos)
      << a.failure.message;
  EXPECT_TRUE(r.failed());
  EXPECT_EQ(r.tick(200.0).type, Action::kNone) << "a failure is reported once";
}

TEST(ReportRound, NoDeadlineWhileNoRankIsInReport) {
  ReportRound r(2, 1.0);
  EXPECT_EQ(r.tick(1e9).type, Action::kNone);
}

TEST(ReportRound, UploadThatDoesNotFinishTimesOut) {
  ReportRound r(2, 2.0);
  r.on_report(0, 1, {}, true, 0.0);
  ASSERT_EQ(r.on_report(1, 1, {}, true, 1.0).type, Action::kBeginUpload);
  r.on_uploaded(0, 1, {entry("a", 1, 1)}, kNoMeta, 1.5);
  EXPECT_EQ(r.tick(2.9).type, Action::kNone) << "the upload deadline counts from its start";
  Action a = r.tick(3.1);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.rank, 1);
  EXPECT_NE(a.failure.message.find("uploading"), std::string::npos) << a.failure.message;
}

TEST(ReportRound, DifferentContentsUnderOneNameIsAConflictNamingBothRanks) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, true, 0.0);
  r.on_report(1, 1, {}, true, 0.0);
  r.on_uploaded(0, 1, {entry("model.bin", 4, 1)}, kNoMeta, 0.0);
  Action a = r.on_uploaded(1, 1, {entry("model.bin", 4, 2)}, kNoMeta, 0.0);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kConflict);
  EXPECT_NE(a.failure.message.find("\"model.bin\" was written by rank 0 and rank 1"),
            std::string::npos)
      << a.failure.message;
  EXPECT_FALSE(is_retryable(a.failure.kind));
}

TEST(MergeRankFiles, IdenticalFilesFromSeveralRanksAreOneEntry) {
  auto merged = merge_rank_files(
      {{0, {entry("x", 5, 9), entry("r0", 1, 1)}}, {1, {entry("x", 5, 9), entry("r1", 1, 2)}}});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].path, "r0");
  EXPECT_EQ(merged[1].path, "r1");
  EXPECT_EQ(merged[2].path, "x");
}

TEST(MergeRankFiles, SizeDifferenceIsAConflictToo) {
  EXPECT_THROW(merge_rank_files({{2, {entry("x", 5, 9)}}, {3, {entry("x", 6, 9)}}}), Error);
}

TEST(ReportRound, WorkerExceptionIsTheCauseOfItsExit) {
  ReportRound r(2, 10.0);
  r.on_worker_error(1, "train_fn raised std::runtime_error: boom");
  Action a = r.on_exit(1, false, "(pid 7) exited with status 1");
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kWorkerFailed);
  EXPECT_EQ(a.failure.rank, 1);
  EXPECT_NE(a.failure.message.find("boom"), std::string::npos);
  EXPECT_NE(a.failure.message.find("status 1"), std::string::npos);
  EXPECT_TRUE(is_retryable(a.failure.kind));
}

TEST(ReportRound, ExitWithoutDoneIsAFailureEvenWithStatusZero) {
  ReportRound r(2, 10.0);
  Action a = r.on_exit(0, true, "exited with status 0");
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_NE(a.failure.message.find("before returning from train_fn"), std::string::npos);
}

TEST(ReportRound, OnlyTheFirstFailureIsReported) {
  ReportRound r(2, 10.0);
  ASSERT_EQ(r.on_exit(0, false, "was killed by signal 9 (SIGKILL)").type, Action::kFailed);
  EXPECT_EQ(r.on_exit(1, false, "was killed by signal 9 (SIGKILL)").type, Action::kNone);
  EXPECT_EQ(r.fail({FailureKind::kDriver, -1, "x"}).type, Action::kNone);
}

TEST(ReportRound, RanksFailingAfterTheFirstAreNamedWithIt) {
  ReportRound r(3, 10.0);
  r.on_worker_error(0, "train_fn raised cairn::Error: all_reduce failed (another rank is gone)");
  ASSERT_EQ(r.on_exit(0, false, "(pid 7) exited with status 1").type, Action::kFailed);
  EXPECT_FALSE(r.all_exited());
  EXPECT_EQ(r.on_exit(1, false, "(pid 8) was killed by signal 9 (SIGKILL)").type, Action::kNone);
  EXPECT_EQ(r.on_done(2, 3).type, Action::kNone);
  EXPECT_EQ(r.on_exit(2, true, "(pid 9) exited with status 0").type, Action::kNone);
  EXPECT_TRUE(r.all_exited());
  const Failure f = r.failure_with_concurrent();
  EXPECT_EQ(f.rank, 0);
  EXPECT_EQ(f.message.rfind("rank 0 failed: train_fn raised", 0), 0u) << f.message;
  EXPECT_NE(f.message.find("; at the same time rank 1 (pid 8) was killed by signal 9 (SIGKILL) "
                           "before returning from train_fn"),
            std::string::npos)
      << f.message;
  // A rank that finished cleanly is no failure of its own.
  EXPECT_EQ(f.message.find("rank 2"), std::string::npos) << f.message;
}

// The driver waits for failures that follow from the first only while a
// rank still runs code of its own: a rank that waits inside report(), even
// one that arrived after the failure, cannot fail because of it.
TEST(ReportRound, NoRankRunsOnceEveryOtherRankWaitsInReportOrHasEnded) {
  ReportRound r(4, 10.0);
  EXPECT_FALSE(r.none_running());
  r.on_report(1, 1, {}, true, 0.0);
  ASSERT_EQ(r.on_exit(0, false, "(pid 7) was killed by signal 9 (SIGKILL)").type, Action::kFailed);
  EXPECT_FALSE(r.none_running()) << "ranks 2 and 3 still run train_fn";
  EXPECT_EQ(r.on_report(2, 1, {}, true, 0.1).type, Action::kNone);
  EXPECT_FALSE(r.none_running()) << "rank 3 still runs train_fn";
  EXPECT_EQ(r.on_exit(3, false, "(pid 9) exited with status 1").type, Action::kNone);
  EXPECT_TRUE(r.none_running());
  EXPECT_FALSE(r.all_exited());
  EXPECT_NE(r.failure_with_concurrent().message.find("at the same time rank 3"), std::string::npos);
}

TEST(ReportRound, AnUploadingRankStillRuns) {
  ReportRound r(2, 10.0);
  r.on_report(0, 1, {}, true, 0.0);
  ASSERT_EQ(r.on_report(1, 1, {}, true, 0.0).type, Action::kBeginUpload);
  r.on_uploaded(0, 1, {entry("a", 1, 1)}, kNoMeta, 0.1);
  EXPECT_EQ(r.fail({FailureKind::kDriver, -1, "lost the storage"}).type, Action::kFailed);
  EXPECT_FALSE(r.none_running()) << "rank 1 is still writing its files";
  r.on_exit(1, false, "(pid 8) was killed by signal 9 (SIGKILL)");
  EXPECT_TRUE(r.none_running());
}

TEST(Restart, BudgetCountsFailuresAndMinusOneIsUnlimited) {
  Failure worker{FailureKind::kWorkerFailed, 0, ""};
  EXPECT_FALSE(should_restart(worker, 1, 0));
  EXPECT_TRUE(should_restart(worker, 1, 1));
  EXPECT_FALSE(should_restart(worker, 2, 1));
  EXPECT_TRUE(should_restart(worker, 1000, -1));
  Failure timeout{FailureKind::kTimeout, 0, ""};
  EXPECT_TRUE(should_restart(timeout, 1, 1));
  Failure mismatch{FailureKind::kMismatch, 0, ""};
  EXPECT_FALSE(should_restart(mismatch, 1, -1));
  Failure conflict{FailureKind::kConflict, 0, ""};
  EXPECT_FALSE(should_restart(conflict, 1, -1));
}

TEST(WaitStatus, NamesExitCodesAndSignals) {
  int exited3 = 3 << 8;
  EXPECT_EQ(describe_wait_status(exited3), "exited with status 3");
  EXPECT_FALSE(is_clean_exit(exited3));
  EXPECT_TRUE(is_clean_exit(0));
  int killed = SIGKILL;
  EXPECT_TRUE(WIFSIGNALED(killed));
  EXPECT_EQ(describe_wait_status(killed), "was killed by signal 9 (SIGKILL)");
}

TEST(SharedStorage, SingleHostWhereEveryRankSeesTheProbeIsAccepted) {
  EXPECT_NO_THROW(check_shared_storage({"a", "a"}, {true, true}, "file:///x"));
}

TEST(SharedStorage, RankOnAnotherHostThatCannotSeeTheProbeIsRefusedByName) {
  try {
    check_shared_storage({"a", "a", "b"}, {true, true, false}, "file:///local/exp");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    std::string m = e.what();
    EXPECT_NE(m.find("rank 2 on host b"), std::string::npos) << m;
    EXPECT_NE(m.find("file:///local/exp is not shared"), std::string::npos) << m;
  }
}

TEST(MpiLaunch, DetectedFromTheLaunchersEnvironment) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("PMI_SIZE");
  ::unsetenv("PMIX_RANK");
  EXPECT_FALSE(launched_by_mpi());
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
}

TEST(MpiLaunch, ZeroWorkersMeansTheWorldSizeAndAnyOtherCountMustMatchIt) {
  EXPECT_EQ(launched_world_ranks({.num_workers = 0}, 4), 4);
  EXPECT_EQ(launched_world_ranks({.num_workers = 4}, 4), 4);
  try {
    launched_world_ranks({.num_workers = 2}, 3);
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    std::string m = e.what();
    EXPECT_NE(m.find("num_workers is 2 but the MPI job has 3 process(es)"), std::string::npos) << m;
  }
}

TEST(MpiLaunch, AnElasticGroupTakesAnyWorldSizeWithinItsRangeAndNamesTheRangeOtherwise) {
  const ScalingConfig elastic{.num_workers = 4, .min_workers = 2};
  EXPECT_EQ(launched_world_ranks(elastic, 4), 4);
  EXPECT_EQ(launched_world_ranks(elastic, 3), 3);
  EXPECT_EQ(launched_world_ranks(elastic, 2), 2);
  for (int size : {1, 5}) {
    try {
      launched_world_ranks(elastic, size, "the job");
      FAIL() << "expected kInvalidArgument for " << size;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(
          std::string(e.what()).find(fmt::format(
              "the job has {} process(es), outside ScalingConfig's elastic range of 2 to 4", size)),
          std::string::npos)
          << e.what();
    }
  }
}

TEST(MpiLaunch, MinWorkersAboveNumWorkersOrWithoutOneIsRefused) {
  for (const ScalingConfig& bad : {ScalingConfig{.num_workers = 2, .min_workers = 3},
                                   ScalingConfig{.num_workers = 2, .min_workers = -1},
                                   ScalingConfig{.num_workers = 0, .min_workers = 1}}) {
    try {
      bad.validate();
      FAIL() << "expected kInvalidArgument";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("ScalingConfig::min_workers is"), std::string::npos)
          << e.what();
    }
  }
  ScalingConfig{.num_workers = 4, .min_workers = 4}.validate();
}

TEST(MpiLaunch, PlacesNumberNodesByFirstRankAndLocalRanksWithinEachNode) {
  auto p = plan_places({"b", "a", "b", "c", "a"});
  ASSERT_EQ(p.size(), 5u);
  const int node[] = {0, 1, 0, 2, 1};
  const int local[] = {0, 0, 1, 0, 1};
  const int local_size[] = {2, 2, 2, 1, 2};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(p[r].world_rank, r);
    EXPECT_EQ(p[r].world_size, 5);
    EXPECT_EQ(p[r].node_rank, node[r]) << r;
    EXPECT_EQ(p[r].local_rank, local[r]) << r;
    EXPECT_EQ(p[r].local_world_size, local_size[r]) << r;
  }
}

TEST(MpiLaunch, OneHostStaysOnLoopbackManyHostsListenEverywhereAndOverrideWins) {
  auto one = choose_control_address({"a", "a"}, "", {"10.0.0.1"}, "a");
  EXPECT_EQ(one.bind, "127.0.0.1");
  EXPECT_EQ(one.advertise, std::vector<std::string>{"127.0.0.1"});
  auto many = choose_control_address({"a", "b"}, "", {"10.0.0.1", "fd00::1"}, "a");
  EXPECT_EQ(many.bind, "");
  EXPECT_EQ(many.advertise, (std::vector<std::string>{"10.0.0.1", "fd00::1", "a"}));
  auto forced = choose_control_address({"a", "b"}, "192.168.1.5", {"10.0.0.1"}, "a");
  EXPECT_EQ(forced.bind, "192.168.1.5");
  EXPECT_EQ(forced.advertise, std::vector<std::string>{"192.168.1.5"});
}

TEST(SharedStorage, WhyARankCouldNotLookIsPartOfTheError) {
  try {
    check_shared_storage({"a", "b"}, {true, false}, "/scratch/exp", {"", "permission denied"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 1 on host b"), std::string::npos) << m;
    EXPECT_NE(m.find("(permission denied)"), std::string::npos) << m;
    EXPECT_NE(m.find("2 host(s)"), std::string::npos) << m;
  }
}

TEST(ReportRound, NonNumericScoreFailsWhenEveryRankArrivedBeforeAnyUploadAndIsNotRetried) {
  ReportRound r(2, 10.0, "eval/loss");
  EXPECT_EQ(r.on_report(0, 1, {{"eval", {{"loss", "low"}}}}, true, 0.0).type, Action::kNone);
  Action a = r.on_report(1, 1, {{"eval", {{"loss", 0.5}}}}, true, 0.0);
  ASSERT_EQ(a.type, Action::kFailed) << "no BeginUpload: nothing is written";
  EXPECT_EQ(a.failure.kind, FailureKind::kInvalidReport);
  EXPECT_NE(a.failure.message.find("score attribute \"eval/loss\""), std::string::npos)
      << a.failure.message;
  EXPECT_NE(a.failure.message.find("\"low\""), std::string::npos) << a.failure.message;
  EXPECT_FALSE(should_restart(a.failure, 1, -1));
}

TEST(ReportRound, ScoreIsOnlyCheckedForRoundsWithACheckpointAndMayBeMissing) {
  ReportRound r(1, 10.0, "loss");
  EXPECT_EQ(r.on_report(0, 1, {{"loss", "n/a"}}, false, 0.0).type, Action::kAck);
  r.on_released();
  EXPECT_EQ(r.on_report(0, 2, {{"other", 1}}, true, 0.0).type, Action::kBeginUpload)
      << "a missing score is a warning of the manager, not a failure";
}

TEST(ReportRound, MetricsThatAreNotAnObjectFailNamingTheRank) {
  ReportRound r(2, 10.0);
  Action a = r.on_report(1, 1, nlohmann::json::array({1}), false, 0.0);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_EQ(a.failure.kind, FailureKind::kInvalidReport);
  EXPECT_EQ(a.failure.rank, 1);
  EXPECT_NE(a.failure.message.find("not a JSON object (array)"), std::string::npos)
      << a.failure.message;
  ReportRound w(2, 10.0);
  Action b = w.on_invalid_report(0, "rank 0: report() metrics must be a JSON object, got string");
  EXPECT_EQ(b.failure.kind, FailureKind::kInvalidReport);
  EXPECT_FALSE(is_retryable(b.failure.kind));
}

TEST(Ordinal, EnglishSuffixes) {
  const std::pair<long long, const char*> cases[] = {
      {0, "0th"},       {1, "1st"},       {2, "2nd"},     {3, "3rd"},     {4, "4th"},
      {11, "11th"},     {12, "12th"},     {13, "13th"},   {21, "21st"},   {22, "22nd"},
      {23, "23rd"},     {101, "101st"},   {111, "111th"}, {112, "112th"}, {113, "113th"},
      {1001, "1001st"}, {1011, "1011th"}, {-1, "-1st"},   {-12, "-12th"}, {100, "100th"},
  };
  for (const auto& [n, want] : cases) EXPECT_EQ(ordinal(n), want) << n;
}

TEST(ReportRound, MismatchMessageUsesOrdinals) {
  ReportRound r(2, 10.0);
  for (int round = 1; round <= 2; ++round) {
    r.on_report(0, round, {}, false, 0.0);
    r.on_report(1, round, {}, false, 0.0);
    r.on_released();
  }
  r.on_done(0, 2);
  Action a = r.on_report(1, 3, {}, false, 0.0);
  ASSERT_EQ(a.type, Action::kFailed);
  EXPECT_NE(a.failure.message.find("a 3rd time"), std::string::npos) << a.failure.message;
}

}  // namespace
}  // namespace cairn::train_internal
