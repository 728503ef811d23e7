// Python values <-> JSON and path arguments, for every part of the binding.
#include "binding.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#ifdef CAIRN_PYTHON_CUDA
#include "cairn/cuda.h"
#endif

namespace py = pybind11;

namespace cairn::python {

using nlohmann::json;

json to_json(py::handle h, int depth) {
  if (depth > 128) throw py::value_error("value nested deeper than 128 levels");
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) {
    // Beyond 64 bits a Python int has no JSON number Cairn can store exactly.
    // A non-negative int is unsigned, as nlohmann's parser makes it, so that
    // C++ checks written against parsed JSON (is_number_unsigned: sizes,
    // block sizes, steps) accept the same values coming from Python.
    try {
      return h.cast<uint64_t>();
    } catch (const py::cast_error&) {
      try {
        return h.cast<int64_t>();
      } catch (const py::cast_error&) {
        throw py::value_error("integer does not fit in 64 bits: " + py::str(h).cast<std::string>());
      }
    }
  }
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::dict>(h)) {
    json out = json::object();
    for (auto [k, v] : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(k)) {
        throw py::type_error("dict keys must be str, got " +
                             py::str(py::type::of(k).attr("__name__")).cast<std::string>());
      }
      out[k.cast<std::string>()] = to_json(v, depth + 1);
    }
    return out;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    json out = json::array();
    for (py::handle v : h) out.push_back(to_json(v, depth + 1));
    return out;
  }
  // numpy and torch scalars: their item() is a plain Python number.
  if (py::hasattr(h, "item") && py::hasattr(h, "ndim") && h.attr("ndim").cast<int>() == 0) {
    return to_json(h.attr("item")(), depth + 1);
  }
  throw py::type_error("not a JSON value: object of type " +
                       py::str(py::type::of(h).attr("__name__")).cast<std::string>());
}

py::object from_json(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return py::none();
    case json::value_t::boolean:
      return py::bool_(j.get<bool>());
    case json::value_t::number_integer:
      return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned:
      return py::int_(j.get<uint64_t>());
    case json::value_t::number_float:
      return py::float_(j.get<double>());
    case json::value_t::string:
      return py::str(j.get_ref<const std::string&>());
    case json::value_t::array: {
      py::list out;
      for (const auto& v : j) out.append(from_json(v));
      return out;
    }
    case json::value_t::object: {
      py::dict out;
      for (auto it = j.begin(); it != j.end(); ++it) out[py::str(it.key())] = from_json(it.value());
      return out;
    }
    default:
      return py::none();  // binary and discarded values never come from Cairn's parser
  }
}

std::string path_arg(py::handle h) {
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  py::module_ os = py::module_::import("os");
  py::object p = os.attr("fspath")(h);
  if (!py::isinstance<py::str>(p)) throw py::type_error("a path must be str or os.PathLike[str]");
  return p.cast<std::string>();
}

namespace {

// The engine's Device for CUDA device `index` whose producer is the stream
// `stream` (a cudaStream_t, 0 for the legacy default stream): one per pair
// for a whole state dict.
std::shared_ptr<const Device> cuda_device(
    const std::string& tensor, int64_t index, uintptr_t stream,
    std::map<std::pair<int64_t, uintptr_t>, std::shared_ptr<const Device>>& devices) {
#ifdef CAIRN_PYTHON_CUDA
  (void)tensor;  // named only by a build without CUDA
  auto [at, added] = devices.try_emplace({index, stream});
  if (added) {
    at->second =
        cuda::device(static_cast<int>(index), [stream] { return reinterpret_cast<void*>(stream); });
  }
  return at->second;
#else
  (void)stream;
  (void)devices;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("tensor \"{}\": on cuda:{}, and this Cairn was built without CUDA "
                          "(CAIRN_CUDA); copy it to host memory first",
                          tensor, index));
#endif
}

}  // namespace

bool built_with_cuda() {
#ifdef CAIRN_PYTHON_CUDA
  return true;
#else
  return false;
#endif
}

StateDict state_from(const py::list& tensors, py::handle metadata, bool writable) {
  StateDict state;
  std::map<std::pair<int64_t, uintptr_t>, std::shared_ptr<const Device>> devices;
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
    auto* data = reinterpret_cast<std::byte*>(t[3].cast<uintptr_t>());
    auto nbytes = t[4].cast<uint64_t>();
    if (t.size() >= 7) {  // (..., CUDA device index, producer stream)
      std::shared_ptr<const Device> device =
          cuda_device(name, t[5].cast<int64_t>(), t[6].cast<uintptr_t>(), devices);
      state.add_device(std::move(name), *dtype, std::move(shape), {data, nbytes}, std::move(device),
                       nullptr, writable);
    } else if (writable) {
      state.add_mutable(std::move(name), *dtype, std::move(shape), {data, nbytes});
    } else {
      state.add(std::move(name), *dtype, std::move(shape), {data, nbytes});
    }
  }
  if (!metadata.is_none()) state.metadata = to_json(metadata);
  return state;
}

}  // namespace cairn::python
