#include "train/control/collective.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "manager/retention.h"
#include "util/hash.h"

namespace cairn::train_internal {

bool is_retryable(FailureKind kind) {
  return kind != FailureKind::kMismatch && kind != FailureKind::kConflict &&
         kind != FailureKind::kInvalidReport;
}

std::string ordinal(long long n) {
  const unsigned long long a = n < 0 ? 0ULL - static_cast<unsigned long long>(n) : n;
  const char* suffix = "th";
  if (a % 100 < 11 || a % 100 > 13) {
    switch (a % 10) {
      case 1:
        suffix = "st";
        break;
      case 2:
        suffix = "nd";
        break;
      case 3:
        suffix = "rd";
        break;
      default:
        break;
    }
  }
  return fmt::format("{}{}", n, suffix);
}

const char* failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kWorkerFailed:
      return "worker failed";
    case FailureKind::kTimeout:
      return "timeout";
    case FailureKind::kMismatch:
      return "report count mismatch";
    case FailureKind::kConflict:
      return "file conflict";
    case FailureKind::kDriver:
      return "driver error";
    case FailureKind::kInvalidReport:
      return "invalid report";
  }
  return "unknown";
}

std::vector<ManifestEntry> merge_rank_files(
    const std::map<int, std::vector<ManifestEntry>>& files_by_rank) {
  struct Owner {
    int rank;
    ManifestEntry entry;
  };
  std::map<std::string, Owner> merged;
  for (const auto& [rank, files] : files_by_rank) {
    for (const auto& f : files) {
      auto [it, inserted] = merged.emplace(f.path, Owner{rank, f});
      if (inserted) continue;
      const ManifestEntry& first = it->second.entry;
      if (first.size != f.size || first.xxh3 != f.xxh3) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("checkpoint file \"{}\" was written by rank {} and rank {} with "
                                "different contents (rank {}: {} bytes, xxh3 {}; rank {}: {} "
                                "bytes, xxh3 {}); give each rank's files distinct names, e.g. "
                                "with a rank suffix",
                                f.path, it->second.rank, rank, it->second.rank, first.size,
                                hash_to_hex(first.xxh3), rank, f.size, hash_to_hex(f.xxh3)));
      }
    }
  }
  std::vector<ManifestEntry> out;
  out.reserve(merged.size());
  for (auto& [path, owner] : merged) out.push_back(owner.entry);
  return out;  // std::map keeps them sorted by path
}

nlohmann::json manifest_ranks(const ReportRound::Action& commit, int world_size) {
  nlohmann::json ranks = {{"world_size", world_size}, {"contributed", commit.uploaders}};
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [rank, paths] : commit.paths_by_rank) files[std::to_string(rank)] = paths;
  ranks["files"] = std::move(files);
  return ranks;
}

ReportRound::ReportRound(int world_size, double timeout_s, std::string score_attribute)
    : world_size_(world_size),
      timeout_s_(timeout_s),
      score_attribute_(std::move(score_attribute)),
      ranks_(world_size) {}

ReportRound::Action ReportRound::fail_with(FailureKind kind, int rank, std::string message) {
  return fail(Failure{kind, rank, std::move(message)});
}

ReportRound::Action ReportRound::fail(Failure failure) {
  Action a;
  if (failure_) return a;  // the first failure is the one reported
  failure_ = std::move(failure);
  a.type = Action::kFailed;
  a.round = round_;
  a.failure = *failure_;
  return a;
}

ReportRound::Action ReportRound::on_report(int rank, int round, const nlohmann::json& metrics,
                                           bool has_checkpoint, double now, bool notice) {
  if (failure_) {
    // The round is lost, but the rank now waits inside report(): it can no
    // longer fail on its own (none_running()).
    RankState& late = ranks_.at(rank);
    if (late.state == State::kRunning) late.state = State::kArrived;
    return {};
  }
  RankState& r = ranks_.at(rank);
  if (r.state != State::kRunning || round != completed_ + 1) {
    return fail_with(
        FailureKind::kWorkerFailed, rank,
        fmt::format("rank {} sent report #{} out of turn (protocol error)", rank, round));
  }
  if (!metrics.is_object() && !metrics.is_null()) {  // null: no metrics
    return fail_with(FailureKind::kInvalidReport, rank,
                     fmt::format("rank {}'s report #{} has metrics that are not a JSON object "
                                 "({}); report() takes an object such as {{\"loss\": 0.1}}",
                                 rank, round, metrics.type_name()));
  }
  r.state = State::kArrived;
  r.has_checkpoint = has_checkpoint;
  r.notice = notice;
  if (rank == 0) rank0_metrics_ = metrics.is_null() ? nlohmann::json::object() : metrics;
  if (phase_ == Phase::kIdle) {
    phase_ = Phase::kCollecting;
    round_ = round;
    deadline_ = now + timeout_s_;
  }
  Action m = check_mismatch();
  if (m.type != Action::kNone) return m;
  return maybe_advance(now);
}

ReportRound::Action ReportRound::check_mismatch() {
  if (phase_ != Phase::kCollecting) return {};
  for (int d = 0; d < world_size_; ++d) {
    if (ranks_[d].state != State::kDone && ranks_[d].state != State::kExited) continue;
    for (int a = 0; a < world_size_; ++a) {
      if (ranks_[a].state != State::kArrived) continue;
      return fail_with(FailureKind::kMismatch, a,
                       fmt::format("rank {} called report() a {} time, but rank {} returned "
                                   "from train_fn after {} report() calls; every rank must call "
                                   "report() the same number of times",
                                   a, ordinal(round_), d, ranks_[d].done_count));
    }
  }
  return {};
}

ReportRound::Action ReportRound::maybe_advance(double now) {
  Action a;
  a.round = round_;
  if (phase_ == Phase::kCollecting) {
    for (const auto& r : ranks_) {
      if (r.state != State::kArrived) return {};
    }
    for (int i = 0; i < world_size_; ++i) {
      if (ranks_[i].has_checkpoint) {
        a.uploaders.push_back(i);
        ranks_[i].state = State::kUploading;
      }
    }
    a.metrics = rank0_metrics_;
    if (a.uploaders.empty()) {
      phase_ = Phase::kReleasing;
      a.type = Action::kAck;
      return a;
    }
    std::vector<int> heard;
    std::vector<int> not_heard;
    for (int i = 0; i < world_size_; ++i) (ranks_[i].notice ? heard : not_heard).push_back(i);
    if (!heard.empty() && !not_heard.empty()) {
      return fail_with(
          FailureKind::kMismatch, not_heard.front(),
          fmt::format("report #{}: the ranks disagree on the preemption notice (rank(s) {} saw "
                      "should_checkpoint() true before this report, rank(s) {} did not), so "
                      "they are not saving the same step; its checkpoint is not committed. "
                      "Every rank must make the same report() calls with the same "
                      "ReportOptions to hear the notice at the same one",
                      round_, fmt::join(heard, ", "), fmt::join(not_heard, ", ")));
    }
    // The checkpoint would be ranked by the score: check it before any rank
    // uploads, so a bad one costs nothing and is reported once.
    if (!score_attribute_.empty()) {
      retention::Score score = retention::extract_score(rank0_metrics_, score_attribute_);
      if (score.kind == retention::ScoreKind::kNotNumber) {
        return fail_with(FailureKind::kInvalidReport, 0,
                         fmt::format("report #{}: the score attribute \"{}\" "
                                     "(CheckpointConfig::checkpoint_score_attribute) in rank 0's "
                                     "metrics is not a number: {}; checkpoints are ranked by it",
                                     round_, score_attribute_, score.found));
      }
    }
    phase_ = Phase::kUploading;
    deadline_ = now + timeout_s_;
    a.type = Action::kBeginUpload;
    return a;
  }
  if (phase_ == Phase::kUploading) {
    // Called once per upload that arrives: only look, copying nothing, until
    // the last one is in (a copy of every rank's files each time made a
    // round of N ranks cost O(N^2)).
    for (const RankState& r : ranks_) {
      if (r.state == State::kUploading) return {};
    }
    std::map<int, std::vector<ManifestEntry>> by_rank;
    for (int i = 0; i < world_size_; ++i) {
      const RankState& r = ranks_[i];
      if (r.state == State::kUploaded) {
        a.uploaders.push_back(i);
        by_rank[i] = r.files;
        std::vector<std::string>& paths = a.paths_by_rank[i];
        for (const ManifestEntry& f : r.files) paths.push_back(f.path);
        if (r.metadata.is_object() && !r.metadata.empty()) a.metadata[i] = r.metadata;
      }
    }
    try {
      a.files = merge_rank_files(by_rank);
    } catch (const Error& e) {
      return fail_with(FailureKind::kConflict, -1, fmt::format("report #{}: {}", round_, e.what()));
    }
    phase_ = Phase::kReleasing;
    a.type = Action::kCommit;
    a.metrics = rank0_metrics_;
    return a;
  }
  return {};
}

ReportRound::Action ReportRound::on_uploaded(int rank, int round, std::vector<ManifestEntry> files,
                                             nlohmann::json metadata, double now) {
  if (failure_) return {};
  RankState& r = ranks_.at(rank);
  if (r.state != State::kUploading || round != round_) {
    return fail_with(FailureKind::kWorkerFailed, rank,
                     fmt::format("rank {} reported an upload for report #{} out of turn "
                                 "(protocol error)",
                                 rank, round));
  }
  r.state = State::kUploaded;
  r.files = std::move(files);
  r.metadata = std::move(metadata);
  return maybe_advance(now);
}

void ReportRound::on_released() {
  for (auto& r : ranks_) {
    if (r.state == State::kArrived || r.state == State::kUploading || r.state == State::kUploaded) {
      r.state = State::kRunning;
      r.has_checkpoint = false;
      r.notice = false;
      r.files.clear();
      r.metadata = nullptr;
    }
  }
  ++completed_;
  phase_ = Phase::kIdle;
}

ReportRound::Action ReportRound::on_worker_error(int rank, const std::string& message) {
  ranks_.at(rank).error = message;
  return {};
}

ReportRound::Action ReportRound::on_upload_failed(int rank, int round, const std::string& message) {
  ranks_.at(rank).error = message;
  return fail_with(
      FailureKind::kWorkerFailed, rank,
      fmt::format("rank {} failed in asynchronous report #{}: {}", rank, round, message));
}

ReportRound::Action ReportRound::on_invalid_report(int rank, const std::string& message) {
  return fail_with(FailureKind::kInvalidReport, rank, message);
}

ReportRound::Action ReportRound::on_done(int rank, int count) {
  RankState& r = ranks_.at(rank);
  r.state = State::kDone;  // after a failure too: its clean exit is then no failure of its own
  r.done_count = count;
  if (failure_) return {};
  Action m = check_mismatch();
  if (m.type != Action::kNone) return m;
  for (int i = 0; i < world_size_; ++i) {
    const RankState& o = ranks_[i];
    if (o.state != State::kDone && o.state != State::kExited) return {};
    if (o.done_count != count) {
      return fail_with(FailureKind::kMismatch, rank,
                       fmt::format("rank {} called report() {} times and rank {} {} times; every "
                                   "rank must call report() the same number of times",
                                   rank, count, i, o.done_count));
    }
  }
  phase_ = Phase::kFinished;
  Action a;
  a.type = Action::kFinished;
  a.round = completed_;
  return a;
}

ReportRound::Action ReportRound::on_exit(int rank, bool clean, const std::string& cause) {
  RankState& r = ranks_.at(rank);
  const bool was_done = r.state == State::kDone;
  r.state = State::kExited;
  if (was_done && clean) return {};
  std::string message;
  if (!r.error.empty()) {
    message = fmt::format("rank {} failed: {} ({})", rank, r.error, cause);
  } else if (was_done) {
    message = fmt::format("rank {} {} after returning from train_fn", rank, cause);
  } else {
    message = fmt::format("rank {} {} before returning from train_fn", rank, cause);
  }
  if (failure_) {
    if (rank != failure_->rank) concurrent_.push_back(std::move(message));
    return {};
  }
  return fail_with(FailureKind::kWorkerFailed, rank, std::move(message));
}

bool ReportRound::all_exited() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const RankState& r) { return r.state == State::kExited; });
}

bool ReportRound::none_running() const {
  return std::none_of(ranks_.begin(), ranks_.end(), [](const RankState& r) {
    return r.state == State::kRunning || r.state == State::kUploading;
  });
}

Failure ReportRound::failure_with_concurrent() const {
  Failure f = failure_.value();
  if (!concurrent_.empty()) {
    f.message += fmt::format("; at the same time {}", fmt::join(concurrent_, "; "));
  }
  return f;
}

ReportRound::Action ReportRound::tick(double now) {
  if (failure_) return {};
  if (phase_ != Phase::kCollecting && phase_ != Phase::kUploading) return {};
  if (now <= deadline_) return {};
  std::vector<int> late;
  std::vector<int> on_time;
  for (int i = 0; i < world_size_; ++i) {
    const State s = ranks_[i].state;
    bool waiting = phase_ == Phase::kCollecting ? s == State::kRunning : s == State::kUploading;
    (waiting ? late : on_time).push_back(i);
  }
  if (late.empty()) return {};
  if (phase_ == Phase::kCollecting) {
    return fail_with(
        FailureKind::kTimeout, late.front(),
        fmt::format("report #{}: rank(s) {} did not call report() within {} s of "
                    "rank(s) {}; a rank that stops reporting, or hangs, stops the "
                    "group (FailureConfig::report_timeout_s)",
                    round_, fmt::join(late, ", "), timeout_s_, fmt::join(on_time, ", ")));
  }
  return fail_with(FailureKind::kTimeout, late.front(),
                   fmt::format("report #{}: rank(s) {} did not finish uploading checkpoint files "
                               "within {} s (FailureConfig::report_timeout_s)",
                               round_, fmt::join(late, ", "), timeout_s_));
}

bool should_restart(const Failure& failure, int failures, int max_failures) {
  if (!is_retryable(failure.kind)) return false;
  if (max_failures < 0) return true;
  return failures <= max_failures;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{}){}", sig, abbrev ? abbrev : "?",
                       WCOREDUMP(status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

bool is_clean_exit(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace cairn::train_internal
