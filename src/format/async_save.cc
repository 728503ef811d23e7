// Asynchronous saves. save() lays out the file, copies the whole file image
// (header and tensors) into a reused staging buffer and queues a job; one
// background thread runs the jobs in order: parallel block writes through
// the storage Writer (durable on commit), then the commit protocol
// (CheckpointWriter, or CheckpointManager::commit_reserved). Errors are kept
// on the job's shared state until someone sees them (see async_save.h).
#include "cairn/async_save.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "format/io.h"
#include "util/log.h"

namespace cairn {

struct SaveHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  bool seen = false;  // the error was rethrown or handed out once
  std::optional<Checkpoint> dest;
  std::optional<CheckpointRecord> record;
  std::optional<Manifest> manifest;
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

std::exception_ptr SaveHandle::error() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
  if (s.error) s.seen = true;
  return s.error;
}

Checkpoint SaveHandle::checkpoint() const {
  auto& s = checked(state_);
  std::lock_guard<std::mutex> g(s.mu);
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

struct AsyncSaver::Impl {
  struct Job {
    std::shared_ptr<SaveHandle::State> state;
    size_t slot = 0;
    uint64_t size = 0;
    Checkpoint dest;
    CheckpointManager* manager = nullptr;
    nlohmann::json metrics;
    nlohmann::json metadata;
    std::string file;
  };

  AsyncSaveOptions options;
  std::mutex call_mu;  // serializes the public calls
  std::mutex mu;       // guards everything below
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
    slots.resize(options.max_in_flight);
    slot_busy.assign(options.max_in_flight, false);
    worker = std::thread([this] { run(); });
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
      std::optional<CheckpointRecord> record;
      std::optional<Manifest> manifest;
      try {
        persist(job, record, manifest);
      } catch (...) {
        error = std::current_exception();
        if (job.manager) discard(job.dest);
      }
      {
        std::lock_guard<std::mutex> g(job.state->mu);
        job.state->done = true;
        job.state->error = error;
        job.state->record = std::move(record);
        job.state->manifest = std::move(manifest);
      }
      job.state->cv.notify_all();
      {
        std::lock_guard<std::mutex> g(mu);
        slot_busy[job.slot] = false;
        running_job = false;
        if (error) failed.push_back(job.state);
      }
      cv.notify_all();
    }
  }

  void persist(const Job& job, std::optional<CheckpointRecord>& record,
               std::optional<Manifest>& manifest) {
    try {
      auto writer = job.dest.storage().open_writer(job.file);
      std::vector<format::Piece> image{{0, {slots[job.slot].data(), job.size}}};
      // The staging buffer is 2 MiB-aligned and rounded up to 2 MiB, so a
      // direct write takes the image as it is, padding included.
      uint64_t hash = format::write_file(
          image, job.size,
          format::sink_of(*writer, format::wants_direct(options.write, job.size)), options.write,
          job.dest.storage().uri_of(job.file), slots[job.slot].size());
      writer->commit();
      ManifestEntry entry{job.file, job.size, hash};
      if (job.manager) {
        if (!job.metadata.empty()) job.dest.set_metadata(job.metadata);
        record = job.manager->commit_reserved(job.dest, job.metrics, {entry});
        manifest = record->checkpoint.manifest();
      } else {
        CheckpointWriter w(job.dest);
        w.add_written(entry);
        manifest =
            w.commit(job.metrics, now_seconds(), job.metadata.empty() ? nullptr : &job.metadata);
      }
    } catch (const Error& e) {
      throw with_context(e, fmt::format("async save into {}", job.dest.uri()));
    }
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

  // `dest` is empty for a manager save: it is reserved after the snapshot.
  SaveHandle save(const StateDict& state, std::optional<Checkpoint> target,
                  CheckpointManager* manager, nlohmann::json metrics, std::string file) {
    std::lock_guard<std::mutex> call(call_mu);
    {
      std::lock_guard<std::mutex> g(mu);
      if (closed) throw Error(ErrorCode::kFailedPrecondition, "AsyncSaver is closed");
      surface_unseen_locked();
    }
    validate_key(file);
    if (!manager && target->is_committed()) {
      throw Error(ErrorCode::kAlreadyExists,
                  fmt::format("{}: already a committed checkpoint", target->uri()));
    }
    FileLayout layout = layout_state(state);
    auto pieces = format::file_pieces(layout, state);
    const uint64_t size = layout.parsed.file_size();

    size_t slot = 0;
    {
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [&] {
        return std::find(slot_busy.begin(), slot_busy.end(), false) != slot_busy.end();
      });
      // A save that failed while we waited surfaces now, not one call later.
      surface_unseen_locked();
      slot = static_cast<size_t>(std::find(slot_busy.begin(), slot_busy.end(), false) -
                                 slot_busy.begin());
      slot_busy[slot] = true;
    }
    try {
      if (slots[slot].size() < size) {
        slots[slot] = format::HugeBuffer();  // release before allocating the larger one
        slots[slot] = format::HugeBuffer(size);
        std::lock_guard<std::mutex> g(mu);
        ++stats.staging_allocations;
      }
      unsigned threads = options.snapshot_threads;
      if (threads == 0) threads = std::min(2u, format::pick_threads(0));
      format::copy_pieces(pieces, {slots[slot].data(), slots[slot].size()}, threads);
      if (manager) target = manager->reserve_next();
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      slot_busy[slot] = false;
      cv.notify_all();
      throw;
    }

    auto st = std::make_shared<SaveHandle::State>();
    st->dest = target;
    Job job{st, slot, size, *target, manager, std::move(metrics), state.metadata, std::move(file)};
    {
      std::lock_guard<std::mutex> g(mu);
      ++stats.saves;
      queue.push_back(std::move(job));
    }
    cv.notify_all();
    return SaveHandle(st);
  }

  void wait_idle() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return queue.empty() && !running_job; });
  }

  void stop() {
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
  return impl_->save(state, std::move(dest), nullptr, std::move(metrics), std::move(file));
}

SaveHandle AsyncSaver::save(const StateDict& state, CheckpointManager& manager,
                            nlohmann::json metrics, std::string file) {
  return impl_->save(state, std::nullopt, &manager, std::move(metrics), std::move(file));
}

void AsyncSaver::wait_all() {
  std::lock_guard<std::mutex> call(impl_->call_mu);
  impl_->wait_idle();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->surface_unseen_locked();
}

void AsyncSaver::close() {
  std::lock_guard<std::mutex> call(impl_->call_mu);
  impl_->wait_idle();
  impl_->stop();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->surface_unseen_locked();
}

AsyncSaver::Stats AsyncSaver::stats() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  Stats s = impl_->stats;
  s.staging_bytes = 0;
  for (const auto& b : impl_->slots) s.staging_bytes += b.size();
  return s;
}

}  // namespace cairn
