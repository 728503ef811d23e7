// Cairn's C++ errors raised in Python as cairn.errors' classes (the code's
// class, with the message, the code and whether it is retryable): the one
// exception translator of every extension module that calls the core
// (_cairn, and _cairn_torch's Hugging Face calls).
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "cairn/error.h"

namespace cairn::python {

inline void register_error_translator() {
  namespace py = pybind11;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cairn::Error& e) {
      py::object errors = py::module_::import("cairn.errors");
      const std::string code(cairn::error_code_name(e.code()));
      py::object cls = errors.attr("_class_for")(code);
      py::object exc = cls(e.what(), code, e.retryable());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace cairn::python
