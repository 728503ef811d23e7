// The `cairn` commands' data collection: the only part of the CLI that
// reads storage. Each function takes the user's PATH (a plain path, file://
// or memory:// URI), throws cairn::Error naming the thing at fault, and
// returns the plain data that views.h renders.
//
// ls, show and verify only read: they take no lock and change nothing, so
// they are safe next to a live training run. gc removes leftovers (see
// cairn::collect_garbage for how it stays out of a live writer's way).
#pragma once

#include <string_view>

#include "cli/views.h"

namespace cairn::cli {

// Experiments at or directly below `path` and their checkpoints: from each
// experiment's history and one listing of its folder (manager/scan.h), each
// checkpoint's size and file count from its history record. `check` (`ls
// --check`) reads every committed checkpoint's manifest as well, so that one
// that is missing or unreadable is flagged in its row's error.
LsView collect_ls(std::string_view path, bool check = false);
// One checkpoint: its files, manifest and metadata.
ShowView collect_show(std::string_view path);
// Every committed checkpoint at `path` (a checkpoint, an experiment or a
// storage root) checked against its manifest.
VerifyView collect_verify(std::string_view path);
// Removes (or with dry_run, lists) the leftovers of interrupted saves.
GcView collect_gc(std::string_view path, bool dry_run);
// Frees (or with dry_run, lists) the memory tiers of dead runs under `root`
// ("" for the default root): collect_memory_tiers.
GcView collect_gc_memory_tiers(std::string_view root, bool dry_run);

}  // namespace cairn::cli
