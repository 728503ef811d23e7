// Asynchronous saves: the training loop waits only while the state is copied
// into staging memory; writing, fsync and the commit run in the background.
//
//   AsyncSaver saver;
//   for (...) {
//     train_step();
//     SaveHandle h = saver.save(state, manager, {{"loss", loss}});  // returns after the copy
//   }
//   saver.close();  // waits; throws an error no one has seen yet
//
// Semantics:
//   - save() returns once every tensor of `state` has been copied into a
//     staging buffer: the caller may then change its tensors. The copy is
//     the complete file image (header and data), so the background needs
//     nothing from the caller.
//   - Staging buffers are allocated once (2 MiB-aligned, huge pages asked
//     for) and reused: after the first save of a state, later saves of a
//     state of the same or smaller size allocate nothing. stats() shows it.
//   - At most `max_in_flight` saves (default 1) are snapshotted but not yet
//     committed ("pending"). What a save() called while that many are
//     pending does is AsyncSaveOptions::when_busy:
//       kWait (default): blocks until the oldest pending save commits or
//         fails, then snapshots as usual.
//       kExtraBuffer: snapshots into another staging buffer at once, so the
//         caller is not blocked by the write in progress; at most
//         `max_staging_buffers` buffers exist in all (allocated on first use,
//         then reused), and when every one holds a pending save, save()
//         blocks as under kWait. More than max_in_flight saves may then be
//         pending.
//       kSkip: takes no snapshot, writes nothing and (for a manager save)
//         reserves no index; returns at once a handle whose skipped() is
//         true, done() true and error() null. stats().skipped counts them.
//     Saves that are taken commit in the order save() was called, under
//     every policy.
//   - reserve() allocates staging ahead of the first save and writes every
//     page of it, so that the first save's stall is a plain copy rather than
//     the much slower first touch of fresh memory (page faults: a first
//     save without it stalled 10-14x as long as a memcpy of the state on
//     the virtual machines the project measures on).
//   - Device tensors (StateDict::add_device, cairn/device.h): the snapshot
//     copies them device-to-host on a stream of their device, ordered after
//     the work their producer had queued when save() was called, into the
//     same staging buffers, which the first such save pins (page-locks) for
//     the device; they stay pinned while reused (stats().staging_pinned_bytes;
//     a device that refuses to pin still works, at pageable-copy speed).
//     save() returns once those copies are complete, so the caller may change
//     its device tensors right away; the stall is the copy at the link's
//     speed. reserve() pins too when given a state with device tensors.
//   - Persisting goes through the commit protocol (commit.h): the file is
//     written durably in parallel blocks, then the manifest; with a
//     CheckpointManager, reserve_next() happens in save() and
//     commit_reserved() in the background. save() only takes the index
//     (Reservation::kDeferred): it neither writes nor waits for the
//     deletions retention queued (ManagerOptions::background_delete); the
//     background writer does both before it writes (prepare_reserved()),
//     so the disk never holds more than with deletion inside the save.
//   - Errors are never lost: a failed save's error is rethrown by its
//     handle's wait() (and returned by error()); if no one has looked at it
//     that way, the next save(), wait_all() or close() throws it instead
//     (once), before doing anything else. A failed save commits nothing and
//     leaves earlier checkpoints intact. This holds under every policy: a
//     skipped save, too, first throws an error not yet seen; a save blocked
//     by kWait (or by a full kExtraBuffer) throws the error of a save that
//     failed while it waited.
//   - A save() that throws (bad arguments, an unseen error, allocation
//     failure) has taken no snapshot and reserved nothing.
//
// Sharded saves (sharded.h) have the same contract, through the same queue,
// staging buffers and policies:
//   - save_rank_shards() is the rank side, for ranks in different processes
//     (each with its own AsyncSaver): it snapshots the rank's shards and
//     writes "rank_<r>.safetensors" into the uncommitted `dest` in the
//     background, durably, without committing. Once its handle's wait()
//     returns, rank_shards() is the RankShards report the committer needs;
//     send report.to_json() to it, and it calls commit_sharded() with every
//     rank's report (a rank whose save failed sends none, so the checkpoint
//     is never committed). The file is byte for byte what the synchronous
//     save_rank_shards() writes.
//   - save_sharded() is the whole save for ranks in one process (threads):
//     it snapshots every rank's shards into one staging buffer, then in the
//     background writes every rank file and, once all are durable, commits
//     them with commit_sharded(). One save_sharded() is one save: it takes
//     one slot under max_in_flight and counts once in stats().saves.
//   - Specs are checked in the call itself, before a snapshot is taken or an
//     index reserved: a spec naming no tensor, a box leaving its global
//     shape and (save_sharded) shards that leave a gap or overlap are
//     kInvalidArgument naming the tensor (and rank).
//
// Thread-safety: one AsyncSaver may be called from several threads; save(),
// save_rank_shards(), save_sharded(), reserve(), wait_all() and close() are
// serialized (a save() blocked under
// kWait holds the others back). stats() may be called at any time, also
// while another thread is blocked in save(). SaveHandle copies may be used
// from any thread.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <map>
#include <vector>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cairn/sharded.h"
#include "cairn/state.h"

namespace cairn {

// What save() does when max_in_flight saves are pending (see above).
enum class WhenBusy {
  kWait,         // block until a pending save finishes
  kExtraBuffer,  // snapshot into another staging buffer, up to max_staging_buffers
  kSkip,         // take no snapshot; return a skipped handle at once
};

struct AsyncSaveOptions {
  unsigned max_in_flight = 1;  // >= 1
  WhenBusy when_busy = WhenBusy::kWait;
  // kExtraBuffer only: the most staging buffers that may exist, in all
  // (>= max_in_flight; 0: max_in_flight + 1). Each is the size of the file
  // image, so this bounds the staging memory. Ignored by other policies,
  // which hold max_in_flight buffers at most.
  unsigned max_staging_buffers = 0;
  SaveOptions write = {};  // threads and block size of the background writes
  // Threads copying into staging (0: min(2, hardware threads)).
  unsigned snapshot_threads = 0;
};

// One rank's part of a sharded save made in one process (save_sharded):
// its local shards and where they sit (see sharded.h). Copying a StateDict
// copies no tensor bytes.
struct ShardedPart {
  int rank = 0;
  StateDict state;
  std::map<std::string, ShardSpec> specs;
};

// The observable state of one background save. Copies share it.
class [[nodiscard]] SaveHandle {
 public:
  SaveHandle() = default;
  // Blocks until the save is committed or failed; rethrows its error.
  void wait() const;
  // True once the save has committed or failed (or was skipped); never blocks.
  bool done() const;
  // True when save() skipped this save (WhenBusy::kSkip): nothing was or
  // will be written; wait() returns at once and error() is null.
  bool skipped() const;
  // The error of a failed save (null while pending or after success). Looking
  // counts as seeing it: it will not be rethrown by the saver.
  std::exception_ptr error() const;
  // Where the save goes (the reserved checkpoint for a manager save).
  // kFailedPrecondition for a skipped save, which goes nowhere.
  Checkpoint checkpoint() const;
  // The manager's record of a committed manager save (after wait()).
  std::optional<CheckpointRecord> record() const;
  // The manifest written by the commit (after wait()). nullopt for a rank
  // save (save_rank_shards), which commits nothing.
  std::optional<Manifest> manifest() const;
  // The report of a rank save (AsyncSaver::save_rank_shards) once it has
  // succeeded: what the committer passes to commit_sharded(). nullopt while
  // pending, after a failure, and for other saves.
  std::optional<RankShards> rank_shards() const;

  struct State;  // shared with the saver

 private:
  friend class AsyncSaver;
  explicit SaveHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

class AsyncSaver {
 public:
  explicit AsyncSaver(AsyncSaveOptions options = {});
  // Waits for pending saves. An error no one has seen is logged, since a
  // destructor cannot throw: call close() to receive it.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Each save() first throws an error not yet seen (see above) and
  // kFailedPrecondition after close(); then, when max_in_flight saves are
  // pending, applies options' when_busy.
  //
  // Snapshots `state`, then in the background writes it as `file` into the
  // uncommitted checkpoint `dest` and commits it with `metrics` (the state's
  // metadata also becomes the checkpoint's metadata.json).
  SaveHandle save(const StateDict& state, Checkpoint dest,
                  nlohmann::json metrics = nlohmann::json::object(),
                  std::string file = std::string(kStateFileName));
  // Snapshots `state` into the manager's next checkpoint (reserve_next() now,
  // commit_reserved() in the background, which applies retention). `manager`
  // must outlive the save (wait, or close the saver, before destroying it).
  SaveHandle save(const StateDict& state, CheckpointManager& manager,
                  nlohmann::json metrics = nlohmann::json::object(),
                  std::string file = std::string(kStateFileName));

  // Rank side of a sharded save: snapshots `local`'s shards (placed by
  // `specs`), then in the background writes them as rank_file_name(rank)
  // into the uncommitted `dest`, durably, and commits nothing; the handle's
  // rank_shards() is then the report for commit_sharded(). kInvalidArgument
  // naming the tensor for a bad spec, kAlreadyExists for a committed `dest`,
  // both before any snapshot. A failed write leaves `dest` to its committer
  // (other ranks write there too): nothing is removed.
  SaveHandle save_rank_shards(const StateDict& local, const std::map<std::string, ShardSpec>& specs,
                              Checkpoint dest, int rank);
  // A whole sharded save of ranks in this process: snapshots every part,
  // then in the background writes each part's rank file into the
  // uncommitted `dest` and, once all are durable, commits them with
  // `metrics` and the global layout (commit_sharded). kInvalidArgument when
  // `parts` is empty, a rank appears twice, or a spec is bad or the shards do
  // not tile a tensor (naming it), before any snapshot.
  SaveHandle save_sharded(const std::vector<ShardedPart>& parts, Checkpoint dest,
                          nlohmann::json metrics = nlohmann::json::object());
  // As above into the manager's next checkpoint (reserve_next() in the call,
  // commit_sharded(manager, ...) in the background, which applies
  // retention); a failed save's reserved location is removed. `manager`
  // must outlive the save.
  SaveHandle save_sharded(const std::vector<ShardedPart>& parts, CheckpointManager& manager,
                          nlohmann::json metrics = nlohmann::json::object());

  // Allocates staging for `buffers` saves of `bytes` (the file image size;
  // see the StateDict overload) and writes every page of it now, so that
  // later saves of up to that size allocate nothing and do not pay the
  // first touch of fresh memory. Buffers already large enough are kept as
  // they are; a smaller one still holding a pending save is replaced once
  // that save finishes (this call waits for it). `buffers` is at most the
  // number of buffers the policy allows (max_in_flight, or
  // max_staging_buffers under kExtraBuffer), else kInvalidArgument.
  // Throws an error not yet seen first, as save() does; kFailedPrecondition
  // after close(); kIO when the memory cannot be had (mmap, or the kernel
  // failing to populate the pages). Counted in stats().staging_allocations. Pages are written with
  // MADV_POPULATE_WRITE where the kernel has it, else by writing zeros, on
  // snapshot_threads threads.
  //
  // With Reserve::kBackground the call returns once its arguments are
  // checked, and the buffers are allocated and touched on a thread of the
  // saver's own, off the caller's (a training loop that knows its state at
  // start-up reserves without waiting, and its first save stalls for a copy
  // only). The next call to this saver (save(), reserve(), wait_all(),
  // close()) first waits for that work to end — a save issued sooner stalls
  // for what is left of it — and throws its error, if any (once, naming
  // the background reservation; the call itself then does not run).
  enum class Reserve { kNow, kBackground };
  void reserve(uint64_t bytes, unsigned buffers = 1, Reserve how = Reserve::kNow);
  // reserve() for the file image of `state` (its header and tensors).
  void reserve(const StateDict& state, unsigned buffers = 1, Reserve how = Reserve::kNow);
  // reserve() for a save_sharded() of `parts` (every rank file's image).
  // kInvalidArgument for bad specs, as save_sharded().
  void reserve(const std::vector<ShardedPart>& parts, unsigned buffers = 1,
               Reserve how = Reserve::kNow);

  // Waits for every pending save; throws the first error not yet seen.
  void wait_all();
  // wait_all(), then stops the background thread (also when a background
  // reservation failed: its error is thrown once stopped). Later saves are
  // kFailedPrecondition.
  void close();

  struct Stats {
    uint64_t saves = 0;                // snapshots taken (a sharded save counts once)
    uint64_t skipped = 0;              // saves skipped by WhenBusy::kSkip
    uint64_t waits = 0;                // saves that blocked for a pending save to finish
    uint64_t extra_buffer_saves = 0;   // kExtraBuffer saves taken beyond max_in_flight
    uint64_t staging_allocations = 0;  // times a staging buffer was (re)allocated
    uint64_t staging_bytes = 0;        // bytes of staging memory held now
    // Of those, bytes page-locked for device copies (see below).
    uint64_t staging_pinned_bytes = 0;
    // The caller's stall: how long save() blocked, from the call to its
    // return (waiting for a slot, allocating, copying, reserving the
    // manager's index), for saves taken or skipped; save() calls that threw
    // are not counted.
    double last_stall_seconds = 0;
    double max_stall_seconds = 0;
    double total_stall_seconds = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
