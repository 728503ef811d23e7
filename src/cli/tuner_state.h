// The part of a Tuner experiment's tuner_state.json that the `cairn` command
// shows: the experiment's metric and mode and, per trial, its folder, status,
// config, last result, failures and error. Other fields (searcher, scheduler
// state) are ignored. Pure: no I/O, so every rule is unit-tested.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::cli {

inline constexpr std::string_view kTunerStateKey = "tuner_state.json";
inline constexpr std::string_view kTunerStateFormat = "cairn-tuner-state";
inline constexpr int64_t kTunerStateVersion = 1;
inline constexpr std::string_view kParamsKey = "params.json";

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
};

// Parses the text of tuner_state.json. Throws Error kCorruption naming
// `source` (its URI) when the text is not JSON, is not a cairn-tuner-state
// document of a version this build reads, or a field Cairn shows has the
// wrong type; a trial folder that is not one plain path segment is damage
// too (the CLI never reads outside the experiment).
TunerState parse_tuner_state(std::string_view text, std::string_view source);

}  // namespace cairn::cli
