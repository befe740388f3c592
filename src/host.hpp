// The compiled layer's one tie to Python: what it calls of l2ctl's Python, registered once as an
// `l2ctl._host.Host` (`_core._planner.register_host`, checked field by field) and kept here, with the names of
// everything it reads of l2ctl's objects. No file of src/ imports a module of l2ctl's by name, nor spells a private
// attribute of one; docs/DESIGN.md ("The tie to Python") draws it.
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
  TYPE(stream_type) TYPE(buffer_type) TYPE(window_type) TYPE(property_type) TYPE(policy_type) TYPE(request_type)    \
  TYPE(stream_ref_type) TYPE(buffer_ref_type) TYPE(target_type) TYPE(names)                                       \
  EXCEPTION(cuda_error) EXCEPTION(cupti_error) EXCEPTION(not_supported) EXCEPTION(kernels_unavailable)

// The private attributes of l2ctl's objects the compiled layer reads or writes, by their keys in l2ctl._host.Names,
// which declares each name (and the classes that carry it) once: `register_host` interns them from there.
#define L2CTL_HOST_NAMES(NAME)                                                                                      \
  NAME(ref) NAME(l2ctl_target) NAME(scope) NAME(prepare_entry) NAME(changed) NAME(executables) NAME(capturing)      \
  NAME(backend) NAME(stream) NAME(mode) NAME(graph) NAME(impl) NAME(dirty)

// The records the compiled layer reads by field name: the fields it reads of each. The registration finds each
// field's position in the NamedTuple (or checks the Policy dataclass has it) and refuses a record that lacks one.
#define L2CTL_STREAM_REF_FIELDS(FIELD) FIELD(handle) FIELD(device) FIELD(owner)
#define L2CTL_BUFFER_REF_FIELDS(FIELD) FIELD(ptr) FIELD(nbytes) FIELD(device) FIELD(owner) FIELD(allocation)
#define L2CTL_TARGET_FIELDS(FIELD) FIELD(device) FIELD(slots) FIELD(owner) FIELD(executables) FIELD(admit)
#define L2CTL_POLICY_FIELDS(FIELD) FIELD(hit_ratio) FIELD(set_aside) FIELD(enabled) FIELD(offset) FIELD(num_bytes)

#define L2CTL_ENUMERATOR(name) name,
// A record's fields as C++ names them (`Stream_ref::handle`), and their count.
struct Stream_ref { enum Field { L2CTL_STREAM_REF_FIELDS(L2CTL_ENUMERATOR) count }; };
struct Buffer_ref { enum Field { L2CTL_BUFFER_REF_FIELDS(L2CTL_ENUMERATOR) count }; };
struct Target_record { enum Field { L2CTL_TARGET_FIELDS(L2CTL_ENUMERATOR) count }; };
struct Policy_record { enum Field { L2CTL_POLICY_FIELDS(L2CTL_ENUMERATOR) count }; };

// A record of `Fields`: its type, each field's interned name and, for a NamedTuple, its position, all found at
// registration. `record(obj, field)`: a NamedTuple's field (borrowed), for an `obj` that `holds` checked.
template <typename Fields>
struct Record {
  PyTypeObject* type = nullptr;
  PyObject* name[Fields::count] = {};
  Py_ssize_t at[Fields::count] = {};
  PyObject* operator()(PyObject* obj, typename Fields::Field field) const { return PyTuple_GET_ITEM(obj, at[field]); }
  bool holds(PyObject* obj) const { return PyObject_TypeCheck(obj, type) != 0; }
};

// Strong references, never released (the interpreter's exit would release them without the GIL).
struct Host {
#define L2CTL_HOST_FIELD(name) PyObject* name = nullptr;
  L2CTL_HOST_FIELDS(L2CTL_HOST_FIELD, L2CTL_HOST_FIELD, L2CTL_HOST_FIELD)
#undef L2CTL_HOST_FIELD
  struct Names {
#define L2CTL_HOST_NAME(key) py::handle key;
    L2CTL_HOST_NAMES(L2CTL_HOST_NAME)
#undef L2CTL_HOST_NAME
  } name;  // the interned names (`host.name.ref`)
  Record<Stream_ref> stream_ref;
  Record<Buffer_ref> buffer_ref;
  Record<Target_record> target;
  Record<Policy_record> policy;
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
