// What the parts of the Python binding (python/*.cc, one module: _cairn)
// share: Python values <-> JSON, path arguments, and each part's bind
// function. Public headers only.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include <nlohmann/json.hpp>

namespace cairn::python {

// Python object -> JSON. Keys must be strings; anything else that is not a
// JSON value is a TypeError naming its type (raised before any I/O).
nlohmann::json to_json(pybind11::handle h, int depth = 0);
// JSON -> Python dicts, lists, str, int, float, bool and None.
pybind11::object from_json(const nlohmann::json& j);
// A path-like (str, os.PathLike) or URI as a string.
std::string path_arg(pybind11::handle h);

// cairn.save / cairn.load's core (_tensors.cc).
void bind_tensors(pybind11::module_& m);

}  // namespace cairn::python
