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
// Thread-safety: called with the GIL held; a tensor's storage drops its
// reference to the file's buffer with the GIL taken.
#include <pybind11/pybind11.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

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

}  // namespace

PYBIND11_MODULE(_cairn_torch, m) {
  m.doc() = "cairn.save / cairn.load's per-tensor work for torch tensors (internal).";
  m.attr("torch_version") = TORCH_VERSION;
  m.def("describe", &describe, py::arg("flat"));
  m.def("views", &views, py::arg("data"), py::arg("described"));
}
