// tuner_state.json: a Tuner experiment's state (its settings, searcher and
// scheduler state, and one entry per trial). This is the file's one reader,
// used by the Tuner's restore and by the `cairn` command, and its one writer.
// The reader checks the document and types what every reader uses (the
// experiment's metric and mode and, per trial, its folder, status, config,
// last result, failures and error); the Tuner's own sections (searcher,
// scheduler, settings, per-trial bookkeeping) are in `doc`, checked by the
// Tuner where it restores them. Parsing is pure, so every rule is unit-tested.
// Thread-safety: free functions; the writer's caller holds the experiment's
// lock. Durability: written whole with Storage::put (atomic replace).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/storage.h"
#include "experiment/layout.h"

namespace cairn::experiment {

inline constexpr std::string_view kTunerStateFormat = "cairn-tuner-state";
inline constexpr int64_t kTunerStateVersion = 1;

struct TunerTrialState {
  std::string trial_id;        // "trial_00003"
  std::string dir;             // its folder in the experiment, one path segment
  std::string status;          // PENDING, RUNNING, PAUSED, TERMINATED, ERROR (as stored)
  nlohmann::json config;       // as stored; null when absent
  nlohmann::json last_result;  // an object, or null
  int64_t num_failures = 0;
  std::optional<std::string> error;
  std::optional<std::string> latest_checkpoint;
};

struct TunerState {
  std::string name;
  std::optional<double> updated_at;  // seconds since the Unix epoch
  std::string metric;                // "" when the tuner ranks by none
  std::string mode;                  // "min", "max" or ""
  std::vector<TunerTrialState> trials;
  nlohmann::json doc;  // the whole document, for the Tuner's own sections
};

// Parses the text of tuner_state.json. Throws Error kCorruption naming
// `source` (its URI) when the text is not JSON, is not a cairn-tuner-state
// document of a version this build reads, or a field Cairn shows has the
// wrong type; a trial folder that is not one plain path segment is damage
// too (the CLI never reads outside the experiment).
TunerState parse_tuner_state(std::string_view text, std::string_view source);

// The tuner state of the experiment `experiment` (parse_tuner_state of its
// tuner_state.json, the file's URI as the source). kNotFound when absent.
TunerState read_tuner_state(Storage& experiment);

// As read_tuner_state, but nullopt when the experiment has no tuner state.
std::optional<TunerState> find_tuner_state(Storage& experiment);

// Replaces the experiment's tuner state with `text`, a document as
// parse_tuner_state reads it (the Tuner builds it incrementally, reusing the
// text of ended trials). Storage errors pass through.
void write_tuner_state(Storage& experiment, std::string_view text);

}  // namespace cairn::experiment
