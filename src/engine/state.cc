// State dictionaries and the write paths of the safetensors engine: parallel
// large-block writes (checksummed while written) to a file or a storage
// object, staging, and checkpoint saves. The read paths (mapped and copying
// loads) are in state_load.cc.
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

void check_entry(const std::string& name, DType dtype, const Shape& shape, size_t nbytes) {
  if (name == kMetadataKeyName) {
    throw Error(ErrorCode::kInvalidArgument, "a tensor may not be named \"__metadata__\"");
  }
  uint64_t want = byte_size(dtype, shape);
  if (want != nbytes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("tensor \"{}\": {}{} needs {} bytes but {} were given", name,
                            dtype_name(dtype), shape_str(shape), want, nbytes));
  }
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace detail {
void check_view_cast(const TensorView& view, DType want, size_t align) {
  if (view.device != nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("tensor of dtype {} lives in {} memory, which the CPU cannot read",
                            dtype_name(view.dtype), view.device->name()));
  }
  if (view.dtype != want) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("tensor of dtype {} viewed as {}",
                                                         dtype_name(view.dtype), dtype_name(want)));
  }
  if (reinterpret_cast<uintptr_t>(view.bytes.data()) % align != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("tensor of dtype {} is not aligned to {} bytes in its file; copy it "
                            "(load_into) instead",
                            dtype_name(view.dtype), align));
  }
}
}  // namespace detail

// ---- StateDict ----

void StateDict::add(std::string name, DType dtype, Shape shape, std::span<const std::byte> bytes) {
  check_entry(name, dtype, shape, bytes.size());
  Entry e{dtype, std::move(shape), const_cast<std::byte*>(bytes.data()), bytes.size(), false, {},
          {}};
  own_entries().insert_or_assign(std::move(name), std::move(e));
}

void StateDict::add_mutable(std::string name, DType dtype, Shape shape,
                            std::span<std::byte> bytes) {
  check_entry(name, dtype, shape, bytes.size());
  Entry e{dtype, std::move(shape), bytes.data(), bytes.size(), true, {}, {}};
  own_entries().insert_or_assign(std::move(name), std::move(e));
}

void StateDict::add_owned(std::string name, DType dtype, Shape shape,
                          std::vector<std::byte> bytes) {
  check_entry(name, dtype, shape, bytes.size());
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  Entry e{dtype, std::move(shape), owned->data(), owned->size(), true, owned, {}};
  own_entries().insert_or_assign(std::move(name), std::move(e));
}

void StateDict::add_shared(std::string name, DType dtype, Shape shape, std::span<std::byte> bytes,
                           std::shared_ptr<void> owner, bool writable) {
  check_entry(name, dtype, shape, bytes.size());
  Entry e{dtype, std::move(shape), bytes.data(), bytes.size(), writable, std::move(owner), {}};
  own_entries().insert_or_assign(std::move(name), std::move(e));
}

void StateDict::add_device(std::string name, DType dtype, Shape shape, std::span<std::byte> bytes,
                           std::shared_ptr<const Device> device, std::shared_ptr<void> owner,
                           bool writable) {
  check_entry(name, dtype, shape, bytes.size());
  if (!device) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("tensor \"{}\": add_device needs a device", name));
  }
  Entry e{dtype,    std::move(shape), bytes.data(),     bytes.size(),
          writable, std::move(owner), std::move(device)};
  own_entries().insert_or_assign(std::move(name), std::move(e));
}

void StateDict::remove(std::string_view name) {
  if (!contains(name)) return;
  Entries& entries = own_entries();
  entries.erase(entries.find(name));
}

StateDict::Entries& StateDict::own_entries() {
  static std::atomic<uint64_t> last_version{0};
  if (!shared_) {
    shared_ = std::make_shared<Shared>();
  } else if (shared_.use_count() > 1) {
    shared_ = std::make_shared<Shared>(*shared_);
  } else {
    // The last other owner may have just let go on another thread: its
    // reads of the entries happen before the writes that follow (use_count()
    // reads the count relaxed; its release decrement pairs with this fence).
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  shared_->version = last_version.fetch_add(1, std::memory_order_relaxed) + 1;
  return shared_->entries;
}

const StateDict::Entries& StateDict::empty_entries() {
  static const Entries empty;
  return empty;
}

std::vector<std::string> StateDict::names() const {
  std::vector<std::string> out;
  out.reserve(size());
  for (const auto& [k, v] : entries()) out.push_back(k);
  return out;
}

const StateDict::Entry& StateDict::entry(std::string_view name) const {
  auto it = entries().find(name);
  if (it == entries().end()) {
    throw Error(ErrorCode::kNotFound, fmt::format("tensor \"{}\" is not in the state", name));
  }
  return it->second;
}

std::span<std::byte> StateDict::mutable_bytes(std::string_view name) const {
  const Entry& e = entry(name);
  if (!e.writable) {
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("tensor \"{}\" is read-only in the state (add it with add_mutable)", name));
  }
  return {e.data, e.nbytes};
}

uint64_t StateDict::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [k, e] : entries()) n += e.nbytes;
  return n;
}

bool StateDict::has_device_entries() const {
  for (const auto& [k, e] : entries()) {
    if (e.device) return true;
  }
  return false;
}

namespace {

// The "__metadata__" strings a file of `state` holds: string_metadata, and
// StateDict::metadata as JSON under kCairnMetadataKey.
std::map<std::string, std::string> header_metadata(const StateDict& state) {
  if (!state.metadata.is_object()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("state metadata must be a JSON object, got {}", state.metadata.type_name()));
  }
  std::map<std::string, std::string> meta = state.string_metadata;
  if (meta.count(std::string(kCairnMetadataKey))) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("string_metadata may not use the key \"{}\" (it holds "
                            "StateDict::metadata)",
                            kCairnMetadataKey));
  }
  if (!state.metadata.empty()) {
    // Checked as a load will check it, so that what is saved can be loaded.
    check_storable_json(state.metadata, "state metadata");
    meta[std::string(kCairnMetadataKey)] = state.metadata.dump();
  }
  return meta;
}

}  // namespace

FileLayout layout_state(const StateDict& state) {
  std::map<std::string, std::string> meta = header_metadata(state);
  std::vector<TensorDescriptor> descriptors;
  descriptors.reserve(state.size());
  for (const auto& [name, e] : state.entries()) descriptors.push_back({name, e.dtype, e.shape});
  return layout_file(std::move(descriptors), meta);
}

void format::update_plan(SavePlan& plan, const StateDict& state) {
  std::unique_ptr<FileLayout>& layout = plan.layout;
  if (layout && state.entries_version() == plan.entries_version) {
    const uint64_t old_start = layout->parsed.data_start();
    set_layout_metadata(*layout, header_metadata(state));
    // The header may have moved in memory and changed size in the file.
    plan.pieces[0] = {0, as_bytes(layout->header)};
    const uint64_t start = layout->parsed.data_start();
    if (start != old_start) {
      for (size_t i = 1; i < plan.pieces.size(); ++i) {
        plan.pieces[i].offset = plan.pieces[i].offset - old_start + start;
      }
    }
    return;
  }
  auto same_tensors = [&] {
    const std::vector<TensorInfo>& tensors = layout->parsed.tensors;
    const std::vector<size_t>& by_name = layout->parsed.by_name;
    if (tensors.size() != state.size() || by_name.size() != tensors.size()) return false;
    auto e = state.entries().begin();
    for (size_t i : by_name) {
      const TensorInfo& t = tensors[i];
      if (e->first != t.name || e->second.dtype != t.dtype || e->second.shape != t.shape) {
        return false;
      }
      ++e;
    }
    return true;
  };
  if (layout && same_tensors()) {
    set_layout_metadata(*layout, header_metadata(state));
  } else {
    layout = std::make_unique<FileLayout>(layout_state(state));
  }
  plan.pieces = file_pieces(*layout, state);
  plan.entries_version = state.entries_version();
}

// ---- saving ----

// Written through the file backend's writer, so a local file takes the one
// durable-write protocol (src/storage/file_storage.cc): temp file, data
// fsync'd, renamed into place, folder fsync'd (the fsyncs only when
// options.durable). The folder must exist, as for open(2).
void save_file(const StateDict& state, const std::filesystem::path& path,
               const SaveOptions& options) {
  FileLayout layout = layout_state(state);
  auto pieces = format::file_pieces(layout, state);
  const uint64_t size = layout.parsed.file_size();
  const std::string name = path.string();
  // Device tensors are copied into pinned staging first (device.h).
  format::DeviceImage image(pieces, size, format::pick_threads(0), name);
  const std::filesystem::path folder = std::filesystem::absolute(
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
  std::shared_ptr<Storage> storage = open_storage(folder.string());
  check_root_exists(*storage);
  auto writer =
      storage->open_writer(path.filename().string(), {.durable = options.durable, .size = size});
  format::write_file(pieces, size, format::sink_of(*writer, format::wants_direct(options, size)),
                     options, name, image.readable());
  writer->commit();
}

ManifestEntry save(const StateDict& state, Storage& storage, std::string_view key,
                   const SaveOptions& options) {
  FileLayout layout = layout_state(state);
  auto pieces = format::file_pieces(layout, state);
  const uint64_t size = layout.parsed.file_size();
  format::DeviceImage image(pieces, size, format::pick_threads(0), storage.uri_of(key));
  auto writer = storage.open_writer(key);
  format::FileDigest digest = format::write_file(
      pieces, size, format::sink_of(*writer, format::wants_direct(options, size)), options,
      storage.uri_of(key), image.readable());
  writer->commit();
  return digest.entry(std::string(key), size);
}

void reserve_device_staging(const StateDict& state) {
  if (std::shared_ptr<const Device> device = format::first_device(state)) {
    format::reserve_device_image(layout_state(state).parsed.file_size(), device);
  }
}

void release_device_staging() { format::release_device_image(); }

Checkpoint in_memory_checkpoint(const StateDict& state, const nlohmann::json& dict) {
  Checkpoint checkpoint = dict.is_null() ? Checkpoint::in_memory() : Checkpoint::from_dict(dict);
  save(state, checkpoint.storage(), kStateFileName);
  return checkpoint;
}

// ---- StateStager ----

struct StateStager::Impl {
  unsigned max_buffers;
  std::vector<std::shared_ptr<std::string>> buffers;
  format::SavePlan plan;
  Stats stats;
};

StateStager::StateStager(unsigned max_buffers) : impl_(std::make_unique<Impl>()) {
  impl_->max_buffers = std::max(1u, max_buffers);
}

StateStager::~StateStager() = default;

Checkpoint StateStager::stage(const StateDict& state, const nlohmann::json& dict,
                              std::string_view file) {
  Impl& m = *impl_;
  format::update_plan(m.plan, state);
  const uint64_t size = m.plan.layout->parsed.file_size();
  // A buffer only this stager holds: no checkpoint refers to it any more.
  std::shared_ptr<std::string> buffer;
  for (auto& b : m.buffers) {
    if (b.use_count() == 1) {
      buffer = b;
      break;
    }
  }
  if (!buffer) {
    buffer = std::make_shared<std::string>();
    if (m.buffers.size() < m.max_buffers) m.buffers.push_back(buffer);
  }
  if (buffer->capacity() < size) ++m.stats.allocations;
  // Same size as last time: no reallocation and no zero fill.
  buffer->resize(static_cast<size_t>(size));
  format::copy_pieces(m.plan.pieces, {reinterpret_cast<std::byte*>(buffer->data()), buffer->size()},
                      format::pick_threads(0));
  Checkpoint checkpoint = dict.is_null() ? Checkpoint::in_memory() : Checkpoint::from_dict(dict);
  put_shared_object(checkpoint.storage(), file, buffer);
  ++m.stats.stages;
  m.stats.buffers = m.buffers.size();
  return checkpoint;
}

StateStager::Stats StateStager::stats() const { return impl_->stats; }

Manifest save_checkpoint(const StateDict& state, const Checkpoint& dest,
                         const nlohmann::json& metrics, std::string_view file,
                         const SaveOptions& options) {
  CheckpointWriter writer(dest);
  writer.add_written(save(state, dest.storage(), file, options));
  const nlohmann::json& md = state.metadata;
  return writer.commit(metrics, now_seconds(), md.empty() ? nullptr : &md);
}

}  // namespace cairn
