// Node-local scratch folders of the training runtime: one per attempt, on
// every node, under $TMPDIR (default /tmp) as cairn-train-XXXXXX. Workers'
// train::TemporaryDirectory folders live inside it.
//
// A folder is removed by its owner when the attempt ends, its `owner` file
// last. An owner killed by SIGKILL cannot do that, so each folder holds that
// `owner` file naming the process that made it (pid namespace, pid and the
// process's start time), and the next driver or agent on that node removes
// folders whose owner is gone. A folder of another pid namespace (another container sharing
// $TMPDIR), or without an owner file, is never touched.
//
// An attempt's folder is removed in the background (BackgroundRemover), so
// that a restart does not wait for the kernel to free what the failed
// attempt's workers wrote there (0.56 s for a 2 GiB file on this machine's
// disk, a third of a restart from the memory tier).
//
// Thread-safety: ScratchDir none needed; BackgroundRemover's remove() and
// its destructor are called by one thread. Failure: ScratchDir's constructor
// throws cairn::Error; the sweep and the remover never throw (they are best
// effort and log).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
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

// Removes folders on threads of its own. The threads call nothing but the
// file system (no log, no storage, no lock a forked worker could need), so
// the owner may fork workers while they run; what they could not remove is
// logged by the destructor, which waits for every removal. A folder whose
// removal a SIGKILL interrupts keeps its `owner` file and is swept later.
class BackgroundRemover {
 public:
  BackgroundRemover() = default;
  ~BackgroundRemover();
  BackgroundRemover(const BackgroundRemover&) = delete;
  BackgroundRemover& operator=(const BackgroundRemover&) = delete;
  // Starts removing `folder`.
  void remove(std::filesystem::path folder);

 private:
  struct Removal {
    std::filesystem::path folder;
    std::error_code error;  // written by the thread, read after join
    std::thread thread;
  };
  void join_finished();
  std::vector<std::unique_ptr<Removal>> removals_;
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
