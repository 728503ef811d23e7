// What each `cairn` command found, as plain data, and its two renderings:
// a JSON document (the schema in docs/cli.md, schema_version 1) and a
// human-readable text. Collecting the data (commands.cc) is the only part
// that touches storage; everything here is pure and unit-tested.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"

namespace cairn::cli {

inline constexpr int kSchemaVersion = 1;

// ---- ls ---------------------------------------------------------------

struct CheckpointRow {
  std::string name;                    // "checkpoint_000003"
  uint64_t index = 0;                  // 3
  std::string uri;                     // where it lives
  bool committed = false;              // false: the leftover of an interrupted save
  std::optional<double> time;          // committed: created_at; leftover: newest file's mtime
  std::optional<uint64_t> size_bytes;  // committed: manifest total; leftover: files present
  std::optional<uint64_t> file_count;
  nlohmann::json metrics;  // as reported; null for leftovers
  bool pinned = false;     // kept by keep_checkpoint_every_n_hours
  std::string error;       // why the manifest could not be read ("" when it could)
  // Where it is held: the experiment's storage, and/or this host's memory
  // tier (docs/memory-tier.md; `uri` is then the tier's copy when the
  // experiment's storage has none).
  bool persistent = true;
  bool in_memory = false;
};

struct TunerView;

struct ExperimentView {
  std::string name;  // relative to the listed URI; "" when the URI is the experiment
  std::string uri;
  std::string error;              // why its history could not be read ("" when it could); the
                                  // checkpoints are then listed from their own manifests
  CheckpointConfig config;        // as last persisted by its manager
  std::vector<std::string> best;  // committed names, best first
  std::vector<CheckpointRow> checkpoints;  // committed and leftovers, in index order
  // Set for a Tuner experiment (a folder holding tuner_state.json): its trials,
  // each a Trainer experiment of its own. `config`, `best` and `checkpoints`
  // are then unused, and `error` says why tuner_state.json could not be read.
  std::shared_ptr<const TunerView> tuner;
};

// One trial of a Tuner experiment: what tuner_state.json says of it, and the
// checkpoints of its folder (read from the folder itself, which is newer than
// the periodically saved state).
struct TrialView {
  std::string trial_id;
  std::string dir;  // its folder, relative to the experiment
  std::string uri;
  std::string status;           // as in tuner_state.json; "UNKNOWN" when not listed there
  bool in_state = false;        // listed in tuner_state.json
  bool folder_missing = false;  // listed there, but its folder does not exist
  nlohmann::json config;        // tuner_state.json's (params.json's when not listed); or null
  nlohmann::json last_result;   // tuner_state.json's; or null
  int64_t num_failures = 0;
  std::optional<std::string> error;  // the trial's failure, from tuner_state.json
  // The folder as a Trainer experiment: its checkpoints, retention, and in
  // `error` why its history (or params.json) could not be read.
  ExperimentView folder;
};

struct TunerView {
  std::string metric;  // "" when none
  std::string mode;    // "min", "max" or ""
  std::optional<double> updated_at;
  std::vector<TrialView> trials;  // tuner_state.json's order, then unlisted folders by name
};

struct LsView {
  std::string uri;
  std::vector<ExperimentView> experiments;
};

nlohmann::ordered_json to_json(const LsView& view);
std::string to_text(const LsView& view);

// ---- show -------------------------------------------------------------

struct FileRow {
  std::string path;
  uint64_t size = 0;
  std::optional<uint64_t> xxh3;  // from the manifest; absent for uncommitted files
};

// `cairn show` of a trial folder: the trial, how many results it reported
// (complete lines of result.json) and its latest.
struct TrialShowView {
  TrialView trial;
  std::string experiment_uri;  // the Tuner experiment; "" when its parent holds no tuner_state.json
  std::optional<double> state_updated_at;  // when that tuner_state.json was saved
  std::string metric;                      // the tuner's metric, "" when none
  std::string mode;
  uint64_t result_count = 0;
};

struct ShowView {
  std::optional<TrialShowView> trial;  // set when the path is a trial folder, not a checkpoint
  std::string uri;
  bool committed = false;
  std::optional<Manifest> manifest;  // present when committed and readable
  // Set when committed but the manifest cannot be read (damaged after the
  // commit): why; `files` then lists the files present, for salvage.
  std::optional<std::string> damage;
  std::vector<FileRow> files;  // the manifest's files, or those present when uncommitted
  nlohmann::json metadata = nlohmann::json::object();
};

nlohmann::ordered_json to_json(const ShowView& view);
std::string to_text(const ShowView& view);

// ---- verify -----------------------------------------------------------

struct VerifiedCheckpoint {
  std::string uri;
  uint64_t files = 0;  // files listed in its manifest (0 when unreadable)
  uint64_t bytes = 0;
  bool ok = false;
};

struct VerifyIssue {
  std::string checkpoint;  // URI of the checkpoint (or experiment) holding the bad file
  std::string path;        // relative to it: "model.bin", ".cairn/manifest.json", ...
  std::string reason;
};

struct VerifyView {
  std::string uri;
  std::vector<VerifiedCheckpoint> checkpoints;
  std::vector<VerifyIssue> problems;
  std::vector<std::string> skipped;  // URIs of uncommitted leftovers, not verified
  bool ok() const { return problems.empty(); }
};

nlohmann::ordered_json to_json(const VerifyView& view);
std::string to_text(const VerifyView& view);

// ---- gc ---------------------------------------------------------------

struct GcView {
  std::string uri;
  bool dry_run = false;
  std::vector<std::string> removed;  // URIs removed (or that would be, with dry_run)
  std::vector<std::string> skipped;  // "<experiment uri>: <why>"
};

nlohmann::ordered_json to_json(const GcView& view);
std::string to_text(const GcView& view);

// ---- output -----------------------------------------------------------

// What a command prints for `view`: its JSON document (indented, with a
// newline) or its text. Bytes that are not valid UTF-8, such as a file name
// written by another tool, are printed as \xNN, so the output is always
// valid UTF-8 and valid JSON.
std::string render_json(const nlohmann::ordered_json& document);
std::string render_text(std::string_view text);
template <typename View>
std::string render(const View& view, bool json) {
  return json ? render_json(to_json(view)) : render_text(to_text(view));
}

// ---- errors -----------------------------------------------------------

// The one line printed on stderr when a command fails: "cairn: error: <message>".
std::string error_line(std::string_view message);

}  // namespace cairn::cli
