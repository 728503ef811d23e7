// Internal: the rank side of a sharded save, before anything is written.
// save_rank_shards() and the asynchronous sharded saves (async_save.cc)
// share it, so that both check specs the same way and write the same bytes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/sharded.h"
#include "cairn/state.h"

namespace cairn::format {

// What rank `rank` writes for `local` placed by `specs`.
struct RankPlan {
  // The rank's report without its file entries (filled in once the file is
  // written).
  RankShards report;
  // The key of the rank's file inside the checkpoint (rank_file_name()).
  std::string file;
  // `local`'s entries (shared, no bytes copied) plus the placement metadata
  // ("cairn.shards", "cairn.rank"): the state the rank file is saved from.
  StateDict file_state;
};

// Pure: checks the rank and every spec (each names a tensor of `local` and
// places it inside its global shape). kInvalidArgument naming the rank and
// the tensor at fault.
RankPlan plan_rank_file(const StateDict& local, const std::map<std::string, ShardSpec>& specs,
                        int rank);

// Pure: the checks build_layout() makes (each rank once; per tensor one dtype
// and global shape, shards inside it that tile it with no gap and no overlap
// other than identical replicas), without requiring the reports to list the
// files they name: for checking a whole sharded save before its files are
// written. kInvalidArgument naming the tensor and the ranks at fault.
void check_sharded_layout(const std::vector<RankShards>& ranks);

// Pure: a JSON array of sizes; kInvalidArgument naming `what` otherwise.
Shape shape_from_json(const nlohmann::json& j, std::string_view what);

// The layout of a checkpoint committed without one (the Trainer commits its
// ranks' files as they come) from the headers of its rank files (written by
// save_rank_shards: "cairn.shards" and "cairn.rank" say where each shard
// sits); nothing when no file is a rank file. Reads only the headers;
// kCorruption naming the file for a damaged one, kInvalidArgument (from
// build_layout) when the shards do not tile their tensors.
std::optional<nlohmann::json> layout_from_rank_files(const Checkpoint& checkpoint,
                                                     const Manifest& manifest);

}  // namespace cairn::format
