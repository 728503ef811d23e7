// Sharded saves: each rank writes its own shards of global tensors; loading
// re-shards to any number of ranks.
//
// A shard is a box of a global tensor: `offsets` (where it starts in each
// dimension) and `shape` (its extent), stored row-major. A rank's state holds
// its shards as ordinary StateDict entries (shape = the shard's shape) plus a
// ShardSpec per entry saying where the box sits; an entry without a spec is a
// whole tensor that every rank may hold (a replica).
//
// Save protocol (ranks can be threads or processes; nothing is gathered
// through one process):
//   1. The committer reserves an uncommitted location (CheckpointManager::
//      reserve_next(), or any uncommitted Checkpoint).
//   2. Every rank calls save_rank_shards() on it: it writes one plain
//      safetensors file, "rank_<r>.safetensors", durably, whose __metadata__
//      "cairn.shards" records each shard's global shape and offsets, and
//      returns a RankShards report (JSON-serializable to send between
//      processes).
//   3. The committer calls commit_sharded() with every report: it checks
//      that the shards of each tensor tile its global shape exactly (no gap,
//      no overlap except identical replicas, one dtype), then commits with
//      Manifest::layout = the global layout (build_layout). Only then is the
//      checkpoint visible.
//
// Manifest::layout format ("cairn.sharded/1"):
//   {"format": "cairn.sharded/1", "world_size": 4,
//    "tensors": {"w": {"dtype": "F32", "shape": [8, 6],
//                      "shards": [{"file": "rank_00000.safetensors", "rank": 0,
//                                  "offsets": [0, 0], "shape": [2, 6]}, ...]}}}
//
// Asynchronous sharded saves (the snapshot in the call, the writes and the
// commit in the background): AsyncSaver::save_rank_shards, the rank side,
// and AsyncSaver::save_sharded, every rank of one process (async_save.h).
//
// Load: ShardedReader reads the layout of a committed checkpoint and fills
// any box of a global tensor from the saved shards that overlap it, so a
// state saved by 4 ranks loads into 2 or 3 (or 1). A checkpoint committed
// without a layout (the Trainer's: each rank reports its rank file like any
// other file) gets it from its rank files' headers ("cairn.shards",
// "cairn.rank"), so a Trainer run re-shards after an elastic restart.
//
// Thread-safety: save_rank_shards() may run concurrently for different ranks.
// A ShardedReader may be read from many threads.
//
// Failure: cairn::Error naming the tensor, rank and file at fault.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cairn/state.h"

namespace cairn {

inline constexpr std::string_view kShardedLayoutFormat = "cairn.sharded/1";
inline constexpr std::string_view kShardsMetadataKey = "cairn.shards";

// A box inside a global tensor.
struct Box {
  Shape offsets;
  Shape shape;
  bool operator==(const Box&) const = default;
};

// Where a rank's entry sits in its global tensor (the box's shape is the
// entry's shape).
struct ShardSpec {
  Shape global_shape;
  Shape offsets;
};

// The box rank `rank` of `world_size` holds when `global_shape` is split
// evenly along `dim` (the first size % world_size ranks get one more).
// kInvalidArgument for a bad dim or rank.
Box even_split(const Shape& global_shape, size_t dim, int rank, int world_size);

// What one rank wrote.
struct RankShards {
  struct Shard {
    std::string tensor;
    DType dtype = DType::kU8;
    Shape global_shape;
    Box box;
    std::string file;  // key inside the checkpoint
  };
  int rank = 0;
  std::vector<ManifestEntry> files;
  std::vector<Shard> shards;

  nlohmann::json to_json() const;
  // kInvalidArgument naming the field if `j` is not a RankShards.
  static RankShards from_json(const nlohmann::json& j);
};

// The file name of rank `rank`'s shards ("rank_00003.safetensors").
std::string rank_file_name(int rank);

// Rank side: writes `local`'s entries (placed by `specs`) as this rank's
// file into the uncommitted `dest`, durably. kInvalidArgument naming the
// tensor if a spec does not fit its global shape.
RankShards save_rank_shards(const StateDict& local, const std::map<std::string, ShardSpec>& specs,
                            const Checkpoint& dest, int rank, const SaveOptions& options = {});

// Pure: the global layout of every rank's shards, after checking that each
// tensor's shards tile its global shape exactly. kInvalidArgument naming the
// tensor and the ranks at fault.
nlohmann::json build_layout(const std::vector<RankShards>& ranks);

// Commits a sharded save into a location reserved by `manager`.
CheckpointRecord commit_sharded(CheckpointManager& manager, const Checkpoint& reserved,
                                const std::vector<RankShards>& ranks,
                                const nlohmann::json& metrics = nlohmann::json::object());
// Commits a sharded save into any uncommitted checkpoint.
Manifest commit_sharded(const Checkpoint& dest, const std::vector<RankShards>& ranks,
                        const nlohmann::json& metrics = nlohmann::json::object());

// Pure re-sharding plan: for a wanted box, which parts of which saved shards
// to copy where. Shards that only repeat an earlier identical box are skipped.
struct CopyRegion {
  size_t shard = 0;  // index into the saved shards
  Box src;           // relative to the saved shard
  Box dst;           // relative to the wanted box
};
// kInvalidArgument if the saved shards do not cover the wanted box.
std::vector<CopyRegion> plan_read(const std::vector<Box>& saved, const Box& wanted);

// Copies the box `src` of a row-major tensor of `src_shape` into the box
// `dst` of a row-major tensor of `dst_shape` (same extents), element size
// `elem` (pure; contiguous runs become one memcpy).
void copy_box(std::span<const std::byte> src_data, const Shape& src_shape, const Box& src,
              std::span<std::byte> dst_data, const Shape& dst_shape, const Box& dst, size_t elem);

class ShardedReader {
 public:
  // Reads and validates the layout of a committed sharded checkpoint (from
  // the manifest, else from the headers of its rank files). kCorruption
  // naming the checkpoint if there is neither, or either is malformed.
  explicit ShardedReader(const Checkpoint& checkpoint);
  ~ShardedReader();
  ShardedReader(ShardedReader&&) noexcept;

  struct GlobalTensor {
    std::string name;
    DType dtype = DType::kU8;
    Shape shape;
  };
  std::vector<GlobalTensor> tensors() const;
  int world_size() const;

  // Fills `out` (row-major, box.shape, the tensor's dtype) with the box of
  // tensor `name`. kNotFound naming the tensor; kInvalidArgument if the box
  // leaves the tensor or `out` has the wrong size.
  void read(std::string_view name, const Box& box, std::span<std::byte> out) const;

  // Fills every writable entry of `local`: an entry with a spec gets its box,
  // one without gets the whole tensor. Checks dtype and global shape; with
  // `strict`, also that every entry was found (not that every saved tensor
  // was wanted: a rank may load a subset). kInvalidArgument listing problems.
  LoadReport load(StateDict& local, const std::map<std::string, ShardSpec>& specs,
                  bool strict = true) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
