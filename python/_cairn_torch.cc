// cairn._cairn_torch: the per-tensor work of cairn.save and cairn.load for
// torch tensors, done in C++ against the LibTorch the interpreter's torch
// runs on (python/cairn/_tensors.py imports it only when that is so). A
// state dict may hold 100,000 tensors; one Python call per tensor (torch's
// as_strided, the attribute reads that check a tensor) costs more than the
// engine's whole work for it. Nothing here decides what a file holds: the
// names, dtypes, shapes and offsets come from the engine (_cairn), and a
// tensor this module cannot take (another dtype, device or layout, a name
// that is not UTF-8) is left to the Python path, which raises its errors.
//
// It also carries Hugging Face's weights layout to Python (save_pretrained /
// load_pretrained of cairn.torch): the C++ adapter (include/cairn/torch.h)
// writes and reads the files, and this module commits them as a Cairn
// checkpoint (manifest with checksums) and checks them against it on load.
//
// Thread-safety: called with the GIL held; a tensor's storage drops its
// reference to the file's buffer with the GIL taken. The pretrained calls
// release the GIL for their I/O.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifdef CAIRN_PYTHON_PRETRAINED
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/storage.h"
#include "cairn/torch.h"
#include "error_translator.h"

#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace py = pybind11;

namespace {

struct FileType {
  std::string_view name;  // the safetensors dtype
  at::ScalarType type;
};

// Every dtype both safetensors and this torch have (as _TORCH_TO_FILE in
// _tensors.py).
constexpr FileType kFileTypes[] = {
    {"BOOL", at::kBool},
    {"U8", at::kByte},
    {"I8", at::kChar},
    {"I16", at::kShort},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I32", at::kInt},
    {"F32", at::kFloat},
    {"F64", at::kDouble},
    {"I64", at::kLong},
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    {"U16", at::kUInt16},
    {"U32", at::kUInt32},
    {"U64", at::kUInt64},
#endif
};

std::optional<at::ScalarType> torch_type(std::string_view file_dtype) {
  for (const FileType& t : kFileTypes) {
    if (t.name == file_dtype) return t.type;
  }
  return std::nullopt;
}

const char* file_type(at::ScalarType type) {
  for (const FileType& t : kFileTypes) {
    if (t.type == type) return t.name.data();
  }
  return nullptr;
}

// (name, file dtype, shape, address, nbytes) of each torch tensor of `flat`
// (name -> value, in order) that is a dense, contiguous CPU tensor of a
// safetensors dtype under a str name; None where the Python path must look
// (anything else, including every error). The caller keeps `flat` alive
// while the engine reads the addresses.
py::list describe(const py::dict& flat) {
  py::list out(static_cast<py::ssize_t>(PyDict_Size(flat.ptr())));
  py::ssize_t i = 0;
  for (const auto& [key, value] : flat) {
    py::object entry = py::none();
    if (PyUnicode_Check(key.ptr()) && THPVariable_Check(value.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(value.ptr());
      const char* dtype = file_type(t.scalar_type());
      Py_ssize_t length = 0;
      if (dtype != nullptr && t.device().is_cpu() && t.layout() == at::kStrided &&
          t.is_contiguous() && !t.is_conj() && !t.is_neg() && t.has_storage()) {
        if (PyUnicode_AsUTF8AndSize(key.ptr(), &length) == nullptr) {
          PyErr_Clear();  // surrogates: not UTF-8, the Python path says so
        } else {
          const c10::IntArrayRef sizes = t.sizes();
          py::tuple shape(sizes.size());
          for (size_t d = 0; d < sizes.size(); ++d) {
            shape[d] = py::int_(sizes[d]);
          }
          entry = py::make_tuple(key, dtype, std::move(shape),
                                 reinterpret_cast<uintptr_t>(t.data_ptr()), t.nbytes());
        }
      }
    }
    out[i++] = std::move(entry);
  }
  return out;
}

// Drops a tensor storage's reference to the buffer it views: with the GIL
// (the last tensor may die on any thread), or never once the interpreter is
// gone.
void release_owner(void* owner) {
  if (!Py_IsInitialized()) return;
  const py::gil_scoped_acquire gil;
  Py_DECREF(static_cast<PyObject*>(owner));
}

// name -> tensor for each (name, dtype, shape, begin, end) of `described`,
// each a view of `data` (a writable buffer: the file's data as
// _cairn.load_tensors returns it) through a storage of its own that keeps
// `data` alive — as torch.load makes them, so that torch.save, pickle and
// deepcopy of one tensor take its bytes only. A tensor at an offset its
// dtype cannot be read at is copied, an empty one is new. None when a dtype
// is not this torch's (the Python path names it).
py::object views(const py::object& data, const py::list& described) {
  const py::buffer_info buffer = py::buffer(data).request(/*writable=*/true);
  auto* const base = static_cast<std::byte*>(buffer.ptr);
  const auto size = static_cast<uint64_t>(buffer.size);

  std::vector<at::ScalarType> types;
  types.reserve(described.size());
  for (const py::handle item : described) {
    const auto t = torch_type(item.cast<py::tuple>()[1].cast<std::string_view>());
    if (!t) return py::none();
    types.push_back(*t);
  }

  py::dict out;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < types.size(); ++i) {
    const py::tuple item = described[i].cast<py::tuple>();
    const py::tuple shape = item[2].cast<py::tuple>();
    const auto begin = item[3].cast<uint64_t>();
    const auto end = item[4].cast<uint64_t>();
    sizes.resize(shape.size());
    uint64_t numel = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      sizes[d] = shape[d].cast<int64_t>();
      numel *= static_cast<uint64_t>(sizes[d]);
    }
    const auto itemsize = static_cast<uint64_t>(c10::elementSize(types[i]));
    const uint64_t nbytes = end - begin;
    if (begin > end || end > size || nbytes != numel * itemsize) {
      throw py::value_error("tensor " + item[0].cast<std::string>() +
                            ": its offsets do not fit the file's data");
    }
    at::Tensor t;
    if (nbytes == 0 || begin % itemsize != 0) {
      // Empty, or a foreign writer's unaligned offset: new memory.
      t = at::empty(sizes, at::TensorOptions().dtype(types[i]));
      if (nbytes > 0) std::memcpy(t.data_ptr(), base + begin, nbytes);
    } else {
      Py_INCREF(data.ptr());
      c10::Storage storage(
          c10::Storage::use_byte_size_t(), nbytes,
          at::DataPtr(base + begin, data.ptr(), &release_owner, at::Device(at::kCPU)),
          /*allocator=*/nullptr, /*resizable=*/false);
      t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   c10::scalarTypeToTypeMeta(types[i]));
      t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    }
    out[item[0]] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
  }
  return out;
}

#ifdef CAIRN_PYTHON_PRETRAINED
// ---- Hugging Face's layout, committed through Cairn ------------------------

// A module holding `tensors` (dotted names, state_dict order) as buffers of
// nested submodules, so that the adapter sees the names a PyTorch module
// would give them. The tensors are shared, not copied: a load fills them.
std::shared_ptr<torch::nn::Module> module_of(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  auto root = std::make_shared<torch::nn::Module>();
  for (const auto& [name, t] : tensors) {
    torch::nn::Module* m = root.get();
    size_t begin = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', begin)) {
      const std::string part = name.substr(begin, dot - begin);
      if (part.empty()) {
        throw cairn::Error(cairn::ErrorCode::kInvalidArgument,
                           "tensor " + name + ": a name with an empty part");
      }
      auto children = m->named_children();
      if (const auto* child = children.find(part)) {
        m = child->get();
      } else {
        m = m->register_module(part, std::make_shared<torch::nn::Module>()).get();
      }
      begin = dot + 1;
    }
    const std::string leaf = name.substr(begin);
    if (leaf.empty() || m->named_buffers(false).find(leaf) != nullptr) {
      throw cairn::Error(cairn::ErrorCode::kInvalidArgument,
                         "tensor " + name + ": an empty or repeated name");
    }
    m->register_buffer(leaf, t);
  }
  return root;
}

std::vector<std::pair<std::string, at::Tensor>> tensors_of(const py::dict& flat) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [key, value] : flat) {
    if (!THPVariable_Check(value.ptr())) {
      throw py::type_error("tensor " + py::str(key).cast<std::string>() + ": not a torch.Tensor");
    }
    out.emplace_back(key.cast<std::string>(), THPVariable_Unpack(value.ptr()));
  }
  return out;
}

// The manifest entry of `key` as written: size, XXH3-64 and the block
// checksums the engine's loaders check (cairn::kChecksumBlockSize).
cairn::ManifestEntry entry_of(cairn::Storage& storage, const std::string& key) {
  std::unique_ptr<cairn::Reader> reader = storage.open_reader(key);
  cairn::ManifestEntry e;
  e.path = key;
  e.size = reader->size();
  e.block_size = cairn::kChecksumBlockSize;
  std::vector<std::byte> buffer(cairn::kChecksumBlockSize);
  XXH3_state_t whole;
  XXH3_64bits_reset(&whole);
  for (uint64_t offset = 0; offset < e.size; offset += cairn::kChecksumBlockSize) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(cairn::kChecksumBlockSize, e.size - offset));
    reader->read_at(offset, std::span<std::byte>(buffer.data(), n));
    XXH3_64bits_update(&whole, buffer.data(), n);
    e.block_xxh3.push_back(XXH3_64bits(buffer.data(), n));
  }
  e.xxh3 = XXH3_64bits_digest(&whole);
  return e;
}

// Writes `flat`'s tensors in Hugging Face's layout into the uncommitted
// checkpoint at `uri` (the adapter's save_pretrained), adds `files` (name ->
// bytes: config.json, ...) and commits with every file's checksums. Returns
// the files written, weights first.
std::vector<std::string> save_pretrained(const std::string& uri, const py::dict& flat,
                                         uint64_t max_shard_size, const std::string& weights_name,
                                         const std::map<std::string, std::string>& metadata,
                                         const std::map<std::string, py::bytes>& files,
                                         const std::optional<std::string>& user_metadata) {
  const auto tensors = tensors_of(flat);
  std::map<std::string, std::string> extra;
  for (const auto& [name, bytes] : files) extra[name] = std::string(bytes);
  const py::gil_scoped_release nogil;
  cairn::Checkpoint dest = cairn::Checkpoint::from_directory(uri);
  cairn::CheckpointWriter writer(dest);  // kAlreadyExists when committed, before any write
  auto module = module_of(tensors);
  cairn::libtorch::PretrainedOptions options;
  options.max_shard_size = max_shard_size;
  options.weights_name = weights_name;
  options.metadata = metadata;
  std::vector<std::string> written = cairn::libtorch::save_pretrained(uri, *module, options);
  std::vector<cairn::ManifestEntry> entries;
  for (const std::string& key : written) entries.push_back(entry_of(dest.storage(), key));
  writer.add_written(entries);
  for (const auto& [name, bytes] : extra) {
    writer.write_file(name, bytes);
    written.push_back(name);
  }
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json meta;
  if (user_metadata) meta = nlohmann::json::parse(*user_metadata);
  writer.commit(nlohmann::json(), now, user_metadata ? &meta : nullptr);
  return written;
}

// Checks the weights files a load reads against the manifest of the
// committed checkpoint they are in: a block that differs is kCorruption
// naming the file, the bytes and the tensors they hold.
void check_weights(const cairn::Checkpoint& checkpoint, const std::vector<std::string>& names) {
  const cairn::Manifest manifest = checkpoint.manifest();
  for (const std::string& name : names) {
    const auto it = std::find_if(manifest.files.begin(), manifest.files.end(),
                                 [&](const cairn::ManifestEntry& e) { return e.path == name; });
    const std::string where = checkpoint.uri() + "/" + name;
    if (it == manifest.files.end()) {
      throw cairn::Error(cairn::ErrorCode::kCorruption,
                         where + ": not in the checkpoint's manifest");
    }
    const cairn::ManifestEntry actual = entry_of(checkpoint.storage(), name);
    if (actual.size != it->size) {
      throw cairn::Error(cairn::ErrorCode::kCorruption, where + ": " + std::to_string(actual.size) +
                                                            " bytes, the manifest says " +
                                                            std::to_string(it->size));
    }
    if (actual.xxh3 == it->xxh3) continue;
    // Which bytes, and whose: the blocks that differ and the tensors there.
    std::string what = where + ": fails its checksum";
    if (it->block_size == actual.block_size && it->block_xxh3.size() == actual.block_xxh3.size()) {
      for (size_t b = 0; b < actual.block_xxh3.size(); ++b) {
        if (actual.block_xxh3[b] == it->block_xxh3[b]) continue;
        const uint64_t begin = b * actual.block_size;
        const uint64_t end = std::min(actual.size, begin + actual.block_size);
        what += "; bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ") hold";
        std::string held;
        try {
          const cairn::MappedState file = cairn::MappedState::open(checkpoint.storage(), name);
          const cairn::SafetensorsHeader& header = file.header();
          const uint64_t base = header.data_start();
          for (const cairn::TensorInfo& t : header.tensors) {
            if (base + t.begin < end && base + t.end > begin) held += " tensor " + t.name + ",";
          }
        } catch (const cairn::Error&) {  // ignore-error: a damaged header names no tensor
        }
        what += held.empty() ? " the file's header" : held.substr(0, held.size() - 1);
        break;
      }
    }
    throw cairn::Error(cairn::ErrorCode::kCorruption, what);
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Fills `flat`'s tensors in place from Hugging Face's layout at `uri` (a
// folder: index or single file; or one .safetensors file). When the folder
// is a committed Cairn checkpoint, the files read are checked against its
// manifest first. Returns (missing, unexpected) names.
std::pair<std::vector<std::string>, std::vector<std::string>> load_pretrained(
    const std::string& uri, const py::dict& flat, bool strict, const std::string& weights_name) {
  const auto tensors = tensors_of(flat);
  const py::gil_scoped_release nogil;
  auto module = module_of(tensors);
  std::string folder = uri;
  std::vector<std::string> files;
  if (ends_with(uri, ".safetensors")) {
    const size_t slash = uri.rfind('/');
    folder = slash == std::string::npos ? "." : uri.substr(0, slash);
    files.push_back(uri.substr(slash == std::string::npos ? 0 : slash + 1));
  }
  const cairn::Checkpoint checkpoint = cairn::Checkpoint::from_directory(folder);
  if (files.empty()) {
    const std::string index_key = weights_name + ".index.json";
    if (checkpoint.storage().exists(index_key)) {
      const std::string where = checkpoint.uri() + "/" + index_key;
      nlohmann::json index;
      try {
        index = nlohmann::json::parse(checkpoint.storage().get(index_key));
      } catch (const nlohmann::json::exception& e) {
        throw cairn::Error(cairn::ErrorCode::kCorruption, where + ": " + e.what());
      }
      // A shard the index names but the folder lacks: say which tensors it held.
      std::map<std::string, std::vector<std::string>> by_file;
      if (index.contains("weight_map") && index["weight_map"].is_object()) {
        for (const auto& [tensor, file] : index["weight_map"].items()) {
          if (file.is_string()) by_file[file.get<std::string>()].push_back(tensor);
        }
      }
      for (const auto& [file, names] : by_file) {
        files.push_back(file);
        if (file.find('/') == std::string::npos && !checkpoint.storage().exists(file)) {
          std::string list;
          for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
          throw cairn::Error(
              cairn::ErrorCode::kCorruption,
              where + ": names shard " + file + " (tensors " + list + "), which does not exist");
        }
      }
    } else {
      files.push_back(weights_name);
    }
  }
  if (checkpoint.is_committed()) check_weights(checkpoint, files);
  cairn::libtorch::LoadStateOptions options;
  options.strict = strict;
  options.prefix = "";
  const cairn::libtorch::LoadStateReport report =
      cairn::libtorch::load_pretrained(uri, *module, options, weights_name);
  return {report.missing_keys, report.unexpected_keys};
}
#endif  // CAIRN_PYTHON_PRETRAINED

}  // namespace

PYBIND11_MODULE(_cairn_torch, m) {
  m.doc() = "cairn.save / cairn.load's per-tensor work for torch tensors (internal).";
  m.attr("torch_version") = TORCH_VERSION;
  m.def("describe", &describe, py::arg("flat"));
  m.def("views", &views, py::arg("data"), py::arg("described"));
#ifdef CAIRN_PYTHON_PRETRAINED
  cairn::python::register_error_translator();
  m.def("save_pretrained", &save_pretrained, py::arg("uri"), py::arg("flat"),
        py::arg("max_shard_size"), py::arg("weights_name"), py::arg("metadata"), py::arg("files"),
        py::arg("user_metadata"));
  m.def("load_pretrained", &load_pretrained, py::arg("uri"), py::arg("flat"), py::arg("strict"),
        py::arg("weights_name"));
#endif
}
