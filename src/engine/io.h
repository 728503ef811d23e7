// Internal I/O helpers of the tensor state engine: parallel block writes and
// reads, and huge-page staging memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/device.h"
#include "cairn/safetensors.h"
#include "cairn/state.h"
#include "util/hash.h"

namespace cairn::format {

// min(4, hardware threads) when `requested` is 0.
unsigned pick_threads(unsigned requested);

// Runs body(i) for i in [0, n) on up to `threads` threads (the caller's
// included). `also` runs on the calling thread while the others work (may be
// empty). The first exception thrown is rethrown after every thread stops;
// the remaining jobs are skipped once one has failed.
void run_parallel(size_t n, unsigned threads, const std::function<void(size_t)>& body,
                  const std::function<void()>& also = {});

// A contiguous piece of a file: `data` goes at `offset`. With a `device`,
// `data` is device memory, which only copy_pieces() may read (through the
// device); every other function here takes host pieces only.
struct Piece {
  uint64_t offset = 0;
  std::span<const std::byte> data;
  std::shared_ptr<const Device> device = nullptr;
};
// Whether any piece lives in device memory.
bool has_device_pieces(const std::vector<Piece>& pieces);

// The pieces of a safetensors file for `state` laid out as `layout` (from
// layout_state or update_plan of that state): the header, then each tensor
// in data order. kInternal if the layout is of other tensors.
std::vector<Piece> file_pieces(const FileLayout& layout, const StateDict& state);

// What a save of a state writes, kept from one save to the next: a training
// loop saves the same tensors again and again, with new metadata.
struct SavePlan {
  std::unique_ptr<FileLayout> layout;  // layout_state() of the state
  std::vector<Piece> pieces;           // file_pieces() of that layout and state
  uint64_t entries_version = 0;        // StateDict::entries_version() of the state
};

// Makes `plan` the plan of `state`. A state of the entries version the plan
// was made for (an unchanged copy of the same StateDict) costs O(1) besides
// rewriting the metadata; one with the same names, dtypes and shapes keeps
// the layout and remakes the pieces, O(n) comparisons; anything else is
// laid out anew (about 0.1 s for 100,000 tensors). Throws as layout_state()
// does, leaving `plan` as it was.
void update_plan(SavePlan& plan, const StateDict& state);

using WriteAt = std::function<void(uint64_t offset, std::span<const std::byte> data)>;
using ReadAt = std::function<void(uint64_t offset, std::span<std::byte> out)>;

// Writes `pieces` with `write_at` in blocks of at most `block_size` on
// `threads` threads, coalescing small neighbouring pieces into one write.
// Returns the XXH3-64 of the pieces in order (computed while writing).
// With `blocks`, the pieces are also fed to it (block checksums).
uint64_t write_pieces(const std::vector<Piece>& pieces, const WriteAt& write_at, size_t block_size,
                      unsigned threads, BlockHasher* blocks = nullptr);

// Reads [offset, offset + out.size()) into out in parallel blocks.
struct ReadJob {
  uint64_t offset = 0;
  std::span<std::byte> out;
};
void read_blocks(const std::vector<ReadJob>& jobs, const ReadAt& read_at, size_t block_size,
                 unsigned threads);

// Anonymous memory, 2 MiB-aligned, with transparent huge pages asked for;
// page-locked for device copies on demand (pin()).
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t size);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& o) noexcept;
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Pins the whole buffer through `device` (once: later calls return the
  // first one's result, see Device::pin); unpinned when released.
  bool pin(const std::shared_ptr<const Device>& device);
  bool pinned() const { return pinned_ != nullptr; }

 private:
  void release();
  std::shared_ptr<const Device> pinned_;  // the device that pinned it
  bool pin_tried_ = false;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Writes every page of [data, data + size) now, so that a later copy into it
// does not pay the first touch of fresh memory: MADV_POPULATE_WRITE (Linux
// 5.14) where the kernel has it, else zeros written by hand. `data` is
// page-aligned. Runs on `threads` threads in 64 MiB pieces. kIO when the
// kernel cannot populate the pages.
void prefault(std::byte* data, size_t size, unsigned threads);

// The device of `state`'s first device entry (null when it has none).
std::shared_ptr<const Device> first_device(const StateDict& state);

// The streams of one save or load: one per device, opened on first use (so
// its copies follow the work that device's producer had queued by then).
// Destroying it destroys the streams, each of which waits for its copies
// first, so buffers the copies use must outlive it.
class DeviceStreams {
 public:
  DeviceStream& of(const Device& device);
  // Appends a mark of every stream (DeviceStream::mark) to `out`.
  void mark(std::vector<std::pair<DeviceStream*, uint64_t>>& out);
  void synchronize();

 private:
  std::vector<std::pair<const Device*, std::unique_ptr<DeviceStream>>> streams_;
};

// Copies `pieces` into `dest` (a whole file image) on `threads` threads;
// device pieces through one stream per device (opened first, so their copies
// follow the work their producers had queued), complete on return.
void copy_pieces(const std::vector<Piece>& pieces, std::span<std::byte> dest, unsigned threads);

// Pins `buffer` through every device `pieces` copy from (see
// HugeBuffer::pin); returns the bytes pinned (0 when none or refused).
uint64_t pin_for(HugeBuffer& buffer, const std::vector<Piece>& pieces);

// A synchronous save of device tensors: when `pieces` hold any, copies the
// whole file image of `file_size` bytes into this process's pinned staging
// buffer (grown to the largest image saved, kept for the next save) and
// replaces `pieces` with that one image; nothing otherwise. The buffer is
// held (other synchronous device saves wait) until this object is destroyed.
// The buffer DeviceImage uses: allocated, touched and pinned through
// `device` for `bytes` now (reserve), or freed (release).
void reserve_device_image(uint64_t bytes, const std::shared_ptr<const Device>& device);
void release_device_image();

class DeviceImage {
 public:
  // `source` names the file for errors.
  DeviceImage(std::vector<Piece>& pieces, uint64_t file_size, unsigned threads,
              std::string_view source);
  ~DeviceImage();
  DeviceImage(const DeviceImage&) = delete;
  DeviceImage& operator=(const DeviceImage&) = delete;
  // What write_file() may read from the image's start (0 without one).
  size_t readable() const { return readable_; }

 private:
  bool held_ = false;
  size_t readable_ = 0;
};

// ---- direct I/O (O_DIRECT) ----

// The value of CAIRN_DIRECT_IO ("" when unset).
std::string direct_io_env();

// Which path a write of `file_size` bytes to `source` takes (pure).
// `alignment` is the sink's direct alignment (0: none); `env` the value of
// CAIRN_DIRECT_IO. Throws kFailedPrecondition naming `source` for kDirect
// without a direct path.
IoReport choose_write_path(IoPath requested, uint64_t file_size, size_t alignment,
                           std::string_view env, std::string_view source);
// Which path a read of `file_size` bytes takes (pure); `cached` is the
// fraction of the file already in the page cache.
IoReport choose_read_path(IoPath requested, uint64_t file_size, bool direct_possible, double cached,
                          std::string_view env, std::string_view source);

// The alignment of direct transfers of local files: 4 KiB covers the logical
// block size of every common device and the memory alignment O_DIRECT needs.
inline constexpr size_t kDirectAlignment = 4096;

// Where write_file() puts bytes.
struct Sink {
  WriteAt write_at;
  size_t alignment = 0;  // of write_direct; 0 when there is no direct path
  std::function<void(uint64_t offset, std::span<const std::byte> data, size_t valid)> write_direct;
  // Called once before direct writes with the padded file size (optional;
  // see Writer::preallocate).
  std::function<void(uint64_t size)> preallocate;
};
// A Sink writing through a storage Writer; its direct path is looked up (a
// second open of the file) only when `direct_wanted`, see wants_direct().
Sink sink_of(Writer& writer, bool direct_wanted);
// Whether a write of `file_size` bytes with `options` may take a direct path.
bool wants_direct(const SaveOptions& options, uint64_t file_size);

// Reads a list of jobs some other way than read_blocks() (direct reads).
using ReadJobs = std::function<void(const std::vector<ReadJob>& jobs)>;

// Writes a file whose `pieces` tile [0, file_size) in order, directly or
// buffered as `options` say (filling options.report). On the direct path,
// aligned windows of the file are assembled in reused staging buffers; when
// `pieces` is one image at offset 0 that may be read `readable` bytes from
// its start (its staging buffer) and is aligned, it is written without a
// copy. Returns the XXH3-64 of the pieces in order and of each block.
struct FileDigest {
  uint64_t xxh3 = 0;
  std::vector<uint64_t> blocks;  // of kChecksumBlockSize bytes each
  // The manifest entry of the file written as `path`, `size` bytes long.
  ManifestEntry entry(std::string path, uint64_t size) const {
    return {std::move(path), size, xxh3, kChecksumBlockSize, blocks};
  }
};
FileDigest write_file(const std::vector<Piece>& pieces, uint64_t file_size, const Sink& sink,
                      const SaveOptions& options, std::string_view source, size_t readable = 0);

// An aligned range of a file that one direct read covers.
struct Window {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const Window&) const = default;
};
// The windows that cover every job (pure): job ranges rounded out to
// `align`, neighbours at most `merge_gap` bytes apart read as one, each
// window at most `max_window` bytes (a multiple of `align`). Jobs may come in
// any order and must not overlap.
std::vector<Window> plan_windows(const std::vector<ReadJob>& jobs, size_t align, size_t max_window,
                                 uint64_t merge_gap);

// Reads every job's bytes from a file of `file_size` bytes opened for direct
// reads: each window of plan_windows() is read by `read` into a reused
// aligned staging buffer and copied to the jobs it covers. `read` returns
// the bytes it read (short only at the end of the file). kCorruption naming
// `source` and the offset if the file ends early.
void read_direct(const std::vector<ReadJob>& jobs, uint64_t file_size, size_t align,
                 const std::function<size_t(uint64_t offset, std::span<std::byte> out)>& read,
                 size_t block_size, unsigned threads, std::string_view source);

}  // namespace cairn::format
