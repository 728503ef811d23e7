// The driver: runs attempts of a group until the training finishes or the
// failure budget is spent, commits distributed checkpoints and keeps the
// trainer's state in the experiment folder.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/train.h"
#include "train/control/group.h"
#include "train/control/tier_hosts.h"

namespace cairn::train_internal {

using GroupFactory = std::function<std::unique_ptr<Group>(const LaunchSpec&)>;

// A released report round, as the tuning runtime sees it (DriverSpec::on_round).
struct RoundInfo {
  // The history row the round added (result.json's line); null for a round
  // that only attached a checkpoint to the previous row (report_checkpoint).
  nlohmann::json row;
  std::optional<std::string> checkpoint;  // the folder name committed this round
  std::vector<std::string> kept;          // every kept checkpoint after retention, oldest first
};

// What the driver does after a round (DriverSpec::on_round's answer).
struct RoundDirective {
  // Ask the ranks for a checkpoint: the release carries a save request
  // (take_save_request() in the worker).
  bool save = false;
  // End the run: at once (without releasing the ranks) when !save; with
  // save, once a checkpoint reported after the request is committed, or
  // when FailureConfig::preemption_grace_s has passed (the preemption path:
  // should_checkpoint() is true in the ranks). The run then ends finished,
  // or preempted, as Result says.
  bool stop = false;
  // With save and stop: the run ends here by the caller's decision (a
  // Tuner's checkpoint_at_end), not a pause to be resumed; once that
  // checkpoint is committed the run ends "stopped", without an error, as
  // a stop without a save does.
  bool ends_run = false;
  // PBT's exploit in place (a class trainable's reset_config): commit the
  // checkpoint at reset["checkpoint"] (a committed checkpoint's URI) into
  // this run with reset["metrics"] as its newest checkpoint, make
  // reset["config"] the run's config (also for later restarts), and send
  // both to the ranks with the release (take_reset_request() in the worker).
  std::optional<nlohmann::json> reset;
};

// Where the driver's time went in one released round (DriverSpec::
// on_round_timing), in seconds of the steady clock. For a round without a
// checkpoint the upload fields equal last_report and committed the release.
struct RoundTiming {
  int attempt = 0;           // TrainContext::attempt
  int round = 0;             // the attempt's report() call, from 1
  int uploaders = 0;         // ranks that passed a checkpoint
  double first_report = 0;   // the first rank's report arrived
  double last_report = 0;    // the last rank's report arrived
  double upload_begun = 0;   // the location reserved and sent to every uploader
  double last_uploaded = 0;  // the last uploader said its files are durable
  double committed = 0;      // commit_reserved returned (manifest and manager history)
  double released = 0;       // the run's history written and every rank released
};

struct DriverSpec {
  TrainFn train_fn;
  nlohmann::json train_loop_config;
  int world_size = 1;  // the most ranks an attempt has
  // Elastic groups (ScalingConfig::min_workers): called before each restart
  // for the number of ranks the next attempt can have (the group factory
  // then starts that many); an attempt with fewer than min_world_size ends
  // the run. Unset: every attempt has world_size ranks.
  std::function<int()> ranks_available;
  int min_world_size = 0;
  // Stored as trainer_state.json's num_workers for Trainer::restore when
  // set (an elastic group's largest size); else world_size.
  int stored_num_workers = 0;
  RunConfig run;  // name and storage_path resolved
  std::optional<Checkpoint> resume_from_checkpoint;
  bool restoring = false;
  std::string experiment_uri;
  std::string experiment_path;  // as shown to users (a plain path for local storage)
  // Called once the experiment is open and locked, before the first group
  // starts (the MPI launcher checks that every node sees the storage here).
  std::function<void()> before_start;
  // Rendezvous (TrainContext::master_addr/master_port): each attempt reserves
  // a port on `rendezvous_bind` (net.h, PortReservation; "" = every
  // interface) and tells the ranks to reach it at `rendezvous_address`.
  std::string rendezvous_bind = "127.0.0.1";
  std::string rendezvous_address = "127.0.0.1";
  // Called for every released round, after its history is written and
  // before its ranks go on (the Tuner's trial runner asks its scheduler
  // here). An exception fails the round like a failed commit.
  std::function<RoundDirective(const RoundInfo&)> on_round;
  // A Tuner trial's rule (Ray Tune's): an attempt takes training_iteration
  // from the checkpoint it resumes from (0 without one), so the rounds a
  // restart repeats are not counted twice, and each committed checkpoint's
  // metrics carry the training_iteration it was taken at. Otherwise a row's
  // training_iteration is its number in the history (1, 2, ...).
  bool iteration_from_checkpoint = false;
  // Passed to the experiment's CheckpointManager (ManagerOptions::before_delete).
  std::function<std::vector<std::string>(const std::vector<std::string>& doomed,
                                         const std::vector<std::string>& kept)>
      before_retention;
  // Remove the scratch folders of dead drivers at the start (the Tuner does
  // it once for all its trials instead).
  bool sweep_scratch = true;
  // Filled by run_driver when given: how the run ended, as trainer_state.json
  // records it ("finished", "stopped" by on_round, "preempted", "errored"),
  // and the group failures it restarted from.
  struct Outcome {
    std::string status;
    int failures = 0;
  };
  Outcome* outcome = nullptr;
  // The memory tier across the hosts of a multi-host launch (tier_hosts.h);
  // null: the tier, if any, serves this host alone.
  TierHosts* tier_hosts = nullptr;
  // Benchmarks (bench/scale_bench.cc): called after each released round.
  std::function<void(const RoundTiming&)> on_round_timing;
};

Result run_driver(const DriverSpec& spec, const GroupFactory& start_group);

// Throws kInvalidArgument naming `who` and the field when `config` asks for
// the checkpoint triggers of class trainables (checkpoint_frequency,
// checkpoint_at_end): a train_fn decides in its own loop when to checkpoint.
void refuse_class_trainable_triggers(const CheckpointConfig& config, std::string_view who);

}  // namespace cairn::train_internal
