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
// protocol) that the tensors view: a copy-on-write mapping, an object read
// into memory, or memory the file was read into.
class FileData {
 public:
  explicit FileData(MappedState mapped) : mapped_(std::move(mapped)) {
    std::span<std::byte> all = mapped_->writable_file_bytes();
    data_ = all.data() + mapped_->header().data_start();
    size_ = mapped_->header().data_size;
  }
  FileData(std::shared_ptr<std::byte> memory, uint64_t size)
      : memory_(std::move(memory)), data_(memory_.get()), size_(size) {}

  py::buffer_info buffer() {
    return py::buffer_info(data_, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(size_)}, {py::ssize_t{1}},
                           /*readonly=*/false);
  }

 private:
  std::optional<MappedState> mapped_;
  std::shared_ptr<std::byte> memory_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// Memory for a copying load, aligned for direct I/O and any element type.
std::shared_ptr<std::byte> allocate(uint64_t size) {
  constexpr std::align_val_t kAlign{4096};
  auto* p = static_cast<std::byte*>(::operator new(std::max<uint64_t>(size, 1), kAlign));
  return std::shared_ptr<std::byte>(p, [](std::byte* q) { ::operator delete(q, kAlign); });
}

// (name, dtype name, shape, begin, end) of each tensor, in file order.
py::list describe(const SafetensorsHeader& header) {
  py::list tensors;
  for (const TensorInfo& t : header.tensors) {
    py::tuple shape(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) shape[i] = py::int_(t.shape[i]);
    tensors.append(py::make_tuple(t.name, std::string(dtype_name(t.dtype)), shape, t.begin, t.end));
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
        StateDict state;
        for (py::handle item : tensors) {
          auto t = item.cast<py::tuple>();
          auto name = t[0].cast<std::string>();
          auto dtype_text = t[1].cast<std::string>();
          std::optional<DType> dtype = parse_dtype(dtype_text);
          if (!dtype) {
            throw Error(ErrorCode::kInvalidArgument,
                        fmt::format("tensor \"{}\": unknown dtype {}", name, dtype_text));
          }
          Shape shape = t[2].cast<Shape>();
          auto address = t[3].cast<uintptr_t>();
          auto nbytes = t[4].cast<uint64_t>();
          state.add(std::move(name), *dtype, std::move(shape),
                    {reinterpret_cast<const std::byte*>(address), nbytes});
        }
        if (!metadata.is_none()) state.metadata = to_json(metadata);
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
        std::optional<FileData> data;
        SafetensorsHeader header;
        json metadata;
        std::map<std::string, std::string> strings;
        {
          py::gil_scoped_release release;
          if (at.storage || mmap) {
            MappedState mapped =
                at.storage ? MappedState::open(*at.storage, at.key, true, MapMode::kCopyOnWrite)
                           : MappedState::open(at.path, true, MapMode::kCopyOnWrite);
            header = mapped.header();
            metadata = mapped.metadata();
            strings = mapped.state_dict().string_metadata;
            data.emplace(std::move(mapped));
          } else {
            // Only the header is read here; the data goes straight into
            // memory of its own, direct from the disk where that is faster.
            MappedState probe = MappedState::open(at.path, /*read_ahead=*/false);
            header = probe.header();
            auto memory = allocate(header.data_size);
            StateDict state;
            for (const TensorInfo& t : header.tensors) {
              state.add_mutable(t.name, t.dtype, t.shape, {memory.get() + t.begin, t.nbytes()});
            }
            load_into(at.path, state);
            metadata = std::move(state.metadata);
            strings = std::move(state.string_metadata);
            data.emplace(std::move(memory), header.data_size);
          }
        }
        return py::make_tuple(describe(header), py::cast(std::move(*data)), from_json(metadata),
                              strings);
      },
      py::arg("path"), py::arg("mmap"));

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
                              mapped->state_dict().string_metadata);
      },
      py::arg("path"));
}

}  // namespace cairn::python
