// The binding of tensor files (cairn.save / cairn.load, python/cairn/_tensors.py):
// safetensors files written and read by the C++ engine. Python hands each
// tensor's memory over by address (the caller keeps the tensors alive for
// the call); a load hands back one buffer of the file's data that every
// tensor views. Public headers only; the GIL is released for the I/O.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "binding.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/storage.h"

namespace py = pybind11;

namespace cairn::python {
namespace {

using nlohmann::json;

// A destination or source: a local path, or the URI of an object (the part
// after the last '/' is its key in the storage of the rest).
struct Location {
  std::shared_ptr<Storage> storage;  // null for a local path
  std::string key;
  std::string path;
};

Location locate(const std::string& where) {
  if (where.find("://") == std::string::npos) return {nullptr, "", where};
  const size_t slash = where.rfind('/');
  if (slash == std::string::npos || slash + 1 == where.size() ||
      where.compare(slash - 2, 3, "://") == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: a tensor file's URI names a file under a folder "
                            "(s3://bucket/folder/model.safetensors)",
                            where));
  }
  return {open_storage(where.substr(0, slash)), where.substr(slash + 1), ""};
}

// The data of a loaded file, as one writable byte buffer (the buffer
// protocol) that the tensors view: a copy-on-write mapping, or the file or
// object read into memory of its own.
class FileData {
 public:
  explicit FileData(MappedState mapped) : mapped_(std::move(mapped)) {
    std::span<std::byte> all = mapped_->writable_file_bytes();
    data_ = all.data() + mapped_->header().data_start();
    size_ = mapped_->header().data_size;
  }

  py::buffer_info buffer() {
    return py::buffer_info(data_, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(size_)}, {py::ssize_t{1}},
                           /*readonly=*/false);
  }

 private:
  std::optional<MappedState> mapped_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// The "__metadata__" strings other than Cairn's JSON metadata (as
// StateDict::string_metadata has them, without building a StateDict).
std::map<std::string, std::string> string_metadata(const SafetensorsHeader& header) {
  std::map<std::string, std::string> out = header.metadata;
  out.erase(std::string(kCairnMetadataKey));
  return out;
}

// (name, dtype name, shape, begin, end) of each tensor, in file order. Built
// with CPython's own calls: a file may hold 100,000 tensors, and this is
// the binding's whole per-tensor cost on the C++ side.
py::list describe(const SafetensorsHeader& header) {
  const GcPause pause;
  std::map<DType, py::str> dtype_names;
  py::list tensors(header.tensors.size());
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    auto [at, added] = dtype_names.try_emplace(t.dtype);
    if (added) at->second = py::str(std::string(dtype_name(t.dtype)));
    py::tuple shape(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) {
      PyTuple_SET_ITEM(shape.ptr(), d, PyLong_FromUnsignedLongLong(t.shape[d]));
    }
    py::tuple entry(5);
    PyTuple_SET_ITEM(entry.ptr(), 0,
                     PyUnicode_DecodeUTF8(t.name.data(), static_cast<py::ssize_t>(t.name.size()),
                                          "surrogateescape"));
    PyTuple_SET_ITEM(entry.ptr(), 1, at->second.inc_ref().ptr());
    PyTuple_SET_ITEM(entry.ptr(), 2, shape.release().ptr());
    PyTuple_SET_ITEM(entry.ptr(), 3, PyLong_FromUnsignedLongLong(t.begin));
    PyTuple_SET_ITEM(entry.ptr(), 4, PyLong_FromUnsignedLongLong(t.end));
    for (int k = 0; k < 5; ++k) {
      if (PyTuple_GET_ITEM(entry.ptr(), k) == nullptr) throw py::error_already_set();
    }
    PyList_SET_ITEM(tensors.ptr(), static_cast<py::ssize_t>(i), entry.release().ptr());
  }
  return tensors;
}

}  // namespace

void bind_tensors(py::module_& m) {
  py::class_<FileData>(m, "FileData", py::buffer_protocol()).def_buffer([](FileData& d) {
    return d.buffer();
  });

  m.def(
      "save_tensors",
      [](const py::list& tensors, const std::string& where, py::handle metadata,
         const std::map<std::string, std::string>& string_metadata, bool durable) {
        StateDict state = state_from(tensors, metadata, /*writable=*/false);
        state.string_metadata = string_metadata;
        Location at = locate(where);
        py::gil_scoped_release release;
        if (at.storage) {
          save(state, *at.storage, at.key);
        } else {
          SaveOptions options;
          options.durable = durable;
          save_file(state, at.path, options);
        }
      },
      py::arg("tensors"), py::arg("path"), py::arg("metadata"), py::arg("string_metadata"),
      py::arg("durable"));

  m.def(
      "load_tensors",
      [](const std::string& where, bool mmap) {
        Location at = locate(where);
        std::optional<MappedState> file;
        {
          py::gil_scoped_release release;
          if (at.storage) {
            file = MappedState::open(*at.storage, at.key, true, MapMode::kCopyOnWrite);
          } else if (mmap) {
            file = MappedState::open(at.path, true, MapMode::kCopyOnWrite);
          } else {
            // One read of the whole file into memory of its own, direct
            // from the disk where that is faster.
            file = MappedState::read(at.path, LoadOptions{});
          }
        }
        return py::make_tuple(describe(file->header()), py::cast(FileData(*file)),
                              from_json(file->metadata()), string_metadata(file->header()));
      },
      py::arg("path"), py::arg("mmap"));

  m.def(
      "load_tensors_into",
      [](const py::list& tensors, const std::string& where) {
        // The file's tensors (described from its header by the caller),
        // each copied into its destination: device tensors through pinned
        // bounce buffers, each copied to the device while the next is read.
        StateDict state = state_from(tensors, py::none(), /*writable=*/true);
        Location at = locate(where);
        py::gil_scoped_release release;
        if (at.storage) {
          load_into(*at.storage, at.key, state);
        } else {
          load_into(at.path, state);
        }
      },
      py::arg("tensors"), py::arg("path"));

  m.def(
      "read_tensor_header",
      [](const std::string& where) {
        Location at = locate(where);
        std::optional<MappedState> mapped;
        {
          py::gil_scoped_release release;
          mapped = at.storage ? MappedState::open(*at.storage, at.key, /*read_ahead=*/false)
                              : MappedState::open(at.path, /*read_ahead=*/false);
        }
        return py::make_tuple(describe(mapped->header()), from_json(mapped->metadata()),
                              string_metadata(mapped->header()));
      },
      py::arg("path"));
}

}  // namespace cairn::python
