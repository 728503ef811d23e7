// Sharded layouts read back from rank files' headers (sharded_plan.h).
#include <algorithm>
#include <array>
#include <charconv>
#include <memory>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/safetensors.h"
#include "engine/sharded_plan.h"
#include "util/json.h"

namespace cairn {

namespace {

Error invalid(std::string message) {
  return Error(ErrorCode::kInvalidArgument, std::move(message));
}

// A whole number written as text ("cairn.rank"), or nothing.
std::optional<int> parse_rank(const std::string& text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

std::optional<nlohmann::json> format::layout_from_rank_files(const Checkpoint& checkpoint,
                                                             const Manifest& manifest) {
  std::vector<RankShards> ranks;
  for (const auto& f : manifest.files) {
    if (!f.path.ends_with(".safetensors") || f.size < 8) continue;
    const std::string source = fmt::format("{}/{}", checkpoint.uri(), f.path);
    std::unique_ptr<Reader> reader = checkpoint.storage().open_reader(f.path);
    std::array<std::byte, 8> prefix{};
    reader->read_at(0, prefix);
    const uint64_t n = parse_header_length(prefix, reader->size(), source);
    std::string text(n, '\0');
    reader->read_at(8, std::as_writable_bytes(std::span<char>(text)));
    const SafetensorsHeader h = parse_header(text, reader->size(), source);
    const auto placement = h.metadata.find(std::string(kShardsMetadataKey));
    const auto rank = h.metadata.find("cairn.rank");
    if (placement == h.metadata.end() || rank == h.metadata.end()) continue;
    RankShards r;
    const std::optional<int> number = parse_rank(rank->second);
    if (!number) throw invalid(fmt::format("{}: \"cairn.rank\" is not a rank", source));
    r.rank = *number;
    r.files.push_back(f);
    const nlohmann::json where = parse_json(placement->second, source);
    if (!where.is_object())
      throw invalid(fmt::format("{}: \"{}\" is not an object", source, kShardsMetadataKey));
    for (const TensorInfo& t : h.tensors) {
      RankShards::Shard shard;
      shard.tensor = t.name;
      shard.dtype = t.dtype;
      shard.box.shape = t.shape;
      shard.file = f.path;
      const auto it = where.find(t.name);
      if (it == where.end()) {
        shard.global_shape = t.shape;  // a replica
        shard.box.offsets.assign(t.shape.size(), 0);
      } else {
        const std::string what = fmt::format("{}: tensor \"{}\"", source, t.name);
        shard.global_shape = shape_from_json(it->at("global_shape"), what + " global_shape");
        shard.box.offsets = shape_from_json(it->at("offsets"), what + " offsets");
      }
      r.shards.push_back(std::move(shard));
    }
    ranks.push_back(std::move(r));
  }
  if (ranks.empty()) return std::nullopt;
  std::sort(ranks.begin(), ranks.end(),
            [](const RankShards& a, const RankShards& b) { return a.rank < b.rank; });
  return build_layout(ranks);
}

}  // namespace cairn
