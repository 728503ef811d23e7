// cairn_bench --reshard: see reshard.h.
#include "reshard.h"

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cairn/manager.h"
#include "cairn/sharded.h"
#include "cairn/state.h"

namespace cairn::bench {

namespace {

// Bytes this process has caused to be read from storage so far.
uint64_t read_bytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (f >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  throw std::runtime_error("no read_bytes in /proc/self/io");
}

Shape to_shape(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

int bench_reshard(const Options& opts, const std::vector<TensorSpec>& specs,
                  const std::vector<FloatBuffer>& state) {
  const auto dir = opts.dir / "reshard";
  std::filesystem::remove_all(dir);
  CheckpointManager manager(dir.string(), CheckpointConfig{}, ManagerOptions{});
  Checkpoint reserved = manager.reserve_next();
  std::vector<RankShards> reports;
  for (int rank = 0; rank < 2; ++rank) {
    StateDict local;
    std::map<std::string, ShardSpec> placement;
    std::vector<std::vector<float>> parts;  // this rank's rows of each tensor
    parts.reserve(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const Shape global = to_shape(specs[i].shape);
      const Box box = even_split(global, 0, rank, 2);
      uint64_t row = 1;
      for (size_t d = 1; d < global.size(); ++d) row *= global[d];
      const float* from = state[i].data() + box.offsets[0] * row;
      parts.emplace_back(from, from + num_elements(box.shape));
      local.add<float>(specs[i].name, box.shape, parts.back());
      placement[specs[i].name] = {global, box.offsets};
    }
    reports.push_back(save_rank_shards(local, placement, reserved, rank));
  }
  CheckpointRecord rec = commit_sharded(manager, reserved, reports);

  const uint64_t loaded = total_bytes(specs);
  uint64_t read = 0;
  double seconds = 0;
  std::string cache_drop;
  for (int rank = 0; rank < 4; ++rank) {
    cache_drop = drop_caches({dir});
    std::vector<std::vector<float>> mine;
    mine.reserve(specs.size());
    StateDict target;
    std::map<std::string, ShardSpec> placement;
    for (const auto& s : specs) {
      const Shape global = to_shape(s.shape);
      const Box box = even_split(global, 0, rank, 4);
      mine.emplace_back(num_elements(box.shape));
      target.add_mutable<float>(s.name, box.shape, mine.back());
      placement[s.name] = {global, box.offsets};
    }
    const uint64_t before = read_bytes();
    const double t0 = now_seconds();
    ShardedReader(rec.checkpoint).load(target, placement);
    seconds += now_seconds() - t0;
    read += read_bytes() - before;
  }
  std::filesystem::remove_all(dir);
  const double ratio = static_cast<double>(read) / static_cast<double>(loaded);
  std::cerr << fmt::format(
      "re-shard 2 -> 4 ranks, {} MB loaded: {} MB read from disk ({:.3f}x), {:.2f} s in all, "
      "caches dropped by {}\n",
      loaded / 1000000, read / 1000000, ratio, seconds, cache_drop);
  const std::string text = nlohmann::json{
      {"loaded_bytes", loaded},
      {"read_bytes", read},
      {"ratio", ratio},
      {"seconds", seconds},
      {"cache_drop",
       cache_drop}}.dump(2);
  if (opts.out.empty()) {
    std::cout << text << "\n";
  } else {
    std::ofstream(opts.out) << text << "\n";
  }
  return 0;
}

}  // namespace cairn::bench
