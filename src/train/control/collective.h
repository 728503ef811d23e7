// The collective report as a state machine, apart from processes and I/O, so
// it is tested without either. The driver feeds it what the workers say and
// when they exit, plus the time; it answers with what to do next.
//
// One report round, n = the round's number (1 for the first report()):
//   1. Every rank sends Report(n, metrics, has_checkpoint). The round waits
//      until all have arrived. Once the first has, the others must arrive
//      within `timeout` seconds.
//   2. No rank passed a checkpoint: Ack (the driver records rank 0's metrics
//      and releases every rank). Otherwise: BeginUpload (the driver reserves
//      a location and tells the uploaders where to write), then each uploader
//      sends Uploaded(its files); again bounded by `timeout` from the start.
//   3. All uploaded: Commit with the merged file list (merge_rank_files), then
//      every rank is released.
// A rank that finishes train_fn sends Done(count). Failures: a rank exits
// before Done or with a bad status (kWorkerFailed), ranks disagree on the
// number of reports (kMismatch), a round times out (kTimeout), an upload
// fails (kWorkerFailed), two ranks write one name differently (kConflict),
// or a report is unusable (kInvalidReport): metrics that are neither a JSON
// object nor null (none) (any rank), or, in a round with a checkpoint, rank 0's score
// attribute present but not a number. The last is found when every rank has
// arrived and before any is told to upload, so nothing is written; so is a
// round with a checkpoint whose ranks disagree on the preemption notice
// (kMismatch).
// After a failure the machine stays failed; the driver stops the group.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn::train_internal {

enum class FailureKind {
  kWorkerFailed,   // exception, non-zero exit, signal, failed upload
  kTimeout,        // a collective round did not complete in time
  kMismatch,       // ranks called report() different numbers of times
  kConflict,       // two ranks wrote one file name with different contents
  kDriver,         // the driver could not commit or reach storage
  kInvalidReport,  // metrics not an object, or a score attribute not a number
};

// Whether a restart could help. A mismatch, a conflict or an invalid report
// is in the program and would happen again.
bool is_retryable(FailureKind kind);
const char* failure_kind_name(FailureKind kind);

struct Failure {
  FailureKind kind = FailureKind::kWorkerFailed;
  int rank = -1;  // the rank at fault, -1 when none is singled out
  std::string message;
};

// Files of one checkpoint from several ranks merged into one list. Two ranks
// with the same path: identical size and checksum are one file; otherwise
// throws cairn::Error(kInvalidArgument) naming the path and both ranks.
std::vector<ManifestEntry> merge_rank_files(
    const std::map<int, std::vector<ManifestEntry>>& files_by_rank);

class ReportRound {
 public:
  struct Action {
    enum Type { kNone, kAck, kBeginUpload, kCommit, kFinished, kFailed };
    Type type = kNone;
    int round = 0;
    nlohmann::json metrics;            // rank 0's, for kAck and kCommit
    std::vector<int> uploaders;        // kBeginUpload; kCommit: who uploaded
    std::vector<ManifestEntry> files;  // kCommit, merged
    // kCommit: the paths each uploader passed (a path two ranks passed alike
    // is under both), for the manifest's "ranks" (which rank wrote what).
    std::map<int, std::vector<std::string>> paths_by_rank;
    std::map<int, nlohmann::json> metadata;  // kCommit: per-rank checkpoint metadata
    Failure failure;                         // kFailed
  };

  // `score_attribute` is CheckpointConfig::checkpoint_score_attribute (empty:
  // none); "a/b" reaches metrics["a"]["b"], as in retention.
  ReportRound(int world_size, double timeout_s, std::string score_attribute = {});

  // Events. `now` is seconds on any monotonic clock. Each returns the action
  // the event completes (kNone if it completes nothing).
  // `notice`: whether the rank's should_checkpoint() was true when it made
  // this report() call. A round with a checkpoint whose ranks disagree on it
  // fails (kMismatch) before anything is uploaded: the ranks are saving at
  // different steps, and their files together are no checkpoint of the run.
  Action on_report(int rank, int round, const nlohmann::json& metrics, bool has_checkpoint,
                   double now, bool notice = false);
  Action on_uploaded(int rank, int round, std::vector<ManifestEntry> files, nlohmann::json metadata,
                     double now);
  Action on_worker_error(int rank, const std::string& message);  // before its exit
  // The rank's asynchronous upload for `round` failed; the group fails now
  // (a worker failure: retried as configured).
  Action on_upload_failed(int rank, int round, const std::string& message);
  // The rank's report() refused its own arguments (metrics it cannot send).
  Action on_invalid_report(int rank, const std::string& message);
  Action on_done(int rank, int count);
  // `cause` describes how it ended ("exited with status 0", ...).
  Action on_exit(int rank, bool clean, const std::string& cause);
  // Deadlines.
  Action tick(double now);
  // The driver committed (or acknowledged) the round; ranks run on.
  void on_released();
  // The driver itself failed to finish the round.
  Action fail(Failure failure);

  bool failed() const { return failure_.has_value(); }
  int completed_rounds() const { return completed_; }
  // Every rank's process has ended (its exit was seen).
  bool all_exited() const;
  // No rank runs code of its own: each has exited, or waits on the driver
  // inside report() (arrived, or its upload done), or has returned from
  // train_fn. After a failure no further failure can then follow from it,
  // so the driver need not wait for one to name with it.
  bool none_running() const;
  // The first failure, its message naming too the ranks whose exits, seen
  // after it, were failures of their own (a rank killed makes its peers'
  // collectives fail a moment later, and the driver may hear from a peer
  // first: the cause must not hide behind its consequence). Call once
  // failed().
  Failure failure_with_concurrent() const;

 private:
  enum class State { kRunning, kArrived, kUploading, kUploaded, kDone, kExited };
  struct RankState {
    State state = State::kRunning;
    bool has_checkpoint = false;
    bool notice = false;  // should_checkpoint() as the rank saw it at report()
    int done_count = -1;
    std::vector<ManifestEntry> files;
    nlohmann::json metadata;
    std::string error;  // the exception it reported before exiting
  };
  enum class Phase { kIdle, kCollecting, kUploading, kReleasing, kFinished };

  Action fail_with(FailureKind kind, int rank, std::string message);
  Action check_mismatch();
  Action maybe_advance(double now);

  int world_size_;
  double timeout_s_;
  std::string score_attribute_;
  std::vector<RankState> ranks_;
  Phase phase_ = Phase::kIdle;
  int round_ = 0;      // the round being collected (completed_ + 1 while active)
  int completed_ = 0;  // rounds released
  double deadline_ = 0.0;
  nlohmann::json rank0_metrics_;
  std::optional<Failure> failure_;
  std::vector<std::string> concurrent_;  // failed exits seen after failure_
};

// The manifest's "ranks" of a kCommit round of `world_size` ranks:
// {"world_size", "contributed": [uploaders], "files": {"<rank>": [paths]}}
// (docs/train.md; Manifest::parse checks it).
nlohmann::json manifest_ranks(const ReportRound::Action& commit, int world_size);

// Whether the group should restart after `failure`, given the restarts used
// so far (`failures` counts this one) and the configured budget (-1: none).
bool should_restart(const Failure& failure, int failures, int max_failures);

// "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "101st", "111th".
std::string ordinal(long long n);

// "exited with status 3", "killed by signal 9 (SIGKILL)", from a wait status.
std::string describe_wait_status(int status);
bool is_clean_exit(int status);

}  // namespace cairn::train_internal
