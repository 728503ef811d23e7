// The file passes of a copy (file_pass.h).
#include "experiment/file_pass.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/align.h"
#include "util/fs.h"
#include "util/hash.h"

namespace cairn::experiment {

namespace {

// One file's chunks, shared by the threads that copy them. The chunks are
// read and written in parallel but hashed in order (XXH3 is a stream), each
// thread waiting for its predecessor: a thread holds one chunk, so memory
// stays within jobs x chunk_size.
struct FileState {
  std::mutex mu;
  std::condition_variable cv;
  bool opened = false;
  bool abandoned = false;  // kProbe: not in place; or the file failed
  bool streamed = false;   // kCopy: sent whole through Storage::put_stream
  uint64_t chunks = 0;
  uint64_t next_to_hash = 0;
  std::unique_ptr<Reader> reader;
  std::unique_ptr<Writer> writer;
  UniqueFd direct;             // kVerify of a local file: the file opened with O_DIRECT
  bool direct_writes = false;  // kCopy: chunks go through Writer::write_direct
  Hasher hasher;
};

// The alignment O_DIRECT asks of offsets, lengths and buffers on every common
// device (as the file backend's direct writes use).
constexpr size_t kDirectAlign = 4096;

// A thread's chunk buffer, aligned for direct I/O. The span get() returns
// starts aligned and has room behind it up to round_up(length, kDirectAlign)
// bytes, for a direct transfer's padding.
class ChunkBuffer {
 public:
  std::span<std::byte> get(uint64_t length) {
    const size_t want = static_cast<size_t>(round_up(length, kDirectAlign));
    if (want > size_) {
      data_.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, want)));
      if (!data_) throw std::bad_alloc();
      size_ = want;
    }
    return {data_.get(), static_cast<size_t>(length)};
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

class FilePass {
 public:
  FilePass(Pass pass, Storage& from, Storage* to, std::vector<Item>& items,
           const TransferOptions& options, ProgressSink* progress)
      : pass_(pass),
        from_(from),
        to_(to),
        items_(items),
        chunk_size_(options.chunk_size),
        jobs_(static_cast<size_t>(options.jobs)),
        progress_(progress),
        states_(items.size()) {}

  void run() {
    // A file the destination takes in one streamed request (S3: one PUT
    // instead of a multipart upload) is one task: its bytes are read as they
    // are sent, so the memory is still one block per thread.
    const uint64_t streamed_limit =
        pass_ == Pass::kCopy && to_ ? to_->capabilities().streamed_put_limit : 0;
    for (size_t i = 0; i < items_.size(); ++i) {
      const uint64_t size = items_[i].want.size;
      if (size > chunk_size_ && size <= streamed_limit) {
        states_[i].streamed = true;
        states_[i].chunks = 1;
        tasks_.push_back({i, 0});
        continue;
      }
      states_[i].chunks = std::max<uint64_t>(1, (size + chunk_size_ - 1) / chunk_size_);
      for (uint64_t c = 0; c < states_[i].chunks; ++c) tasks_.push_back({i, c});
    }
    const size_t threads = std::min(jobs_, tasks_.size());
    if (threads == 0) return;
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (size_t t = 1; t < threads; ++t) pool.emplace_back([this] { work(); });
    work();
    for (auto& t : pool) t.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Task {
    size_t item;
    uint64_t chunk;
  };

  void work() {
    ChunkBuffer buf;
    try {
      while (!stop_.load()) {
        const size_t t = next_.fetch_add(1);
        if (t >= tasks_.size()) return;
        step(tasks_[t], buf);
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void step(const Task& task, ChunkBuffer& buf) {
    Item& item = items_[task.item];
    FileState& f = states_[task.item];
    const uint64_t offset = task.chunk * chunk_size_;
    const uint64_t length = std::min(chunk_size_, item.want.size - offset);
    {
      std::lock_guard<std::mutex> g(f.mu);
      if (f.abandoned) return;
      if (!f.opened) {
        f.opened = true;
        try {
          if (!open(item, f)) {
            abandon(f);
            return;
          }
        } catch (...) {
          f.abandoned = true;
          throw;
        }
      }
    }
    if (f.streamed) {
      stream(item, f);
      return;
    }
    std::span<std::byte> block = buf.get(length);
    if (length > 0) {
      if (!read_direct(f, offset, block)) f.reader->read_at(offset, block);
      if (f.writer) write(f, offset, block);
    }
    std::unique_lock<std::mutex> lk(f.mu);
    f.cv.wait(lk, [&] { return f.next_to_hash == task.chunk || f.abandoned || stop_.load(); });
    if (f.next_to_hash != task.chunk || f.abandoned) return;
    f.hasher.update(block);
    const bool last = ++f.next_to_hash == f.chunks;
    lk.unlock();
    f.cv.notify_all();
    if (pass_ == Pass::kCopy && progress_ && length > 0) progress_->chunk_done(length);
    if (last) finish(item, f);
  }

  // Opens the file's reader (and writer); false when a probed file is not in
  // place after all. Called once per file, under its mutex.
  bool open(Item& item, FileState& f) {
    const std::string where = from_.uri_of(item.want.path);
    try {
      f.reader = from_.open_reader(item.want.path);
    } catch (const Error& e) {
      if (pass_ == Pass::kProbe && e.code() == ErrorCode::kNotFound) return false;
      throw;
    }
    const uint64_t size = f.reader->size();
    if (size != item.want.size) {
      switch (pass_) {
        case Pass::kProbe:
          return false;
        case Pass::kHash:
          throw Error(ErrorCode::kFailedPrecondition,
                      fmt::format("{}: changed while being copied (size {}, listed as {}); run "
                                  "the copy again",
                                  where, size, item.want.size),
                      /*retryable=*/true);
        case Pass::kCopy:
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: size {}, the manifest says {}; the source checkpoint is "
                                  "damaged, nothing was committed at the destination",
                                  where, size, item.want.size));
        case Pass::kVerify:
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: read back after copying: size {}, the manifest says {}",
                                  where, size, item.want.size));
      }
    }
    if (pass_ == Pass::kCopy && !f.streamed) {
      WriteOptions options;
      options.size = item.want.size;
      f.writer = to_->open_writer(item.want.path, options);
      // Direct writes where the destination has them (a local disk): the
      // copy's chunks bypass the page cache, which would hold them dirty for
      // the writeback to flush before the file's fsync. The blocks are
      // allocated first, so parallel chunks overwrite rather than extend.
      const size_t a = f.writer->direct_alignment();
      f.direct_writes = a > 0 && kDirectAlign % a == 0 && chunk_size_ % kDirectAlign == 0;
      if (f.direct_writes) {
        f.writer->preallocate(round_up(item.want.size, kDirectAlign));
      }
    }
    if (pass_ == Pass::kVerify) open_direct(item, f);
    return true;
  }

  // Writes one chunk (a ChunkBuffer's span): directly where the file allows
  // it, the last chunk's padding up to the alignment taken from the buffer
  // behind it and cut off by commit().
  static void write(FileState& f, uint64_t offset, std::span<std::byte> block) {
    if (!f.direct_writes) {
      f.writer->write_at(offset, block);
      return;
    }
    const size_t padded = static_cast<size_t>(round_up(block.size(), kDirectAlign));
    f.writer->write_direct(offset, std::span<std::byte>(block.data(), padded), block.size());
  }

  // A local file is read back from the disk, not from the page cache that
  // still holds what the copy wrote (and would return it whatever the disk
  // has): O_DIRECT, where the file system has it.
  void open_direct(const Item& item, FileState& f) {
    std::optional<std::filesystem::path> path = from_.local_path(item.want.path);
    if (!path) return;
    // ignore-error: a file system without O_DIRECT (tmpfs) refuses it; the
    // page cache is then what there is to read.
    const int fd = ::open(path->c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) f.direct = UniqueFd(fd);
  }

  // Reads `out` (a ChunkBuffer's span) at `offset` through the file's
  // O_DIRECT descriptor, padding into the buffer behind it; false where that
  // cannot serve (no descriptor, an unaligned chunk, a refused or short
  // read), for the reader to do it and report what is wrong.
  static bool read_direct(FileState& f, uint64_t offset, std::span<std::byte> out) {
    if (f.direct.get() < 0 || offset % kDirectAlign != 0) return false;
    const size_t want = static_cast<size_t>(round_up(out.size(), kDirectAlign));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n =
          ::pread(f.direct.get(), out.data() + got, want - got, static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;  // ignore-error: the buffered read reports it
      got += static_cast<size_t>(n);
      if (got % kDirectAlign != 0) break;  // the end of the file
    }
    return got >= out.size();
  }

  // Copies a whole file through Storage::put_stream: its first pass is read
  // front to back and hashed, and the checksum is checked at its end, before
  // the destination shows anything.
  void stream(Item& item, FileState& f) {
    const uint64_t size = item.want.size;
    uint64_t hashed = 0;
    auto source = [&](uint64_t offset, std::span<std::byte> out) {
      // Another file's failure stops the first pass; a request already
      // sending is left to finish (a server may keep a PUT cut short).
      if (hashed < size && stop_.load()) {
        throw Error(ErrorCode::kFailedPrecondition, "the copy stopped: another file failed");
      }
      f.reader->read_at(offset, out);
      if (offset == hashed && hashed < size) {
        f.hasher.update(out);
        hashed += out.size();
      }
    };
    auto check = [&] { check_copied(item, f.hasher.digest()); };
    to_->put_stream(item.want.path, size, source, check);
    f.reader.reset();
    if (progress_) {
      progress_->chunk_done(size);
      progress_->file_done(to_->uri_of(item.want.path), size, false);
    }
  }

  void check_copied(const Item& item, uint64_t got) const {
    if (got == item.want.xxh3) return;
    throw Error(
        ErrorCode::kCorruption,
        fmt::format("{}: checksum {}, the manifest says {}; the source checkpoint "
                    "is damaged (or the file changed), nothing was committed at "
                    "the destination",
                    from_.uri_of(item.want.path), hash_to_hex(got), hash_to_hex(item.want.xxh3)));
  }

  void finish(Item& item, FileState& f) {
    const uint64_t got = f.hasher.digest();
    f.reader.reset();
    const std::string where = from_.uri_of(item.want.path);
    switch (pass_) {
      case Pass::kHash:
        item.want.xxh3 = got;
        break;
      case Pass::kProbe:
        item.matched = got == item.want.xxh3;
        if (item.matched && progress_) progress_->file_done(where, item.want.size, true);
        break;
      case Pass::kCopy:
        check_copied(item, got);
        f.writer->commit();
        f.writer.reset();
        if (progress_) progress_->file_done(to_->uri_of(item.want.path), item.want.size, false);
        break;
      case Pass::kVerify:
        if (got != item.want.xxh3) {
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: read back after copying: checksum {}, the manifest says {}",
                                  where, hash_to_hex(got), hash_to_hex(item.want.xxh3)));
        }
        break;
    }
  }

  void abandon(FileState& f) {
    // Under f.mu (the caller holds it).
    f.abandoned = true;
    f.reader.reset();
    f.cv.notify_all();
  }

  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> g(error_mu_);
      if (!error_) error_ = e;
    }
    stop_.store(true);
    // Wake threads waiting for a predecessor chunk that will never be hashed.
    for (auto& f : states_) {
      std::lock_guard<std::mutex> g(f.mu);
      f.abandoned = true;
      f.cv.notify_all();
    }
  }

  const Pass pass_;
  Storage& from_;
  Storage* to_;
  std::vector<Item>& items_;
  const uint64_t chunk_size_;
  const size_t jobs_;
  ProgressSink* progress_;
  std::vector<FileState> states_;
  std::vector<Task> tasks_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace

void run_pass(Pass pass, Storage& from, Storage* to, std::vector<Item>& items,
              const TransferOptions& options, ProgressSink* progress) {
  FilePass(pass, from, to, items, options, progress).run();
}

std::vector<Item> items_of(const std::vector<ManifestEntry>& entries) {
  std::vector<Item> items;
  items.reserve(entries.size());
  for (const auto& e : entries) items.push_back({e, false});
  return items;
}

}  // namespace cairn::experiment
