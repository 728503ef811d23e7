// Copying checkpoints and experiments between storages (cairn/transfer.h).
//
// The order of writes is what makes an interrupted or failed copy harmless.
// For one checkpoint:
//   1. The source must be committed; its manifest's bytes are read once and
//      are the copy's contract for the whole run.
//   2. The destination is either committed (identical manifest: nothing to
//      do; different: refused before anything is written) or an uncommitted
//      location whose files are all named by the manifest (an earlier attempt
//      of this copy). Anything else there is refused.
//   3. Files already present with the manifest's size are hashed in place;
//      those that match are kept (resume).
//   4. Every other file is copied in ranged chunks by `jobs` threads; the
//      chunks of a file are hashed in order as they are read and the file is
//      committed only if its size and XXH3 match the manifest. A file the
//      destination takes in one streamed request (Storage::put_stream; S3 up
//      to CAIRN_S3_UPLOAD_CUTOFF) is one thread's: hashed on a first pass and
//      checked before anything of it is sent.
//   5. Every copied file is checked at the destination: read back and
//      checksummed, or (TransferVerify::kSize, the default where the
//      destination verifies uploads itself, as S3 does with Content-MD5) its
//      stored size compared.
//   6. Metadata, then the manifest (the source's bytes) are written, last:
//      only now is the destination a committed checkpoint.
// For an experiment: take the destination's lock, copy each committed
// checkpoint as above in index order, then the experiment's other files, then
// the history, last, once every checkpoint it names is committed there.
// The passes over files (steps 3 to 5) are in file_pass.cc.
#include "cairn/transfer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "checkpoint/manifest_text.h"
#include "checkpoint/metadata.h"
#include "experiment/file_pass.h"
#include "experiment/layout.h"
#include "manager/history_store.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

namespace {

using experiment::Item;
using experiment::items_of;
using experiment::Pass;
using experiment::ProgressSink;
using experiment::run_pass;

constexpr std::string_view kHistoryKey = experiment::kManagerHistoryKey;
// Re-reads of a live source's history before giving up; see copy_history().
constexpr int kHistoryRounds = 4;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Context {
  const TransferOptions& options;
  ProgressSink& progress;
  TransferReport& report;
};

// Brings `files` (sizes and checksums known) from `src` to `dst`: keeps those
// in place, copies and reads back the rest. Nothing is committed beyond the
// files themselves.
void sync_files(Storage& src, Storage& dst, const std::vector<ManifestEntry>& files, Context& ctx) {
  std::map<std::string, uint64_t, std::less<>> present;
  for (const auto& o : dst.list("")) present[o.key] = o.size;
  std::vector<Item> probe;
  for (const auto& f : files) {
    auto it = present.find(f.path);
    if (it != present.end() && it->second == f.size) probe.push_back({f, false});
  }
  run_pass(Pass::kProbe, dst, nullptr, probe, ctx.options, &ctx.progress);
  std::set<std::string, std::less<>> in_place;
  for (const auto& p : probe) {
    if (!p.matched) continue;
    in_place.insert(p.want.path);
    ++ctx.report.files_skipped;
    ctx.report.bytes_skipped += p.want.size;
  }
  std::vector<Item> todo;
  for (const auto& f : files) {
    if (!in_place.count(f.path)) todo.push_back({f, false});
  }
  run_pass(Pass::kCopy, src, &dst, todo, ctx.options, &ctx.progress);
  const bool read_back = ctx.options.verify == TransferVerify::kChecksum ||
                         (ctx.options.verify == TransferVerify::kAuto && !dst.verifies_uploads());
  if (read_back) {
    run_pass(Pass::kVerify, dst, nullptr, todo, ctx.options, nullptr);
  } else {
    for (const auto& t : todo) {
      std::optional<ObjectInfo> got = dst.stat(t.want.path);
      if (!got || got->size != t.want.size) {
        throw Error(
            ErrorCode::kCorruption,
            fmt::format("{}: after copying: {}, the manifest says {}", dst.uri_of(t.want.path),
                        got ? fmt::format("size {}", got->size) : std::string("missing"),
                        t.want.size));
      }
    }
  }
  for (const auto& t : todo) {
    ++ctx.report.files_copied;
    ctx.report.bytes_copied += t.want.size;
  }
}

std::optional<std::string> get_if_exists(Storage& storage, std::string_view key) {
  if (!storage.exists(key)) return std::nullopt;
  try {
    return storage.get(key);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) return std::nullopt;  // removed since the stat
    throw;
  }
}

// Metadata may change after a commit (update_metadata), so a re-run brings
// it up to date; it is never removed at the destination. What is copied is
// what get_metadata() reads (on a store that tears writes, a torn replace
// leaves the metadata it was replacing).
void copy_metadata(Storage& src, Storage& dst) {
  std::optional<std::string> metadata;
  if (src.capabilities().torn_writes) {
    std::optional<StoredMetadata> m = read_checkpoint_metadata(src);
    if (m) metadata = std::move(m->text);
  } else {
    metadata = get_if_exists(src, kMetadataKey);
  }
  if (!metadata) return;
  if (get_if_exists(dst, kMetadataKey) == metadata) return;
  dst.put(kMetadataKey, *metadata);
}

// Steps 2-6 of the protocol at the top of this file for one committed
// checkpoint whose manifest (`text`, parsed as `manifest`) was read from `src`.
void copy_committed(Storage& src, Storage& dst, const std::string& text, const Manifest& manifest,
                    Context& ctx) {
  // A torn manifest at the destination (an earlier attempt killed while
  // writing it) is no commit: the copy goes on over it.
  std::optional<std::string> existing = get_if_exists(dst, kManifestKey);
  const bool torn_there = existing && Manifest::torn(*existing).has_value();
  if (torn_there) existing.reset();
  if (existing) {
    bool same = *existing == text;
    if (!same) {
      try {
        same = Manifest::parse(*existing, dst.uri_of(kManifestKey)).to_json() == manifest.to_json();
      } catch (const Error&) {
        same = false;  // ignore-error: an unreadable manifest is not the same one; refused below
      }
    }
    if (!same) {
      throw Error(ErrorCode::kAlreadyExists,
                  fmt::format("{}: already a committed checkpoint with a different manifest than "
                              "{}; refusing to overwrite it (copy to a new location, or delete "
                              "it first)",
                              dst.uri(), src.uri()));
    }
    copy_metadata(src, dst);
    for (const auto& f : manifest.files) {
      ctx.progress.file_done(dst.uri_of(f.path), f.size, true);
      ++ctx.report.files_skipped;
      ctx.report.bytes_skipped += f.size;
    }
    ctx.report.checkpoints_unchanged.push_back(dst.uri());
    return;
  }
  std::set<std::string, std::less<>> listed;
  for (const auto& f : manifest.files) listed.insert(f.path);
  for (const auto& o : dst.list("")) {
    if (o.key == kMetadataKey || listed.count(o.key)) continue;
    if (o.key == kManifestKey && torn_there) continue;  // replaced below
    throw Error(ErrorCode::kAlreadyExists,
                fmt::format("{}: the destination holds a file that {}'s manifest does not list; "
                            "refusing to mix it into the copy (choose an empty destination)",
                            dst.uri_of(o.key), src.uri()));
  }
  sync_files(src, dst, manifest.files, ctx);
  copy_metadata(src, dst);
  dst.put(kManifestKey, text);
  ctx.report.checkpoints_copied.push_back(dst.uri());
}

void check_options(const TransferOptions& options) {
  if (options.jobs < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("jobs must be at least 1, got {}", options.jobs));
  }
  if (options.chunk_size < 1) {
    throw Error(ErrorCode::kInvalidArgument, "chunk size must be at least 1 byte");
  }
}

// A copy into itself, or into or out of its own subfolder, would read what it
// writes.
void check_disjoint(const Storage& src, const Storage& dst) {
  const std::string a = src.uri();
  const std::string b = dst.uri();
  auto inside = [](const std::string& outer, const std::string& inner) {
    return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
           (outer.back() == '/' || inner[outer.size()] == '/');
  };
  if (a == b || inside(a, b) || inside(b, a)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("cannot copy {} to {}: the source and the destination overlap", a, b));
  }
}

// The source checkpoint's manifest text; kFailedPrecondition if it has none
// or a torn one.
std::string committed_manifest(Storage& src) {
  std::optional<std::string> text = get_if_exists(src, kManifestKey);
  if (!text) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: not a committed checkpoint (no {}; an interrupted or "
                            "unfinished save?); only committed checkpoints are copied",
                            src.uri(), kManifestKey));
  }
  if (std::optional<std::string> why = Manifest::torn(*text)) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: not a committed checkpoint: its {} is torn, the remains of an "
                            "interrupted commit ({}); only committed checkpoints are copied",
                            src.uri(), kManifestKey, *why));
  }
  return *text;
}

TransferOptions with_defaults(const TransferOptions& options) {
  TransferOptions o = options;
  if (!o.clock) o.clock = steady_seconds;
  return o;
}

// The names of the checkpoints a history lists.
std::vector<std::string> history_names(std::string_view text, std::string_view where) {
  nlohmann::json j = parse_json(text, where);
  const nlohmann::json* list = nullptr;
  if (j.is_object()) {
    auto it = j.find("checkpoints");
    if (it != j.end() && it->is_array()) list = &*it;
  }
  if (!list) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: history has no \"checkpoints\" array", where));
  }
  std::vector<std::string> names;
  for (const auto& r : *list) {
    auto it = r.is_object() ? r.find("name") : r.end();
    if (!r.is_object() || it == r.end() || !it->is_string() ||
        !parse_checkpoint_name(it->get<std::string>())) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: history entry {} has no checkpoint \"name\"", where, r.dump()));
    }
    names.push_back(it->get<std::string>());
  }
  return names;
}

struct ExperimentScan {
  std::map<uint64_t, std::string> committed;    // index -> name
  std::map<uint64_t, std::string> uncommitted;  // index -> name
  std::vector<ManifestEntry> other;  // experiment files outside checkpoints (no checksum)
  bool has_history = false;
};

ExperimentScan scan_experiment(Storage& src) {
  ExperimentScan scan;
  std::map<uint64_t, std::string> folders;
  std::set<std::string, std::less<>> with_manifest;
  for (const auto& o : src.list("")) {
    const size_t slash = o.key.find('/');
    if (slash != std::string::npos) {
      std::string_view first = std::string_view(o.key).substr(0, slash);
      if (first == experiment::kTrashPrefix) continue;  // retired files, not the experiment's
      if (auto index = parse_checkpoint_name(first)) {
        folders.emplace(*index, std::string(first));
        // An empty manifest is a torn one, never a commit (Manifest::torn).
        if (o.key.substr(slash + 1) == kManifestKey && o.size > 0) with_manifest.emplace(first);
        continue;
      }
    }
    if (o.key == experiment::kLockKey) continue;
    if (o.key == kHistoryKey) {
      scan.has_history = true;
      continue;
    }
    // The history's log is folded into the snapshot copy_history() writes.
    if (history::parse_log_key(o.key)) continue;
    scan.other.push_back({o.key, o.size, 0});
  }
  for (auto& [index, name] : folders) {
    (with_manifest.count(name) ? scan.committed : scan.uncommitted).emplace(index, name);
  }
  return scan;
}

// One planned checkpoint of an experiment copy.
struct Planned {
  std::string name;
  std::string text;  // its manifest
  Manifest manifest;
};

// nullopt when the checkpoint has no manifest (any more) or a torn one.
std::optional<Planned> plan_checkpoint(Storage& src, const std::string& name) {
  std::optional<std::string> text = get_if_exists(src, join_key(name, kManifestKey));
  if (!text || Manifest::torn(*text)) return std::nullopt;
  Manifest m = Manifest::parse(*text, src.uri_of(join_key(name, kManifestKey)));
  return Planned{name, std::move(*text), std::move(m)};
}

// Copies a planned checkpoint of an experiment. A checkpoint that the source's
// retention deleted meanwhile is skipped with a warning (and what was copied
// of it removed: the destination's lock is held, so it is this copy's own
// leftover).
void copy_planned(Storage& src, Storage& dst, const Planned& p, Context& ctx) {
  auto from = src.child(p.name);
  auto to = dst.child(p.name);
  try {
    copy_committed(*from, *to, p.text, p.manifest, ctx);
  } catch (const Error&) {
    if (Checkpoint(from).is_committed()) throw;
    ctx.report.warnings.push_back(
        fmt::format("{}: deleted from the source during the copy (by its retention?); not copied",
                    from->uri()));
    ctx.progress.drop(p.manifest.total_bytes(), p.manifest.files.size());
    Checkpoint leftover(to);
    if (!leftover.is_committed()) remove_uncommitted(leftover);
  }
}

// Writes the source's history last, once every checkpoint it names is
// committed at the destination. A live source may have committed more
// checkpoints since they were planned: those are copied first, and the
// history read again, a few times at most.
void copy_history(Storage& src, Storage& dst, Context& ctx) {
  const std::string where = src.uri_of(kHistoryKey);
  for (int round = 0;; ++round) {
    // The snapshot with its log applied: the copy gets one whole snapshot.
    std::optional<std::string> text =
        history::read_folded(src, [&](const std::string& m) { ctx.report.warnings.push_back(m); });
    if (!text) {
      ctx.report.warnings.push_back(
          fmt::format("{}: not copied (removed from the source during the copy, or torn); a "
                      "manager opening the copy rebuilds the history from the manifests",
                      where));
      return;
    }
    std::vector<std::string> missing;
    std::vector<std::string> notes;
    for (const auto& name : history_names(*text, where)) {
      if (read_whole_manifest(dst, join_key(name, kManifestKey))) continue;
      if (read_whole_manifest(src, join_key(name, kManifestKey))) {
        missing.push_back(name);
      } else {
        notes.push_back(
            fmt::format("{}: names {}, which is not a committed checkpoint at the source either; a "
                        "manager opening the copy drops it from the history",
                        where, name));
      }
    }
    if (missing.empty()) {
      dst.put(kHistoryKey, *text);
      for (auto& n : notes) ctx.report.warnings.push_back(std::move(n));
      return;
    }
    if (round + 1 == kHistoryRounds) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("{}: the experiment kept changing during the copy ({} is not "
                              "copied yet); run the copy again",
                              src.uri(), src.uri_of(missing.front())),
                  /*retryable=*/true);
    }
    for (const auto& name : missing) {
      std::optional<Planned> p = plan_checkpoint(src, name);
      if (!p) continue;  // deleted again meanwhile; the next round sees it
      ctx.progress.add_total(p->manifest.total_bytes(), p->manifest.files.size());
      copy_planned(src, dst, *p, ctx);
    }
  }
}

}  // namespace

TransferKind detect_transfer_kind(std::string_view uri) {
  auto storage = open_storage(uri);
  check_root_exists(*storage);
  if (storage->exists(kManifestKey)) return TransferKind::kCheckpoint;
  std::vector<std::string> experiments = find_experiments(uri);
  if (std::find(experiments.begin(), experiments.end(), "") != experiments.end()) {
    return TransferKind::kExperiment;
  }
  if (!experiments.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: a storage root holding {} experiment(s) ({}, ...); copy one "
                            "experiment or one checkpoint at a time",
                            storage->uri(), experiments.size(), experiments.front()));
  }
  if (!storage->list("").empty()) committed_manifest(*storage);  // throws kFailedPrecondition
  throw Error(ErrorCode::kNotFound,
              fmt::format("{}: holds no checkpoint and no experiment to copy", storage->uri()));
}

namespace {

// The source and destination of a copy, checked to be apart and the source
// to exist.
std::pair<std::shared_ptr<Storage>, std::shared_ptr<Storage>> open_ends(std::string_view src_uri,
                                                                        std::string_view dst_uri) {
  auto src = open_storage(src_uri);
  auto dst = open_storage(dst_uri);
  check_disjoint(*src, *dst);
  check_root_exists(*src);
  return {src, dst};
}

}  // namespace

TransferReport copy_checkpoint(std::string_view src_uri, std::string_view dst_uri,
                               const TransferOptions& user_options) {
  check_options(user_options);
  const TransferOptions options = with_defaults(user_options);
  const double start = options.clock();
  auto [src, dst] = open_ends(src_uri, dst_uri);
  const std::string text = committed_manifest(*src);
  const Manifest manifest = Manifest::parse(text, src->uri_of(kManifestKey));

  TransferReport report;
  report.kind = TransferKind::kCheckpoint;
  report.source = src->uri();
  report.destination = dst->uri();
  ProgressSink progress(options);
  progress.add_total(manifest.total_bytes(), manifest.files.size());
  Context ctx{options, progress, report};
  copy_committed(*src, *dst, text, manifest, ctx);
  report.seconds = options.clock() - start;
  return report;
}

TransferReport copy_experiment(std::string_view src_uri, std::string_view dst_uri,
                               const TransferOptions& user_options) {
  check_options(user_options);
  const TransferOptions options = with_defaults(user_options);
  const double start = options.clock();
  auto [src, dst] = open_ends(src_uri, dst_uri);
  ExperimentScan scan = scan_experiment(*src);
  if (!scan.has_history && scan.committed.empty() && scan.uncommitted.empty()) {
    if (src->exists(kManifestKey)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: is a checkpoint, not an experiment", src->uri()));
    }
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: not an experiment (no {} and no checkpoint_* folders)", src->uri(),
                            kHistoryKey));
  }
  // A malformed history fails the copy before anything is written.
  if (scan.has_history) {
    if (auto text = get_if_exists(*src, kHistoryKey)) {
      // A torn one (an interrupted write) is rebuilt, not copied: see copy_history().
      if (!history::torn_snapshot(*text)) history_names(*text, src->uri_of(kHistoryKey));
    }
  }

  TransferReport report;
  report.kind = TransferKind::kExperiment;
  report.source = src->uri();
  report.destination = dst->uri();
  for (const auto& [index, name] : scan.uncommitted) {
    report.uncommitted_skipped.push_back(src->uri_of(name));
  }
  ProgressSink progress(options);
  Context ctx{options, progress, report};

  std::unique_ptr<Lock> lock = dst->try_lock(experiment::kLockKey);

  std::vector<Planned> plan;
  for (const auto& [index, name] : scan.committed) {
    std::optional<Planned> p = plan_checkpoint(*src, name);
    if (!p && !get_if_exists(*src, join_key(name, kManifestKey))) {
      report.warnings.push_back(
          fmt::format("{}: deleted from the source during the copy (by its retention?); not copied",
                      src->uri_of(name)));
      continue;
    }
    if (!p) {  // a torn manifest: the leftover of an interrupted commit
      report.uncommitted_skipped.push_back(src->uri_of(name));
      continue;
    }
    progress.add_total(p->manifest.total_bytes(), p->manifest.files.size());
    plan.push_back(std::move(*p));
  }
  uint64_t other_bytes = 0;
  for (const auto& f : scan.other) other_bytes += f.size;
  progress.add_total(other_bytes, scan.other.size());

  for (const auto& p : plan) copy_planned(*src, *dst, p, ctx);

  // The experiment's own files (trainer state, ...) have no manifest: their
  // checksums are taken from the source first, then they are synced like a
  // checkpoint's files.
  std::vector<Item> other = items_of(scan.other);
  run_pass(Pass::kHash, *src, nullptr, other, options, nullptr);
  std::vector<ManifestEntry> other_files;
  for (const auto& o : other) other_files.push_back(o.want);
  sync_files(*src, *dst, other_files, ctx);

  if (scan.has_history) copy_history(*src, *dst, ctx);
  report.seconds = options.clock() - start;
  return report;
}

TransferReport transfer(std::string_view src_uri, std::string_view dst_uri,
                        const TransferOptions& options) {
  check_options(options);
  return detect_transfer_kind(src_uri) == TransferKind::kCheckpoint
             ? copy_checkpoint(src_uri, dst_uri, options)
             : copy_experiment(src_uri, dst_uri, options);
}

}  // namespace cairn
