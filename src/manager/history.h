// The experiment's history as stored: a snapshot plus a log of changes made
// after it, the way leveldb's MANIFEST works, so that registering a
// checkpoint writes one small record instead of rewriting the whole history.
//
//   checkpoint_manager.json                   the snapshot: the whole history
//                                             as of log record `log_seq`
//   checkpoint_manager.log/<20 digits>.rec    one object per change, named by
//                                             its sequence number
//
// A log object holds framed records: a 4-byte little-endian payload length,
// the 8-byte little-endian XXH3-64 of the payload, then the payload (JSON
// with "op" and "seq"). Records are separate objects because Storage has no
// append (S3), and one object per record is O(1) per change on every
// backend with one code path.
//
// Replay: a reader applies, in sequence order, the records whose seq is
// above the snapshot's log_seq; those at or below it are leftovers of a
// compaction that crashed before removing them, and are ignored. A snapshot
// without "log_seq" (written by an older Cairn) covers every record, and
// without a snapshot (deleted to rebuild the history from the manifests, or
// torn by an interrupted write: torn_snapshot()) every record is stale. Records
// carry the experiment's counters (next_index, last_pinned_at) as absolute
// values, so a record skipped because it is damaged loses only its own
// change, which the manager's reconciliation with the committed manifests
// recovers (a missing "add" is adopted from its manifest, a missing
// "remove" dropped because its checkpoint is gone).
//
// Version 2 of the format (this one) makes the history authoritative for
// which checkpoints are committed, so that opening an experiment and `cairn
// ls` read the history and one listing of the experiment folder instead of
// every checkpoint's folder and manifest:
//   - each checkpoint's entry (snapshot and "add" record) carries its size
//     and file count from the manifest ("size_bytes", "file_count");
//   - retention announces a deletion before the first manifest goes: a
//     "deleting" record names the checkpoints, whose entries are then
//     flagged ("deleting": true, in a snapshot too) until the "remove"
//     record; a reader checks the manifests of flagged entries only;
//   - every record says "version": 2. A snapshot of version 1, or any
//     applied record without the version (an older Cairn wrote it, and its
//     deletions announce nothing), makes the history not authoritative
//     (State::version < 2): readers then read every checkpoint's folder, as
//     version 1 did, and the manager's next snapshot is version 2 again.
// Older Cairn versions read version 2 as version 1: they ignore the new
// fields and the unknown "deleting" op stops them only at that record, as
// any damaged record does (its change is recovered from the manifests).
//
// Everything here is pure (no I/O), so the format and replay are unit-tested
// alone; manager.cc does the reading and writing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/manager.h"
#include "manager/layout.h"

namespace cairn::history {

inline constexpr std::string_view kSnapshotKey = manager_layout::kHistoryKey;
inline constexpr std::string_view kLogPrefix = manager_layout::kHistoryLogPrefix;
inline constexpr std::string_view kSnapshotFormat = "cairn-manager";
// The format version this Cairn writes (snapshot and records); see above.
inline constexpr int kVersion = 2;

// The history: what the snapshot holds, with the log applied.
struct State {
  bool present = false;  // a snapshot was found
  double created_at = 0.0;
  uint64_t next_index = 0;
  std::optional<double> last_pinned_at;
  CheckpointConfig config;
  struct Entry {
    nlohmann::json metrics;
    double created_at = 0.0;
    bool pinned = false;
    // From the manifest (Manifest::total_bytes, the number of files); absent
    // in entries an older Cairn wrote.
    std::optional<uint64_t> size_bytes = std::nullopt;
    std::optional<uint64_t> file_count = std::nullopt;
    // A deletion was announced and may have begun: the manifest may be gone.
    bool deleting = false;
  };
  std::map<uint64_t, Entry> records;
  uint64_t log_seq = 0;  // the last log record folded in
  // The lowest format version of the snapshot and of the records applied:
  // below kVersion the history is not authoritative (see above).
  int version = kVersion;
};

// The snapshot's JSON form (the format older Cairn versions read and write,
// plus "log_seq"), and its parser. parse_snapshot throws kCorruption naming
// `where` and the reason.
nlohmann::json snapshot_json(const State& state);
State parse_snapshot(std::string_view text, std::string_view where);
// Why `text` is the remains of an interrupted snapshot write rather than a
// whole snapshot, or nullopt: empty (an object store may keep an
// interrupted PUT as 0 bytes), holding NUL bytes (blocks a file system never
// wrote) or not JSON (a write cut short never holds the object's closing
// brace; a text too large or nested too deeply is malformed, not torn). A
// torn snapshot is no history: readers rebuild it from the committed
// manifests, with a warning, as if it were absent. (A whole text can still
// be a malformed snapshot, which parse_snapshot() refuses.)
std::optional<std::string> torn_snapshot(std::string_view text);

// One framed record around `payload`.
std::string encode_record(const nlohmann::json& payload);

struct Decoded {
  std::vector<nlohmann::json> records;  // the good records, in order
  // Set when decoding stopped early: the offset of the first byte not
  // decoded and why (a torn tail, a checksum mismatch, a bad payload).
  std::optional<uint64_t> bad_offset;
  std::string problem;
};
// Decodes framed records until the end of `bytes` or the first bad frame.
Decoded decode_records(std::string_view bytes);

// The log object of record `seq`, and the seq of a key (nullopt if the key is
// not a log record's).
std::string log_key(uint64_t seq);
std::optional<uint64_t> parse_log_key(std::string_view key);

// Record payloads.
nlohmann::json add_record(uint64_t seq, uint64_t index, const State::Entry& entry,
                          uint64_t next_index, std::optional<double> last_pinned_at);
nlohmann::json remove_record(uint64_t seq, const std::vector<uint64_t>& indices);
nlohmann::json deleting_record(uint64_t seq, const std::vector<uint64_t>& indices);
nlohmann::json counters_record(uint64_t seq, uint64_t next_index);

// Applies one record payload to `state`. Throws kCorruption (naming `where`)
// if the payload is not a well-formed record; `state` is then unchanged.
void apply(State& state, const nlohmann::json& record, std::string_view where);

// Whether a log holding `log_records` records after the snapshot should be
// folded into a new snapshot, for a history of `live` checkpoints: past
// max(64, live / 8) records, so the snapshot rewrite (O(live)) is amortized
// to O(1) per record and opening reads at most that many records.
bool should_compact(uint64_t log_records, uint64_t live);

}  // namespace cairn::history
