#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "checkpoint/entry_json.h"
#include "checkpoint/manifest_text.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

namespace {
constexpr std::string_view kFormat = "cairn-checkpoint";
// The member that proves a manifest whole; see Manifest::to_json.
constexpr std::string_view kSelfCheck = "self_check";

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
  // The text proves itself whole: its last member, "self_check", holds the
  // length and XXH3-64 of every byte before it. A write cut short anywhere
  // (an object store that kept part of an interrupted PUT, or none of it)
  // leaves either no closing brace, hence no JSON, or bytes that do not
  // match. Readers of older versions ignore the member.
  std::string text = j.dump(1);
  // dump(1) ends the object with "\n}"; the member goes before that brace.
  text.resize(text.size() - 2);
  const uint64_t length = text.size();
  const std::string hash = hash_to_hex(xxh3_64(text));
  text +=
      fmt::format(",\n \"{}\": {{\"bytes\": {}, \"xxh3\": \"{}\"}}\n}}", kSelfCheck, length, hash);
  return text;
}

namespace {

// The first checks of Manifest::torn, before any parsing: nothing at all, or
// NUL bytes (what a file system may show of blocks never written).
std::optional<std::string> torn_before_parsing(std::string_view text) {
  if (text.empty()) return std::string("empty (0 bytes)");
  if (size_t at = text.find('\0'); at != std::string_view::npos) {
    return fmt::format("a NUL byte at offset {} of {}", at, text.size());
  }
  return std::nullopt;
}

// Whether `j`, parsed from `text`, fails its "self_check" (absent: an older
// version wrote it, nothing to check).
std::optional<std::string> self_check_fails(std::string_view text, const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(kSelfCheck);
  if (it == j.end()) return std::nullopt;
  auto bytes = it->is_object() ? it->find("bytes") : it->end();
  auto hash = it->is_object() ? it->find("xxh3") : it->end();
  uint64_t want = 0;
  if (!it->is_object() || bytes == it->end() || !bytes->is_number_unsigned() || hash == it->end() ||
      !hash->is_string() || !hash_from_hex(hash->get_ref<const std::string&>(), want)) {
    return std::string("its \"self_check\" is malformed");
  }
  const uint64_t length = bytes->get<uint64_t>();
  if (length >= text.size()) {
    return fmt::format("\"self_check\" covers {} bytes of {}", length, text.size());
  }
  const uint64_t got = xxh3_64(text.substr(0, length));
  if (got != want) {
    return fmt::format("its first {} bytes hash to {}, \"self_check\" says {}", length,
                       hash_to_hex(got), hash_to_hex(want));
  }
  return std::nullopt;
}

// "ranks"."files" (optional): {"<rank>": [paths]}, each rank a contributed
// one, each path a file of the manifest.
void check_rank_files(const nlohmann::json& ranks, const std::set<std::string>& paths,
                      std::string_view source) {
  if (!ranks.contains("files")) return;
  const nlohmann::json* files = &ranks["files"];
  if (!files->is_object()) corrupt(source, "manifest \"ranks\".\"files\" is not an object");
  const nlohmann::json& contributed = ranks.at("contributed");
  for (const auto& item : files->items()) {
    const std::string rank = item.key();
    const nlohmann::json& list = item.value();
    const bool known = std::any_of(contributed.begin(), contributed.end(),
                                   [&](const nlohmann::json& r) { return r.dump() == rank; });
    if (!known) {
      corrupt(source, fmt::format("manifest \"ranks\".\"files\" names rank \"{}\", which "
                                  "contributed nothing",
                                  rank));
    }
    if (!list.is_array()) {
      corrupt(source,
              fmt::format("manifest \"ranks\".\"files\": rank {}'s are not an array", rank));
    }
    for (const nlohmann::json& p : list) {
      if (!p.is_string() || !paths.count(p.get<std::string>())) {
        corrupt(source, fmt::format("manifest \"ranks\".\"files\": rank {}'s file {} is not a "
                                    "file of the manifest",
                                    rank, p.dump()));
      }
    }
  }
}
}  // namespace

std::optional<std::string> Manifest::torn(std::string_view text) {
  if (std::optional<std::string> why = torn_before_parsing(text)) return why;
  try {
    // Too large or nested too deeply is no tearing: parse() refuses those.
    check_json_text(text, "manifest");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    return std::nullopt;
  }
  nlohmann::json j;
  try {
    j = parse_json(text, "manifest");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    return fmt::format("{} bytes that are not JSON ({})", text.size(), e.what());
  }
  // Whole JSON is never what an interrupted write leaves (the manifest is one
  // object, and no proper prefix of it is JSON): a self-check that fails on
  // it means the bytes were damaged after the commit, which parse() reports
  // as corruption for a person to look at, and nothing deletes.
  return std::nullopt;
}

Manifest Manifest::parse(std::string_view text, std::string_view source) {
  auto torn_manifest = [&](const std::string& why) {
    corrupt(source, fmt::format("torn manifest, the remains of an interrupted commit: {}", why));
  };
  if (std::optional<std::string> why = torn_before_parsing(text)) torn_manifest(*why);
  check_json_text(text, source);
  nlohmann::json j;
  try {
    j = parse_json(text, source);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    torn_manifest(fmt::format("{} bytes that are not JSON ({})", text.size(), e.what()));
  }
  if (std::optional<std::string> why = self_check_fails(text, j)) {
    corrupt(source, fmt::format("manifest damaged after it was written: {}", *why));
  }
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
  if (!m.ranks.is_null()) check_rank_files(m.ranks, seen, source);
  return m;
}

std::optional<std::string> read_manifest_text(Storage& storage, std::string_view key) {
  try {
    return storage.get(key);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) return std::nullopt;
    throw;
  }
}

std::optional<std::string> read_whole_manifest(Storage& storage, std::string_view key,
                                               std::string* why) {
  std::optional<std::string> text = read_manifest_text(storage, key);
  if (!text) return std::nullopt;
  if (std::optional<std::string> reason = Manifest::torn(*text)) {
    if (why) *why = std::move(*reason);
    return std::nullopt;
  }
  return text;
}

}  // namespace cairn
