#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "checkpoint/entry_json.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

namespace {
constexpr std::string_view kFormat = "cairn-checkpoint";

[[noreturn]] void corrupt(std::string_view source, std::string_view why) {
  throw Error(ErrorCode::kCorruption, fmt::format("{}: {}", source, why));
}
}  // namespace

void parse_entry_blocks(const nlohmann::json& f, ManifestEntry& e, std::string_view source,
                        std::string_view where_view) {
  const std::string where(where_view);
  auto field = [](const nlohmann::json& obj, const char* key) -> const nlohmann::json* {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  };
  if (const nlohmann::json* blocks = field(f, "blocks")) {
    const nlohmann::json* bsize = blocks->is_object() ? field(*blocks, "size") : nullptr;
    const nlohmann::json* bhex = blocks->is_object() ? field(*blocks, "xxh3") : nullptr;
    if (!bsize || !bsize->is_number_unsigned() || bsize->get<uint64_t>() < 4096 ||
        (bsize->get<uint64_t>() & (bsize->get<uint64_t>() - 1)) != 0 || !bhex ||
        !bhex->is_string()) {
      corrupt(source, where +
                          " has malformed \"blocks\" (want {\"size\": a power of two >= "
                          "4096, \"xxh3\": a string of hashes})");
    }
    e.block_size = bsize->get<uint64_t>();
    const std::string& hex = bhex->get_ref<const std::string&>();
    const uint64_t n = (e.size + e.block_size - 1) / e.block_size;
    if (hex.size() != 16 * n) {
      corrupt(source, fmt::format("{} has {} hex digits of block checksums; {} bytes in blocks "
                                  "of {} need {}",
                                  where, hex.size(), e.size, e.block_size, 16 * n));
    }
    e.block_xxh3.resize(n);
    for (uint64_t b = 0; b < n; ++b) {
      if (!hash_from_hex(std::string_view(hex).substr(16 * b, 16), e.block_xxh3[b])) {
        corrupt(source, fmt::format("{}: block checksum {} is not 16 hex digits", where, b));
      }
    }
  }
}

nlohmann::json entry_to_json(const ManifestEntry& f) {
  nlohmann::json e{{"path", f.path}, {"size", f.size}, {"xxh3", hash_to_hex(f.xxh3)}};
  if (f.block_size > 0) {
    std::string hex;
    hex.reserve(16 * f.block_xxh3.size());
    for (uint64_t h : f.block_xxh3) hex += hash_to_hex(h);
    e["blocks"] = {{"size", f.block_size}, {"xxh3", std::move(hex)}};
  }
  return e;
}

uint64_t Manifest::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files) total += f.size;
  return total;
}

std::string Manifest::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = version;
  j["created_at"] = created_at;
  j["metrics"] = metrics.is_null() ? nlohmann::json::object() : metrics;
  if (!layout.is_null()) j["layout"] = layout;
  if (!ranks.is_null()) j["ranks"] = ranks;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : files) {
    list.push_back(entry_to_json(f));
  }
  j["files"] = std::move(list);
  return j.dump(1);
}

Manifest Manifest::parse(std::string_view text, std::string_view source) {
  nlohmann::json j = parse_json(text, source);
  if (!j.is_object()) corrupt(source, "manifest is not a JSON object");
  // Fields are looked up with find(): operator[] on a const object with a
  // missing key is undefined behaviour in nlohmann::json.
  auto field = [](const nlohmann::json& obj, const char* key) -> const nlohmann::json* {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  };
  const nlohmann::json* format = field(j, "format");
  if (!format || !format->is_string() || format->get<std::string>() != kFormat) {
    corrupt(source, "manifest has no \"format\": \"cairn-checkpoint\"");
  }
  Manifest m;
  const nlohmann::json* version = field(j, "version");
  if (!version || !version->is_number_integer() || *version != 1) {
    corrupt(source, fmt::format("unsupported manifest version {}",
                                version ? version->dump() : "(missing)"));
  }
  const nlohmann::json* created = field(j, "created_at");
  if (!created || !created->is_number()) corrupt(source, "manifest \"created_at\" is not a number");
  m.created_at = created->get<double>();
  const nlohmann::json* metrics = field(j, "metrics");
  m.metrics = metrics ? *metrics : nlohmann::json::object();
  if (!m.metrics.is_object()) corrupt(source, "manifest \"metrics\" is not an object");
  if (const nlohmann::json* layout = field(j, "layout")) m.layout = *layout;
  if (const nlohmann::json* ranks = field(j, "ranks")) {
    const nlohmann::json* world = ranks->is_object() ? field(*ranks, "world_size") : nullptr;
    const nlohmann::json* contributed = ranks->is_object() ? field(*ranks, "contributed") : nullptr;
    if (!world || !world->is_number_integer() || *world < 1 || !contributed ||
        !contributed->is_array()) {
      corrupt(source, "manifest \"ranks\" is not {\"world_size\": N, \"contributed\": [...]}");
    }
    const int64_t w = world->get<int64_t>();
    int64_t previous = -1;
    for (const nlohmann::json& r : *contributed) {
      if (!r.is_number_integer() || r.get<int64_t>() <= previous || r.get<int64_t>() >= w) {
        corrupt(source, fmt::format("manifest \"ranks\": contributed rank {} is not an ascending "
                                    "rank below world_size {}",
                                    r.dump(), w));
      }
      previous = r.get<int64_t>();
    }
    m.ranks = *ranks;
  }
  const nlohmann::json* files = field(j, "files");
  if (!files || !files->is_array()) corrupt(source, "manifest \"files\" is not an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& f = (*files)[i];
    std::string where = fmt::format("manifest entry {}", i);
    const nlohmann::json* path = f.is_object() ? field(f, "path") : nullptr;
    if (!path || !path->is_string()) corrupt(source, where + " has no \"path\" string");
    ManifestEntry e;
    e.path = path->get<std::string>();
    where = fmt::format("manifest entry {} (\"{}\")", i, e.path);
    try {
      validate_key(e.path, /*is_stored=*/true);
    } catch (const Error& err) {
      corrupt(source, fmt::format("{}: {}", where, err.what()));
    }
    if (e.path == kCairnDir || e.path.rfind(std::string(kCairnDir) + "/", 0) == 0) {
      corrupt(source, where + " names a file inside .cairn/");
    }
    const nlohmann::json* size = field(f, "size");
    if (!size || !size->is_number_unsigned()) corrupt(source, where + " has no unsigned \"size\"");
    e.size = size->get<uint64_t>();
    const nlohmann::json* xxh3 = field(f, "xxh3");
    if (!xxh3 || !xxh3->is_string() || !hash_from_hex(xxh3->get<std::string>(), e.xxh3)) {
      corrupt(source, where + " has no 16-hex-digit \"xxh3\" checksum");
    }
    parse_entry_blocks(f, e, source, where);
    if (!seen.insert(e.path).second) corrupt(source, where + " is listed twice");
    m.files.push_back(std::move(e));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const auto& a, const auto& b) { return a.path < b.path; });
  return m;
}

}  // namespace cairn
