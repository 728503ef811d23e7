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
//     committed. save() blocks until one finishes when that many are pending.
//     Saves commit in the order save() was called.
//   - Persisting goes through the commit protocol (commit.h): the file is
//     written durably in parallel blocks, then the manifest; with a
//     CheckpointManager, reserve_next() happens in save() and
//     commit_reserved() in the background.
//   - Errors are never lost: a failed save's error is rethrown by its
//     handle's wait() (and returned by error()); if no one has looked at it
//     that way, the next save(), wait_all() or close() throws it instead
//     (once), before doing anything else. A failed save commits nothing and
//     leaves earlier checkpoints intact.
//
// Thread-safety: one AsyncSaver may be called from several threads; calls
// are serialized. SaveHandle copies may be used from any thread.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cairn/state.h"

namespace cairn {

struct AsyncSaveOptions {
  unsigned max_in_flight = 1;  // >= 1
  SaveOptions write = {};      // threads and block size of the background writes
  // Threads copying into staging (0: min(2, hardware threads)).
  unsigned snapshot_threads = 0;
};

// The observable state of one background save. Copies share it.
class [[nodiscard]] SaveHandle {
 public:
  SaveHandle() = default;
  // Blocks until the save is committed or failed; rethrows its error.
  void wait() const;
  // True once the save has committed or failed; never blocks.
  bool done() const;
  // The error of a failed save (null while pending or after success). Looking
  // counts as seeing it: it will not be rethrown by the saver.
  std::exception_ptr error() const;
  // Where the save goes (the reserved checkpoint for a manager save).
  Checkpoint checkpoint() const;
  // The manager's record of a committed manager save (after wait()).
  std::optional<CheckpointRecord> record() const;
  // The manifest written by the commit (after wait()).
  std::optional<Manifest> manifest() const;

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

  // Waits for every pending save; throws the first error not yet seen.
  void wait_all();
  // wait_all(), then stops the background thread. Later saves are
  // kFailedPrecondition.
  void close();

  struct Stats {
    uint64_t saves = 0;                // snapshots taken
    uint64_t staging_allocations = 0;  // times a staging buffer was (re)allocated
    uint64_t staging_bytes = 0;        // bytes of staging memory held now
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
