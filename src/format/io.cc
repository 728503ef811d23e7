#include "format/io.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "cairn/error.h"
#include "util/hash.h"

namespace cairn::format {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
// Pieces smaller than this are gathered into one write with their neighbours.
constexpr size_t kSmallPiece = size_t{256} << 10;
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
  std::vector<Piece> out;
  out.reserve(layout.parsed.tensors.size() + 1);
  out.push_back({0, as_bytes(layout.header)});
  const uint64_t base = layout.parsed.data_start();
  for (const auto& t : layout.parsed.tensors) {
    const auto& e = state.entry(t.name);
    out.push_back({base + t.begin, {e.data, e.nbytes}});
  }
  return out;
}

uint64_t write_pieces(const std::vector<Piece>& pieces, const WriteAt& write_at, size_t block_size,
                      unsigned threads) {
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
        for (const auto& p : pieces) hasher.update(p.data);
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
    : map_(o.map_), map_size_(o.map_size_), data_(o.data_), size_(o.size_) {
  o.map_ = nullptr;
  o.data_ = nullptr;
  o.size_ = o.map_size_ = 0;
}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    release();
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

void HugeBuffer::release() {
  if (map_) ::munmap(map_, map_size_);  // ignore-error: nothing to do if unmapping fails
  map_ = nullptr;
  data_ = nullptr;
  size_ = map_size_ = 0;
}

void copy_pieces(const std::vector<Piece>& pieces, std::span<std::byte> dest, unsigned threads) {
  constexpr size_t kChunk = size_t{32} << 20;
  std::vector<Piece> chunks;
  for (const auto& p : pieces) {
    for (size_t off = 0; off < p.data.size(); off += kChunk) {
      chunks.push_back(
          {p.offset + off, p.data.subspan(off, std::min(kChunk, p.data.size() - off))});
    }
  }
  for (const auto& c : chunks) {
    if (c.offset + c.data.size() > dest.size()) {
      throw Error(ErrorCode::kInternal, "staging buffer smaller than the file image");
    }
  }
  run_parallel(chunks.size(), threads, [&](size_t i) {
    std::memcpy(dest.data() + chunks[i].offset, chunks[i].data.data(), chunks[i].data.size());
  });
}

}  // namespace cairn::format
