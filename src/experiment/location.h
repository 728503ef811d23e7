// Where an experiment folder is: its name and the storage path that holds
// it, resolved from what a user passed (RunConfig, a restore path), and
// whether a folder already holds an experiment.
// Thread-safety: free functions over their arguments; safe from any thread.
// Failure: kInvalidArgument naming the field or path at fault; storage
// errors pass through as the storage raises them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "cairn/storage.h"

namespace cairn::experiment {

// Throws kInvalidArgument naming `field` unless `name` is one path component:
// not "", "." or "..", without '/', '\\' or NUL. An experiment name is a
// folder directly under storage_path; anything else could nest one experiment
// inside another.
void check_experiment_name(std::string_view name, std::string_view field);

// The default RunConfig::name for a run started at `now`, with `random` as its
// suffix: "cairn_train_2024-05-01_12-00-00.123456_1a2b3c" (local time,
// microseconds, 24 random bits), so that runs started at once, or one right
// after the other, never share a folder. Pure apart from the time zone.
std::string default_run_name(std::chrono::system_clock::time_point now, uint32_t random);

// Where Trainer::restore(path) finds the experiment: `path` itself, as the
// storage path (its parent folder or URI prefix) and the name (its last
// component). A leading "~" is the home directory; a relative path is made
// absolute. kInvalidArgument when `path` has no last component.
struct ExperimentParts {
  std::string storage_path;
  std::string name;
};
ExperimentParts split_experiment_path(std::string_view path);

// The normalized URI of the experiment folder at `path` (split_experiment_path).
std::string experiment_uri_of(std::string_view path);

// Resolves RunConfig's storage_path and name: a leading "~" in
// `storage_path` (or, when it is empty, $CAIRN_STORAGE_PATH through
// util/settings.h) is the home directory, a relative path is made absolute,
// an empty name gets default_run_name(); a bad name is kInvalidArgument
// naming RunConfig::name.
struct ExperimentLocation {
  std::string name;
  std::string storage_path;
  std::string uri;   // normalized URI of the experiment folder
  std::string path;  // a plain path for local storage, else the URI
};
ExperimentLocation locate_experiment(std::string_view storage_path, std::string_view name);

// Whether the folder holds an experiment: a trainer state, a manager
// history, or checkpoint folders (committed or not).
bool holds_experiment(Storage& storage);

}  // namespace cairn::experiment
