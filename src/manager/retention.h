// Retention policy: which checkpoints to keep. Pure functions, no I/O, so the
// rules are unit-tested and fuzzed alone; the manager applies their answers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::retention {

enum class ScoreKind { kNumber, kMissing, kNotNumber };

struct Score {
  ScoreKind kind = ScoreKind::kMissing;
  double value = 0.0;  // when kNumber (may be NaN)
  std::string found;   // when kNotNumber: the JSON found there
};

// Looks up `attribute` in `metrics`. As in Ray, which flattens nested metrics
// with "/", "a/b" names both metrics["a/b"] and metrics["a"]["b"]; when both
// exist the literal key wins, and in general the longest literal key at each
// level is tried first. Booleans are not numbers; null counts as missing.
Score extract_score(const nlohmann::json& metrics, std::string_view attribute);

struct Candidate {
  uint64_t index = 0;
  std::optional<double> score;  // nullopt: reported without the attribute
  bool pinned = false;          // kept by keep_checkpoint_every_n_hours
};

struct Policy {
  std::optional<int> num_to_keep;  // nullopt: keep all
  bool by_score = false;           // false: rank by recency
  bool maximize = true;
};

// True if `a` ranks before (better than) `b`: a valid score beats a missing or
// NaN one, then the better score, then the newer index.
bool better(const Candidate& a, const Candidate& b, const Policy& policy);

// All candidates, best first.
std::vector<uint64_t> rank(std::vector<Candidate> candidates, const Policy& policy);

// The indices to delete: those outside the best num_to_keep, except pinned
// ones and the most recent (pinned ones count toward the K, as in
// tf.train.CheckpointManager, where pinning only saves what leaves the window).
std::vector<uint64_t> to_delete(const std::vector<Candidate>& candidates, const Policy& policy);

// keep_checkpoint_every_n_hours: pin a checkpoint made at `created_at` if at
// least `hours` passed since `last_pinned_at` (the experiment's start before
// any pin).
bool should_pin(double created_at, double last_pinned_at, std::optional<double> hours);

}  // namespace cairn::retention
