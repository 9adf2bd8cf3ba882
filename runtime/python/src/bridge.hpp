// SPDX-License-Identifier: Apache-2.0
// What the binding's translation units share (kf._kf: module.cpp, policies.cpp): JSON between
// nlohmann::json and Python, and the registration of the policy classes. pybind11 only, no
// LibTorch, so that policies.cpp compiles quickly. Private to runtime/python.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include <nlohmann/json.hpp>

namespace kf_python {

namespace py = pybind11;

// nlohmann::json to Python and back, through the json module: settings and defaults are small.
inline py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}
inline nlohmann::json from_python(const py::handle& o, const char* what) {
  std::string text;
  try {
    text = py::module_::import("json").attr("dumps")(o).cast<std::string>();
  } catch (py::error_already_set& e) {
    throw py::type_error(std::string(what) + " must be JSON-serialisable: " + e.what());
  }
  return nlohmann::json::parse(text);
}

/// Registers kf.PolicyContext, kf.PolicyRunner and the session's policy calls
/// (_add_python_policy, _set_policies) in `m` (policies.cpp).
void bind_policies(py::module_& m);

}  // namespace kf_python
