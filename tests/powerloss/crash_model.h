// The power-loss harness's pure part: a recorded trace of file-system calls
// in, the file-system states a power cut may leave out. No I/O here: the
// recorder (recorder.cc) writes traces, the test materializes states.
//
// The persistence model (a conservative reading of ext4 with data=ordered,
// the default journaling mode; docs/crash-testing.md):
//   - Directory operations (create, mkdir, rmdir, unlink, rename, link) are
//     each atomic and reach the disk in program order: jbd2 commits
//     transactions in sequence, so what survives is a prefix of them. With
//     Model::kPerDirectory the order holds only within each directory (a
//     weaker, POSIX-like file system), so directories may diverge.
//   - fsync of a directory makes every directory operation before it durable
//     (with kPerDirectory: the operations on names in that directory); sync
//     and syncfs make everything before them durable.
//   - fsync/fdatasync of a file makes that file's earlier writes, truncates
//     and fallocates durable, and nothing else: not its name (no reliance on
//     ext4 committing the whole journal on fsync, which fast_commit breaks).
//   - A file operation (write, truncate, fallocate) not yet made durable may
//     be lost, survive whole or, for a write, survive in part: any subset of
//     its 512-byte sectors (aligned to the file offset), in any order relative
//     to the file's other unsynced writes. A surviving piece past the file's
//     size extends it, with zeros in any gap (data=ordered never shows stale
//     blocks; a hole or unwritten extent reads as zeros). O_DIRECT writes are
//     treated as any other write: until an fsync the extent conversion that
//     makes them visible is not durable.
//   - What was on disk before the trace started is durable.
//
// A crash point is a position in the trace: the operations before it were
// issued, the rest never were. The generator takes one crash point before
// every fsync, fdatasync, directory fsync and sync, and one at the end.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::powerloss {

enum class OpKind {
  kCreate,     // path, inode: a new empty file named path
  kMkdir,      // path
  kRmdir,      // path
  kUnlink,     // path
  kRename,     // path -> path2 (files)
  kLink,       // path -> path2
  kWrite,      // inode, offset, data
  kTruncate,   // inode, length
  kFallocate,  // inode, mode, offset, length
  kFsync,      // inode (fsync and fdatasync alike)
  kFsyncDir,   // path
  kSync,       // everything
  kMark,       // path holds the workload's text; no effect on the file system
};

struct Op {
  OpKind kind;
  std::string path;
  std::string path2;
  uint64_t inode = 0;  // the model's inode (not the recorded st_ino)
  uint64_t offset = 0;
  uint64_t length = 0;
  int mode = 0;
  std::string data;
};

// A file-system image: folders and files, relative to the root ("" is the
// root, always present).
struct Image {
  std::set<std::string> dirs;
  std::map<std::string, std::string> files;
  bool operator==(const Image&) const = default;
};

// A parsed trace, with the recorded inode numbers mapped to the model's
// (an inode number the file system reuses becomes a new model inode).
struct Trace {
  std::vector<Op> ops;
  // Opens with O_DIRECT seen, for the report.
  int direct_opens = 0;
};

// Parses the recorder's trace. `initial` is the state before the trace (its
// files get model inodes as the trace opens them). Records, one per line:
//   create INO PATH | open INO FLAGS_HEX PATH | mkdir PATH | rmdir PATH |
//   unlink PATH | rename PATH PATH | link PATH PATH | trunc INO LEN |
//   falloc INO MODE OFF LEN | fsync INO | fdatasync INO | fsyncdir PATH |
//   sync | mark TEXT | write INO OFF LEN\n<LEN bytes>\n
// Paths are relative to the root, with ' ', '\n', '\r' and '%' written %XX.
// Throws std::runtime_error on a malformed trace.
Trace parse_trace(std::string_view text, const Image& initial);

enum class Model { kExt4Ordered, kPerDirectory };

// Which surviving operations make up one crash state (what the generator
// chose); see CrashStates::build.
struct Choice {
  size_t crash_point = 0;                    // operations [0, crash_point) were issued
  std::map<std::string, size_t> prefix;      // directory-op group -> how many survive
  std::map<size_t, int> fate;                // unsynced file op index -> 0 lost, 1 whole, 2 torn
  std::map<size_t, std::vector<bool>> torn;  // op index -> which sectors survive
};

struct CrashState {
  Choice choice;
  Image image;
};

// One line naming an operation ("rename a/.x.cairn-tmp-1 a/x").
std::string describe(const Op& op);

class CrashStates {
 public:
  CrashStates(const Trace& trace, Image initial, Model model);

  // Crash points: before each fsync, fdatasync, fsyncdir and sync, and the
  // end of the trace.
  const std::vector<size_t>& crash_points() const { return points_; }

  // The states at one crash point: the least that may survive, everything
  // issued, each length of each directory-op group's unsynced tail (with
  // unsynced file ops lost, and kept), and `samples` random choices drawn
  // from `rng` (a random earlier cut since the previous crash point, random
  // directory-op prefixes, each unsynced file op lost, whole or torn).
  std::vector<CrashState> states_at(size_t crash_point, int samples, std::mt19937_64& rng) const;

  // The image a choice leaves.
  Image build(const Choice& choice) const;

  // The image with every issued operation applied (what a process crash
  // leaves).
  Image issued(size_t crash_point) const;

  // For failure messages: the crash point, the last operations issued
  // before it, and what the choice lost or tore.
  std::string describe(const Choice& choice) const;

  const Trace& trace() const { return trace_; }

 private:
  std::string group_of(const Op& op) const;
  // Per crash point: the directory-op groups, each op's index in its group,
  // and how many of each group are durable.
  struct Durability {
    std::map<std::string, size_t> total;
    std::map<std::string, size_t> durable;
    std::vector<size_t> unsynced_file_ops;
  };
  Durability durability(size_t crash_point) const;

  const Trace& trace_;
  Image initial_;
  Model model_;
  std::vector<size_t> points_;
};

// The model inode numbers the initial image's files get: parse_trace numbers
// them 1..n in path order, and new files from n + 1.
uint64_t initial_inode(const Image& initial, const std::string& path);

}  // namespace cairn::powerloss
