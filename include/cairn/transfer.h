// Copying committed checkpoints and whole experiments between any two
// storages (local <-> S3, S3 <-> S3, file <-> file, memory), by URI.
//
// What is copied:
//   - a checkpoint: only a committed one (it has a whole .cairn/manifest.json,
//     not a torn one: Manifest::torn). Its
//     files, its metadata, then its manifest, last. The destination is the
//     checkpoint location itself (DST becomes the checkpoint; nothing is
//     appended to its name).
//   - an experiment: every committed checkpoint_NNNNNN folder in index order
//     (uncommitted leftovers of interrupted saves are skipped and reported),
//     then the experiment's other files (trainer_state.json, ...), then
//     checkpoint_manager.json last, so the destination's history never names
//     a checkpoint that is not there yet. .cairn.lock is never copied.
//
// Integrity: every file is checksummed (XXH3-64) as it is read and must match
// the source manifest (kCorruption naming the source file otherwise, and the
// destination stays uncommitted). Once every file has landed it is read back
// from the destination and checked against the manifest before the manifest
// is written, so a destination checkpoint that carries a manifest is whole:
// a half-done, failed or corrupt copy is never a committed checkpoint.
//
// Resume and idempotence (as `aws s3 sync`, but by checksum rather than by
// size and time): a destination file already present with the manifest's size
// and checksum is not copied again (TransferReport::files_skipped). A
// destination that is already a committed checkpoint with an identical
// manifest is left as it is (only its metadata is brought up to date, since
// metadata may change after a commit); one with a different manifest is
// kAlreadyExists naming it, and nothing is written (committed data is never
// overwritten). An uncommitted destination holding files that the source's
// manifest does not list is kAlreadyExists too: it is someone else's data,
// not an earlier attempt of this copy. A torn manifest at the destination (a
// copy killed while writing it) is no commit: the copy goes on over it.
// Nothing is ever deleted at the
// destination (no --delete): checkpoints that exist only there are kept.
//
// Concurrency: the source is only read and never locked, so a live training
// run may be copied; a checkpoint that its retention deletes during the copy
// is skipped with a warning, and checkpoints it commits meanwhile are copied
// when the history written last names them. An experiment copy holds the
// destination experiment's lock (.cairn.lock) for its whole duration: a
// manager or another copy writing there is kLocked. A checkpoint copy takes no
// lock; two copies into one checkpoint location must not run at once.
//
// Durability: as Storage: each file is durable when committed, and the
// destination checkpoint is committed, durably, when its manifest lands.
//
// Thread-safety: the calls may run concurrently on different destinations.
// They use TransferOptions::jobs threads of their own; the progress callback
// is called from them, one call at a time (never concurrently).
//
// Failure: throws cairn::Error naming the source or destination URI and key
// at fault: kNotFound (no source), kFailedPrecondition (an uncommitted
// source), kCorruption (a file that does not match its manifest, a malformed
// manifest or history), kAlreadyExists (see above), kInvalidArgument (bad
// options, a source that is a storage root holding several experiments), and
// storage errors (kNoSpace, kPermissionDenied, kIO, kUnavailable, ...). What
// was committed at the destination before a failure stays there, so a re-run
// resumes.
//
// Memory: up to jobs x chunk_size bytes of buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn {

enum class TransferKind { kCheckpoint, kExperiment };

struct TransferProgress {
  uint64_t bytes_done = 0;     // copied or found already in place, so far
  uint64_t bytes_total = 0;    // of everything to be copied (known before the first byte)
  uint64_t bytes_skipped = 0;  // of bytes_done, found already in place (not transferred)
  uint64_t files_done = 0;
  uint64_t files_total = 0;
  // Set when a file has just been finished: its destination URI, and whether
  // it was found already in place. Empty for progress within a file.
  std::string file;
  bool skipped = false;
};

// How a copy checks what landed at the destination before it writes the
// manifest there.
enum class TransferVerify {
  // kSize where the destination checks every upload's integrity itself (S3:
  // Content-MD5 on every PUT and part, so the server refuses bytes that
  // differ from the ones Cairn checksummed), kChecksum elsewhere.
  kAuto,
  // Read every copied file back and compare its size and XXH3-64. A file on
  // a local file system is read with O_DIRECT where it has it: from the
  // disk, not from the page cache that still holds what the copy wrote.
  kChecksum,
  // Compare every copied file's size as stored (one stat each).
  kSize,
};

struct TransferOptions {
  // Threads reading and writing at once; >= 1.
  int jobs = 8;
  // A file larger than this is copied as ranged chunks of this size
  // (Reader::read_at / Writer::write_at), in parallel; >= 1. Each job's
  // buffer is fresh memory on every copy, slow to touch on virtual machines
  // (docs/benchmarks.md): 16 MiB, one S3 part or ranged GET, measured faster
  // than 64 MiB both ways to and from S3.
  uint64_t chunk_size = 16ull << 20;
  // Progress, after every chunk and every file; see the thread-safety note.
  // An exception thrown from it stops the copy and is rethrown.
  std::function<void(const TransferProgress&)> progress;
  // Seconds on a monotonic clock, for TransferReport::seconds. Default: the
  // steady clock.
  std::function<double()> clock;
  TransferVerify verify = TransferVerify::kAuto;
};

struct TransferReport {
  TransferKind kind = TransferKind::kCheckpoint;
  std::string source;  // normalized URIs
  std::string destination;
  uint64_t files_copied = 0;
  uint64_t bytes_copied = 0;
  uint64_t files_skipped = 0;  // already at the destination with the right size and checksum
  uint64_t bytes_skipped = 0;
  // Destination URIs of the checkpoints committed by this call, and of those
  // that were already committed there with an identical manifest.
  std::vector<std::string> checkpoints_copied;
  std::vector<std::string> checkpoints_unchanged;
  // Source URIs of uncommitted checkpoint folders that were not copied.
  std::vector<std::string> uncommitted_skipped;
  // Things the caller should know that did not stop the copy.
  std::vector<std::string> warnings;
  double seconds = 0.0;  // by TransferOptions::clock
};

// What `uri` holds: a committed checkpoint or an experiment. Throws kNotFound
// when nothing is stored there, kFailedPrecondition for an uncommitted
// checkpoint, kInvalidArgument for a storage root holding experiments.
TransferKind detect_transfer_kind(std::string_view uri);

// Copies the committed checkpoint at `src_uri` to `dst_uri`.
TransferReport copy_checkpoint(std::string_view src_uri, std::string_view dst_uri,
                               const TransferOptions& options = {});

// Copies the experiment at `src_uri` into the experiment at `dst_uri`.
TransferReport copy_experiment(std::string_view src_uri, std::string_view dst_uri,
                               const TransferOptions& options = {});

// copy_checkpoint or copy_experiment, by detect_transfer_kind(src_uri).
TransferReport transfer(std::string_view src_uri, std::string_view dst_uri,
                        const TransferOptions& options = {});

}  // namespace cairn
