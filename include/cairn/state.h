// State dictionaries: named tensors plus JSON metadata, saved as safetensors.
//
// A StateDict does not own the tensors you add with add()/add_mutable(): it
// records their dtype, shape and where their bytes are, so saving a model
// needs no copy. A save reads those bytes while it runs (an async save only
// while AsyncSaver::save() runs; see async_save.h). Loading either maps the
// file (MappedState: zero copy) or copies into the buffers of a StateDict's
// writable entries (load_into).
//
// Files are plain safetensors (safetensors.h). The JSON metadata (epoch,
// step, loss, learning rate, RNG state, ...) is stored as one JSON string
// under the "__metadata__" key "cairn.metadata", so any safetensors reader
// opens the file; other string entries of "__metadata__" are kept as
// StateDict::string_metadata.
//
// Durability: save_file() with SaveOptions::durable (the default) fsyncs the
// file and its directory before returning, and replaces the destination
// atomically (a reader sees the old file or the new one, never a mix).
// save() to a Storage is durable when it returns (see storage.h).
//
// Failure: every function throws cairn::Error naming the file (or URI), and,
// where one is at fault, the tensor and byte offset. A malformed file is
// kCorruption; a StateDict that does not match a file is kInvalidArgument
// listing every missing, unexpected and mismatched tensor.
//
// Thread-safety: a StateDict is a plain value (not synchronized); copies are
// independent values, which may be used from different threads although
// they share their entries until one changes (see entries()). A
// MappedState may be read from many threads; copies share one mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/device.h"
#include "cairn/safetensors.h"
#include "cairn/storage.h"

namespace cairn {

// "__metadata__" key holding StateDict::metadata as a JSON string.
inline constexpr std::string_view kCairnMetadataKey = "cairn.metadata";
// The file name Cairn's managers use for a state inside a checkpoint.
inline constexpr std::string_view kStateFileName = "state.safetensors";

// A tensor: dtype, shape and a non-owning view of its bytes (row-major).
// `device` is null for host memory; otherwise `bytes` are device addresses
// the CPU must not read (see device.h).
struct TensorView {
  DType dtype = DType::kU8;
  Shape shape;
  std::span<const std::byte> bytes;
  const Device* device = nullptr;

  // The bytes as elements of T. Throws kInvalidArgument if T is not this
  // dtype's C++ type or the bytes are not aligned for T (possible only for a
  // foreign file whose writer did not align its tensors), and
  // kFailedPrecondition for a view of device memory.
  template <class T>
  std::span<const T> as() const;
};

class StateDict {
 public:
  struct Entry {
    DType dtype = DType::kU8;
    Shape shape;
    std::byte* data = nullptr;
    uint64_t nbytes = 0;
    bool writable = false;        // may be a load/restore target
    std::shared_ptr<void> owner;  // keeps owned bytes or a mapping alive (may be null)
    // Where the bytes live: null for host memory, else a device whose memory
    // the CPU must not read (`data` is a device address; see device.h).
    std::shared_ptr<const Device> device;
    TensorView view() const { return {dtype, shape, {data, nbytes}, device.get()}; }
  };

  // Adds (or replaces) a read-only entry viewing the caller's bytes: it can be
  // saved but not loaded into. Throws kInvalidArgument if `bytes` is not
  // byte_size(dtype, shape) long, or the name is "__metadata__". The empty name
  // is allowed, as in safetensors.
  void add(std::string name, DType dtype, Shape shape, std::span<const std::byte> bytes);
  // Adds (or replaces) a writable entry: saved from, and loaded into.
  void add_mutable(std::string name, DType dtype, Shape shape, std::span<std::byte> bytes);
  // Adds (or replaces) an entry owning `bytes` (writable).
  void add_owned(std::string name, DType dtype, Shape shape, std::vector<std::byte> bytes);
  // Typed conveniences: dtype from T (dtype_of<T>()).
  template <class T>
  void add(std::string name, Shape shape, std::span<const T> data) {
    add(std::move(name), dtype_of<T>(), std::move(shape), std::as_bytes(data));
  }
  template <class T>
  void add_mutable(std::string name, Shape shape, std::span<T> data) {
    add_mutable(std::move(name), dtype_of<T>(), std::move(shape), std::as_writable_bytes(data));
  }
  // An entry that shares ownership of bytes kept alive by `owner`.
  void add_shared(std::string name, DType dtype, Shape shape, std::span<std::byte> bytes,
                  std::shared_ptr<void> owner, bool writable);
  // An entry whose bytes live in `device`'s memory (`bytes` are device
  // addresses), kept alive by `owner` (may be null). Saved through device
  // copies and, when writable, loaded into the same way (device.h).
  // kInvalidArgument as add(), or when `device` is null.
  void add_device(std::string name, DType dtype, Shape shape, std::span<std::byte> bytes,
                  std::shared_ptr<const Device> device, std::shared_ptr<void> owner, bool writable);

  bool contains(std::string_view name) const { return entries().contains(name); }
  size_t size() const { return entries().size(); }
  void remove(std::string_view name);
  // Sorted names.
  std::vector<std::string> names() const;
  // kNotFound naming the tensor if absent.
  const Entry& entry(std::string_view name) const;
  TensorView view(std::string_view name) const { return entry(name).view(); }
  // kFailedPrecondition naming the tensor if the entry is read-only. For a
  // device entry these are device addresses.
  std::span<std::byte> mutable_bytes(std::string_view name) const;
  using Entries = std::map<std::string, Entry, std::less<>>;
  // Copies of a StateDict share their entries until one of them adds or
  // removes one, which first gives that copy entries of its own (copy on
  // write): a copy costs O(1), however many tensors it has.
  const Entries& entries() const { return shared_ ? shared_->entries : empty_entries(); }
  // Names the entries as they are: every add or remove gives a version never
  // given before in the process, and copies keep it until they change. So
  // two StateDicts of equal versions have the same names, dtypes, shapes and
  // buffers, which lets work done for one serve the other (an AsyncSaver
  // reuses the last save's layout without comparing every tensor). 0 when
  // no entry was ever added.
  uint64_t entries_version() const { return shared_ ? shared_->version : 0; }
  // Sum of every entry's bytes.
  uint64_t total_bytes() const;
  // Whether any entry lives in device memory.
  bool has_device_entries() const;

  // JSON metadata, an object (epoch, step, loss, lr, RNG state, ...).
  nlohmann::json metadata = nlohmann::json::object();
  // Other "__metadata__" strings (e.g. {"format": "pt"} as Hugging Face
  // writes); must not use the key "cairn.metadata".
  std::map<std::string, std::string> string_metadata;

 private:
  struct Shared {
    Entries entries;
    uint64_t version = 0;
  };
  // The entries to change, made this copy's own first if they are shared,
  // under a new version.
  Entries& own_entries();
  static const Entries& empty_entries();

  std::shared_ptr<Shared> shared_;
};

// The descriptors and "__metadata__" a save of `state` writes (pure).
FileLayout layout_state(const StateDict& state);

// How a file's bytes move between memory and a local disk.
//   kAuto      direct for a file of at least kDirectIoMinBytes where the
//              storage supports it and, when loading, where the file is not
//              mostly in the page cache already; buffered otherwise. The
//              environment variable CAIRN_DIRECT_IO=off makes kAuto buffered.
//   kDirect    O_DIRECT through aligned staging buffers that are allocated
//              once per process and reused (threads x block_size bytes):
//              fresh page-cache pages are never touched, which is what makes
//              buffered writes slow on virtual machines. kFailedPrecondition
//              naming the file where the storage or file system cannot.
//   kBuffered  through the page cache.
// Durability is the same either way: fsync of the file and its directory,
// manifest last. Only local files (file://, save_file, load_into of a path)
// have a direct path; memory:// and s3:// are always buffered.
enum class IoPath : uint8_t { kAuto, kDirect, kBuffered };
inline constexpr uint64_t kDirectIoMinBytes = uint64_t{8} << 20;

// What a save or load did, filled in when the options point at one.
struct IoReport {
  IoPath path = IoPath::kBuffered;  // kDirect or kBuffered, never kAuto
  std::string reason;               // why that path, for logs and benchmarks
};

struct SaveOptions {
  // fsync the file and its directory (save_file). Saves to a Storage are
  // always durable on return, whatever this says.
  bool durable = true;
  // Threads writing blocks in parallel; 0 picks min(4, hardware threads).
  unsigned threads = 0;
  // Bytes per write call (large blocks; also the unit of parallelism).
  size_t block_size = size_t{16} << 20;
  // Direct or buffered writes (see IoPath), and where to say which was used.
  IoPath io = IoPath::kAuto;
  IoReport* report = nullptr;
};

// Writes `state` as a safetensors file at the local `path`, atomically: a temp
// file next to it is written in parallel blocks, fsync'd (durable), renamed
// over `path`, and the directory fsync'd (durable).
void save_file(const StateDict& state, const std::filesystem::path& path,
               const SaveOptions& options = {});

// Synchronous saves of device tensors (save_file, save, save_checkpoint and
// the managers' saves of a StateDict with device entries; device.h) copy the
// file image into one per-process pinned staging buffer, grown to the
// largest image saved and kept for the next save. reserve_device_staging()
// allocates, touches and pins it for `state`'s file image ahead of the first
// save, which then costs only the copy (allocating and pinning 2 GiB took
// about 0.8 s on the machine of docs/benchmarks.md); nothing for a state
// without device entries. release_device_staging() frees it (a later device
// save allocates it again). Both wait while a save uses it. Failure: kIO
// when the memory cannot be had; a device that refuses to pin is not one.
void reserve_device_staging(const StateDict& state);
void release_device_staging();

// Writes `state` as object `key` of `storage`; durable and visible when it
// returns. Returns the entry (size, XXH3-64) a manifest needs.
ManifestEntry save(const StateDict& state, Storage& storage, std::string_view key,
                   const SaveOptions& options = {});

// An in-memory checkpoint (Checkpoint::in_memory) holding `state` as
// kStateFileName and, when `dict` is a JSON object, `dict` as kDictFileName:
// small state (JSON plus tensors) to report without a temporary directory.
// The tensors are copied. Read back with MappedState::open(checkpoint.storage(),
// kStateFileName) and Checkpoint::to_dict().
Checkpoint in_memory_checkpoint(const StateDict& state,
                                const nlohmann::json& dict = nlohmann::json());

// In-memory checkpoints of a state built in reused memory, for a state
// reported every step with train::report(..., {.async = true}): the report's
// snapshot of an in-memory checkpoint copies nothing, so this one copy of the
// tensors is the whole stall, at memcpy speed once the buffers were used once
// (fresh memory is much slower to touch the first time; docs/benchmarks.md).
//
//   StateStager stager;
//   for (...) {
//     train_step();
//     train::report(metrics, stager.stage(state, {{"step", step}}), {.async = true});
//   }
//
// stage() returns what in_memory_checkpoint(state, dict) returns, with the
// state's file written into a buffer that no checkpoint from this stager
// still holds (a pending report holds its checkpoint until its upload is
// done); when every buffer is held, it makes a new one, and it keeps at most
// `max_buffers` buffers in all, dropping the others as they are freed. The
// checkpoint's state file must not be changed through the checkpoint's
// storage while it is held (replacing it with put() is fine).
// Thread-safety: one thread at a time per stager; the checkpoints it returns
// may be read from any thread. Failure: kInvalidArgument as save() would.
class StateStager {
 public:
  explicit StateStager(unsigned max_buffers = 3);
  ~StateStager();
  StateStager(const StateStager&) = delete;
  StateStager& operator=(const StateStager&) = delete;

  // `file` names the state's file (ranks of a Trainer that report different
  // states need names of their own, such as "state-rank1.safetensors").
  Checkpoint stage(const StateDict& state, const nlohmann::json& dict = nlohmann::json(),
                   std::string_view file = kStateFileName);

  struct Stats {
    uint64_t stages = 0;       // checkpoints made
    uint64_t allocations = 0;  // buffers made or grown
    uint64_t buffers = 0;      // buffers kept now
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Saves `state` as `file` into the uncommitted checkpoint `dest` and commits
// it (CheckpointWriter) with `metrics`; the state's metadata also becomes the
// checkpoint's metadata.json. Returns the manifest.
Manifest save_checkpoint(const StateDict& state, const Checkpoint& dest,
                         const nlohmann::json& metrics = nlohmann::json::object(),
                         std::string_view file = kStateFileName, const SaveOptions& options = {});

// A validated safetensors file mapped read-only into memory (zero copy). The
// header is validated when opened; tensor views stay valid while any copy of
// the MappedState, or any StateDict made by state_dict(), lives.
struct LoadOptions;

// How MappedState::open maps a local file.
//   kReadOnly     shared, read-only: a write through a view is a crash.
//   kCopyOnWrite  private and writable: a write copies the page it touches
//                 for this process only; the file never changes. For views
//                 handed to code that may write to them (a framework's
//                 tensors), as torch.load(mmap=True) and numpy's mmap mode
//                 "c" map.
// Either way, a change to the file by another process while it is mapped
// may show in pages this process has not written (do not rewrite files in
// place; Cairn's saves replace them).
enum class MapMode : uint8_t { kReadOnly, kCopyOnWrite };

class MappedState {
 public:
  // Maps a local file. kNotFound if it does not exist, kCorruption if invalid.
  // `read_ahead` asks the kernel to read the whole file in (the fastest way
  // to read all of it); without it, only the pages touched are read, and
  // prefetch() reads ranges ahead.
  static MappedState open(const std::filesystem::path& path, bool read_ahead = true,
                          MapMode mode = MapMode::kReadOnly);
  // Maps `key` when the backend keeps it as a local file (local_path);
  // otherwise reads the object into memory once (memory of its own, which
  // is writable whatever `mode` says).
  static MappedState open(Storage& storage, std::string_view key, bool read_ahead = true,
                          MapMode mode = MapMode::kReadOnly);
  // Reads a local file whole into memory of its own (writable, see
  // writable_file_bytes) and validates it: one read of the file, direct from
  // the disk where that is faster (LoadOptions::io, as load_into decides),
  // however many tensors it has; the header is parsed once. For a copying
  // load into fresh memory, which later changes to the file cannot reach.
  // LoadOptions::expected_xxh3, when set, is checked (kCorruption naming the
  // file); threads and block_size are used; the rest is ignored. kNotFound
  // if the file does not exist, kCorruption if it is invalid.
  static MappedState read(const std::filesystem::path& path, const LoadOptions& options);
  // Validates an in-memory file image and keeps `owner` alive with it.
  static MappedState from_bytes(std::span<const std::byte> file, std::string source,
                                std::shared_ptr<void> owner);

  const SafetensorsHeader& header() const;
  const std::string& source() const;  // path or URI, for messages
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  // kNotFound naming the file and the tensor if absent.
  TensorView tensor(std::string_view name) const;
  // The file's JSON metadata ("cairn.metadata"; {} if absent). kCorruption
  // naming the file if it is not a JSON object.
  nlohmann::json metadata() const;
  // Read-only entries viewing the mapping (they keep it alive), with
  // metadata and string_metadata filled in.
  StateDict state_dict() const;
  // The whole file.
  std::span<const std::byte> file_bytes() const;
  // The whole file, writable: a copy-on-write mapping or memory of its own
  // (see open()). kFailedPrecondition naming the file for a read-only
  // mapping or an image from from_bytes(). Writes change what every copy of
  // this MappedState, and every view of it, sees; never the file.
  std::span<std::byte> writable_file_bytes() const;
  // Asks the kernel to read bytes [offset, offset + length) of a mapped file
  // in now, in large requests (a hint; nothing for an in-memory image).
  void prefetch(uint64_t offset, uint64_t length) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

struct LoadOptions {
  // TensorFlow's assert_consumed: every tensor in the file must be matched by
  // an entry and every entry found in the file. Without it, only tensors
  // present in both are loaded and the report lists the rest.
  bool strict = true;
  // Threads and block size of the parallel reads (as SaveOptions).
  unsigned threads = 0;
  size_t block_size = size_t{16} << 20;
  // The whole file's XXH3-64 (from a manifest): checked after reading;
  // kCorruption naming the file if it differs. A load of some tensors only
  // reads the rest of the file too, to check it, unless block checksums
  // are given.
  std::optional<uint64_t> expected_xxh3 = std::nullopt;
  // The file's block checksums (from a manifest: ManifestEntry::block_size
  // and block_xxh3, e.g. through expect()). A load of some tensors then reads
  // only the blocks holding the header and those tensors, checks each, and
  // copies the tensors from the checked bytes only. A block that differs is
  // kCorruption naming the file, its byte range and the block (tensors in
  // other blocks may have been copied by then). A load of every tensor
  // checks expected_xxh3 when given, else every block. Ignored when they do
  // not cover the file's size. Reads checked block by block go through the
  // page cache whatever `io` says (the IoReport says so).
  uint64_t expected_block_size = 0;
  std::vector<uint64_t> expected_block_xxh3 = {};
  // Sets the three checksums above from a manifest's entry for the file.
  LoadOptions& expect(const ManifestEntry& file) {
    expected_xxh3 = file.xxh3;
    expected_block_size = file.block_size;
    expected_block_xxh3 = file.block_xxh3;
    return *this;
  }
  // Direct or buffered reads (see IoPath), and where to say which was used.
  IoPath io = IoPath::kAuto;
  IoReport* report = nullptr;
};

struct LoadReport {
  std::vector<std::string> loaded;      // names copied into the state
  std::vector<std::string> missing;     // in the state, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the state
  // "name: file F32[2, 3], state F32[3, 2]" (dtype or shape differs, or the
  // entry is read-only)
  std::vector<std::string> mismatched;
  bool consumed() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // One line listing the problems, for error messages.
  std::string describe() const;
};

// Pure: compares a file's tensors with a state's entries (loaded = the names
// that match and are writable).
LoadReport match_state(const SafetensorsHeader& header, const StateDict& state);

// Copying load: reads each matched tensor of the file into its entry's bytes,
// in parallel large blocks, and replaces state.metadata/string_metadata with
// the file's. Mismatched dtypes or shapes are always an error; with
// options.strict, so are missing and unexpected tensors. Errors are
// kInvalidArgument listing every problem, raised before any buffer is written.
// A malformed or truncated file is kCorruption (buffers may then be partly
// written).
LoadReport load_into(const std::filesystem::path& path, StateDict& state,
                     const LoadOptions& options = {});
LoadReport load_into(Storage& storage, std::string_view key, StateDict& state,
                     const LoadOptions& options = {});

// ---- implementation of TensorView::as ----
namespace detail {
void check_view_cast(const TensorView& view, DType want, size_t align);
}
template <class T>
std::span<const T> TensorView::as() const {
  detail::check_view_cast(*this, dtype_of<T>(), alignof(T));
  return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
}

}  // namespace cairn
