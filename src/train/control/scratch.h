// Node-local scratch folders of the training runtime: one per attempt, on
// every node, under $TMPDIR (default /tmp) as cairn-train-XXXXXX. Workers'
// train::TemporaryDirectory folders live inside it.
//
// A folder is removed by its owner when the attempt ends, its `owner` file
// last. An owner killed by SIGKILL cannot do that, so each folder holds that
// `owner` file naming the process that made it (pid namespace, pid and the
// process's start time), and the next driver or agent on that node removes
// folders whose owner is gone. A folder of another pid namespace (another
// container sharing $TMPDIR), or without an owner file, is never touched.
//
// An attempt's folder is removed in the background (BackgroundRemover), so
// that a restart does not wait for the kernel to free what the failed
// attempt's workers wrote there (0.56 s for a 2 GiB file on this machine's
// disk, a third of a restart from the memory tier).
//
// Thread-safety: none needed (one thread uses each object). Failure:
// ScratchDir's constructor throws cairn::Error; the sweep and the remover
// never throw (they are best effort and log).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::train_internal {

class BackgroundRemover;

class ScratchDir {
 public:
  // The destructor removes the folder, or hands it to `remover` (which must
  // outlive this object) to be removed in the background.
  explicit ScratchDir(BackgroundRemover* remover = nullptr);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  BackgroundRemover* remover_;
};

// Removes folders in a child process, so that the owner goes on meanwhile.
// Not a thread: the owner forks workers right after an attempt ends, and a
// thread inside the allocator, the log or a library when a worker is forked
// would leave that lock held forever in the worker (a sanitizer build's
// allocator does hang so). remove() only queues a folder; start() forks the
// child that removes the queued folders, and is called where the owner
// forks its workers anyway (after the manager's deleter has stopped), so
// the process is no less safe to fork than before. The destructor waits for
// the children and removes what is still queued itself. A folder whose
// removal a SIGKILL interrupts keeps its `owner` file and is swept later.
class BackgroundRemover {
 public:
  BackgroundRemover() = default;
  ~BackgroundRemover();
  BackgroundRemover(const BackgroundRemover&) = delete;
  BackgroundRemover& operator=(const BackgroundRemover&) = delete;
  // Queues `folder` for the next start() (or the destructor).
  void remove(std::filesystem::path folder);
  // Forks a child that removes the queued folders (none queued: nothing);
  // first reaps the children of earlier calls, waiting for any still running.
  void start();

 private:
  struct Removal {
    std::vector<std::filesystem::path> folders;
    int pid = -1;
  };
  void reap();
  std::vector<std::filesystem::path> queued_;
  std::vector<Removal> running_;
};

// Removes the scratch folders in $TMPDIR whose owner process is gone and
// returns them.
std::vector<std::filesystem::path> sweep_dead_scratch_dirs();

// Pure parts, for tests.
struct ScratchOwner {
  std::string pid_namespace;  // e.g. "pid:[4026531836]"
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat
};
std::string format_owner(const ScratchOwner& owner);
std::optional<ScratchOwner> parse_owner(std::string_view text);
// The start time (field 22) from the text of /proc/<pid>/stat, whose second
// field, the command name, may hold spaces and parentheses.
std::optional<uint64_t> stat_start_time(std::string_view stat_text);

}  // namespace cairn::train_internal
