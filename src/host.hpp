// The compiled layer's one tie to Python: what it calls of l2ctl's Python, registered once as an
// `l2ctl._host.Host` (`_core._planner.register_host`, checked field by field) and kept here. No file of src/
// imports a module of l2ctl's by name; docs/DESIGN.md ("The tie to Python") draws it.
#pragma once

#include <pybind11/pybind11.h>

#include "l2ctl/window_value.hpp"

namespace l2ctl_bindings {

namespace py = pybind11;

// The Host's fields, one list for the struct, the registration's checks and `_planner.HOST_FIELDS` (a test
// compares it with l2ctl._host.Host, which says what each field is): callables, types, exception classes.
#define L2CTL_HOST_FIELDS(CALLABLE, TYPE, EXCEPTION)                                                            \
  CALLABLE(prepare) CALLABLE(announce) CALLABLE(unavailable) CALLABLE(stream_device) CALLABLE(check_stream_context) \
  CALLABLE(check_owned_pointer) CALLABLE(properties) CALLABLE(require_persistence) CALLABLE(resolve_target)         \
  CALLABLE(after_changes) CALLABLE(active_backend) CALLABLE(planner_of) CALLABLE(current_streams)                   \
  TYPE(stream_type) TYPE(buffer_type) TYPE(window_type) TYPE(property_type)                                         \
  EXCEPTION(cuda_error) EXCEPTION(cupti_error) EXCEPTION(not_supported) EXCEPTION(kernels_unavailable)

// Strong references, never released (the interpreter's exit would release them without the GIL).
struct Host {
#define L2CTL_HOST_FIELD(name) PyObject* name = nullptr;
  L2CTL_HOST_FIELDS(L2CTL_HOST_FIELD, L2CTL_HOST_FIELD, L2CTL_HOST_FIELD)
#undef L2CTL_HOST_FIELD
  // Made from the fields at registration: AccessProperty's members by value (NORMAL, STREAMING, PERSISTING), and
  // AccessPolicyWindow() (an unentered scope's window).
  PyObject* access[3] = {nullptr, nullptr, nullptr};
  PyObject* no_window = nullptr;
  bool registered = false;
};
extern Host host;

// The host, or a RuntimeError (py::error_already_set) saying that l2ctl was not imported.
const Host& registered_host();

void bind_host(py::module_& planner);

// The one converter between the two window shapes: l2ctl::Window (C++) and AccessPolicyWindow (Python: a named
// tuple, base, num_bytes, hit_ratio, hit_prop, miss_prop; any 5-sequence of them is read).
py::object window_object(const l2ctl::Window& w);
l2ctl::Window to_window(py::handle w);

}  // namespace l2ctl_bindings
