// The compiled layer's one tie to Python: what it calls of l2ctl's Python, registered once as an
// `l2ctl._host.Host` (`_core._planner.register_host`, checked field by field) and kept here. No file of src/
// imports a module of l2ctl's by name; docs/DESIGN.md ("The tie to Python") draws it.
#pragma once

#include <pybind11/pybind11.h>

namespace l2ctl_bindings {

namespace py = pybind11;

// Strong references, never released (the interpreter's exit would release them without the GIL). The field
// names are the Host's (host.cpp lists each with its kind; a test compares them with l2ctl._host.Host).
struct Host {
  // callables
  PyObject* prepare = nullptr;               // _persist._prepare(13 arguments) -> the normalised tuple
  PyObject* announce = nullptr;              // _persist._announce(scope, clip, limit, demand, capped, clamped)
  PyObject* unavailable = nullptr;           // _persist._unavailable(scope): warns that a best-effort scope is off
  PyObject* stream_device = nullptr;         // _device.stream_device(ref) -> int
  PyObject* check_stream_context = nullptr;  // _device.check_stream_context(ref, device)
  PyObject* check_owned_pointer = nullptr;   // _device.check_owned_pointer(ptr, nbytes, device, owner, what)
  PyObject* properties = nullptr;            // _device.properties(device)
  PyObject* require_persistence = nullptr;   // _device.require_persistence(device): raises where unsupported
  PyObject* resolve_target = nullptr;        // _targets.resolve_target(obj) -> _registry.Target
  PyObject* after_changes = nullptr;         // _targets.after_changes(target, window) -> changed | None
  PyObject* active_backend = nullptr;        // _backend.current() -> the backend in use
  PyObject* planner_of = nullptr;            // _registry._planner(backend) -> its Registry
  PyObject* current_streams = nullptr;       // _interop.current_streams() -> this thread's stack (a list)
  // types
  PyObject* stream_type = nullptr;    // l2ctl.Stream
  PyObject* buffer_type = nullptr;    // l2ctl.DeviceBuffer
  PyObject* window_type = nullptr;    // AccessPolicyWindow
  PyObject* property_type = nullptr;  // AccessProperty
  // exception classes
  PyObject* cuda_error = nullptr;
  PyObject* cupti_error = nullptr;
  PyObject* not_supported = nullptr;
  PyObject* kernels_unavailable = nullptr;
  // made from the fields at registration
  PyObject* persisting = nullptr;  // AccessProperty.PERSISTING
  PyObject* streaming = nullptr;   // AccessProperty.STREAMING
  PyObject* no_window = nullptr;   // AccessPolicyWindow(): an unentered scope's window
  bool registered = false;
};
extern Host host;

// The host, or a RuntimeError (py::error_already_set) saying that l2ctl was not imported.
const Host& registered_host();

void bind_host(py::module_& planner);

}  // namespace l2ctl_bindings
