// The persist scope's object (`_core._planner.Persist`, a plain CPython type) as its two files see it: the
// argument fast path with its cache of foreign objects (scope_arguments.cpp), and the type with its entry and
// end (persist_scope.cpp).
//
// Why a plain CPython type and not a pybind11 class: a lean scope's whole budget is about 2 us, and a pybind11
// class cost 1.15 us more per scope in the probe the issue cites (argument loaders on every call). The scope's
// hot state lives in C-typed fields; its entry and end run in C++, so between a device change and its record no
// bytecode runs: an interrupt lands before the entry (nothing changed) or after the record (the end undoes it).
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>

#include "planner_bindings.hpp"

namespace l2ctl_bindings {

// persist()'s arguments, by name. Their one Python declaration is l2ctl._persist._prepare's parameters (their order,
// defaults and types: Persist's signature is theirs). The Host's registration checks this list against them, and
// against the fields of the Request that _prepare returns: a field of each argument's name but `policy` (which it
// folds into the others), and those of L2CTL_PERSIST_RESOLVED. Neither side depends on the other's order: the
// registration finds which arguments are positional (`persist_arguments`).
#define L2CTL_PERSIST_ARGUMENTS(ARG)                                                                               \
  ARG(stream) ARG(buf) ARG(hit_ratio) ARG(num_bytes) ARG(offset) ARG(hit_prop) ARG(miss_prop) ARG(set_aside)       \
  ARG(reset_on_exit) ARG(share) ARG(policy) ARG(strict) ARG(clamp)
// What the Request adds: the target as given (a graph-like one is resolved at entry), why the scope changes nothing
// (None: it does not), whether the stream object may be remembered, how to tell the buffer object's memory moved
// (None: it is not remembered).
#define L2CTL_PERSIST_RESOLVED(FIELD) FIELD(target) FIELD(reason) FIELD(remember_stream) FIELD(buffer_stamp)

#define L2CTL_ARG_ENUM(name) a_##name,
#define L2CTL_RESOLVED_ENUM(name) r_##name,
enum Arg { L2CTL_PERSIST_ARGUMENTS(L2CTL_ARG_ENUM) n_args };
enum Resolved { L2CTL_PERSIST_RESOLVED(L2CTL_RESOLVED_ENUM) n_resolved };
extern PyObject* interned_args[n_args];

// Where persist's positional arguments go, and how many are required: what the registration found in _prepare.
struct Persist_arguments {
  Arg positional[n_args] = {};
  int n_positional = 0, n_required = 0;
};
extern Persist_arguments persist_arguments;
// _prepare's parameters and its Request's fields checked against the lists above (a TypeError naming the first
// that differs); what it found, for the registration to keep.
Persist_arguments check_persist_arguments(py::handle prepare, py::handle request_type);

enum class Limit { none, automatic, max, exact, fraction };

struct Persist {
  PyObject_HEAD
  PyObject* weakrefs;
  // What the scope asks, checked at construction.
  PyObject* stream_ref;  // StreamRef, or NULL for a graph-like target
  PyObject* target;      // the target as given (a graph-like one is resolved at entry)
  PyObject* buffer_ref;  // BufferRef
  PyObject* stream_object;  // a foreign stream resolved once (its checks are remembered on it), or NULL
  PyObject* buffer_object;  // a foreign buffer resolved once, or NULL
  std::uintptr_t handle;
  int stream_device;  // -1: ask the backend
  bool own_stream;    // an l2ctl.Stream (made in the primary context; closed when its _ref is None)
  std::uintptr_t ptr;
  long long nbytes;
  int buffer_device;  // -1: unknown
  bool allocation;    // one l2ctl.DeviceBuffer (no pointer check; freed when its _ref is None)
  std::uint64_t own_released;  // `own_released` when the references were taken: unchanged, neither was closed
  long long offset, num_bytes;  // num_bytes -1: to the buffer's end
  double requested;             // NaN: fit the hit ratio to the set-aside
  int hit_prop, miss_prop;
  Limit limit;
  long long limit_bytes;
  double limit_fraction;  // Limit::fraction: the share of the max asked for, in (0, 1)
  bool reset_on_exit, share, enabled;
  bool strict;  // false: where the device cannot persist, the scope changes nothing and says why (`reason`)
  bool clamp;   // an exact set-aside above the device's max is granted the max, with a warning
  PyObject* reason;  // why the scope changes nothing (a "no persistence" policy, or the device), or NULL
  // The device (and the registry, one per backend) a foreign stream's context / the pointer was checked for.
  int stream_checked, buffer_checked;
  std::uint64_t stream_checked_on, buffer_checked_on;  // registry serials (0: none)
  // The live scope and what entering it learnt.
  std::shared_ptr<Scope_object> live;  // the registry's record of the live scope, or empty (made in persist_new)
  PyObject* changed;      // called with the scope after the slots changed (graph targets), or NULL
  PyObject* executables;  // an l2ctl Graph to mark stale at the end, or NULL
  PyObject* window;       // the window object, made when first read, or NULL
  l2ctl::Window entered_window;
  bool has_window;
  bool clipped;
  int device;
  std::uintptr_t first_slot;
  bool has_slots;
  bool idle;  // entered without applying anything (`reason` says why): device and stream describe the target
  // An entry under way: its Python calls (a graph's predicate, a warning filter) may run anything, and the entry
  // reads the fields above after them, so neither a second entry nor `__init__` may change them meanwhile.
  bool entering;
};

extern PyTypeObject* persist_type;

// ---- the arguments (scope_arguments.cpp) ----

// The common forms of every argument, taken without Python; true when all of them were.
bool take_common(Persist* self, PyObject* const* v);
// Any other form, through the Host's `prepare` (l2ctl._persist._prepare), given the arguments as they came
// (vectorcall's form) and as placed (`v`).
void take_prepared(Persist* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject* const* v);
long long as_ll(PyObject* value);

// An l2ctl Stream's or DeviceBuffer's reference (`_ref`), or NULL when it is closed or freed (new reference).
PyObject* own_ref(PyObject* obj);
// Arguments placed by name from positional values and keyword names (vectorcall's form).
bool place_arguments(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out);
// A remembered foreign object's stream context or pointer range checked for `device` of registry `serial`.
void mark_checked(PyObject* obj, int device, std::uint64_t serial);
void intern_argument_names();

// While one lives, pointers into the table of foreign objects may be held: nothing is erased from it or
// overwritten (a garbage collection that runs Python there, a scope made by a gc callback or a finalizer, defers
// its evictions to the end of the outermost use).
class Object_table_use {
 public:
  Object_table_use();
  ~Object_table_use();
  Object_table_use(const Object_table_use&) = delete;
  Object_table_use& operator=(const Object_table_use&) = delete;
};

}  // namespace l2ctl_bindings
