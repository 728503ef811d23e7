// Node-local views of remote checkpoints, shared between processes.
//
// The cache root (view_cache_root()) holds, for each checkpoint version in
// use (named B, a hash of its URI and manifest): the view directory B, and
// the files B.lock (serializes acquire, release and removal of B), B.users
// (each user holds a shared flock on it) and B.done (B is complete).
//
// Protocol:
//   lock B:  open B.lock (creating it), flock EX, then check that the path
//            still names the file locked (fstat/stat inode); if it was
//            unlinked meanwhile, start again. So B.lock can be removed while
//            others wait on it: they wake, see the change, and retry.
//   acquire: 1. lock B.
//            2. If B.done is missing, remove any partial B, download into B,
//               then create B.done. (Exactly one process downloads; the
//               others wait in step 1 and find B.done.)
//            3. flock(B.users, SH): this process now uses B.
//            4. Unlock B; then sweep (below) the views no one uses.
//   release: 1. lock B.
//            2. Drop our SH on B.users and try flock(B.users, EX | NB): if it
//               succeeds no one else uses B, so remove B, B.done, B.users and
//               (still holding it) B.lock.
//            3. Unlock B.
//   sweep:   for every other view C in the root: try to lock C without
//            waiting (a download in progress holds it: skip), then remove C
//            as in release step 2 if no one holds C.users.
// Locks held by a process that dies are released by the kernel, so a view
// whose only users were killed (or a download interrupted by a crash) is
// unused: the next acquire on the node, or `cairn gc`, removes it. Nothing
// is left once the last user is gone but the root folder itself.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cairn/checkpoint.h"

namespace cairn {

// The cache root: $CAIRN_CACHE_DIR, else $TMPDIR (or /tmp)/cairn-views-<uid>.
std::filesystem::path view_cache_root();

// Acquires the shared view of `checkpoint`; the returned handle releases it.
// `path` receives the view's directory.
std::shared_ptr<void> acquire_shared_view(const Checkpoint& checkpoint,
                                          std::filesystem::path& path);

// Removes every view in the cache root that no live process uses (left by
// killed users or interrupted downloads) and returns the paths removed; with
// `dry_run`, the paths that would be. A missing root is not an error.
std::vector<std::string> sweep_unused_views(bool dry_run = false);

}  // namespace cairn
