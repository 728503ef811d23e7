#include "manager/history.h"

#include <algorithm>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/parse.h"

namespace cairn::history {

namespace {

constexpr size_t kHeaderBytes = 12;  // u32 length + u64 XXH3-64
constexpr std::string_view kLogSuffix = ".rec";
constexpr size_t kSeqDigits = 20;  // UINT64_MAX has 20 digits

Error corrupt_snapshot(std::string_view where, std::string_view why) {
  return Error(ErrorCode::kCorruption,
               fmt::format("{}: {} (delete this file to rebuild the history from the "
                           "checkpoints' manifests)",
                           where, why));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

nlohmann::json optional_number(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

uint64_t required_index(const nlohmann::json& j, const char* field, std::string_view where) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_unsigned()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: history record has no unsigned \"{}\"", where, field));
  }
  return it->get<uint64_t>();
}

// An entry's fields as the snapshot and "add" records hold them.
void put_entry(nlohmann::json& j, const State::Entry& e) {
  j["metrics"] = e.metrics;
  j["created_at"] = e.created_at;
  j["pinned"] = e.pinned;
  if (e.size_bytes) j["size_bytes"] = *e.size_bytes;
  if (e.file_count) j["file_count"] = *e.file_count;
  if (e.deleting) j["deleting"] = true;
}

std::optional<uint64_t> optional_count(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

// Throws json type_error for a field of the wrong type, as value() does.
State::Entry parse_entry(const nlohmann::json& j) {
  State::Entry e;
  e.metrics = j.value("metrics", nlohmann::json::object());
  e.created_at = j.value("created_at", 0.0);
  e.pinned = j.value("pinned", false);
  e.size_bytes = optional_count(j, "size_bytes");
  e.file_count = optional_count(j, "file_count");
  e.deleting = j.value("deleting", false);
  return e;
}

// The format version a snapshot or record says it is (1 when it says none).
int version_of(const nlohmann::json& j) {
  auto it = j.find("version");
  return it != j.end() && it->is_number_integer() ? it->get<int>() : 1;
}

}  // namespace

nlohmann::json snapshot_json(const State& state) {
  nlohmann::json j;
  j["format"] = kSnapshotFormat;
  j["version"] = kVersion;
  j["created_at"] = state.created_at;
  j["next_index"] = state.next_index;
  j["last_pinned_at"] = optional_number(state.last_pinned_at);
  j["config"] = state.config.to_json();
  j["log_seq"] = state.log_seq;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [index, e] : state.records) {
    nlohmann::json r = {{"index", index}, {"name", checkpoint_name(index)}};
    put_entry(r, e);
    list.push_back(std::move(r));
  }
  j["checkpoints"] = std::move(list);
  return j;
}

State parse_snapshot(std::string_view text, std::string_view where) {
  State s;
  nlohmann::json j;
  try {
    j = parse_json(text, where);
  } catch (const Error& e) {
    // parse_json names `where` first; keep its reason, add the remedy.
    std::string_view what = e.what();
    if (e.code() != ErrorCode::kCorruption || what.rfind(where, 0) != 0) throw;
    throw corrupt_snapshot(where, what.substr(std::min(what.size(), where.size() + 2)));
  }
  if (!j.is_object()) throw corrupt_snapshot(where, "not a JSON object");
  try {
    if (j.value("format", "") != kSnapshotFormat) {
      throw corrupt_snapshot(where, "not a Cairn manager state file");
    }
    if (!j.contains("checkpoints") || !j["checkpoints"].is_array()) {
      throw corrupt_snapshot(where, "\"checkpoints\" is not an array");
    }
    s.present = true;
    s.version = version_of(j);
    s.created_at = j.value("created_at", 0.0);
    s.next_index = j.value("next_index", uint64_t{0});
    if (j.contains("last_pinned_at") && j["last_pinned_at"].is_number()) {
      s.last_pinned_at = j["last_pinned_at"].get<double>();
    }
    s.config = CheckpointConfig::from_json(j.contains("config") ? j["config"] : nlohmann::json());
    // An older Cairn writes no log_seq and covers every record on storage.
    s.log_seq = j.value("log_seq", UINT64_MAX);
    for (const auto& r : j["checkpoints"]) {
      if (!r.is_object() || !r.contains("index") || !r["index"].is_number_unsigned()) {
        throw corrupt_snapshot(where, "a checkpoint record has no index");
      }
      s.records[r["index"].get<uint64_t>()] = parse_entry(r);
    }
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type (value() throws type_error).
    throw corrupt_snapshot(where, fmt::format("malformed field: {}", e.what()));
  }
  return s;
}

std::optional<std::string> torn_snapshot(std::string_view text) {
  if (text.empty()) return std::string("empty (0 bytes)");
  if (size_t at = text.find('\0'); at != std::string_view::npos) {
    return fmt::format("a NUL byte at offset {} of {}", at, text.size());
  }
  try {
    // Too large or nested too deeply is no tearing: parse_snapshot() refuses those.
    check_json_text(text, "history");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    return std::nullopt;
  }
  try {
    (void)parse_json(text, "history");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    return fmt::format("{} bytes that are not JSON ({})", text.size(), e.what());
  }
  return std::nullopt;
}

std::string encode_record(const nlohmann::json& payload) {
  std::string body = payload.dump();
  std::string out;
  out.reserve(kHeaderBytes + body.size());
  put_le(out, body.size(), 4);
  put_le(out, xxh3_64(body), 8);
  out += body;
  return out;
}

Decoded decode_records(std::string_view bytes) {
  Decoded d;
  uint64_t offset = 0;
  auto stop = [&](std::string why) {
    d.bad_offset = offset;
    d.problem = std::move(why);
  };
  while (offset < bytes.size()) {
    std::string_view rest = bytes.substr(offset);
    if (rest.size() < kHeaderBytes) {
      stop(fmt::format("torn record: {} bytes, shorter than a record header", rest.size()));
      break;
    }
    const uint64_t length = get_le(rest, 4);
    const uint64_t checksum = get_le(rest.substr(4), 8);
    if (rest.size() - kHeaderBytes < length) {
      stop(fmt::format("torn record: header says {} payload bytes, {} present", length,
                       rest.size() - kHeaderBytes));
      break;
    }
    std::string_view body = rest.substr(kHeaderBytes, length);
    if (xxh3_64(body) != checksum) {
      stop(fmt::format("checksum mismatch (stored {}, computed {})", hash_to_hex(checksum),
                       hash_to_hex(xxh3_64(body))));
      break;
    }
    nlohmann::json j;
    try {
      j = parse_json(body, "history record");
    } catch (const Error& e) {
      stop(fmt::format("payload is not JSON: {}", e.what()));
      break;
    }
    if (!j.is_object()) {
      stop("payload is not a JSON object");
      break;
    }
    d.records.push_back(std::move(j));
    offset += kHeaderBytes + length;
  }
  return d;
}

std::string log_key(uint64_t seq) {
  return fmt::format("{}/{:0{}d}{}", kLogPrefix, seq, kSeqDigits, kLogSuffix);
}

std::optional<uint64_t> parse_log_key(std::string_view key) {
  if (key.size() != kLogPrefix.size() + 1 + kSeqDigits + kLogSuffix.size()) return std::nullopt;
  if (key.substr(0, kLogPrefix.size()) != kLogPrefix || key[kLogPrefix.size()] != '/') {
    return std::nullopt;
  }
  if (key.substr(key.size() - kLogSuffix.size()) != kLogSuffix) return std::nullopt;
  return parse_decimal(key.substr(kLogPrefix.size() + 1, kSeqDigits));
}

nlohmann::json add_record(uint64_t seq, uint64_t index, const State::Entry& entry,
                          uint64_t next_index, std::optional<double> last_pinned_at) {
  nlohmann::json j = {{"op", "add"}, {"version", kVersion}, {"seq", seq}, {"index", index}};
  State::Entry e = entry;
  e.deleting = false;  // a checkpoint being deleted is never added
  put_entry(j, e);
  j["next_index"] = next_index;
  j["last_pinned_at"] = optional_number(last_pinned_at);
  return j;
}

nlohmann::json remove_record(uint64_t seq, const std::vector<uint64_t>& indices) {
  return {{"op", "remove"}, {"version", kVersion}, {"seq", seq}, {"indices", indices}};
}

nlohmann::json deleting_record(uint64_t seq, const std::vector<uint64_t>& indices) {
  return {{"op", "deleting"}, {"version", kVersion}, {"seq", seq}, {"indices", indices}};
}

nlohmann::json counters_record(uint64_t seq, uint64_t next_index) {
  return {{"op", "counters"}, {"version", kVersion}, {"seq", seq}, {"next_index", next_index}};
}

void apply(State& state, const nlohmann::json& record, std::string_view where) {
  auto bad = [&](std::string_view why) {
    return Error(ErrorCode::kCorruption, fmt::format("{}: history record {}", where, why));
  };
  if (!record.is_object()) throw bad("is not a JSON object");
  auto op_it = record.find("op");
  if (op_it == record.end() || !op_it->is_string()) throw bad("has no \"op\"");
  const std::string op = op_it->get<std::string>();
  // The indices of a "remove" or "deleting" record.
  auto indices_of = [&] {
    auto it = record.find("indices");
    if (it == record.end() || !it->is_array()) throw bad("has no \"indices\" array");
    std::vector<uint64_t> indices;
    for (const auto& i : *it) {
      if (!i.is_number_unsigned()) throw bad("has an index that is not an unsigned number");
      indices.push_back(i.get<uint64_t>());
    }
    return indices;
  };
  try {
    if (op == "add") {
      const uint64_t index = required_index(record, "index", where);
      State::Entry e = parse_entry(record);
      e.deleting = false;
      const uint64_t next = required_index(record, "next_index", where);
      std::optional<double> pinned_at;
      if (record.contains("last_pinned_at") && record["last_pinned_at"].is_number()) {
        pinned_at = record["last_pinned_at"].get<double>();
      }
      state.records[index] = std::move(e);
      state.next_index = std::max(state.next_index, next);
      if (pinned_at) state.last_pinned_at = pinned_at;
    } else if (op == "remove") {
      for (uint64_t i : indices_of()) state.records.erase(i);
    } else if (op == "deleting") {
      for (uint64_t i : indices_of()) {
        if (auto it = state.records.find(i); it != state.records.end()) it->second.deleting = true;
      }
    } else if (op == "counters") {
      state.next_index = std::max(state.next_index, required_index(record, "next_index", where));
    } else {
      throw bad(fmt::format("has an unknown op \"{}\"", printable(op)));
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("has a malformed field: {}", e.what()));
  }
  state.version = std::min(state.version, version_of(record));
}

bool should_compact(uint64_t log_records, uint64_t live) {
  return log_records > std::max<uint64_t>(64, live / 8);
}

}  // namespace cairn::history
