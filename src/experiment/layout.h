// The experiment folder's file names, defined once for every part above the
// manager (train/, tune/, cli/, transfer):
//
//   <storage_path>/<experiment>/
//     .cairn.lock                 the experiment's lock (the manager's)
//     checkpoint_manager.json     the checkpoint history (the manager's) and
//     checkpoint_manager.log/     its log
//     checkpoint_000000/ ...      committed checkpoints
//     trainer_state.json          a Trainer run's configuration and status
//                                 (experiment/trainer_state.h)
//     result.json, progress.csv,  a run's result rows (train/results.h)
//     events.out.tfevents.*
//     params.json                 a Tuner trial's config
//     tuner_state.json            a Tuner experiment's state
//                                 (experiment/tuner_state.h)
//     .cairn_clones/              PBT's staged checkpoint copies (the Tuner's)
//     trial_00000/ ...            a Tuner experiment's trials, each of the
//                                 Trainer's shape above
// Pure constants: no I/O, safe from any thread.
#pragma once

#include <string_view>

#include "manager/layout.h"

namespace cairn::experiment {

inline constexpr std::string_view kLockKey = manager_layout::kLockKey;
inline constexpr std::string_view kManagerHistoryKey = manager_layout::kHistoryKey;
inline constexpr std::string_view kManagerLogPrefix = manager_layout::kHistoryLogPrefix;
inline constexpr std::string_view kTrashPrefix = manager_layout::kTrashPrefix;

inline constexpr std::string_view kTrainerStateKey = "trainer_state.json";
inline constexpr std::string_view kTunerStateKey = "tuner_state.json";
inline constexpr std::string_view kParamsKey = "params.json";

inline constexpr std::string_view kResultJsonKey = "result.json";
inline constexpr std::string_view kProgressCsvKey = "progress.csv";
inline constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

inline constexpr std::string_view kClonesFolder = ".cairn_clones";
// The metadata key of a trial's checkpoint copied from another trial (PBT's
// exploit): "<trial id>/<checkpoint name>" it was copied from. Such a
// checkpoint was not reported by the trial, so no result row is written
// for it when a restore backfills rows.
inline constexpr std::string_view kClonedFromKey = "cairn.cloned_from";

}  // namespace cairn::experiment
