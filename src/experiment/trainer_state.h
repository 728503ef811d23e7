// trainer_state.json: a Trainer run's configuration, failure count and how
// it ended, in its experiment folder. This is its one reader and its one
// writer; train/ (the driver, Trainer::restore, Result::from_path) and tune/
// (a trial's reconciliation) use them.
// Thread-safety: free functions; concurrent calls on one experiment are
// serialized by the experiment's lock, which the writer's caller holds.
// Durability: written whole with Storage::put (atomic replace), so a reader
// sees the old state or the new one, never a mix.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "cairn/storage.h"

namespace cairn::experiment {

inline constexpr std::string_view kTrainerStateFormat = "cairn-trainer-state";
inline constexpr int kTrainerStateVersion = 1;

// The trainer state of the experiment at `experiment_uri`: null if absent;
// kCorruption naming the file if it is not a Cairn trainer state (malformed,
// nested too deeply, not an object of the right format, or a field that
// restore and the driver read has the wrong type).
nlohmann::json read_trainer_state(std::string_view experiment_uri);

// Replaces the experiment's trainer state with `state` (Storage::put).
// Storage errors pass through.
void write_trainer_state(Storage& experiment, const nlohmann::json& state);

}  // namespace cairn::experiment
