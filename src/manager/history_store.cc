#include "manager/history_store.h"

#include <algorithm>

#include <fmt/format.h>

#include "cairn/error.h"

namespace cairn::history {

Loaded load_history(Storage& storage, const std::vector<ObjectInfo>& listing,
                    const std::function<void(const std::string&)>& warn) {
  Loaded out;
  bool has_snapshot = false;
  for (const auto& o : listing) {
    if (o.key == kSnapshotKey) has_snapshot = true;
    if (auto seq = parse_log_key(o.key)) out.log_seqs.push_back(*seq);
  }
  std::sort(out.log_seqs.begin(), out.log_seqs.end());
  if (!out.log_seqs.empty()) out.max_seq = out.log_seqs.back();
  if (has_snapshot) {
    std::optional<std::string> text;
    try {
      text = storage.get(kSnapshotKey);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;  // removed since the listing
    }
    // Parsed once; only a text that does not parse is told apart as torn
    // (the remains of an interrupted write) or malformed.
    if (text) {
      try {
        out.state = parse_snapshot(*text, storage.uri_of(kSnapshotKey));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kCorruption) throw;
        std::optional<std::string> torn = torn_snapshot(*text);
        if (!torn) throw;
        out.torn = true;
        warn(
            fmt::format("{}: torn, the remains of an interrupted write ({}); rebuilding the "
                        "history from the checkpoints' manifests",
                        storage.uri_of(kSnapshotKey), *torn));
      }
    }
  }
  // Without a snapshot (deleted to rebuild the history from the manifests,
  // as the corruption message says, or torn) the log is stale too: it is
  // ignored.
  if (!out.state.present) out.state.log_seq = UINT64_MAX;
  if (out.state.log_seq == UINT64_MAX) {
    out.legacy = true;
    out.state.log_seq = out.max_seq;
  }
  for (uint64_t seq : out.log_seqs) {
    if (seq <= out.state.log_seq) continue;  // folded in by a compaction
    const std::string key = log_key(seq);
    const std::string where = storage.uri_of(key);
    std::string bytes;
    try {
      bytes = storage.get(key);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;
      continue;  // a compaction removed it since the listing
    }
    Decoded d = decode_records(bytes);
    try {
      for (const auto& r : d.records) {
        if (r.value("seq", uint64_t{0}) != seq) {
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: record says seq {}, its name {}", where,
                                  r.value("seq", nlohmann::json()).dump(), seq));
        }
        apply(out.state, r, where);
      }
    } catch (const nlohmann::json::exception& e) {
      d.bad_offset = 0;
      d.problem = fmt::format("malformed record: {}", e.what());
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption) throw;
      d.bad_offset = 0;
      d.problem = e.what();
    }
    if (d.bad_offset || d.records.empty()) {
      out.damaged = true;
      warn(
          fmt::format("{}: damaged history record at offset {}: {}; skipping it (the history is "
                      "reconciled with the checkpoints' manifests)",
                      where, d.bad_offset.value_or(0),
                      d.records.empty() && !d.bad_offset ? "empty object" : d.problem));
    }
    ++out.applied;
  }
  return out;
}

std::vector<ObjectInfo> history_objects(Storage& storage) {
  std::vector<ObjectInfo> out;
  if (auto snapshot = storage.stat(kSnapshotKey)) out.push_back(std::move(*snapshot));
  for (auto& o : storage.list(kLogPrefix)) out.push_back(std::move(o));
  return out;
}

std::optional<std::string> read_folded(Storage& storage,
                                       const std::function<void(const std::string&)>& warn) {
  Loaded loaded = load_history(storage, storage.list(""), warn);
  if (!loaded.state.present) return std::nullopt;
  loaded.state.log_seq = std::max(loaded.state.log_seq, loaded.max_seq);
  return snapshot_json(loaded.state).dump(1);
}

}  // namespace cairn::history
