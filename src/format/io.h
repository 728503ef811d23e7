// Internal I/O helpers of the tensor state engine: parallel block writes and
// reads, and huge-page staging memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cairn/safetensors.h"
#include "cairn/state.h"

namespace cairn::format {

// min(4, hardware threads) when `requested` is 0.
unsigned pick_threads(unsigned requested);

// Runs body(i) for i in [0, n) on up to `threads` threads (the caller's
// included). `also` runs on the calling thread while the others work (may be
// empty). The first exception thrown is rethrown after every thread stops;
// the remaining jobs are skipped once one has failed.
void run_parallel(size_t n, unsigned threads, const std::function<void(size_t)>& body,
                  const std::function<void()>& also = {});

// A contiguous piece of a file: `data` goes at `offset`.
struct Piece {
  uint64_t offset = 0;
  std::span<const std::byte> data;
};

// The pieces of a safetensors file for `state` laid out as `layout`: the
// header, then each tensor in data order.
std::vector<Piece> file_pieces(const FileLayout& layout, const StateDict& state);

using WriteAt = std::function<void(uint64_t offset, std::span<const std::byte> data)>;
using ReadAt = std::function<void(uint64_t offset, std::span<std::byte> out)>;

// Writes `pieces` with `write_at` in blocks of at most `block_size` on
// `threads` threads, coalescing small neighbouring pieces into one write.
// Returns the XXH3-64 of the pieces in order (computed while writing).
uint64_t write_pieces(const std::vector<Piece>& pieces, const WriteAt& write_at, size_t block_size,
                      unsigned threads);

// Reads [offset, offset + out.size()) into out in parallel blocks.
struct ReadJob {
  uint64_t offset = 0;
  std::span<std::byte> out;
};
void read_blocks(const std::vector<ReadJob>& jobs, const ReadAt& read_at, size_t block_size,
                 unsigned threads);

// Anonymous memory, 2 MiB-aligned, with transparent huge pages asked for.
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t size);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& o) noexcept;
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Copies `pieces` into `dest` (a whole file image) on `threads` threads.
void copy_pieces(const std::vector<Piece>& pieces, std::span<std::byte> dest, unsigned threads);

}  // namespace cairn::format
