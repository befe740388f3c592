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

// persist()'s parameters, in the declared order (`_persist._parameters` shows the same; a test compares them).
enum Arg { a_stream, a_buf, a_hit_ratio, a_num_bytes, a_offset, a_hit_prop, a_miss_prop, a_set_aside, a_reset_on_exit,
           a_share, a_policy, a_strict, a_clamp, n_args };
extern const char* const arg_names[n_args];
extern PyObject* interned_args[n_args];

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
// Any other form, through the Host's `prepare` (l2ctl._persist._prepare).
void take_prepared(Persist* self, PyObject* const* v);
long long as_ll(PyObject* value);

// An l2ctl Stream's or DeviceBuffer's reference (`_ref`), or NULL when it is closed or freed (new reference).
PyObject* own_ref(PyObject* obj);
// Arguments in the declared order from positional values and keyword names (vectorcall's form).
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
