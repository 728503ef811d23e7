// Sharded saves and re-sharding loads. The planning (even splits, box
// intersections, the tiling check, strided box copies) is pure and kept at
// the top of this file; the I/O below only writes rank files and maps them.
#include "cairn/sharded.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "checkpoint/entry_json.h"
#include "engine/io.h"
#include "engine/sharded_plan.h"
#include "util/hash.h"

namespace cairn {

namespace {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }
std::string box_str(const Box& b) {
  return fmt::format("offsets {} shape {}", shape_str(b.offsets), shape_str(b.shape));
}

Error invalid(std::string message) {
  return Error(ErrorCode::kInvalidArgument, std::move(message));
}

// Throws unless `box` lies inside a tensor of `shape` (same rank, no overflow).
void check_inside(const Box& box, const Shape& shape, std::string_view what) {
  if (box.offsets.size() != shape.size() || box.shape.size() != shape.size()) {
    throw invalid(
        fmt::format("{}: {} does not have the rank of {}", what, box_str(box), shape_str(shape)));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t end;
    if (__builtin_add_overflow(box.offsets[d], box.shape[d], &end) || end > shape[d]) {
      throw invalid(
          fmt::format("{}: {} leaves the global shape {}", what, box_str(box), shape_str(shape)));
    }
  }
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    uint64_t lo = std::max(a.offsets[d], b.offsets[d]);
    uint64_t hi = std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.shape.push_back(hi - lo);
  }
  return out;
}

Shape minus(const Shape& a, const Shape& b) {
  Shape out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

// Checks that `boxes` (with their owners' names, for messages) tile `shape`:
// identical boxes are replicas; any other overlap, or a gap, is an error.
void check_tiling(std::string_view tensor, const Shape& shape, const std::vector<Box>& boxes,
                  const std::vector<std::string>& owners) {
  std::vector<size_t> unique;
  for (size_t i = 0; i < boxes.size(); ++i) {
    bool replica = false;
    for (size_t u : unique) {
      if (boxes[u] == boxes[i]) {
        replica = true;
        break;
      }
      if (num_elements(boxes[i].shape) > 0 && num_elements(boxes[u].shape) > 0 &&
          intersect(boxes[u], boxes[i])) {
        throw invalid(
            fmt::format("tensor \"{}\": the shard of {} ({}) overlaps the shard of {} ({})", tensor,
                        owners[i], box_str(boxes[i]), owners[u], box_str(boxes[u])));
      }
    }
    if (!replica) unique.push_back(i);
  }
  uint64_t covered = 0;
  for (size_t u : unique) covered += num_elements(boxes[u].shape);
  const uint64_t total = num_elements(shape);
  if (covered != total) {
    throw invalid(
        fmt::format("tensor \"{}\": the shards cover {} of its {} elements (global shape "
                    "{}); some part was saved by no rank",
                    tensor, covered, total, shape_str(shape)));
  }
}

using format::shape_from_json;

DType dtype_from_json(const nlohmann::json& j, std::string_view what) {
  if (!j.is_string()) throw invalid(fmt::format("{} is not a dtype name", what));
  auto d = parse_dtype(j.get<std::string>());
  if (!d) throw invalid(fmt::format("{}: unknown dtype {}", what, j.dump()));
  return *d;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Shape format::shape_from_json(const nlohmann::json& j, std::string_view what) {
  if (!j.is_array()) throw invalid(fmt::format("{} is not an array of sizes", what));
  Shape out;
  for (const auto& v : j) {
    if (!v.is_number_unsigned()) throw invalid(fmt::format("{} is not an array of sizes", what));
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// ---- pure planning ----

Box even_split(const Shape& global_shape, size_t dim, int rank, int world_size) {
  if (dim >= global_shape.size()) {
    throw invalid(fmt::format("cannot split {} along dimension {}", shape_str(global_shape), dim));
  }
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw invalid(fmt::format("rank {} is not in a world of {}", rank, world_size));
  }
  const auto r = static_cast<uint64_t>(rank), w = static_cast<uint64_t>(world_size);
  const uint64_t n = global_shape[dim], base = n / w, rem = n % w;
  Box b;
  b.offsets.assign(global_shape.size(), 0);
  b.shape = global_shape;
  b.offsets[dim] = r * base + std::min(r, rem);
  b.shape[dim] = base + (r < rem ? 1 : 0);
  return b;
}

std::vector<CopyRegion> plan_read(const std::vector<Box>& saved, const Box& wanted) {
  std::vector<CopyRegion> plan;
  const uint64_t want = num_elements(wanted.shape);
  if (want == 0) return plan;
  uint64_t covered = 0;
  std::vector<size_t> used;
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].shape.size() != wanted.shape.size() ||
        saved[i].offsets.size() != wanted.shape.size()) {
      throw invalid(fmt::format("saved shard {} ({}) does not have the rank of the wanted box", i,
                                box_str(saved[i])));
    }
    auto part = intersect(saved[i], wanted);
    if (!part) continue;
    bool replica = false;
    for (size_t u : used) {
      if (saved[u] == saved[i]) {
        replica = true;
        break;
      }
      if (intersect(saved[u], saved[i])) {
        throw invalid(fmt::format("saved shards {} ({}) and {} ({}) overlap", u, box_str(saved[u]),
                                  i, box_str(saved[i])));
      }
    }
    if (replica) continue;
    used.push_back(i);
    covered += num_elements(part->shape);
    plan.push_back({i, Box{minus(part->offsets, saved[i].offsets), part->shape},
                    Box{minus(part->offsets, wanted.offsets), part->shape}});
  }
  if (covered != want) {
    throw invalid(fmt::format("the saved shards cover {} of the {} elements of {}", covered, want,
                              box_str(wanted)));
  }
  return plan;
}

void copy_box(std::span<const std::byte> src_data, const Shape& src_shape, const Box& src,
              std::span<std::byte> dst_data, const Shape& dst_shape, const Box& dst, size_t elem) {
  check_inside(src, src_shape, "copy source");
  check_inside(dst, dst_shape, "copy destination");
  if (src.shape != dst.shape) throw invalid("copy_box: source and destination extents differ");
  if (src_data.size() != num_elements(src_shape) * elem ||
      dst_data.size() != num_elements(dst_shape) * elem) {
    throw invalid("copy_box: buffer sizes do not match their shapes");
  }
  const size_t rank = src.shape.size();
  if (num_elements(src.shape) == 0) return;
  // The innermost dimensions that both boxes cover whole are one run.
  size_t inner = rank;  // first dimension of the contiguous run
  uint64_t run = 1;
  while (inner > 0) {
    size_t d = inner - 1;
    run *= src.shape[d];
    --inner;
    if (src.shape[d] != src_shape[d] || dst.shape[d] != dst_shape[d]) break;
  }
  // Row-major strides in elements.
  std::vector<uint64_t> sstride(rank, 1), dstride(rank, 1);
  for (size_t d = rank; d-- > 1;) {
    sstride[d - 1] = sstride[d] * src_shape[d];
    dstride[d - 1] = dstride[d] * dst_shape[d];
  }
  // Odometer over the dimensions before `inner`.
  std::vector<uint64_t> idx(inner, 0);
  const size_t bytes = static_cast<size_t>(run * elem);
  while (true) {
    uint64_t so = 0, dof = 0;
    for (size_t d = 0; d < rank; ++d) {
      uint64_t i = d < inner ? idx[d] : 0;
      so += (src.offsets[d] + i) * sstride[d];
      dof += (dst.offsets[d] + i) * dstride[d];
    }
    std::memcpy(dst_data.data() + dof * elem, src_data.data() + so * elem, bytes);
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < src.shape[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

nlohmann::json RankShards::to_json() const {
  nlohmann::json files_j = nlohmann::json::array();
  for (const auto& f : files) {
    files_j.push_back(entry_to_json(f));
  }
  nlohmann::json shards_j = nlohmann::json::array();
  for (const auto& s : shards) {
    shards_j.push_back({{"tensor", s.tensor},
                        {"dtype", dtype_name(s.dtype)},
                        {"global_shape", s.global_shape},
                        {"offsets", s.box.offsets},
                        {"shape", s.box.shape},
                        {"file", s.file}});
  }
  return {{"rank", rank}, {"files", files_j}, {"shards", shards_j}};
}

RankShards RankShards::from_json(const nlohmann::json& j) {
  try {
    RankShards r;
    r.rank = j.at("rank").get<int>();
    for (const auto& f : j.at("files")) {
      ManifestEntry e;
      e.path = f.at("path").get<std::string>();
      e.size = f.at("size").get<uint64_t>();
      if (!hash_from_hex(f.at("xxh3").get<std::string>(), e.xxh3)) {
        throw invalid(fmt::format("file \"{}\": bad xxh3", e.path));
      }
      parse_entry_blocks(f, e, "rank report", fmt::format("file \"{}\"", e.path));
      r.files.push_back(std::move(e));
    }
    for (const auto& s : j.at("shards")) {
      Shard sh;
      sh.tensor = s.at("tensor").get<std::string>();
      sh.dtype = dtype_from_json(s.at("dtype"), "dtype");
      sh.global_shape = shape_from_json(s.at("global_shape"), "global_shape");
      sh.box.offsets = shape_from_json(s.at("offsets"), "offsets");
      sh.box.shape = shape_from_json(s.at("shape"), "shape");
      sh.file = s.at("file").get<std::string>();
      r.shards.push_back(std::move(sh));
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw invalid(fmt::format("not a rank shard report: {}", e.what()));
  }
}

namespace {

// build_layout(), and with `files_written` false the same checks for reports
// whose files are not written yet (check_sharded_layout).
nlohmann::json layout_of(const std::vector<RankShards>& ranks, bool files_written) {
  struct Tensor {
    DType dtype;
    Shape shape;
    std::vector<Box> boxes;
    std::vector<std::string> owners;
    nlohmann::json shards = nlohmann::json::array();
  };
  std::map<std::string, Tensor> tensors;
  std::set<int> seen_ranks;
  int world = 0;
  for (const auto& r : ranks) {
    if (!seen_ranks.insert(r.rank).second)
      throw invalid(fmt::format("rank {} reported twice", r.rank));
    world = std::max(world, r.rank + 1);
    for (const auto& s : r.shards) {
      const std::string owner = fmt::format("rank {}", r.rank);
      bool has_file =
          !files_written || std::any_of(r.files.begin(), r.files.end(),
                                        [&](const ManifestEntry& e) { return e.path == s.file; });
      if (!has_file) {
        throw invalid(fmt::format("tensor \"{}\": {} names file \"{}\" it did not report writing",
                                  s.tensor, owner, s.file));
      }
      check_inside(s.box, s.global_shape, fmt::format("tensor \"{}\" from {}", s.tensor, owner));
      auto [it, fresh] = tensors.try_emplace(s.tensor, Tensor{s.dtype, s.global_shape, {}, {}, {}});
      Tensor& t = it->second;
      if (!fresh && (t.dtype != s.dtype || t.shape != s.global_shape)) {
        throw invalid(fmt::format("tensor \"{}\": {} saved it as {}{} but {} as {}{}", s.tensor,
                                  t.owners.front(), dtype_name(t.dtype), shape_str(t.shape), owner,
                                  dtype_name(s.dtype), shape_str(s.global_shape)));
      }
      t.boxes.push_back(s.box);
      t.owners.push_back(owner);
      t.shards.push_back(
          {{"file", s.file}, {"rank", r.rank}, {"offsets", s.box.offsets}, {"shape", s.box.shape}});
    }
  }
  nlohmann::json out_tensors = nlohmann::json::object();
  for (auto& [name, t] : tensors) {
    check_tiling(name, t.shape, t.boxes, t.owners);
    out_tensors[name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"shards", std::move(t.shards)}};
  }
  return {{"format", kShardedLayoutFormat}, {"world_size", world}, {"tensors", out_tensors}};
}

}  // namespace

nlohmann::json build_layout(const std::vector<RankShards>& ranks) {
  return layout_of(ranks, /*files_written=*/true);
}

void format::check_sharded_layout(const std::vector<RankShards>& ranks) {
  (void)layout_of(ranks, /*files_written=*/false);
}

// ---- rank side ----

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

format::RankPlan format::plan_rank_file(const StateDict& local,
                                        const std::map<std::string, ShardSpec>& specs, int rank) {
  if (rank < 0) throw invalid(fmt::format("rank {} is negative", rank));
  for (const auto& [name, spec] : specs) {
    if (!local.contains(name)) {
      throw invalid(
          fmt::format("rank {}: a shard spec names tensor \"{}\", which is not in the "
                      "state",
                      rank, name));
    }
  }
  RankPlan plan;
  plan.report.rank = rank;
  plan.file = rank_file_name(rank);
  plan.file_state = local;  // views only
  nlohmann::json placement = nlohmann::json::object();
  for (const auto& [name, e] : local.entries()) {
    RankShards::Shard s;
    s.tensor = name;
    s.dtype = e.dtype;
    s.file = plan.file;
    s.box.shape = e.shape;
    auto spec = specs.find(name);
    if (spec != specs.end()) {
      s.global_shape = spec->second.global_shape;
      s.box.offsets = spec->second.offsets;
    } else {
      s.global_shape = e.shape;
      s.box.offsets.assign(e.shape.size(), 0);
    }
    check_inside(s.box, s.global_shape, fmt::format("rank {}: tensor \"{}\"", rank, name));
    placement[name] = {{"global_shape", s.global_shape}, {"offsets", s.box.offsets}};
    plan.report.shards.push_back(std::move(s));
  }
  plan.file_state.string_metadata[std::string(kShardsMetadataKey)] = placement.dump();
  plan.file_state.string_metadata["cairn.rank"] = std::to_string(rank);
  return plan;
}

RankShards save_rank_shards(const StateDict& local, const std::map<std::string, ShardSpec>& specs,
                            const Checkpoint& dest, int rank, const SaveOptions& options) {
  format::RankPlan plan = format::plan_rank_file(local, specs, rank);
  plan.report.files.push_back(save(plan.file_state, dest.storage(), plan.file, options));
  return std::move(plan.report);
}

CheckpointRecord commit_sharded(CheckpointManager& manager, const Checkpoint& reserved,
                                const std::vector<RankShards>& ranks,
                                const nlohmann::json& metrics) {
  nlohmann::json layout = build_layout(ranks);
  std::vector<ManifestEntry> files;
  for (const auto& r : ranks) files.insert(files.end(), r.files.begin(), r.files.end());
  return manager.commit_reserved(reserved, metrics, files, layout);
}

Manifest commit_sharded(const Checkpoint& dest, const std::vector<RankShards>& ranks,
                        const nlohmann::json& metrics) {
  nlohmann::json layout = build_layout(ranks);
  CheckpointWriter writer(dest);
  std::vector<ManifestEntry> files;
  for (const auto& r : ranks) files.insert(files.end(), r.files.begin(), r.files.end());
  writer.add_written(files);
  writer.set_layout(layout);
  return writer.commit(metrics, now_seconds());
}

// ---- reader ----

struct ShardedReader::Impl {
  struct Shard {
    std::string file;
    int rank = 0;
    Box box;
  };
  struct Tensor {
    DType dtype = DType::kU8;
    Shape shape;
    std::vector<Shard> shards;
    std::vector<Box> boxes;
  };
  Checkpoint checkpoint;
  std::map<std::string, Tensor, std::less<>> tensors;
  std::map<std::string, ManifestEntry> checksums;  // file -> its manifest entry
  int world_size = 0;
  std::mutex mu;
  struct OpenFile {
    MappedState map;
    std::vector<bool> verified;  // per checksum block; empty: checked whole
    // A file not on the local file system, with block checksums: `map` views
    // `buffer`, whose blocks are fetched with ranged reads as they are first
    // verified, so only the blocks a load needs travel.
    std::shared_ptr<Reader> remote;
    std::shared_ptr<format::HugeBuffer> buffer;
  };
  std::map<std::string, OpenFile> open_files;

  explicit Impl(const Checkpoint& cp) : checkpoint(cp) {}

  static bool has_blocks(const ManifestEntry& e) {
    return blocks_cover(e.size, e.block_size, e.block_xxh3.size());
  }

  // Maps a rank file once. With block checksums in the manifest, nothing but
  // the header is read and checked now: verify() checks each block when it
  // is first read. Without them (older checkpoints), the whole file is read
  // and checked against the file's checksum.
  MappedState file(const std::string& key) {
    std::lock_guard<std::mutex> g(mu);
    auto it = open_files.find(key);
    if (it != open_files.end()) return it->second.map;
    const ManifestEntry& e = checksums.at(key);
    const std::string uri = checkpoint.storage().uri_of(key);
    OpenFile f = has_blocks(e) && !checkpoint.storage().local_path(key)
                     ? open_remote(key, e, uri)
                     : OpenFile{MappedState::open(checkpoint.storage(), key,
                                                  /*read_ahead=*/!has_blocks(e)),
                                {},
                                nullptr,
                                nullptr};
    if (f.map.file_bytes().size() != e.size) {
      throw Error(ErrorCode::kCorruption, fmt::format("{}: {} bytes, but the manifest says {}", uri,
                                                      f.map.file_bytes().size(), e.size));
    }
    if (has_blocks(e)) {
      f.verified.assign(e.block_xxh3.size(), false);
      verify_locked(key, f, 0, f.map.header().data_start());
    } else {
      Hasher h;
      h.update(f.map.file_bytes());
      check_file_digest(h.digest(), e.xxh3, uri);
    }
    return open_files.emplace(key, std::move(f)).first->second.map;
  }

  // Checks the blocks holding bytes [offset, offset + length) of a mapped
  // rank file against the manifest, each block once.
  void verify(const std::string& key, uint64_t offset, uint64_t length) {
    std::lock_guard<std::mutex> g(mu);
    verify_locked(key, open_files.at(key), offset, length);
  }

  void verify_locked(const std::string& key, OpenFile& f, uint64_t offset, uint64_t length) {
    if (f.verified.empty()) return;
    const ManifestEntry& e = checksums.at(key);
    const auto bytes = f.map.file_bytes();
    const auto [first, last] = blocks_covering(offset, length, e.block_size);
    if (f.remote) {
      fetch_blocks(f, e, first, last, checkpoint.storage().uri_of(key));
    } else {
      // One large read of the blocks not checked yet, rather than a fault per page.
      uint64_t from = first;
      while (from < last && f.verified[from]) ++from;
      if (from < last) f.map.prefetch(from * e.block_size, (last - from) * e.block_size);
    }
    for (uint64_t b = first; b < last; ++b) {
      if (f.verified[b]) continue;
      const uint64_t begin = b * e.block_size;
      const uint64_t end = std::min<uint64_t>(begin + e.block_size, bytes.size());
      check_block(bytes.subspan(begin, end - begin), begin, b, e.block_xxh3[b],
                  checkpoint.storage().uri_of(key));
      f.verified[b] = true;
    }
  }

  // Opens a stored (not local) rank file for block-wise reads: reads its
  // header's length and makes a map of the whole file over memory that is
  // filled only as blocks are fetched (untouched pages cost nothing).
  OpenFile open_remote(const std::string& key, const ManifestEntry& e, const std::string& uri) {
    OpenFile f;
    f.remote = checkpoint.storage().open_reader(key);
    const uint64_t size = f.remote->size();
    if (size != e.size) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: {} bytes, but the manifest says {}", uri, size, e.size));
    }
    f.buffer = std::make_shared<format::HugeBuffer>(static_cast<size_t>(size));
    std::span<std::byte> all(f.buffer->data(), static_cast<size_t>(size));
    std::array<std::byte, 8> prefix{};
    if (size < prefix.size()) {
      throw Error(ErrorCode::kCorruption, fmt::format("{}: {} bytes, too short for a safetensors "
                                                      "header",
                                                      uri, size));
    }
    f.remote->read_at(0, prefix);
    const uint64_t header_end = 8 + parse_header_length(prefix, size, uri);
    // The header, to lay the map out; the caller then verifies (and so
    // fetches whole) the blocks holding it before anything is read from it.
    f.remote->read_at(0, all.subspan(0, static_cast<size_t>(header_end)));
    f.verified.assign(e.block_xxh3.size(), false);
    f.map = MappedState::from_bytes(all, uri, f.buffer);
    return f;
  }

  // Reads blocks [first, last) of a stored file that are not verified yet,
  // each run of consecutive ones with one parallel ranged read. Verified
  // blocks are never written again: other threads may be copying from them.
  void fetch_blocks(OpenFile& f, const ManifestEntry& e, uint64_t first, uint64_t last,
                    const std::string& uri) {
    const uint64_t size = e.size;  // checked against the object's; the buffer may be larger
    for (uint64_t b = first; b < last;) {
      if (f.verified[b]) {
        ++b;
        continue;
      }
      uint64_t run_end = b;
      while (run_end < last && !f.verified[run_end]) ++run_end;
      const uint64_t begin = b * e.block_size;
      const uint64_t end = std::min<uint64_t>(run_end * e.block_size, size);
      if (begin < end) {
        std::span<std::byte> out(f.buffer->data() + begin, static_cast<size_t>(end - begin));
        try {
          format::read_blocks(
              {{begin, out}},
              [&](uint64_t off, std::span<std::byte> o) { f.remote->read_at(off, o); },
              size_t{16} << 20, format::pick_threads(0));
        } catch (const Error& err) {
          throw with_context(err, fmt::format("reading bytes {}-{} of {}", begin, end, uri));
        }
      }
      b = run_end;
    }
  }
};

namespace {
// Bytes [first, last) of a row-major tensor of `shape` that the box touches:
// from its first element to the end of its last (what a copy reads).
std::pair<uint64_t, uint64_t> touched_bytes(const Shape& shape, const Box& box, size_t elem) {
  for (uint64_t d : box.shape) {
    if (d == 0) return {0, 0};
  }
  uint64_t first = 0, last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    first = first * shape[i] + box.offsets[i];
    last = last * shape[i] + box.offsets[i] + box.shape[i] - 1;
  }
  return {first * elem, (last + 1) * elem};
}
}  // namespace

ShardedReader::ShardedReader(const Checkpoint& checkpoint)
    : impl_(std::make_unique<Impl>(checkpoint)) {
  Manifest manifest = checkpoint.manifest();
  for (const auto& f : manifest.files) impl_->checksums[f.path] = f;
  nlohmann::json layout = manifest.layout;
  try {
    if (!layout.is_object() || layout.value("format", "") != kShardedLayoutFormat) {
      if (std::optional<nlohmann::json> built =
              format::layout_from_rank_files(checkpoint, manifest)) {
        layout = std::move(*built);
      } else {
        throw invalid(
            "the manifest has no sharded layout (\"format\": \"cairn.sharded/1\") and no file "
            "is a rank file of save_rank_shards");
      }
    }
    impl_->world_size = layout.at("world_size").get<int>();
    for (const auto& [name, t] : layout.at("tensors").items()) {
      Impl::Tensor tensor;
      tensor.dtype = dtype_from_json(t.at("dtype"), fmt::format("tensor \"{}\" dtype", name));
      tensor.shape = shape_from_json(t.at("shape"), fmt::format("tensor \"{}\" shape", name));
      std::vector<std::string> owners;
      for (const auto& s : t.at("shards")) {
        Impl::Shard shard;
        shard.file = s.at("file").get<std::string>();
        shard.rank = s.at("rank").get<int>();
        shard.box.offsets = shape_from_json(s.at("offsets"), "offsets");
        shard.box.shape = shape_from_json(s.at("shape"), "shape");
        if (!impl_->checksums.count(shard.file)) {
          throw invalid(fmt::format("tensor \"{}\": shard file \"{}\" is not in the manifest", name,
                                    shard.file));
        }
        check_inside(shard.box, tensor.shape, fmt::format("tensor \"{}\"", name));
        owners.push_back(fmt::format("rank {}", shard.rank));
        tensor.boxes.push_back(shard.box);
        tensor.shards.push_back(std::move(shard));
      }
      check_tiling(name, tensor.shape, tensor.boxes, owners);
      impl_->tensors.emplace(name, std::move(tensor));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: malformed sharded layout: {}", checkpoint.uri(), e.what()));
  } catch (const Error& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: malformed sharded layout: {}", checkpoint.uri(), e.what()));
  }
}

ShardedReader::~ShardedReader() = default;
ShardedReader::ShardedReader(ShardedReader&&) noexcept = default;

std::vector<ShardedReader::GlobalTensor> ShardedReader::tensors() const {
  std::vector<GlobalTensor> out;
  for (const auto& [name, t] : impl_->tensors) out.push_back({name, t.dtype, t.shape});
  return out;
}

int ShardedReader::world_size() const { return impl_->world_size; }

void ShardedReader::read(std::string_view name, const Box& box, std::span<std::byte> out) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: no tensor \"{}\" in the sharded layout",
                                                  impl_->checkpoint.uri(), name));
  }
  const Impl::Tensor& t = it->second;
  check_inside(box, t.shape, fmt::format("tensor \"{}\"", name));
  const size_t elem = dtype_size(t.dtype);
  if (out.size() != byte_size(t.dtype, box.shape)) {
    throw invalid(fmt::format("tensor \"{}\": {} needs {} bytes, the buffer has {}", name,
                              box_str(box), byte_size(t.dtype, box.shape), out.size()));
  }
  for (const CopyRegion& r : plan_read(t.boxes, box)) {
    const Impl::Shard& shard = t.shards[r.shard];
    MappedState file = impl_->file(shard.file);
    TensorView v = file.tensor(name);
    if (v.dtype != t.dtype || v.shape != shard.box.shape) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: tensor \"{}\" is {}{} but the layout says {}{}", file.source(),
                              name, dtype_name(v.dtype), shape_str(v.shape), dtype_name(t.dtype),
                              shape_str(shard.box.shape)));
    }
    const auto [first, last] = touched_bytes(shard.box.shape, r.src, elem);
    const auto at = static_cast<uint64_t>(v.bytes.data() - file.file_bytes().data());
    impl_->verify(shard.file, at + first, last - first);
    copy_box(v.bytes, shard.box.shape, r.src, out, box.shape, r.dst, elem);
  }
}

LoadReport ShardedReader::load(StateDict& local, const std::map<std::string, ShardSpec>& specs,
                               bool strict) const {
  LoadReport report;
  std::vector<std::pair<std::string, Box>> todo;
  for (const auto& [name, e] : local.entries()) {
    auto it = impl_->tensors.find(name);
    if (it == impl_->tensors.end()) {
      report.missing.push_back(name);
      continue;
    }
    const Impl::Tensor& t = it->second;
    auto spec = specs.find(name);
    Shape global = spec != specs.end() ? spec->second.global_shape : e.shape;
    Box box{spec != specs.end() ? spec->second.offsets : Shape(e.shape.size(), 0), e.shape};
    if (e.dtype != t.dtype || global != t.shape) {
      report.mismatched.push_back(fmt::format("{}: saved {}{}, state {}{}", name,
                                              dtype_name(t.dtype), shape_str(t.shape),
                                              dtype_name(e.dtype), shape_str(global)));
      continue;
    }
    if (!e.writable) {
      report.mismatched.push_back(fmt::format("{}: the state's entry is read-only", name));
      continue;
    }
    try {
      check_inside(box, t.shape, name);
    } catch (const Error& err) {
      report.mismatched.push_back(err.what());
      continue;
    }
    todo.emplace_back(name, std::move(box));
  }
  for (const auto& [name, t] : impl_->tensors) {
    if (!local.contains(name)) report.unexpected.push_back(name);
  }
  if (!report.mismatched.empty() || (strict && !report.missing.empty())) {
    throw invalid(fmt::format("{}: the state does not match the sharded checkpoint: {}",
                              impl_->checkpoint.uri(), report.describe()));
  }
  // A device tensor is assembled in (pinned) host memory, then copied to
  // its device; the buffer is reused once the copy is complete.
  format::HugeBuffer host;
  for (const auto& [name, box] : todo) {
    const StateDict::Entry& e = local.entry(name);
    if (!e.device) {
      read(name, box, local.mutable_bytes(name));
    } else {
      if (host.size() < e.nbytes) host = format::HugeBuffer(e.nbytes);
      host.pin(e.device);
      read(name, box, {host.data(), static_cast<size_t>(e.nbytes)});
      try {
        std::unique_ptr<DeviceStream> stream = e.device->open_stream();
        stream->to_device(e.data, host.data(), e.nbytes);
        stream->synchronize();
      } catch (const Error& err) {
        throw with_context(err, fmt::format("{}: loading tensor \"{}\" into device memory",
                                            impl_->checkpoint.uri(), name));
      }
    }
    report.loaded.push_back(name);
  }
  return report;
}

}  // namespace cairn
