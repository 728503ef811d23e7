#include "engine/io.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/align.h"
#include "util/hash.h"
#include "util/settings.h"

namespace cairn::format {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
// Pieces smaller than this are gathered into one write with their neighbours.
constexpr size_t kSmallPiece = size_t{256} << 10;
// Neighbouring ranges of a direct read closer than this are read as one.
constexpr uint64_t kMergeGap = uint64_t{1} << 20;
// Direct I/O blocks in the kernel without using a core, so more requests in
// flight than cores pays off: the default thread count of direct transfers.
constexpr unsigned kDirectThreads = 4;
// Staging buffers kept for reuse after a transfer (each block_size bytes).
constexpr size_t kMaxPooledBuffers = 8;

// Aligned staging buffers for direct transfers, allocated once and reused:
// first touch of fresh memory is what makes fresh buffers slow here.
class StagingPool {
 public:
  HugeBuffer take(size_t size) {
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->size() >= size) {
          HugeBuffer b = std::move(*it);
          free_.erase(it);
          return b;
        }
      }
    }
    return HugeBuffer(size);
  }
  void give(HugeBuffer b) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_.size() < kMaxPooledBuffers) free_.push_back(std::move(b));
  }

 private:
  std::mutex mu_;
  std::vector<HugeBuffer> free_;
};

StagingPool& staging_pool() {
  static StagingPool pool;
  return pool;
}

// A staging buffer borrowed from the pool for one window.
class Staging {
 public:
  explicit Staging(size_t size) : buffer_(staging_pool().take(size)) {}
  ~Staging() { staging_pool().give(std::move(buffer_)); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  std::byte* data() const { return buffer_.data(); }

 private:
  HugeBuffer buffer_;
};

unsigned direct_threads(unsigned requested) { return requested > 0 ? requested : kDirectThreads; }
}  // namespace

unsigned pick_threads(unsigned requested) {
  if (requested > 0) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(hw, 1u, 4u);
}

void run_parallel(size_t n, unsigned threads, const std::function<void(size_t)>& body,
                  const std::function<void()>& also) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::exception_ptr first;
  auto note = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> g(mu);
    if (!first) first = e;
    failed = true;
  };
  auto loop = [&] {
    try {
      for (size_t i; !failed && (i = next.fetch_add(1)) < n;) body(i);
    } catch (...) {
      note(std::current_exception());
    }
  };
  const size_t want = std::min<size_t>(threads == 0 ? 1 : threads, n);
  std::vector<std::thread> pool;
  // With `also` the calling thread is busy with it, so every worker is extra.
  const size_t extra = also ? want : (want > 0 ? want - 1 : 0);
  pool.reserve(extra);
  for (size_t t = 0; t < extra; ++t) pool.emplace_back(loop);
  if (also) {
    try {
      also();
    } catch (...) {
      note(std::current_exception());
    }
  }
  loop();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

std::vector<Piece> file_pieces(const FileLayout& layout, const StateDict& state) {
  const std::vector<TensorInfo>& tensors = layout.parsed.tensors;
  const std::vector<size_t>& by_name = layout.parsed.by_name;
  if (by_name.size() != tensors.size() || state.size() != tensors.size()) {
    throw Error(ErrorCode::kInternal, "file_pieces: the layout is not one of this state");
  }
  std::vector<Piece> out(tensors.size() + 1);
  out[0] = {0, as_bytes(layout.header)};
  const uint64_t base = layout.parsed.data_start();
  // The layout's name index and the state's map list the same names in the
  // same order: one walk, no lookups.
  auto e = state.entries().begin();
  for (size_t i : by_name) {
    if (e->first != tensors[i].name) {
      throw Error(ErrorCode::kInternal, fmt::format("file_pieces: the layout has tensor \"{}\" "
                                                    "where the state has \"{}\"",
                                                    tensors[i].name, e->first));
    }
    out[1 + i] = {base + tensors[i].begin, {e->second.data, e->second.nbytes}, e->second.device};
    ++e;
  }
  return out;
}

uint64_t write_pieces(const std::vector<Piece>& pieces, const WriteAt& write_at, size_t block_size,
                      unsigned threads, BlockHasher* blocks) {
  block_size = std::max<size_t>(block_size, 4096);
  std::vector<Piece> jobs;
  std::deque<std::vector<std::byte>> gathered;
  std::vector<std::byte>* open = nullptr;
  uint64_t open_at = 0;
  auto flush = [&] {
    if (open && !open->empty()) jobs.push_back({open_at, {open->data(), open->size()}});
    open = nullptr;
  };
  for (const auto& p : pieces) {
    if (p.data.empty()) continue;
    if (p.data.size() < kSmallPiece) {
      if (open && open->size() + p.data.size() > block_size) flush();
      if (!open) {
        open = &gathered.emplace_back();
        open->reserve(std::min(block_size, size_t{4} << 20));
        open_at = p.offset;
      }
      open->insert(open->end(), p.data.begin(), p.data.end());
      continue;
    }
    flush();
    for (size_t off = 0; off < p.data.size(); off += block_size) {
      jobs.push_back(
          {p.offset + off, p.data.subspan(off, std::min(block_size, p.data.size() - off))});
    }
  }
  flush();
  Hasher hasher;
  run_parallel(
      jobs.size(), threads, [&](size_t i) { write_at(jobs[i].offset, jobs[i].data); },
      [&] {
        for (const auto& p : pieces) {
          hasher.update(p.data);
          if (blocks) blocks->update(p.data);
        }
      });
  return hasher.digest();
}

void read_blocks(const std::vector<ReadJob>& jobs, const ReadAt& read_at, size_t block_size,
                 unsigned threads) {
  block_size = std::max<size_t>(block_size, 4096);
  std::vector<ReadJob> blocks;
  for (const auto& j : jobs) {
    for (size_t off = 0; off < j.out.size(); off += block_size) {
      blocks.push_back(
          {j.offset + off, j.out.subspan(off, std::min(block_size, j.out.size() - off))});
    }
  }
  run_parallel(blocks.size(), threads, [&](size_t i) { read_at(blocks[i].offset, blocks[i].out); });
}

HugeBuffer::HugeBuffer(size_t size) {
  if (size == 0) return;
  const size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
  map_size_ = rounded + kHugePage;
  map_ = ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw errno_error(errno, "mmap", "staging memory");
  }
  auto addr = reinterpret_cast<uintptr_t>(map_);
  auto aligned = (addr + kHugePage - 1) / kHugePage * kHugePage;
  data_ = reinterpret_cast<std::byte*>(aligned);
  size_ = rounded;
  // ignore-error: huge pages are an optimization (first touch of 4 KiB pages
  // is slow on virtual machines); without them the buffer still works.
  (void)::madvise(data_, size_, MADV_HUGEPAGE);
}

HugeBuffer::~HugeBuffer() { release(); }

HugeBuffer::HugeBuffer(HugeBuffer&& o) noexcept
    : pinned_(std::move(o.pinned_)),
      pin_tried_(o.pin_tried_),
      map_(o.map_),
      map_size_(o.map_size_),
      data_(o.data_),
      size_(o.size_) {
  o.pin_tried_ = false;
  o.map_ = nullptr;
  o.data_ = nullptr;
  o.size_ = o.map_size_ = 0;
}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pinned_ = std::move(o.pinned_);
    pin_tried_ = o.pin_tried_;
    o.pin_tried_ = false;
    map_ = o.map_;
    map_size_ = o.map_size_;
    data_ = o.data_;
    size_ = o.size_;
    o.map_ = nullptr;
    o.data_ = nullptr;
    o.size_ = o.map_size_ = 0;
  }
  return *this;
}

bool HugeBuffer::pin(const std::shared_ptr<const Device>& device) {
  if (pin_tried_ || !data_) return pinned_ != nullptr;
  pin_tried_ = true;
  if (device->pin(data_, size_)) pinned_ = device;
  return pinned_ != nullptr;
}

void HugeBuffer::release() {
  if (pinned_) pinned_->unpin(data_);
  pinned_.reset();
  pin_tried_ = false;
  if (map_) ::munmap(map_, map_size_);  // ignore-error: nothing to do if unmapping fails
  map_ = nullptr;
  data_ = nullptr;
  size_ = map_size_ = 0;
}

void prefault(std::byte* data, size_t size, unsigned threads) {
  constexpr size_t kPiece = size_t{64} << 20;
  const size_t pieces = (size + kPiece - 1) / kPiece;
  std::atomic<bool> populate{true};
  run_parallel(pieces, threads, [&](size_t i) {
    std::byte* p = data + i * kPiece;
    const size_t n = std::min(kPiece, size - i * kPiece);
#ifdef MADV_POPULATE_WRITE
    if (populate.load(std::memory_order_relaxed)) {
      if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
      // EINVAL: a kernel without MADV_POPULATE_WRITE; write by hand. Any
      // other error (ENOMEM) would fail the same way when written by hand.
      if (errno != EINVAL)
        throw errno_error(errno, "madvise(MADV_POPULATE_WRITE)", "staging memory");
      populate.store(false, std::memory_order_relaxed);
    }
#endif
    std::memset(p, 0, n);
  });
}

std::shared_ptr<const Device> first_device(const StateDict& state) {
  for (const auto& [name, e] : state.entries()) {
    if (e.device) return e.device;
  }
  return nullptr;
}

DeviceStream& DeviceStreams::of(const Device& device) {
  for (auto& [d, stream] : streams_) {
    if (d == &device) return *stream;
  }
  streams_.emplace_back(&device, device.open_stream());
  return *streams_.back().second;
}

void DeviceStreams::mark(std::vector<std::pair<DeviceStream*, uint64_t>>& out) {
  for (auto& [d, stream] : streams_) out.push_back({stream.get(), stream->mark()});
}

void DeviceStreams::synchronize() {
  for (auto& [d, stream] : streams_) stream->synchronize();
}

bool has_device_pieces(const std::vector<Piece>& pieces) {
  return std::any_of(pieces.begin(), pieces.end(), [](const Piece& p) { return p.device; });
}

uint64_t pin_for(HugeBuffer& buffer, const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) {
    if (p.device) return buffer.pin(p.device) ? buffer.size() : 0;
  }
  return 0;
}

void copy_pieces(const std::vector<Piece>& pieces, std::span<std::byte> dest, unsigned threads) {
  // Jobs of about kChunk bytes: a large piece is split, small neighbours go
  // together, so 100,000 small tensors are not 100,000 jobs.
  constexpr size_t kChunk = size_t{8} << 20;
  std::vector<Piece> parts;
  parts.reserve(pieces.size());
  std::vector<size_t> job_end;  // job j copies parts [job_end[j - 1], job_end[j])
  size_t in_job = 0;
  // Device pieces are enqueued on their device's stream first, so that the
  // device copies while the host pieces are copied below.
  DeviceStreams streams;
  for (const auto& p : pieces) {
    if (p.offset > dest.size() || p.data.size() > dest.size() - p.offset) {
      throw Error(ErrorCode::kInternal, "staging buffer smaller than the file image");
    }
    if (p.device) {
      DeviceStream& stream = streams.of(*p.device);
      if (!p.data.empty()) stream.to_host(dest.data() + p.offset, p.data.data(), p.data.size());
      continue;
    }
    for (size_t off = 0; off < p.data.size(); off += kChunk) {
      const size_t n = std::min(kChunk, p.data.size() - off);
      parts.push_back({p.offset + off, p.data.subspan(off, n)});
      in_job += n;
      if (in_job >= kChunk) {
        job_end.push_back(parts.size());
        in_job = 0;
      }
    }
  }
  if (job_end.empty() || job_end.back() != parts.size()) job_end.push_back(parts.size());
  run_parallel(job_end.size(), threads, [&](size_t j) {
    for (size_t i = j == 0 ? 0 : job_end[j - 1]; i < job_end[j]; ++i) {
      std::memcpy(dest.data() + parts[i].offset, parts[i].data.data(), parts[i].data.size());
    }
  });
  streams.synchronize();
}

namespace {
// The pinned staging of synchronous device saves (DeviceImage).
struct SyncStaging {
  std::mutex mu;
  HugeBuffer buffer;
};
SyncStaging& sync_staging() {
  static SyncStaging* s = new SyncStaging();  // never destroyed: no exit-time unpinning
  return *s;
}
}  // namespace

void reserve_device_image(uint64_t bytes, const std::shared_ptr<const Device>& device) {
  SyncStaging& s = sync_staging();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.buffer.size() < bytes) {
    s.buffer = HugeBuffer();
    s.buffer = HugeBuffer(bytes);
    // Touch every page now: the first save should cost the copy alone.
    prefault(s.buffer.data(), s.buffer.size(), pick_threads(0));
  }
  if (device) s.buffer.pin(device);
}

void release_device_image() {
  SyncStaging& s = sync_staging();
  std::lock_guard<std::mutex> g(s.mu);
  s.buffer = HugeBuffer();
}

DeviceImage::DeviceImage(std::vector<Piece>& pieces, uint64_t file_size, unsigned threads,
                         std::string_view source) {
  if (!has_device_pieces(pieces)) return;
  SyncStaging& s = sync_staging();
  s.mu.lock();
  held_ = true;
  try {
    if (s.buffer.size() < file_size) {
      s.buffer = HugeBuffer();  // release (and unpin) before allocating the larger one
      s.buffer = HugeBuffer(file_size);
    }
    pin_for(s.buffer, pieces);
    copy_pieces(pieces, {s.buffer.data(), s.buffer.size()}, threads);
  } catch (const Error& e) {
    s.mu.unlock();
    held_ = false;
    throw with_context(e, fmt::format("{}: copying its device tensors", source));
  } catch (...) {
    s.mu.unlock();
    held_ = false;
    throw;
  }
  pieces = {{0, {s.buffer.data(), static_cast<size_t>(file_size)}, nullptr}};
  readable_ = s.buffer.size();
}

DeviceImage::~DeviceImage() {
  if (held_) sync_staging().mu.unlock();
}

std::string direct_io_env() { return Settings::from(Environment::process()).direct_io; }

namespace {
bool env_says_off(std::string_view env) {
  return env == "off" || env == "0" || env == "false" || env == "no";
}
}  // namespace

IoReport choose_write_path(IoPath requested, uint64_t file_size, size_t alignment,
                           std::string_view env, std::string_view source) {
  switch (requested) {
    case IoPath::kBuffered:
      return {IoPath::kBuffered, "buffered I/O was asked for"};
    case IoPath::kDirect:
      if (alignment == 0) {
        throw Error(ErrorCode::kFailedPrecondition,
                    fmt::format("{}: direct I/O was asked for, but the storage has no direct path "
                                "(not a local file, or the file system refuses O_DIRECT)",
                                source));
      }
      return {IoPath::kDirect, "direct I/O was asked for"};
    case IoPath::kAuto:
      break;
  }
  if (env_says_off(env)) return {IoPath::kBuffered, "CAIRN_DIRECT_IO=off"};
  if (file_size < kDirectIoMinBytes) {
    return {IoPath::kBuffered, fmt::format("a small file ({} bytes)", file_size)};
  }
  if (alignment == 0) {
    return {IoPath::kBuffered,
            "no direct path (not a local file, or the file system refuses O_DIRECT)"};
  }
  return {IoPath::kDirect, "a large file on a file system with O_DIRECT"};
}

IoReport choose_read_path(IoPath requested, uint64_t file_size, bool direct_possible, double cached,
                          std::string_view env, std::string_view source) {
  IoReport r = choose_write_path(requested, file_size, direct_possible ? 1 : 0, env, source);
  if (requested == IoPath::kAuto && r.path == IoPath::kDirect && cached >= 0.5) {
    return {IoPath::kBuffered,
            fmt::format("{:.0f}% of the file is in the page cache already", cached * 100)};
  }
  return r;
}

bool wants_direct(const SaveOptions& options, uint64_t file_size) {
  return options.io == IoPath::kDirect ||
         (options.io == IoPath::kAuto && file_size >= kDirectIoMinBytes);
}

Sink sink_of(Writer& writer, bool direct_wanted) {
  Sink sink;
  sink.write_at = [&writer](uint64_t off, std::span<const std::byte> d) {
    writer.write_at(off, d);
  };
  sink.alignment = direct_wanted ? writer.direct_alignment() : 0;
  sink.write_direct = [&writer](uint64_t off, std::span<const std::byte> d, size_t valid) {
    writer.write_direct(off, d, valid);
  };
  sink.preallocate = [&writer](uint64_t size) { writer.preallocate(size); };
  return sink;
}

FileDigest write_file(const std::vector<Piece>& pieces, uint64_t file_size, const Sink& sink,
                      const SaveOptions& options, std::string_view source, size_t readable) {
  const IoReport report =
      choose_write_path(options.io, file_size, sink.alignment, direct_io_env(), source);
  if (options.report) *options.report = report;
  BlockHasher blocks(kChecksumBlockSize);
  if (report.path == IoPath::kBuffered) {
    uint64_t h = write_pieces(pieces, sink.write_at, options.block_size,
                              pick_threads(options.threads), &blocks);
    return {h, blocks.finish()};
  }
  uint64_t total = 0;
  for (const auto& p : pieces) total += p.data.size();
  if (total != file_size) {
    throw Error(ErrorCode::kInternal, fmt::format("{}: the pieces hold {} bytes of a {}-byte file",
                                                  source, total, file_size));
  }
  const size_t align = sink.alignment;
  const size_t chunk = round_up(std::max(options.block_size, align), align);
  const uint64_t padded = round_up(file_size, align);
  const size_t windows = (file_size + chunk - 1) / chunk;
  // Parallel direct writes into allocated blocks run side by side; into a
  // growing file or a hole, the file system takes them one at a time.
  if (sink.preallocate) sink.preallocate(padded);
  // The block checksums of a window are taken by the thread that writes it,
  // from the bytes it writes (whole blocks, as windows hold whole blocks),
  // so the one sequential pass left beside the writers is the whole file's.
  constexpr uint64_t bs = kChecksumBlockSize;
  const bool blocks_in_windows = chunk % bs == 0;
  std::vector<uint64_t> window_blocks(blocks_in_windows ? (file_size + bs - 1) / bs : 0);
  auto hash_blocks = [&](const std::byte* data, uint64_t begin, uint64_t valid) {
    if (!blocks_in_windows) return;
    for (uint64_t b = begin / bs; b * bs < begin + valid; ++b) {
      const uint64_t from = b * bs, to = std::min(from + bs, begin + valid);
      Hasher h;
      h.update({data + (from - begin), to - from});
      window_blocks[b] = h.digest();
    }
  };
  auto digest = [&](Hasher& hasher) -> FileDigest {
    return {hasher.digest(), blocks_in_windows ? std::move(window_blocks) : blocks.finish()};
  };
  Hasher hasher;
  auto hash_all = [&] {
    for (const auto& p : pieces) {
      hasher.update(p.data);
      if (!blocks_in_windows) blocks.update(p.data);
    }
  };
  const bool whole_image = pieces.size() == 1 && pieces[0].offset == 0 && readable >= padded &&
                           reinterpret_cast<uintptr_t>(pieces[0].data.data()) % align == 0;
  if (whole_image) {
    const std::byte* image = pieces[0].data.data();
    run_parallel(
        windows, direct_threads(options.threads),
        [&](size_t i) {
          const uint64_t begin = i * chunk;
          const uint64_t end = std::min<uint64_t>(begin + chunk, padded);
          const uint64_t valid = std::min<uint64_t>(end, file_size) - begin;
          hash_blocks(image + begin, begin, valid);
          sink.write_direct(begin, {image + begin, end - begin}, valid);
        },
        hash_all);
    return digest(hasher);
  }
  run_parallel(
      windows, direct_threads(options.threads),
      [&](size_t i) {
        const uint64_t begin = i * chunk;
        const uint64_t end = std::min<uint64_t>(begin + chunk, file_size);
        Staging staging(chunk);
        // The first piece that ends after `begin`, then every one that starts
        // before `end`.
        auto it = std::partition_point(pieces.begin(), pieces.end(), [&](const Piece& p) {
          return p.offset + p.data.size() <= begin;
        });
        for (; it != pieces.end() && it->offset < end; ++it) {
          const uint64_t from = std::max(it->offset, begin);
          const uint64_t to = std::min(it->offset + it->data.size(), end);
          if (to > from) {
            std::memcpy(staging.data() + (from - begin), it->data.data() + (from - it->offset),
                        to - from);
          }
        }
        const uint64_t length = round_up(end - begin, align);
        std::memset(staging.data() + (end - begin), 0, length - (end - begin));
        hash_blocks(staging.data(), begin, end - begin);
        sink.write_direct(begin, {staging.data(), length}, end - begin);
      },
      hash_all);
  return digest(hasher);
}

std::vector<Window> plan_windows(const std::vector<ReadJob>& jobs, size_t align, size_t max_window,
                                 uint64_t merge_gap) {
  std::vector<Window> ranges;
  ranges.reserve(jobs.size());
  for (const auto& j : jobs) {
    if (j.out.empty()) continue;
    ranges.push_back({j.offset / align * align, round_up(j.offset + j.out.size(), align)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Window& a, const Window& b) { return a.begin < b.begin; });
  std::vector<Window> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.begin <= merged.back().end + merge_gap) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  const uint64_t cap = std::max<uint64_t>(max_window / align * align, align);
  std::vector<Window> out;
  for (const auto& m : merged) {
    for (uint64_t b = m.begin; b < m.end; b += cap) out.push_back({b, std::min(b + cap, m.end)});
  }
  return out;
}

void read_direct(const std::vector<ReadJob>& jobs, uint64_t file_size, size_t align,
                 const std::function<size_t(uint64_t offset, std::span<std::byte> out)>& read,
                 size_t block_size, unsigned threads, std::string_view source) {
  const size_t chunk = round_up(std::max(block_size, align), align);
  const std::vector<Window> windows = plan_windows(jobs, align, chunk, kMergeGap);
  std::vector<ReadJob> sorted;
  sorted.reserve(jobs.size());
  for (const auto& j : jobs) {
    if (!j.out.empty()) sorted.push_back(j);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const ReadJob& a, const ReadJob& b) { return a.offset < b.offset; });
  run_parallel(windows.size(), direct_threads(threads), [&](size_t i) {
    const Window w = windows[i];
    const uint64_t need = std::min(w.end, file_size) - std::min(w.begin, file_size);
    Staging staging(chunk);
    uint64_t got = 0;
    while (got < w.end - w.begin) {
      const size_t n = read(w.begin + got, {staging.data() + got, w.end - w.begin - got});
      got += n;
      if (n == 0 || n % align != 0) break;  // the end of the file
    }
    if (got < need) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: the file ends at byte offset {}, before byte offset {}", source,
                              w.begin + got, w.begin + need));
    }
    auto it = std::partition_point(sorted.begin(), sorted.end(), [&](const ReadJob& j) {
      return j.offset + j.out.size() <= w.begin;
    });
    for (; it != sorted.end() && it->offset < w.end; ++it) {
      const uint64_t from = std::max(it->offset, w.begin);
      const uint64_t to = std::min(it->offset + it->out.size(), w.end);
      if (to > from) {
        std::memcpy(it->out.data() + (from - it->offset), staging.data() + (from - w.begin),
                    to - from);
      }
    }
  });
}

}  // namespace cairn::format
