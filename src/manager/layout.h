// The files a CheckpointManager keeps in an experiment folder beside the
// checkpoint folders. Defined here, once; the experiment layer
// (experiment/layout.h) re-exports them with the experiment's other names.
// Pure constants: no I/O, safe from any thread.
#pragma once

#include <string_view>

namespace cairn::manager_layout {

// The experiment's lock (Storage::try_lock): one writer per experiment.
inline constexpr std::string_view kLockKey = ".cairn.lock";
// The history's snapshot (manager/history.h) and its log folder.
inline constexpr std::string_view kHistoryKey = "checkpoint_manager.json";
inline constexpr std::string_view kHistoryLogPrefix = "checkpoint_manager.log";
// Retired checkpoints' files waiting for the deleter (manager.cc): each
// retired checkpoint's folder name under it, holding no manifest. Never part
// of the experiment: listings, copies and experiment discovery skip it, and
// the manager's open and `cairn gc` empty it.
inline constexpr std::string_view kTrashPrefix = ".cairn.trash";

}  // namespace cairn::manager_layout
