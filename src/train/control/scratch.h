// Node-local scratch folders of the training runtime: one per attempt, on
// every node, under $TMPDIR (default /tmp) as cairn-train-XXXXXX. Workers'
// train::TemporaryDirectory folders live inside it.
//
// A folder is removed by its owner when the attempt ends. An owner killed by
// SIGKILL cannot do that, so each folder holds an `owner` file naming the
// process that made it (pid namespace, pid and the process's start time),
// and the next driver or agent on that node removes folders whose owner is
// gone. A folder of another pid namespace (another container sharing
// $TMPDIR), or without an owner file, is never touched.
//
// Thread-safety: none needed. Failure: ScratchDir's constructor throws
// cairn::Error; the sweep never throws (it is best effort and logs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::train_internal {

class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
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
