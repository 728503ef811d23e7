// Node-local views of remote checkpoints, shared between processes.
//
// Protocol, for the view directory D of one checkpoint version (named by a
// hash of its URI and manifest) under the node's cache root:
//   acquire: 1. flock(D.lock, EX).
//            2. If D.done is missing, remove any partial D and download into
//               D, then create D.done. (Exactly one process downloads; the
//               others wait in step 1 and find D.done.)
//            3. flock(D.users, SH): this process now uses D.
//            4. Release D.lock.
//   release: 1. flock(D.lock, EX), so no one can acquire meanwhile.
//            2. Drop our SH on D.users, then try flock(D.users, EX | NB): if
//               it succeeds no one else uses D, so remove D and D.done.
//            3. Release D.lock.
// Locks held by a process that dies are released by the kernel; a download
// interrupted by a crash has no D.done and is redone by the next acquirer.
#pragma once

#include <filesystem>
#include <memory>

#include "cairn/checkpoint.h"

namespace cairn {

// The cache root: $CAIRN_CACHE_DIR, else $TMPDIR (or /tmp)/cairn-views-<uid>.
std::filesystem::path view_cache_root();

// Acquires the shared view of `checkpoint`; the returned handle releases it.
// `path` receives the view's directory.
std::shared_ptr<void> acquire_shared_view(const Checkpoint& checkpoint,
                                          std::filesystem::path& path);

}  // namespace cairn
