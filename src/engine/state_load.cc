// The read paths of the safetensors engine: zero-copy mapped loads and
// copying loads into caller buffers (host or device, through pinned bounce
// buffers), checked against the manifest's checksums as they are read. The
// write paths are in state.cc.
#include "cairn/state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "engine/io.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {
namespace {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

nlohmann::json decode_metadata(const std::map<std::string, std::string>& m,
                               std::string_view source) {
  auto it = m.find(std::string(kCairnMetadataKey));
  if (it == m.end()) return nlohmann::json::object();
  nlohmann::json j =
      parse_json(it->second, fmt::format("{}: __metadata__ \"{}\"", source, kCairnMetadataKey));
  if (!j.is_object()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: __metadata__ \"{}\" is a JSON {}, not an object", source,
                            kCairnMetadataKey, j.type_name()));
  }
  return j;
}

std::map<std::string, std::string> other_metadata(const std::map<std::string, std::string>& m) {
  auto out = m;
  out.erase(std::string(kCairnMetadataKey));
  return out;
}

// A tensor of the file to be loaded into its entry of the state.
struct Match {
  const TensorInfo* tensor;
  const StateDict::Entry* entry;
};

// match_state() in one merge of the header's name index with the state's
// entries (both in name order): O(n) comparisons and no lookups, which at
// 100,000 tensors is most of what matching cost. `matches`, when given,
// receives the loaded tensors with their state entries, in name order.
LoadReport match_sorted(const SafetensorsHeader& header, const StateDict& state,
                        std::vector<Match>* matches) {
  const std::vector<TensorInfo>& tensors = header.tensors;
  std::vector<size_t> local;
  const std::vector<size_t>* by_name = &header.by_name;
  if (by_name->size() != tensors.size()) {  // a header filled in by hand
    local.resize(tensors.size());
    std::iota(local.begin(), local.end(), size_t{0});
    std::sort(local.begin(), local.end(),
              [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
    by_name = &local;
  }
  LoadReport r;
  r.loaded.reserve(std::min(tensors.size(), state.size()));
  if (matches) matches->reserve(r.loaded.capacity());
  auto e = state.entries().begin();
  const auto end = state.entries().end();
  for (size_t i : *by_name) {
    const TensorInfo& t = tensors[i];
    while (e != end && e->first < t.name) r.missing.push_back((e++)->first);
    if (e == end || e->first != t.name) {
      r.unexpected.push_back(t.name);
      continue;
    }
    const StateDict::Entry& entry = (e++)->second;
    if (entry.dtype != t.dtype || entry.shape != t.shape) {
      r.mismatched.push_back(fmt::format("{}: file {}{}, state {}{}", t.name, dtype_name(t.dtype),
                                         shape_str(t.shape), dtype_name(entry.dtype),
                                         shape_str(entry.shape)));
    } else if (!entry.writable) {
      r.mismatched.push_back(fmt::format("{}: the state's entry is read-only", t.name));
    } else {
      r.loaded.push_back(t.name);
      if (matches) matches->push_back({&t, &entry});
    }
  }
  while (e != end) r.missing.push_back((e++)->first);
  std::sort(r.mismatched.begin(), r.mismatched.end());
  return r;
}

// Reads the blocks holding the header and the matched tensors, checks each
// against `options`' block checksums and copies the tensors out of the
// checked bytes: a partial load that reads only what it needs and still
// verifies all of it, on options.threads.
void load_checked_blocks(const SafetensorsHeader& header, std::string_view header_bytes,
                         std::vector<Match> matches, const format::ReadAt& read_at,
                         const LoadOptions& options, const std::string& source) {
  const uint64_t bs = options.expected_block_size;
  const uint64_t data_start = header.data_start();
  std::sort(matches.begin(), matches.end(),
            [](const Match& a, const Match& b) { return a.tensor->begin < b.tensor->begin; });
  // Runs of blocks to read, in file order, each at most options.block_size
  // bytes (or one block).
  const uint64_t max_blocks = std::max<uint64_t>(1, options.block_size / bs);
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // [first, last) blocks
  auto add = [&](uint64_t offset, uint64_t length) {
    auto [first, last] = blocks_covering(offset, length, bs);
    if (first == last) return;
    if (!runs.empty() && first <= runs.back().second) {
      first = runs.back().second;
      if (first >= last) return;
      // Grow the last run while it has room, then start new ones.
      const uint64_t room = max_blocks - (runs.back().second - runs.back().first);
      const uint64_t grow = std::min(room, last - first);
      runs.back().second += grow;
      first += grow;
    }
    for (; first < last; first += max_blocks)
      runs.push_back({first, std::min(last, first + max_blocks)});
  };
  add(0, data_start);
  for (const auto& m : matches) add(data_start + m.tensor->begin, m.tensor->nbytes());
  const uint64_t file_size = header.file_size();
  format::run_parallel(runs.size(), format::pick_threads(options.threads), [&](size_t r) {
    const uint64_t begin = runs[r].first * bs;
    const uint64_t end = std::min(runs[r].second * bs, file_size);
    std::vector<std::byte> buf(end - begin);
    read_at(begin, buf);
    for (uint64_t b = runs[r].first; b < runs[r].second; ++b) {
      const uint64_t from = b * bs, to = std::min(from + bs, file_size);
      check_block(std::span<const std::byte>(buf).subspan(from - begin, to - from), from, b,
                  options.expected_block_xxh3[b], source);
    }
    // The header was parsed from an earlier read: it must be what was checked.
    const uint64_t in_header =
        begin < header_bytes.size() ? std::min<uint64_t>(end, header_bytes.size()) - begin : 0;
    if (in_header > 0 && std::memcmp(buf.data(), header_bytes.data() + begin, in_header) != 0) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: the header changed while the file was read", source));
    }
    // The parts of tensors this run holds: those that end after it begins.
    auto it = std::lower_bound(
        matches.begin(), matches.end(), begin,
        [&](const Match& m, uint64_t at) { return data_start + m.tensor->end <= at; });
    for (; it != matches.end() && data_start + it->tensor->begin < end; ++it) {
      const uint64_t t_begin = data_start + it->tensor->begin, t_end = data_start + it->tensor->end;
      const uint64_t lo = std::max(begin, t_begin), hi = std::min(end, t_end);
      if (lo >= hi) continue;
      std::memcpy(it->entry->data + (lo - t_begin), buf.data() + (lo - begin), hi - lo);
    }
  });
}

// Reads the matched tensors with `read_jobs` (direct reads) or parallel
// buffered reads, then checks options.expected_xxh3, when given, over the
// whole file: the bytes read and, read for the purpose, the rest.
void load_and_check_file(const SafetensorsHeader& header, std::string_view header_bytes,
                         const std::vector<Match>& matches, const LoadReport& report,
                         const format::ReadAt& read_at, StateDict& state,
                         const LoadOptions& options, const std::string& source,
                         const format::ReadJobs& read_jobs) {
  std::vector<format::ReadJob> jobs;
  jobs.reserve(matches.size());
  for (const auto& [t, entry] : matches) {
    jobs.push_back({header.data_start() + t->begin, {entry->data, entry->nbytes}});
  }
  if (read_jobs) {
    read_jobs(jobs);
  } else {
    format::read_blocks(jobs, read_at, options.block_size, format::pick_threads(options.threads));
  }
  if (options.expected_xxh3) {
    Hasher h;
    h.update(as_bytes(header_bytes));
    std::vector<std::byte> scratch;
    for (const auto& t : header.tensors) {
      if (std::binary_search(report.loaded.begin(), report.loaded.end(), t.name)) {
        h.update(state.mutable_bytes(t.name));
        continue;
      }
      scratch.resize(std::min<uint64_t>(t.nbytes(), uint64_t{8} << 20));
      for (uint64_t off = 0; off < t.nbytes(); off += scratch.size()) {
        std::span<std::byte> part(scratch.data(),
                                  std::min<uint64_t>(scratch.size(), t.nbytes() - off));
        read_at(header.data_start() + t.begin + off, part);
        h.update(part);
      }
    }
    check_file_digest(h.digest(), *options.expected_xxh3, source);
  }
}

// Bytes of each bounce buffer of a load into device tensors: large enough
// that a read of one keeps the disk busy (parallel blocks), small enough
// that two cost little memory.
constexpr uint64_t kBounceBytes = uint64_t{64} << 20;

// The two pinned bounce buffers of loads into device tensors, kept from one
// load to the next (pinning costs about as much as the copies it speeds up).
// One load at a time uses them; a concurrent one makes its own.
struct BouncePool {
  std::mutex mu;
  format::HugeBuffer buffers[2];
};
BouncePool& bounce_pool() {
  static BouncePool* pool = new BouncePool();  // never destroyed: no exit-time unpinning
  return *pool;
}

// What a bounce load reads: [begin, end) of the file, in chunks of `chunk`
// bytes, checked block by block (`blocks`) or by the whole file's digest
// (`whole`), or not at all.
struct BouncePlan {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t chunk = 0;
  bool blocks = false;
  bool whole = false;
};

// Sorts `matches` by offset and plans their read; nothing when there is
// nothing to read or check.
std::optional<BouncePlan> plan_bounce(const SafetensorsHeader& header, std::vector<Match>& matches,
                                      const LoadOptions& options) {
  const uint64_t file_size = header.file_size();
  const uint64_t bs = options.expected_block_size;
  BouncePlan plan;
  plan.blocks = blocks_cover(file_size, bs, options.expected_block_xxh3.size());
  plan.whole = options.expected_xxh3.has_value() && !plan.blocks;
  std::sort(matches.begin(), matches.end(),
            [](const Match& a, const Match& b) { return a.tensor->begin < b.tensor->begin; });
  plan.end = file_size;
  if (!plan.whole) {
    if (matches.empty()) return std::nullopt;
    uint64_t last = 0;
    for (const Match& m : matches) last = std::max(last, m.tensor->end);
    plan.begin = header.data_start() + matches.front().tensor->begin;
    plan.end = header.data_start() + last;
    // Checked reads start at the header's blocks (they are checked too) and
    // end at a block boundary.
    if (plan.blocks) {
      plan.begin = 0;
      plan.end = std::min(file_size, (plan.end + bs - 1) / bs * bs);
    }
  }
  plan.chunk = plan.blocks ? std::max<uint64_t>(1, kBounceBytes / bs) * bs : kBounceBytes;
  return plan;
}

// Makes the first `count` of `buffers` hold a chunk each, pinned for the
// first device among `matches`.
void prepare_bounce_buffers(format::HugeBuffer* buffers, size_t count, uint64_t chunk,
                            const std::vector<Match>& matches) {
  for (size_t i = 0; i < count; ++i) {
    if (buffers[i].size() < chunk) buffers[i] = format::HugeBuffer(chunk);
    for (const Match& m : matches) {
      if (m.entry->device) {
        buffers[i].pin(m.entry->device);
        break;
      }
    }
  }
}

// Checks the chunk `bytes` read at `off` before anything is copied out of
// it: the header's bytes unchanged, its blocks' checksums; feeds `hasher`
// when the whole file's digest is checked.
void check_bounce_chunk(std::span<const std::byte> bytes, uint64_t off,
                        std::string_view header_bytes, const BouncePlan& plan,
                        const LoadOptions& options, unsigned threads, Hasher& hasher,
                        const std::string& source) {
  const uint64_t n = bytes.size();
  if (off < header_bytes.size()) {
    const uint64_t in_header = std::min<uint64_t>(n, header_bytes.size() - off);
    if (std::memcmp(bytes.data(), header_bytes.data() + off, in_header) != 0) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: the header changed while the file was read", source));
    }
  }
  if (plan.whole) hasher.update(bytes);
  if (plan.blocks) {
    const uint64_t bs = options.expected_block_size;
    const uint64_t first = off / bs, last = (off + n + bs - 1) / bs;
    format::run_parallel(last - first, threads, [&](size_t i) {
      const uint64_t b = first + i, from = b * bs, to = std::min(from + bs, off + n);
      check_block(bytes.subspan(from - off, to - from), from, b, options.expected_block_xxh3[b],
                  source);
    });
  }
}

// Copies what the chunk `bytes` read at `off` holds of each match to its
// tensor: by memcpy on the host, on the tensor's stream (`stream_of`) for a
// device. `next` is the first match that ends after the chunk's start, and
// moves on as chunks do.
template <typename OnDevice, typename StreamOf>
void copy_bounce_chunk(std::span<const std::byte> bytes, uint64_t off, uint64_t data_start,
                       const std::vector<Match>& matches, std::vector<Match>::const_iterator& next,
                       const OnDevice& on_device, const StreamOf& stream_of) {
  const uint64_t n = bytes.size();
  while (next != matches.end() && data_start + next->tensor->end <= off) ++next;
  for (auto it = next; it != matches.end() && data_start + it->tensor->begin < off + n; ++it) {
    const uint64_t t_begin = data_start + it->tensor->begin;
    const uint64_t lo = std::max(off, t_begin);
    const uint64_t hi = std::min(off + n, data_start + it->tensor->end);
    if (lo >= hi) continue;
    std::byte* dst = it->entry->data + (lo - t_begin);
    const std::byte* src = bytes.data() + (lo - off);
    if (it->entry->device) {
      DeviceStream& stream = stream_of(*it->entry->device);
      on_device([&] { stream.to_device(dst, src, hi - lo); });
    } else {
      std::memcpy(dst, src, hi - lo);
    }
  }
}

// A load with device tensors among `matches`: the file is read in order, in
// chunks, into two pinned bounce buffers; while one chunk's tensors are
// copied to their devices (one stream each, opened first so the copies
// follow the work queued on the tensors) and host tensors are copied by
// memcpy, the next chunk is read into the other buffer. Every byte copied
// out was checked first when block checksums are given; with the whole
// file's checksum alone, every byte of the file is read and hashed in order
// (as load_and_check_file does).
void load_through_bounce(const SafetensorsHeader& header, std::string_view header_bytes,
                         std::vector<Match> matches, const format::ReadAt& read_at,
                         const format::ReadJobs& read_jobs, const LoadOptions& options,
                         const std::string& source) {
  const std::optional<BouncePlan> planned = plan_bounce(header, matches, options);
  if (!planned) return;
  const BouncePlan& plan = *planned;
  const uint64_t chunk = plan.chunk;

  // The buffers are declared before the streams, so that on an error the
  // streams (which wait for their copies) go before the buffers do.
  BouncePool& pool = bounce_pool();
  std::unique_lock<std::mutex> pool_lock(pool.mu, std::try_to_lock);
  BouncePool own;
  format::HugeBuffer* buffers = pool_lock.owns_lock() ? pool.buffers : own.buffers;
  prepare_bounce_buffers(
      buffers, std::min<uint64_t>(2, (plan.end - plan.begin + chunk - 1) / chunk), chunk, matches);
  // A failed device operation names the file too.
  auto on_device = [&](const auto& op) {
    try {
      op();
    } catch (const Error& e) {
      throw with_context(e, fmt::format("{}: loading into device tensors", source));
    }
  };
  format::DeviceStreams streams;
  auto stream_of = [&](const Device& d) -> DeviceStream& {
    DeviceStream* s = nullptr;
    on_device([&] { s = &streams.of(d); });
    return *s;
  };
  for (const Match& m : matches) {
    if (m.entry->device) stream_of(*m.entry->device);
  }

  // The copies out of each buffer still in flight: (stream, mark).
  std::vector<std::pair<DeviceStream*, uint64_t>> in_flight[2];
  Hasher hasher;
  const unsigned threads = format::pick_threads(options.threads);
  std::vector<Match>::const_iterator next = matches.begin();
  for (uint64_t off = plan.begin, k = 0; off < plan.end; off += chunk, ++k) {
    format::HugeBuffer& buffer = buffers[k % 2];
    on_device([&] {
      for (auto& [stream, mark] : in_flight[k % 2]) stream->wait(mark);
    });
    in_flight[k % 2].clear();
    const std::span<std::byte> bytes(buffer.data(), std::min(chunk, plan.end - off));
    if (read_jobs) {
      read_jobs({{off, bytes}});
    } else {
      format::read_blocks({{off, bytes}}, read_at, options.block_size, threads);
    }
    check_bounce_chunk(bytes, off, header_bytes, plan, options, threads, hasher, source);
    copy_bounce_chunk(bytes, off, header.data_start(), matches, next, on_device, stream_of);
    on_device([&] { streams.mark(in_flight[k % 2]); });
  }
  on_device([&] { streams.synchronize(); });
  if (plan.whole) check_file_digest(hasher.digest(), *options.expected_xxh3, source);
}

// The loading path shared by files and storage objects.
LoadReport load_common(const SafetensorsHeader& header, std::string_view header_bytes,
                       const format::ReadAt& read_at, StateDict& state, const LoadOptions& options,
                       const std::string& source, const format::ReadJobs& read_jobs) {
  std::vector<Match> matches;
  LoadReport report = match_sorted(header, state, &matches);
  if (!report.mismatched.empty() || (options.strict && !report.consumed())) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: the state does not match the file: {}", source, report.describe()));
  }
  nlohmann::json metadata = decode_metadata(header.metadata, source);
  const bool partial = matches.size() < header.tensors.size();
  const bool device = std::any_of(matches.begin(), matches.end(),
                                  [](const Match& m) { return m.entry->device != nullptr; });
  if (device) {
    if (options.report) {
      *options.report = {read_jobs ? IoPath::kDirect : IoPath::kBuffered,
                         read_jobs
                             ? "direct reads into pinned bounce buffers for device tensors"
                             : "buffered reads into pinned bounce buffers for device tensors"};
    }
    load_through_bounce(header, header_bytes, std::move(matches), read_at, read_jobs, options,
                        source);
  } else if (blocks_cover(header.file_size(), options.expected_block_size,
                          options.expected_block_xxh3.size()) &&
             (partial || !options.expected_xxh3)) {
    if (options.report) {
      *options.report = {IoPath::kBuffered,
                         "a load checked block by block reads through the page cache"};
    }
    load_checked_blocks(header, header_bytes, std::move(matches), read_at, options, source);
  } else {
    load_and_check_file(header, header_bytes, matches, report, read_at, state, options, source,
                        read_jobs);
  }
  state.metadata = std::move(metadata);
  state.string_metadata = other_metadata(header.metadata);
  return report;
}

// Headers from this size on are read into huge-page memory.
constexpr uint64_t kLargeHeaderBytes = uint64_t{1} << 20;

// Reads and validates the header through `read_at`, then loads the tensors.
LoadReport load_from(const format::ReadAt& read_at, uint64_t size, StateDict& state,
                     const LoadOptions& options, const std::string& source,
                     const format::ReadJobs& read_jobs = {}) {
  if (size < 8) {
    throw Error(
        ErrorCode::kCorruption,
        fmt::format("{}: file of {} bytes is shorter than the 8-byte header length", source, size));
  }
  std::array<std::byte, 8> prefix;
  read_at(0, prefix);
  uint64_t n = parse_header_length(prefix, size, source);
  // Fresh 4 KiB pages are slow to touch (PERF-NOTES): a header of many
  // tensors (8 MB for 100,000) goes in huge-page memory, and is read the way
  // the tensors are, directly when they are, which skips filling the page
  // cache.
  std::string small;
  format::HugeBuffer large;
  std::byte* bytes;
  if (8 + n >= kLargeHeaderBytes) {
    large = format::HugeBuffer(8 + n);
    bytes = large.data();
  } else {
    small.assign(8 + n, '\0');
    bytes = reinterpret_cast<std::byte*>(small.data());
  }
  std::memcpy(bytes, prefix.data(), 8);
  const std::span<std::byte> text{bytes + 8, n};
  if (read_jobs) {
    read_jobs({{8, text}});
  } else {
    read_at(8, text);
  }
  const std::string_view header_bytes(reinterpret_cast<const char*>(bytes), 8 + n);
  SafetensorsHeader header = parse_header(header_bytes.substr(8), size, source);
  return load_common(header, header_bytes, read_at, state, options, source, read_jobs);
}

// A local file opened for reading, with the read path chosen as load_into
// and MappedState::read choose it: direct reads only for a large file the
// page cache does not hold already (one it holds is copied from memory
// faster than any disk reads it).
struct LocalFile {
  UniqueFd fd;
  UniqueFd direct;  // open only when the path is kDirect
  uint64_t size = 0;
  std::string source;
  format::ReadAt buffered;
  format::ReadJobs read_jobs;  // direct reads; empty for buffered ones

  LocalFile(const std::filesystem::path& path, const LoadOptions& options, std::string src)
      : fd(open_file(path, O_RDONLY)), source(std::move(src)) {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw errno_error(errno, "stat", source);
    size = static_cast<uint64_t>(st.st_size);
    buffered = [this](uint64_t off, std::span<std::byte> out) {
      pread_all(fd.get(), out, off, source);
    };
    if (options.io != IoPath::kBuffered && size >= kDirectIoMinBytes) {
      int d = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (d >= 0) direct = UniqueFd(d);  // ignore-error: no O_DIRECT means buffered reads
    }
    const double cached =
        direct && options.io == IoPath::kAuto ? cached_fraction(fd.get(), size) : 0.0;
    const IoReport io = format::choose_read_path(options.io, size, static_cast<bool>(direct),
                                                 cached, format::direct_io_env(), source);
    if (options.report) *options.report = io;
    if (io.path == IoPath::kDirect) {
      read_jobs = [this, block = options.block_size,
                   threads = options.threads](const std::vector<format::ReadJob>& jobs) {
        format::read_direct(
            jobs, size, format::kDirectAlignment,
            [this](uint64_t off, std::span<std::byte> out) {
              return pread_some(direct.get(), out, off, source);
            },
            block, threads, source);
      };
    }
  }
  LocalFile(const LocalFile&) = delete;
  LocalFile& operator=(const LocalFile&) = delete;
};

LoadReport load_local(const std::filesystem::path& path, StateDict& state,
                      const LoadOptions& options, const std::string& source) {
  LocalFile file(path, options, source);
  return load_from(file.buffered, file.size, state, options, source, file.read_jobs);
}

}  // namespace
// ---- MappedState ----

struct MappedState::Impl {
  std::string source;
  SafetensorsHeader header;
  std::span<const std::byte> bytes;
  void* map = nullptr;
  size_t map_size = 0;
  bool writable = false;  // a copy-on-write mapping, or memory of its own
  std::shared_ptr<void> owner;
  ~Impl() {
    if (map) ::munmap(map, map_size);  // ignore-error: nothing to do if unmapping fails
  }
  void init() {
    header = parse_file_header(bytes, source);  // indexed by name (header.find)
  }
  TensorView view(const TensorInfo& t) const {
    return {t.dtype, t.shape, bytes.subspan(header.data_start() + t.begin, t.nbytes())};
  }
};

MappedState MappedState::open(const std::filesystem::path& path, bool read_ahead, MapMode mode) {
  auto impl = std::make_shared<Impl>();
  impl->source = path.string();
  UniqueFd fd = open_file(path, O_RDONLY);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw errno_error(errno, "stat", impl->source);
  const auto size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    const bool cow = mode == MapMode::kCopyOnWrite;
    void* m = ::mmap(nullptr, size, cow ? PROT_READ | PROT_WRITE : PROT_READ,
                     cow ? MAP_PRIVATE : MAP_SHARED, fd.get(), 0);
    if (m == MAP_FAILED) throw errno_error(errno, "mmap", impl->source);
    // Read-ahead of the whole mapping: touching it page by page otherwise
    // faults in small reads (measured about 2x slower than with the advice).
    if (read_ahead) (void)::madvise(m, size, MADV_WILLNEED);  // ignore-error: a hint
    impl->map = m;
    impl->map_size = size;
    impl->bytes = {static_cast<const std::byte*>(m), size};
  }
  impl->writable = mode == MapMode::kCopyOnWrite;
  impl->init();
  MappedState out;
  out.impl_ = std::move(impl);
  return out;
}

MappedState MappedState::open(Storage& storage, std::string_view key, bool read_ahead,
                              MapMode mode) {
  if (auto local = storage.local_path(key)) {
    try {
      return open(*local, read_ahead, mode);
    } catch (const Error& e) {
      throw with_context(e, fmt::format("opening {}", storage.uri_of(key)));
    }
  }
  auto reader = storage.open_reader(key);
  auto buffer = std::make_shared<format::HugeBuffer>(reader->size());
  std::span<std::byte> all(buffer->data(), reader->size());
  format::read_blocks(
      {{0, all}}, [&](uint64_t off, std::span<std::byte> out) { reader->read_at(off, out); },
      size_t{16} << 20, format::pick_threads(0));
  MappedState out = from_bytes(all, storage.uri_of(key), buffer);
  std::const_pointer_cast<Impl>(out.impl_)->writable = true;
  return out;
}

MappedState MappedState::read(const std::filesystem::path& path, const LoadOptions& options) {
  const std::string source = path.string();
  LocalFile file(path, options, source);
  auto buffer = std::make_shared<format::HugeBuffer>(std::max<uint64_t>(file.size, 1));
  const std::span<std::byte> all(buffer->data(), file.size);
  if (file.read_jobs) {
    file.read_jobs({{0, all}});
  } else {
    format::read_blocks({{0, all}}, file.buffered, options.block_size,
                        format::pick_threads(options.threads));
  }
  if (options.expected_xxh3) {
    const uint64_t got =
        xxh3_64(std::string_view(reinterpret_cast<const char*>(all.data()), all.size()));
    if (got != *options.expected_xxh3) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: checksum mismatch: XXH3-64 {}, expected {}", source,
                              hash_to_hex(got), hash_to_hex(*options.expected_xxh3)));
    }
  }
  MappedState out = from_bytes(all, source, std::move(buffer));
  std::const_pointer_cast<Impl>(out.impl_)->writable = true;
  return out;
}

MappedState MappedState::from_bytes(std::span<const std::byte> file, std::string source,
                                    std::shared_ptr<void> owner) {
  auto impl = std::make_shared<Impl>();
  impl->source = std::move(source);
  impl->bytes = file;
  impl->owner = std::move(owner);
  impl->init();
  MappedState out;
  out.impl_ = std::move(impl);
  return out;
}

const SafetensorsHeader& MappedState::header() const { return impl_->header; }
const std::string& MappedState::source() const { return impl_->source; }

std::vector<std::string> MappedState::names() const {
  const SafetensorsHeader& h = impl_->header;
  std::vector<std::string> out;
  out.reserve(h.tensors.size());
  for (size_t i : h.by_name) out.push_back(h.tensors[i].name);
  return out;
}

bool MappedState::contains(std::string_view name) const {
  return impl_->header.find(name) != nullptr;
}

TensorView MappedState::tensor(std::string_view name) const {
  const TensorInfo* t = impl_->header.find(name);
  if (t == nullptr) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: no tensor \"{}\" in the file", impl_->source, name));
  }
  return impl_->view(*t);
}

nlohmann::json MappedState::metadata() const {
  return decode_metadata(impl_->header.metadata, impl_->source);
}

StateDict MappedState::state_dict() const {
  StateDict out;
  auto owner = std::const_pointer_cast<Impl>(impl_);
  for (const auto& t : impl_->header.tensors) {
    const TensorView v = impl_->view(t);
    out.add_shared(t.name, t.dtype, t.shape,
                   {const_cast<std::byte*>(v.bytes.data()), v.bytes.size()}, owner, false);
  }
  out.metadata = metadata();
  out.string_metadata = other_metadata(impl_->header.metadata);
  return out;
}

std::span<const std::byte> MappedState::file_bytes() const { return impl_->bytes; }

std::span<std::byte> MappedState::writable_file_bytes() const {
  if (!impl_->writable) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: mapped read-only (open it with MapMode::kCopyOnWrite to write "
                            "to its views)",
                            impl_->source));
  }
  return {const_cast<std::byte*>(impl_->bytes.data()), impl_->bytes.size()};
}

void MappedState::prefetch(uint64_t offset, uint64_t length) const {
  if (!impl_->map || length == 0 || offset >= impl_->map_size) return;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  const uint64_t end = std::min<uint64_t>(offset + length, impl_->map_size);
  // ignore-error: a hint
  (void)::madvise(static_cast<std::byte*>(impl_->map) + begin, end - begin, MADV_WILLNEED);
}

// ---- copying loads ----

std::string LoadReport::describe() const {
  std::vector<std::string> parts;
  if (!missing.empty()) {
    parts.push_back(fmt::format("missing from the file: {}", fmt::join(missing, ", ")));
  }
  if (!unexpected.empty()) {
    parts.push_back(fmt::format("unexpected (not in the state): {}", fmt::join(unexpected, ", ")));
  }
  if (!mismatched.empty()) {
    parts.push_back(fmt::format("mismatched: {}", fmt::join(mismatched, "; ")));
  }
  if (parts.empty()) return "every tensor matched";
  return fmt::format("{}", fmt::join(parts, "; "));
}

LoadReport match_state(const SafetensorsHeader& header, const StateDict& state) {
  return match_sorted(header, state, nullptr);
}

LoadReport load_into(const std::filesystem::path& path, StateDict& state,
                     const LoadOptions& options) {
  return load_local(path, state, options, path.string());
}

LoadReport load_into(Storage& storage, std::string_view key, StateDict& state,
                     const LoadOptions& options) {
  const std::string source = storage.uri_of(key);
  if (auto local = storage.local_path(key)) return load_local(*local, state, options, source);
  auto reader = storage.open_reader(key);
  return load_from([&](uint64_t off, std::span<std::byte> out) { reader->read_at(off, out); },
                   reader->size(), state, options, source);
}

}  // namespace cairn
