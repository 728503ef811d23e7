// Asynchronous saves. save() lays out the file, copies the whole file image
// (header and tensors) into a reused staging buffer and queues a job; one
// background thread runs the jobs in order: parallel block writes through
// the storage Writer (durable on commit), then the commit protocol
// (CheckpointWriter, or CheckpointManager::commit_reserved). Errors are kept
// on the job's shared state until someone sees them (see async_save.h).
//
// Every kind of save is one job of one or more file images in one staging
// buffer: a single-file save has one image; a rank save (save_rank_shards)
// one image and no commit; a sharded save (save_sharded) one image per rank,
// back to back, committed with commit_sharded() once every file is durable.
// So the slots, the queue, the policies and the error handling below are
// the same for all of them.
//
// Staging: `slots` has a fixed number of entries (max_in_flight, or
// max_staging_buffers under kExtraBuffer), each an empty or allocated
// buffer. A slot is busy from the save() that claims it until the
// background finishes its job; only the slot's owner (the claiming save()
// or reserve(), then the background) touches its buffer, and a buffer is
// replaced only under `mu` so that stats() may read the sizes.
#include "cairn/async_save.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "engine/io.h"
#include "engine/sharded_plan.h"
#include "util/log.h"

namespace cairn {

struct SaveHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool skipped = false;  // WhenBusy::kSkip: nothing taken, nothing to wait for
  std::exception_ptr error;
  bool seen = false;  // the error was rethrown or handed out once
  std::optional<Checkpoint> dest;
  std::optional<CheckpointRecord> record;
  std::optional<Manifest> manifest;
  std::optional<RankShards> rank_shards;
};

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

SaveHandle::State& checked(const std::shared_ptr<SaveHandle::State>& s) {
  if (!s) throw Error(ErrorCode::kFailedPrecondition, "empty SaveHandle (not returned by a save)");
  return *s;
}

}  // namespace

void SaveHandle::wait() const {
  auto& s = checked(state_);
  std::unique_lock<std::mutex> g(s.mu);
  s.cv.wait(g, [&] { return s.done; });
  if (s.error) {
    s.seen = true;
    std::rethrow_exception(s.error);
  }
}

bool SaveHandle::done() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  return s.done;
}

bool SaveHandle::skipped() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  return s.skipped;
}

std::exception_ptr SaveHandle::error() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  if (!s.done) return nullptr;
  if (s.error) s.seen = true;
  return s.error;
}

Checkpoint SaveHandle::checkpoint() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  if (!s.dest) throw Error(ErrorCode::kFailedPrecondition, "the save was skipped: no checkpoint");
  return *s.dest;
}

std::optional<CheckpointRecord> SaveHandle::record() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  return s.record;
}

std::optional<Manifest> SaveHandle::manifest() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  return s.manifest;
}

std::optional<RankShards> SaveHandle::rank_shards() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  return s.rank_shards;
}

struct AsyncSaver::Impl {
  enum class Kind {
    kFile,     // save(): one file, committed
    kRank,     // save_rank_shards(): one rank file, not committed
    kSharded,  // save_sharded(): a rank file per part, committed together
  };
  // A file of a job: `size` bytes at `offset` in the job's staging buffer.
  struct Image {
    std::string file;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  struct Job {
    std::shared_ptr<SaveHandle::State> state;
    Kind kind = Kind::kFile;
    size_t slot = 0;
    std::vector<Image> images;
    Checkpoint dest;
    CheckpointManager* manager = nullptr;
    nlohmann::json metrics;
    nlohmann::json metadata;
    // kRank, kSharded: the rank reports, one per image, whose file entries
    // are filled in once written.
    std::vector<RankShards> ranks;
  };
  // A checked save, before its snapshot: the job to be, with the states
  // whose images it writes (one per file; copies, which share the caller's
  // tensors, read only while save() runs).
  struct Request {
    Kind kind = Kind::kFile;
    std::vector<StateDict> states;
    std::vector<std::string> files;
    std::vector<RankShards> ranks;
    std::optional<Checkpoint> target;  // empty for a manager save
    CheckpointManager* manager = nullptr;
    nlohmann::json metrics = nlohmann::json::object();
    nlohmann::json metadata = nlohmann::json::object();
  };
  // What a finished job leaves on its handle.
  struct Outcome {
    std::optional<CheckpointRecord> record;
    std::optional<Manifest> manifest;
    std::optional<RankShards> rank_shards;
  };

  // Images of one job start at multiples of this in its staging buffer, so
  // that each may be written directly without a copy (see write_image).
  static constexpr uint64_t kImageAlignment = format::kDirectAlignment;

  AsyncSaveOptions options;
  std::mutex call_mu;  // serializes the public calls
  // A reserve(..., kBackground) at work, and its error for the next call;
  // call_mu guards both (every public call joins it first: settle_locked()).
  std::thread reserver;
  std::exception_ptr reserve_error;
  // Of the last save, one per file image (a training loop saves the same
  // tensors again and again); call_mu guards them.
  std::vector<format::SavePlan> plans;
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<Job> queue;
  bool running_job = false;
  bool stopping = false;
  bool closed = false;
  std::vector<format::HugeBuffer> slots;
  std::vector<bool> slot_busy;
  std::vector<std::shared_ptr<SaveHandle::State>> failed;  // errors possibly unseen
  Stats stats;
  std::thread worker;

  explicit Impl(AsyncSaveOptions o) : options(std::move(o)) {
    if (options.max_in_flight == 0) {
      throw Error(ErrorCode::kInvalidArgument, "AsyncSaveOptions::max_in_flight must be >= 1");
    }
    size_t count = options.max_in_flight;
    if (options.when_busy == WhenBusy::kExtraBuffer) {
      if (options.max_staging_buffers == 0) {
        options.max_staging_buffers = options.max_in_flight + 1;
      }
      if (options.max_staging_buffers < options.max_in_flight) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("AsyncSaveOptions::max_staging_buffers ({}) is below "
                                "max_in_flight ({})",
                                options.max_staging_buffers, options.max_in_flight));
      }
      count = options.max_staging_buffers;
    }
    slots.resize(count);
    slot_busy.assign(count, false);
    worker = std::thread([this] { run(); });
  }

  unsigned snapshot_threads() const {
    return options.snapshot_threads != 0 ? options.snapshot_threads
                                         : std::min(2u, format::pick_threads(0));
  }

  bool any_free_locked() const {
    return std::find(slot_busy.begin(), slot_busy.end(), false) != slot_busy.end();
  }

  // A free slot for an image of `size` bytes: one whose buffer is large
  // enough, else one holding a buffer (replaced, so the count of buffers
  // does not grow), else an empty one. Call with mu, with a slot free.
  size_t pick_slot_locked(uint64_t size) const {
    std::optional<size_t> held, empty;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slot_busy[i]) continue;
      if (slots[i].size() >= size) return i;
      if (slots[i].size() > 0) {
        if (!held) held = i;
      } else if (!empty) {
        empty = i;
      }
    }
    return held ? *held : *empty;
  }

  // Makes the buffer of `slot` (owned by the caller: busy, or free while
  // call_mu is held) at least `size` bytes; pre-faults a new one when asked.
  void ensure_buffer(size_t slot, uint64_t size, bool prefault_pages) {
    if (slots[slot].size() >= size) return;
    format::HugeBuffer old;
    {
      std::lock_guard<std::mutex> g(mu);
      old = std::move(slots[slot]);
    }
    old = format::HugeBuffer();  // release before allocating the larger one
    format::HugeBuffer fresh(size);
    if (prefault_pages) format::prefault(fresh.data(), fresh.size(), snapshot_threads());
    std::lock_guard<std::mutex> g(mu);
    slots[slot] = std::move(fresh);
    ++stats.staging_allocations;
    stats.staging_pinned_bytes = pinned_bytes_locked();
  }

  // Bytes of staging pinned for device copies. Call with mu.
  uint64_t pinned_bytes_locked() const {
    uint64_t n = 0;
    for (const auto& b : slots) n += b.pinned() ? b.size() : 0;
    return n;
  }

  // Records the stall of a save() that started at `t0`. Call with mu.
  void record_stall_locked(std::chrono::steady_clock::time_point t0) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats.last_stall_seconds = s;
    stats.max_stall_seconds = std::max(stats.max_stall_seconds, s);
    stats.total_stall_seconds += s;
  }

  // Throws the first failed save's error that no one has seen. Call with mu.
  void surface_unseen_locked() {
    std::exception_ptr first;
    for (auto& s : failed) {
      std::lock_guard<std::mutex> g(s->mu);
      if (!s->seen && !first) {
        s->seen = true;
        first = s->error;
      }
    }
    failed.erase(std::remove_if(failed.begin(), failed.end(),
                                [](const auto& s) {
                                  std::lock_guard<std::mutex> g(s->mu);
                                  return s->seen;
                                }),
                 failed.end());
    if (first) std::rethrow_exception(first);
  }

  void run() {
    for (;;) {
      std::optional<Job> next;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        next.emplace(std::move(queue.front()));
        queue.pop_front();
        running_job = true;
      }
      Job& job = *next;
      std::exception_ptr error;
      Outcome outcome;
      try {
        persist(job, outcome);
      } catch (...) {
        error = std::current_exception();
        outcome = {};
        if (job.manager) discard(job.dest);
      }
      {
        std::lock_guard<std::mutex> g(job.state->mu);
        job.state->error = error;
        job.state->record = std::move(outcome.record);
        job.state->manifest = std::move(outcome.manifest);
        job.state->rank_shards = std::move(outcome.rank_shards);
      }
      // The slot is free before the handle says done, so that a save()
      // called after wait() returns finds it free (and, under kSkip, is not
      // skipped); the error is in the state before the failed list holds
      // it; and the job stops running only once its handle is done, so that
      // after wait_all() every handle is done.
      {
        std::lock_guard<std::mutex> g(mu);
        slot_busy[job.slot] = false;
        if (error) failed.push_back(job.state);
      }
      cv.notify_all();
      {
        std::lock_guard<std::mutex> g(job.state->mu);
        job.state->done = true;
      }
      job.state->cv.notify_all();
      {
        std::lock_guard<std::mutex> g(mu);
        running_job = false;
      }
      cv.notify_all();
    }
  }

  // Writes one image of `job` durably; returns its manifest entry.
  ManifestEntry write_image(const Job& job, const Image& image) {
    auto writer = job.dest.storage().open_writer(image.file);
    const format::HugeBuffer& buffer = slots[job.slot];
    std::vector<format::Piece> pieces{{0, {buffer.data() + image.offset, image.size}}};
    // The staging buffer is 2 MiB-aligned and rounded up to 2 MiB and each
    // image starts at a multiple of kImageAlignment, so a direct write takes
    // the image as it is; its last window reads on past the image (padding,
    // or the next image), bytes the commit trims off.
    format::FileDigest digest = format::write_file(
        pieces, image.size,
        format::sink_of(*writer, format::wants_direct(options.write, image.size)), options.write,
        job.dest.storage().uri_of(image.file), buffer.size() - image.offset);
    writer->commit();
    return digest.entry(image.file, image.size);
  }

  void persist(Job& job, Outcome& out) {
    try {
      // The disk holds no more than with deletion inside the save: the
      // previous checkpoints' queued deletions finish before this writes,
      // and the index is persisted before anything is written there.
      if (job.manager) job.manager->prepare_reserved(job.dest);
      std::vector<ManifestEntry> entries;
      for (const Image& image : job.images) entries.push_back(write_image(job, image));
      switch (job.kind) {
        case Kind::kFile:
          if (job.manager) {
            if (!job.metadata.empty()) job.dest.set_metadata(job.metadata);
            out.record = job.manager->commit_reserved(job.dest, job.metrics, entries);
            out.manifest = out.record->checkpoint.manifest();
          } else {
            CheckpointWriter w(job.dest);
            w.add_written(entries.front());
            out.manifest = w.commit(job.metrics, now_seconds(),
                                    job.metadata.empty() ? nullptr : &job.metadata);
          }
          break;
        case Kind::kRank:
          job.ranks.front().files = {entries.front()};
          out.rank_shards = job.ranks.front();
          break;
        case Kind::kSharded:
          for (size_t i = 0; i < entries.size(); ++i) job.ranks[i].files = {entries[i]};
          if (job.manager) {
            out.record = commit_sharded(*job.manager, job.dest, job.ranks, job.metrics);
            out.manifest = out.record->checkpoint.manifest();
          } else {
            out.manifest = commit_sharded(job.dest, job.ranks, job.metrics);
          }
          break;
      }
    } catch (const Error& e) {
      throw with_context(e, describe(job));
    }
  }

  static std::string describe(const Job& job) {
    switch (job.kind) {
      case Kind::kRank:
        return fmt::format("async save of rank {} into {}", job.ranks.front().rank, job.dest.uri());
      case Kind::kSharded:
        return fmt::format("async sharded save of {} ranks into {}", job.ranks.size(),
                           job.dest.uri());
      case Kind::kFile:
        break;
    }
    return fmt::format("async save into {}", job.dest.uri());
  }

  static void discard(const Checkpoint& dest) {
    try {
      if (!dest.is_committed()) remove_uncommitted(dest);
    } catch (const Error& e) {
      // ignore-error: the manager removes leftovers when it next opens; the
      // save's own error is what the caller needs.
      log::warn(fmt::format("could not clean up {}: {}", dest.uri(), e.what()));
    }
  }

  // Waits for a background reservation; throws its error once. Call first
  // under call_mu: while it runs, it owns the slots that no save holds.
  void settle_locked() {
    if (reserver.joinable()) reserver.join();
    if (reserve_error) std::rethrow_exception(std::exchange(reserve_error, nullptr));
  }

  // The first check of every save: no reservation at work, not closed, and
  // no unseen error. Call with call_mu.
  void check_open_locked() {
    settle_locked();
    std::lock_guard<std::mutex> g(mu);
    if (closed) throw Error(ErrorCode::kFailedPrecondition, "AsyncSaver is closed");
    surface_unseen_locked();
  }

  static void refuse_committed(const Checkpoint& dest) {
    if (dest.is_committed()) {
      throw Error(ErrorCode::kAlreadyExists,
                  fmt::format("{}: already a committed checkpoint", dest.uri()));
    }
  }

  // Checks a sharded save's parts and plans their rank files: every spec,
  // and that the shards of every tensor tile it.
  static Request sharded_request(const std::vector<ShardedPart>& parts) {
    if (parts.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "a sharded save needs at least one rank's part");
    }
    Request r;
    r.kind = Kind::kSharded;
    for (const ShardedPart& part : parts) {
      format::RankPlan plan = format::plan_rank_file(part.state, part.specs, part.rank);
      r.states.push_back(std::move(plan.file_state));
      r.files.push_back(std::move(plan.file));
      r.ranks.push_back(std::move(plan.report));
    }
    format::check_sharded_layout(r.ranks);
    return r;
  }

  // Where the image after `end` bytes of staging starts.
  static uint64_t image_offset(uint64_t end) {
    return (end + kImageAlignment - 1) / kImageAlignment * kImageAlignment;
  }
  // The staging one save of files of these sizes takes.
  static uint64_t staging_size(const std::vector<uint64_t>& sizes) {
    uint64_t end = 0;
    for (uint64_t n : sizes) end = image_offset(end) + n;
    return end;
  }

  SaveHandle save_file(const StateDict& state, std::optional<Checkpoint> target,
                       CheckpointManager* manager, nlohmann::json metrics, std::string file) {
    const auto t0 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> call(call_mu);
    check_open_locked();
    validate_key(file);
    if (!manager) refuse_committed(*target);
    Request r;
    r.kind = Kind::kFile;
    r.states.push_back(state);
    r.files.push_back(std::move(file));
    r.target = std::move(target);
    r.manager = manager;
    r.metrics = std::move(metrics);
    r.metadata = state.metadata;
    return submit_locked(std::move(r), t0);
  }

  SaveHandle save_rank(const StateDict& local, const std::map<std::string, ShardSpec>& specs,
                       Checkpoint dest, int rank) {
    const auto t0 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> call(call_mu);
    check_open_locked();
    format::RankPlan plan = format::plan_rank_file(local, specs, rank);
    refuse_committed(dest);
    Request r;
    r.kind = Kind::kRank;
    r.states.push_back(std::move(plan.file_state));
    r.files.push_back(std::move(plan.file));
    r.ranks.push_back(std::move(plan.report));
    r.target = std::move(dest);
    return submit_locked(std::move(r), t0);
  }

  SaveHandle save_sharded(const std::vector<ShardedPart>& parts, std::optional<Checkpoint> target,
                          CheckpointManager* manager, nlohmann::json metrics) {
    const auto t0 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> call(call_mu);
    check_open_locked();
    Request r = sharded_request(parts);
    if (!manager) refuse_committed(*target);
    r.target = std::move(target);
    r.manager = manager;
    r.metrics = std::move(metrics);
    return submit_locked(std::move(r), t0);
  }

  // Applies the when_busy policy, snapshots the request's images into a
  // slot, reserves the manager's index and queues the job. Call with call_mu
  // held, after every check of the request: from here on the only failures
  // are the layout of a state (as a synchronous save would fail),
  // allocation and the manager's reservation, and none leaves anything
  // taken or reserved.
  SaveHandle submit_locked(Request r, std::chrono::steady_clock::time_point t0) {
    if (options.when_busy == WhenBusy::kSkip) {
      // Slots are claimed only under call_mu, which this call holds: one free
      // now stays free until this save claims it below.
      std::lock_guard<std::mutex> g(mu);
      if (!any_free_locked()) {
        ++stats.skipped;
        record_stall_locked(t0);
        auto st = std::make_shared<SaveHandle::State>();
        st->done = true;
        st->skipped = true;
        return SaveHandle(st);
      }
    }
    // A training loop saves the same tensors again and again: the last
    // save's plans serve again, with the new metadata.
    if (plans.size() < r.states.size()) plans.resize(r.states.size());
    std::vector<Image> images;
    uint64_t size = 0;  // of the staging the images take
    for (size_t i = 0; i < r.states.size(); ++i) {
      format::update_plan(plans[i], r.states[i]);
      const uint64_t offset = image_offset(size);
      images.push_back({std::move(r.files[i]), offset, plans[i].layout->parsed.file_size()});
      size = offset + images.back().size;
    }
    // One list of pieces for the whole buffer, so that the copy of several
    // small rank files is spread over the snapshot threads as one.
    std::vector<format::Piece> shifted;
    if (images.size() > 1) {
      for (size_t i = 0; i < images.size(); ++i) {
        for (const format::Piece& p : plans[i].pieces) {
          shifted.push_back({images[i].offset + p.offset, p.data, p.device});
        }
      }
    }
    const std::vector<format::Piece>& pieces = images.size() > 1 ? shifted : plans[0].pieces;

    size_t slot = 0;
    bool extra = false;  // taken beyond max_in_flight (kExtraBuffer)
    {
      std::unique_lock<std::mutex> g(mu);
      if (!any_free_locked()) {
        ++stats.waits;
        cv.wait(g, [&] { return any_free_locked(); });
      }
      // A save that failed while we waited surfaces now, not one call later.
      surface_unseen_locked();
      const auto pending =
          static_cast<size_t>(std::count(slot_busy.begin(), slot_busy.end(), true));
      extra = pending >= options.max_in_flight;
      slot = pick_slot_locked(size);
      slot_busy[slot] = true;
    }
    try {
      // No separate pre-fault here: the copy below writes every page of the
      // images on snapshot_threads threads, which is the touch itself.
      ensure_buffer(slot, size, /*prefault_pages=*/false);
      // Device tensors copy at full speed only into page-locked memory: the
      // buffer is pinned once and stays pinned while it is reused.
      if (format::pin_for(slots[slot], pieces) > 0) {
        std::lock_guard<std::mutex> g(mu);
        stats.staging_pinned_bytes = pinned_bytes_locked();
      }
      try {
        format::copy_pieces(pieces, {slots[slot].data(), slots[slot].size()}, snapshot_threads());
      } catch (const Error& e) {
        throw with_context(
            e, fmt::format("snapshot of {}", r.target ? r.target->uri() : r.manager->uri()));
      }
      // Only the index: the writer makes the location ready before it
      // writes (persist()), so the stall holds no I/O and does not wait
      // for deletions the last commit queued.
      if (r.manager) {
        r.target = r.manager->reserve_next(CheckpointManager::Reservation::kDeferred);
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      slot_busy[slot] = false;
      cv.notify_all();
      throw;
    }

    auto st = std::make_shared<SaveHandle::State>();
    st->dest = r.target;
    Job job{st,
            r.kind,
            slot,
            std::move(images),
            *r.target,
            r.manager,
            std::move(r.metrics),
            std::move(r.metadata),
            std::move(r.ranks)};
    {
      std::lock_guard<std::mutex> g(mu);
      ++stats.saves;
      if (extra) ++stats.extra_buffer_saves;
      queue.push_back(std::move(job));
      record_stall_locked(t0);
    }
    cv.notify_all();
    return SaveHandle(st);
  }

  // `device`: pin the buffers for it too (a state with device tensors).
  void reserve(uint64_t bytes, unsigned buffers, const std::shared_ptr<const Device>& device,
               Reserve how) {
    std::lock_guard<std::mutex> call(call_mu);
    check_open_locked();
    if (buffers == 0 || buffers > slots.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("AsyncSaver::reserve: {} buffers asked for; this saver holds 1 to {}",
                              buffers, slots.size()));
    }
    if (bytes == 0) return;
    if (how == Reserve::kNow) return fill_slots(bytes, buffers, device);
    reserver = std::thread([this, bytes, buffers, device] {
      const std::string what =
          fmt::format("AsyncSaver::reserve in the background ({} bytes)", bytes);
      try {
        fill_slots(bytes, buffers, device);
      } catch (const Error& e) {
        reserve_error = std::make_exception_ptr(with_context(e, what));
      } catch (const std::exception& e) {
        reserve_error =
            std::make_exception_ptr(Error(ErrorCode::kIO, fmt::format("{}: {}", what, e.what())));
      }
    });
  }

  // Makes the first `buffers` slots hold at least `bytes`, touched. Call
  // holding call_mu, or on the reserver thread (which call_mu's holders join).
  void fill_slots(uint64_t bytes, unsigned buffers, const std::shared_ptr<const Device>& device) {
    for (size_t i = 0; i < buffers; ++i) {
      {
        // Only a too small buffer still holding a pending save is waited for.
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return !slot_busy[i] || slots[i].size() >= bytes; });
        if (slots[i].size() < bytes) {
          g.unlock();
          // Free, and no save() can claim it while this call holds call_mu.
          ensure_buffer(i, bytes, /*prefault_pages=*/true);
        }
      }
      // Pinning reads nothing a pending save's write reads: the buffer may be busy.
      if (device && slots[i].pin(device)) {
        std::lock_guard<std::mutex> g(mu);
        stats.staging_pinned_bytes = pinned_bytes_locked();
      }
    }
  }

  void wait_idle() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return queue.empty() && !running_job; });
  }

  void stop() {
    if (reserver.joinable()) reserver.join();  // its error, if any, unseen: the memory is moot
    {
      std::lock_guard<std::mutex> g(mu);
      stopping = true;
      closed = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
};

AsyncSaver::AsyncSaver(AsyncSaveOptions options) : impl_(std::make_unique<Impl>(options)) {}

AsyncSaver::~AsyncSaver() {
  impl_->wait_idle();
  impl_->stop();
  std::lock_guard<std::mutex> g(impl_->mu);
  for (auto& s : impl_->failed) {
    std::lock_guard<std::mutex> sg(s->mu);
    if (s->seen) continue;
    try {
      std::rethrow_exception(s->error);
    } catch (const std::exception& e) {
      // ignore-error: a destructor cannot throw; close() would have thrown this.
      log::error(fmt::format("an async save failed and no one waited for it: {}", e.what()));
    }
  }
}

SaveHandle AsyncSaver::save(const StateDict& state, Checkpoint dest, nlohmann::json metrics,
                            std::string file) {
  return impl_->save_file(state, std::move(dest), nullptr, std::move(metrics), std::move(file));
}

SaveHandle AsyncSaver::save(const StateDict& state, CheckpointManager& manager,
                            nlohmann::json metrics, std::string file) {
  return impl_->save_file(state, std::nullopt, &manager, std::move(metrics), std::move(file));
}

SaveHandle AsyncSaver::save_rank_shards(const StateDict& local,
                                        const std::map<std::string, ShardSpec>& specs,
                                        Checkpoint dest, int rank) {
  return impl_->save_rank(local, specs, std::move(dest), rank);
}

SaveHandle AsyncSaver::save_sharded(const std::vector<ShardedPart>& parts, Checkpoint dest,
                                    nlohmann::json metrics) {
  return impl_->save_sharded(parts, std::move(dest), nullptr, std::move(metrics));
}

SaveHandle AsyncSaver::save_sharded(const std::vector<ShardedPart>& parts,
                                    CheckpointManager& manager, nlohmann::json metrics) {
  return impl_->save_sharded(parts, std::nullopt, &manager, std::move(metrics));
}

void AsyncSaver::reserve(uint64_t bytes, unsigned buffers, Reserve how) {
  impl_->reserve(bytes, buffers, nullptr, how);
}

void AsyncSaver::reserve(const StateDict& state, unsigned buffers, Reserve how) {
  impl_->reserve(layout_state(state).parsed.file_size(), buffers, format::first_device(state), how);
}

void AsyncSaver::reserve(const std::vector<ShardedPart>& parts, unsigned buffers, Reserve how) {
  std::vector<uint64_t> sizes;
  for (const StateDict& s : Impl::sharded_request(parts).states) {
    sizes.push_back(layout_state(s).parsed.file_size());
  }
  std::shared_ptr<const Device> device;
  for (const ShardedPart& p : parts) {
    if (!device) device = format::first_device(p.state);
  }
  impl_->reserve(Impl::staging_size(sizes), buffers, device, how);
}

void AsyncSaver::wait_all() {
  std::lock_guard<std::mutex> call(impl_->call_mu);
  impl_->settle_locked();
  impl_->wait_idle();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->surface_unseen_locked();
}

void AsyncSaver::close() {
  std::lock_guard<std::mutex> call(impl_->call_mu);
  // A failed background reservation does not keep the saver open.
  std::exception_ptr reservation;
  try {
    impl_->settle_locked();
  } catch (...) {
    reservation = std::current_exception();
  }
  impl_->wait_idle();
  impl_->stop();
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->surface_unseen_locked();
  }
  if (reservation) std::rethrow_exception(reservation);
}

AsyncSaver::Stats AsyncSaver::stats() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  Stats s = impl_->stats;
  s.staging_bytes = 0;
  for (const auto& b : impl_->slots) s.staging_bytes += b.size();
  return s;
}

}  // namespace cairn
