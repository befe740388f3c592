// The compiled scope objects: `l2ctl.persist`'s scope as a plain CPython type (`_core._planner.Persist`), and the
// compiled `__enter__` of the scoped window, the set_aside scope and `with l2ctl.Stream()`.
//
// Why a plain CPython type and not a pybind11 class: a lean scope's whole budget is about 2 us, and a pybind11
// class cost 1.15 us more per scope in the probe the issue cites (argument loaders on every call). The scope's
// hot state lives in C-typed fields; its entry and end run here, so between a device change and its record no
// bytecode runs: an interrupt lands before the entry (nothing changed) or after the record (the end undoes it).
//
// What stays Python, all before anything changes or after the record with the end compiled: checking and
// normalising unusual arguments (`_persist._prepare`: policies, byte ranges, foreign objects on first sight),
// resolving a graph-like target (its predicate), first-time checks of a foreign stream's context and of a
// pointer, and the warnings of an entry. The rules of device state are the planner's (planner.cpp).
#include <Python.h>
#include <structmember.h>

#include <cmath>
#include <cstring>
#include <unordered_map>

#include "planner_bindings.hpp"

namespace l2ctl_bindings {

namespace {

// Python functions and objects of l2ctl's the scope calls, set once by l2ctl._persist (set_scope_hooks).
struct Hooks {
  PyObject* prepare = nullptr;              // _persist._prepare(11 arguments) -> the normalised tuple
  PyObject* stream_device = nullptr;        // _device.stream_device(ref) -> int
  PyObject* check_stream_context = nullptr;  // _device.check_stream_context(ref, device)
  PyObject* check_owned_pointer = nullptr;   // _device.check_owned_pointer(ptr, nbytes, device, owner, what)
  PyObject* properties = nullptr;            // _device.properties(device)
  PyObject* require_persistence = nullptr;   // _device.require_persistence(device): raises where unsupported
  PyObject* resolve_target = nullptr;        // _targets.resolve_target(obj) -> _registry.Target
  PyObject* after_changes = nullptr;         // _targets.after_changes(target, window) -> changed | None
  PyObject* announce = nullptr;              // _persist._announce(scope, clip, limit, demand, capped, clamped)
  PyObject* unavailable = nullptr;           // _persist._unavailable(scope): warns that a best-effort scope is off
  PyObject* stream_type = nullptr;           // l2ctl.Stream
  PyObject* buffer_type = nullptr;           // l2ctl.DeviceBuffer
  PyObject* persisting = nullptr;            // AccessProperty.PERSISTING
  PyObject* streaming = nullptr;             // AccessProperty.STREAMING
  PyObject* no_window = nullptr;             // AccessPolicyWindow(): an unentered scope's window
  bool set = false;
};
Hooks hooks;


enum Arg { a_stream, a_buf, a_hit_ratio, a_num_bytes, a_offset, a_hit_prop, a_miss_prop, a_set_aside, a_reset_on_exit,
           a_share, a_policy, a_strict, a_clamp, n_args };
const char* const arg_names[n_args] = {"stream",    "buf",       "hit_ratio",     "num_bytes", "offset",
                                       "hit_prop",  "miss_prop", "set_aside",     "reset_on_exit", "share",
                                       "policy",    "strict",    "clamp"};
PyObject* interned_args[n_args];

// ---- foreign objects, resolved once ----------------------------------------------------------------------------

// A torch or CuPy stream or array resolved by l2ctl._interop, remembered while the object lives (a weak
// reference), with what was checked of it on which device. `stamp`: for objects whose memory can move under the
// same object (a torch tensor's set_ or resize_), `stamp_of(obj)` must still equal it, or it is resolved again.
// `ref` is kept without its owner (the object itself): the table must not keep the object, and a tensor's memory,
// alive; `with_owner` puts it back at each use. `stream`: what the object was resolved as (a stream or a buffer).
struct Resolved {
  py::object weak, ref, stamp_of, stamp;
  bool stream = false;
  // The stream's context, or the buffer's pointer range, checked for this device of this registry's backend.
  int checked_device = -1;
  std::uint64_t checked_on = 0;  // the registry's serial (0: none)
};
std::unordered_map<const void*, Resolved>& resolved() {
  static auto* known = new std::unordered_map<const void*, Resolved>;
  return *known;
}
constexpr std::size_t resolved_bound = 1024;

constexpr Py_ssize_t stream_owner_field = 3;  // StreamRef.owner
constexpr Py_ssize_t buffer_owner_field = 4;  // BufferRef.owner

// `ref` (a StreamRef or BufferRef: a named tuple) with `owner` in field `index` (a new reference).
PyObject* with_owner(PyObject* ref, Py_ssize_t index, PyObject* owner) {
  PyTypeObject* type = Py_TYPE(ref);
  const Py_ssize_t n = PyTuple_GET_SIZE(ref);
  PyObject* out = type->tp_alloc(type, n);  // as tuple.__new__(type, items) makes it
  if (out == nullptr) throw py::error_already_set();
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(i == index ? owner : PyTuple_GET_ITEM(ref, i)));
  return out;
}

// The entry of `obj` resolved as a stream (`stream`) or as a buffer, or null.
Resolved* known_object(PyObject* obj, bool stream) {
  auto& table = resolved();
  auto it = table.find(obj);
  if (it == table.end() || it->second.stream != stream) return nullptr;
  if (PyWeakref_GetObject(it->second.weak.ptr()) != obj) {  // another object at a freed one's address
    table.erase(it);
    return nullptr;
  }
  if (!it->second.stamp_of.is_none()) {
    // Python runs here (a tensor's data_ptr) and may change the table (another scope made meanwhile): the entry
    // is looked up again after it.
    const py::object stamp_of = it->second.stamp_of, stamp = it->second.stamp;
    PyObject* now = PyObject_CallOneArg(stamp_of.ptr(), obj);
    if (now == nullptr) throw py::error_already_set();
    const int same = PyObject_RichCompareBool(now, stamp.ptr(), Py_EQ);
    Py_DECREF(now);
    if (same < 0) throw py::error_already_set();
    it = table.find(obj);
    if (it == table.end() || it->second.stream != stream || !it->second.stamp.is(stamp)) return nullptr;
    if (!same) {
      table.erase(it);
      return nullptr;
    }
  }
  return &it->second;
}

void remember_object(PyObject* obj, const py::object& ref, const py::object& stamp_of, const py::object& stamp,
                     bool stream) {
  PyObject* weak = PyWeakref_NewRef(obj, nullptr);
  if (weak == nullptr) {  // not weakly referable: resolved at every scope
    PyErr_Clear();
    return;
  }
  py::object weak_ref = py::reinterpret_steal<py::object>(weak);
  py::object ownerless = py::reinterpret_steal<py::object>(
      with_owner(ref.ptr(), stream ? stream_owner_field : buffer_owner_field, Py_None));
  auto& table = resolved();
  if (table.size() >= resolved_bound) table.clear();
  table[obj] = Resolved{weak_ref, ownerless, stamp_of, stamp, stream, -1, 0};
}

void mark_checked(PyObject* obj, int device, std::uint64_t registry) {
  auto it = resolved().find(obj);
  if (it != resolved().end() && PyWeakref_GetObject(it->second.weak.ptr()) == obj) {
    it->second.checked_device = device;
    it->second.checked_on = registry;
  }
}

// ---- the Persist type ------------------------------------------------------------------------------------------

enum class Limit { none, automatic, max, exact };

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
  long long offset, num_bytes;  // num_bytes -1: to the buffer's end
  double requested;             // NaN: fit the hit ratio to the set-aside
  int hit_prop, miss_prop;
  Limit limit;
  long long limit_bytes;
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
  pl::Plan_window entered_window;
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

PyTypeObject* persist_type = nullptr;

void clear_request(Persist* self) {
  Py_CLEAR(self->stream_ref);
  Py_CLEAR(self->target);
  Py_CLEAR(self->buffer_ref);
  Py_CLEAR(self->stream_object);
  Py_CLEAR(self->buffer_object);
  Py_CLEAR(self->reason);
}

int persist_traverse(Persist* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->stream_ref);
  Py_VISIT(self->target);
  Py_VISIT(self->buffer_ref);
  Py_VISIT(self->stream_object);
  Py_VISIT(self->buffer_object);
  Py_VISIT(self->reason);
  Py_VISIT(self->changed);
  Py_VISIT(self->executables);
  Py_VISIT(self->window);
  return 0;
}

int persist_clear(Persist* self) {
  clear_request(self);
  self->live.reset();
  Py_CLEAR(self->changed);
  Py_CLEAR(self->executables);
  Py_CLEAR(self->window);
  return 0;
}

PyObject* persist_exit(PyObject* o, PyObject* const* args, Py_ssize_t nargs);

// A live scope whose object is collected (a started scope nobody stopped, or one an interrupt cut off from its
// name between start() returning and the assignment) ends here, as stop() would: the device holds what the other
// live scopes ask for. Inside an l2ctl call on this thread (a collection there) the end is deferred to that call's
// return (end_scope). An error of the end cannot be raised from a finalizer: it is reported as unraisable.
void persist_finalize(PyObject* o) {
  if (!reinterpret_cast<Persist*>(o)->live) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // what was being raised stays raised
  PyObject* r = persist_exit(o, nullptr, 0);
  if (r == nullptr) PyErr_WriteUnraisable(o);
  Py_XDECREF(r);
  PyErr_Restore(type, value, traceback);
}

void persist_dealloc(Persist* self) {
  if (PyObject_CallFinalizerFromDealloc(reinterpret_cast<PyObject*>(self)) < 0) return;  // resurrected
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(reinterpret_cast<PyObject*>(self));
  // The finalizer ended a live scope; should one still be recorded (its end failed), the planner sees its holder
  // dead and ends it at the next call.
  persist_clear(self);
  self->live.~shared_ptr();
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* persist_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Persist*>(type->tp_alloc(type, 0));  // zeroed
  if (self == nullptr) return nullptr;
  new (&self->live) std::shared_ptr<Scope_object>();
  self->stream_device = self->buffer_device = self->device = -1;
  self->stream_checked = self->buffer_checked = -1;
  self->num_bytes = -1;
  self->requested = std::nan("");
  self->enabled = self->strict = true;
  return reinterpret_cast<PyObject*>(self);
}

long long as_ll(PyObject* value) {
  const long long out = PyLong_AsLongLong(value);
  if (out == -1 && PyErr_Occurred()) throw py::error_already_set();
  return out;
}

// A StreamRef (handle, device, source, owner) into the scope's fields.
void take_stream_ref(Persist* self, PyObject* ref) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 4) throw py::type_error("a stream reference is a StreamRef");
  PyObject* handle = PyTuple_GET_ITEM(ref, 0);
  self->handle = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(handle));
  if (PyErr_Occurred()) throw py::error_already_set();
  PyObject* device = PyTuple_GET_ITEM(ref, 1);
  self->stream_device = device == Py_None ? -1 : static_cast<int>(as_ll(device));
  // An l2ctl.Stream, or one of a subclass: checked for being closed at entry, before the device is touched.
  self->own_stream = PyObject_TypeCheck(PyTuple_GET_ITEM(ref, 3), reinterpret_cast<PyTypeObject*>(hooks.stream_type));
  Py_INCREF(ref);
  Py_XSETREF(self->stream_ref, ref);
}

// A BufferRef (ptr, nbytes, device, source, owner, allocation) into the scope's fields.
void take_buffer_ref(Persist* self, PyObject* ref) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 6) throw py::type_error("a buffer reference is a BufferRef");
  self->ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ref, 0)));
  if (PyErr_Occurred()) throw py::error_already_set();
  self->nbytes = as_ll(PyTuple_GET_ITEM(ref, 1));
  PyObject* device = PyTuple_GET_ITEM(ref, 2);
  self->buffer_device = device == Py_None ? -1 : static_cast<int>(as_ll(device));
  self->allocation = PyTuple_GET_ITEM(ref, 5) == Py_True;
  Py_INCREF(ref);
  Py_XSETREF(self->buffer_ref, ref);
}

// An l2ctl Stream's or DeviceBuffer's reference (`_ref`), or NULL when it is closed or freed (new reference).
PyObject* own_ref(PyObject* obj) {
  PyObject* ref = PyObject_GetAttr(obj, L2CTL_NAME("_ref").ptr());
  if (ref == nullptr) throw py::error_already_set();
  if (ref == Py_None || !PyTuple_Check(ref)) {
    Py_DECREF(ref);
    return nullptr;
  }
  return ref;
}

bool is_bool(PyObject* v) { return v == Py_True || v == Py_False; }

// numpy's real scalars (np.float32, np.float64, np.int64, ...: what numbers.Real holds of numpy's), known by their
// classes (numpy.floating, numpy.integer) without importing numpy. np.bool_ and complex scalars are neither.
bool is_numpy_real(PyTypeObject* type) {
  PyObject* mro = type->tp_mro;
  if (mro == nullptr || !PyTuple_Check(mro)) return false;
  for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(mro); ++i) {
    const char* name = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_name;
    if (std::strcmp(name, "numpy.floating") == 0 || std::strcmp(name, "numpy.integer") == 0) return true;
  }
  return false;
}

// A hit ratio (not None) of a form taken without Python: a float, an int (not bool) or a numpy real scalar, read
// through the number protocol as float() reads it, which the planner takes (check_hit_ratio: the one rule) into
// `*out`. False for any other form or value: _prepare then refuses it with _plan's words, or takes it.
bool fast_hit_ratio(PyObject* value, double* out) {
  double x;
  if (PyFloat_CheckExact(value)) {
    x = PyFloat_AS_DOUBLE(value);
  } else if (PyLong_CheckExact(value) || is_numpy_real(Py_TYPE(value))) {
    PyObject* as_float = PyNumber_Float(value);  // an int beyond a float's range: OverflowError, worded by _prepare
    if (as_float == nullptr) {
      PyErr_Clear();
      return false;
    }
    x = PyFloat_AS_DOUBLE(as_float);
    Py_DECREF(as_float);
  } else {
    return false;
  }
  const pl::Checked_hit_ratio checked = pl::check_hit_ratio(x);
  *out = checked.value;
  return checked.fault == pl::Hit_ratio_fault::none;
}

// A set-aside of a form taken without Python: None, "auto", "max", or an int byte count in [0, 2**63).
bool fast_limit(PyObject* value, Limit* kind, long long* bytes) {
  *bytes = 0;
  if (value == Py_None) {
    *kind = Limit::none;
  } else if (PyUnicode_CheckExact(value) && PyUnicode_Compare(value, L2CTL_NAME("auto").ptr()) == 0) {
    *kind = Limit::automatic;
  } else if (PyUnicode_CheckExact(value) && PyUnicode_Compare(value, L2CTL_NAME("max").ptr()) == 0) {
    *kind = Limit::max;
  } else if (PyLong_CheckExact(value)) {
    int overflow = 0;
    *bytes = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || *bytes < 0) return false;  // refused by _prepare, in its words
    *kind = Limit::exact;
  } else {
    return false;
  }
  return true;
}

// `policy=`: an l2ctl Policy (exactly: its class names itself `_l2ctl_policy`), its fields checked when it was made,
// enabled and without a byte range, read into the hit ratio and set-aside it asks for. False for anything else (a
// tuned policy, a subclass, a disabled one, one with a range): _prepare takes those.
bool fast_policy(PyObject* policy, double* requested, Limit* kind, long long* bytes) {
  PyTypeObject* type = Py_TYPE(policy);
  if (_PyType_Lookup(type, L2CTL_NAME("_l2ctl_policy").ptr()) != reinterpret_cast<PyObject*>(type)) return false;
  const auto field = [policy](py::handle name) {
    PyObject* value = PyObject_GetAttr(policy, name.ptr());
    if (value == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(value);
  };
  const py::object enabled = field(L2CTL_NAME("enabled")), offset = field(L2CTL_NAME("offset")),
                   num_bytes = field(L2CTL_NAME("num_bytes"));
  if (enabled.ptr() != Py_True || !num_bytes.is_none() || !PyLong_CheckExact(offset.ptr())) return false;
  int overflow = 0;
  if (PyLong_AsLongLongAndOverflow(offset.ptr(), &overflow) != 0 || overflow) return false;
  const py::object hit_ratio = field(L2CTL_NAME("hit_ratio"));
  if (!hit_ratio.is_none() && !fast_hit_ratio(hit_ratio.ptr(), requested)) return false;
  return fast_limit(field(L2CTL_NAME("set_aside")).ptr(), kind, bytes);
}

// The common forms of every argument, taken without Python; true when all of them were.
bool take_common(Persist* self, PyObject* const* v) {
  PyObject* hit_ratio = v[a_hit_ratio];
  double requested = std::nan("");
  if (hit_ratio != nullptr && hit_ratio != Py_None && !fast_hit_ratio(hit_ratio, &requested)) return false;
  Limit kind = Limit::automatic;
  long long limit_bytes = 0;
  if (v[a_set_aside] != nullptr && !fast_limit(v[a_set_aside], &kind, &limit_bytes)) return false;
  if (v[a_policy] != nullptr && v[a_policy] != Py_None) {
    // With a policy, hit_ratio and set_aside stay unset ("auto" as given is unset too): _prepare refuses both.
    if ((hit_ratio != nullptr && hit_ratio != Py_None) || kind != Limit::automatic) return false;
    if (!fast_policy(v[a_policy], &requested, &kind, &limit_bytes)) return false;
  }
  if (v[a_num_bytes] != nullptr && v[a_num_bytes] != Py_None) return false;
  if (v[a_offset] != nullptr) {  // 0 only (an int too large for a long long is not: _prepare refuses it)
    int overflow = 0;
    if (!PyLong_CheckExact(v[a_offset]) || PyLong_AsLongLongAndOverflow(v[a_offset], &overflow) != 0 || overflow)
      return false;
  }
  if (v[a_hit_prop] != nullptr && v[a_hit_prop] != hooks.persisting) return false;
  if (v[a_miss_prop] != nullptr && v[a_miss_prop] != hooks.streaming) return false;
  if (v[a_reset_on_exit] != nullptr && !is_bool(v[a_reset_on_exit])) return false;
  if (v[a_share] != nullptr && !is_bool(v[a_share])) return false;
  if (v[a_strict] != nullptr && !is_bool(v[a_strict])) return false;
  if (v[a_clamp] != nullptr && !is_bool(v[a_clamp])) return false;
  // The stream and the buffer: l2ctl's own, or foreign objects already resolved.
  PyObject* stream = v[a_stream];
  PyObject* buf = v[a_buf];
  py::object stream_ref, buffer_ref;
  // What the table knew of each, copied out at once: looking up the buffer runs Python, which may change the table.
  Resolved* stream_known = nullptr;
  Resolved* buffer_known = nullptr;
  int stream_checked = -1, buffer_checked = -1;
  std::uint64_t stream_checked_on = 0, buffer_checked_on = 0;
  bool graph_like = false;
  if (Py_TYPE(stream) == reinterpret_cast<PyTypeObject*>(hooks.stream_type)) {
    PyObject* ref = own_ref(stream);
    if (ref == nullptr) return false;  // closed: _prepare says so
    stream_ref = py::reinterpret_steal<py::object>(ref);
  } else if (PyObject_HasAttr(reinterpret_cast<PyObject*>(Py_TYPE(stream)), L2CTL_NAME("_l2ctl_target").ptr())) {
    graph_like = true;  // an l2ctl graph, a node selection, torch_captures(): resolved at entry (as _prepare does)
  } else if ((stream_known = known_object(stream, true)) != nullptr) {
    stream_ref = py::reinterpret_steal<py::object>(with_owner(stream_known->ref.ptr(), stream_owner_field, stream));
    stream_checked = stream_known->checked_device;
    stream_checked_on = stream_known->checked_on;
  } else {
    return false;
  }
  if (Py_TYPE(buf) == reinterpret_cast<PyTypeObject*>(hooks.buffer_type)) {
    PyObject* ref = own_ref(buf);
    if (ref == nullptr) return false;
    buffer_ref = py::reinterpret_steal<py::object>(ref);
  } else if ((buffer_known = known_object(buf, false)) != nullptr) {
    buffer_ref = py::reinterpret_steal<py::object>(with_owner(buffer_known->ref.ptr(), buffer_owner_field, buf));
    buffer_checked = buffer_known->checked_device;
    buffer_checked_on = buffer_known->checked_on;
  } else {
    return false;
  }
  if (graph_like) {
    Py_CLEAR(self->stream_ref);
    self->handle = 0;
    self->stream_device = -1;
    self->own_stream = false;
    Py_XSETREF(self->target, Py_NewRef(stream));
  } else {
    take_stream_ref(self, stream_ref.ptr());
    Py_CLEAR(self->target);
  }
  take_buffer_ref(self, buffer_ref.ptr());
  Py_XSETREF(self->stream_object, stream_known != nullptr ? Py_NewRef(stream) : nullptr);
  Py_XSETREF(self->buffer_object, buffer_known != nullptr ? Py_NewRef(buf) : nullptr);
  self->stream_checked = stream_checked;
  self->stream_checked_on = stream_checked_on;
  self->buffer_checked = buffer_checked;
  self->buffer_checked_on = buffer_checked_on;
  self->offset = 0;
  self->num_bytes = -1;
  self->requested = requested;
  self->hit_prop = l2ctl::access_persisting;
  self->miss_prop = l2ctl::access_streaming;
  self->limit = kind;
  self->limit_bytes = limit_bytes;
  self->reset_on_exit = v[a_reset_on_exit] == nullptr || v[a_reset_on_exit] == Py_True;
  self->share = v[a_share] == Py_True;
  self->enabled = true;
  self->strict = v[a_strict] == nullptr || v[a_strict] == Py_True;
  self->clamp = v[a_clamp] == Py_True;
  Py_CLEAR(self->reason);
  return true;
}

// Any other form: l2ctl._persist._prepare checks and normalises every argument (the one place their rules are
// written), and says which foreign objects may be remembered.
void take_prepared(Persist* self, PyObject* const* v) {
  PyObject* args[n_args];
  PyObject* zero = PyLong_FromLong(0);
  for (int i = 0; i < n_args; ++i) args[i] = v[i];
  if (args[a_hit_ratio] == nullptr) args[a_hit_ratio] = Py_None;
  if (args[a_num_bytes] == nullptr) args[a_num_bytes] = Py_None;
  if (args[a_offset] == nullptr) args[a_offset] = zero;
  if (args[a_hit_prop] == nullptr) args[a_hit_prop] = hooks.persisting;
  if (args[a_miss_prop] == nullptr) args[a_miss_prop] = hooks.streaming;
  if (args[a_set_aside] == nullptr) args[a_set_aside] = L2CTL_NAME("auto").ptr();
  if (args[a_reset_on_exit] == nullptr) args[a_reset_on_exit] = Py_True;
  if (args[a_share] == nullptr) args[a_share] = Py_False;
  if (args[a_policy] == nullptr) args[a_policy] = Py_None;
  if (args[a_strict] == nullptr) args[a_strict] = Py_True;
  if (args[a_clamp] == nullptr) args[a_clamp] = Py_False;
  PyObject* result = PyObject_Vectorcall(hooks.prepare, args, n_args, nullptr);
  Py_DECREF(zero);
  if (result == nullptr) throw py::error_already_set();
  py::tuple t = py::reinterpret_steal<py::tuple>(result);
  // (stream_ref | None, target, buffer_ref, offset, num_bytes | None, hit_prop, miss_prop, hit_ratio | None,
  //  limit (None, "auto", "max" or bytes), reset_on_exit, share, disabled (None, or why), stream_remembered,
  //  buffer_stamp, strict, clamp)
  //  buffer_stamp: None (not remembered), or (stamp_of | None, stamp).
  if (t.size() != 16) throw py::type_error("_prepare returned the wrong number of fields");
  py::object stream_ref = t[0];
  if (stream_ref.is_none()) {
    Py_CLEAR(self->stream_ref);
    self->handle = 0;
    self->stream_device = -1;
    self->own_stream = false;
  } else {
    take_stream_ref(self, stream_ref.ptr());
  }
  Py_XSETREF(self->target, Py_NewRef(t[1].ptr()));
  take_buffer_ref(self, t[2].ptr());
  self->offset = t[3].cast<long long>();
  self->num_bytes = t[4].is_none() ? -1 : t[4].cast<long long>();
  self->hit_prop = t[5].cast<int>();
  self->miss_prop = t[6].cast<int>();
  self->requested = t[7].is_none() ? std::nan("") : t[7].cast<double>();
  py::object limit = t[8];
  if (limit.is_none()) {
    self->limit = Limit::none;
  } else if (PyUnicode_Check(limit.ptr())) {
    self->limit = PyUnicode_Compare(limit.ptr(), L2CTL_NAME("max").ptr()) == 0 ? Limit::max : Limit::automatic;
  } else {
    self->limit = Limit::exact;
    self->limit_bytes = limit.cast<long long>();
  }
  self->reset_on_exit = t[9].cast<bool>();
  self->share = t[10].cast<bool>();
  self->enabled = t[11].is_none();
  Py_XSETREF(self->reason, t[11].is_none() ? nullptr : Py_NewRef(t[11].ptr()));
  self->strict = t[14].cast<bool>();
  self->clamp = t[15].cast<bool>();
  Py_CLEAR(self->stream_object);
  Py_CLEAR(self->buffer_object);
  self->stream_checked = self->buffer_checked = -1;
  if (t[12].cast<bool>()) {
    remember_object(v[a_stream], stream_ref, py::none(), py::none(), true);
    Py_XSETREF(self->stream_object, Py_NewRef(v[a_stream]));
  }
  if (!t[13].is_none()) {
    py::tuple stamp = t[13];
    remember_object(v[a_buf], t[2], stamp[0], stamp[1], false);
    Py_XSETREF(self->buffer_object, Py_NewRef(v[a_buf]));
  }
}

int initialise(Persist* self, PyObject* const* v) {
  if (self->live) {
    PyErr_SetString(PyExc_RuntimeError, "this persist scope is live: end it before initialising it again");
    return -1;
  }
  if (self->entering) {
    PyErr_SetString(PyExc_RuntimeError, "this persist scope is being entered: it cannot be initialised again now");
    return -1;
  }
  if (!hooks.set) {
    PyErr_SetString(PyExc_RuntimeError, "l2ctl._persist was not imported: use l2ctl.persist");
    return -1;
  }
  try {
    if (!take_common(self, v)) take_prepared(self, v);
    self->has_window = false;
    self->clipped = false;
    self->device = -1;
    self->has_slots = false;
    self->idle = false;
    Py_CLEAR(self->window);
    Py_CLEAR(self->changed);
    Py_CLEAR(self->executables);
    return 0;
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (py::builtin_exception& e) {  // py::type_error and the like: the Python type they name
    e.set_error();
    return -1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

// Arguments in the declared order from positional values and keyword names (vectorcall's form).
bool place_arguments(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  for (int i = 0; i < n_args; ++i) out[i] = nullptr;
  if (nargs > 3) {
    PyErr_Format(PyExc_TypeError, "persist() takes from 2 to 3 positional arguments but %zd were given", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    int found = -1;
    for (int i = 0; i < n_args && found < 0; ++i)
      if (name == interned_args[i]) found = i;
    for (int i = 0; i < n_args && found < 0; ++i)
      if (PyUnicode_Compare(name, interned_args[i]) == 0) found = i;
    if (found < 0) {
      PyErr_Format(PyExc_TypeError, "persist() got an unexpected keyword argument '%U'", name);
      return false;
    }
    if (out[found] != nullptr) {
      PyErr_Format(PyExc_TypeError, "persist() got multiple values for argument '%s'", arg_names[found]);
      return false;
    }
    out[found] = args[nargs + k];
  }
  for (int i = 0; i < 2; ++i)
    if (out[i] == nullptr) {
      PyErr_Format(PyExc_TypeError, "persist() missing required argument '%s'", arg_names[i]);
      return false;
    }
  return true;
}

int persist_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  // The tuple-and-dict form (Persist.__init__ called directly): into vectorcall's form.
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  std::vector<PyObject*> flat(args == nullptr ? 0 : static_cast<std::size_t>(nargs));
  for (Py_ssize_t i = 0; i < nargs; ++i) flat[i] = PyTuple_GET_ITEM(args, i);
  py::object names;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0) {
    names = py::reinterpret_steal<py::object>(PyTuple_New(PyDict_GET_SIZE(kwargs)));
    PyObject *key, *value;
    Py_ssize_t pos = 0, k = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      PyTuple_SET_ITEM(names.ptr(), k++, Py_NewRef(key));
      flat.push_back(value);
    }
  }
  PyObject* v[n_args];
  if (!place_arguments(flat.data(), nargs, names ? names.ptr() : nullptr, v)) return -1;
  return initialise(reinterpret_cast<Persist*>(self), v);
}

// `persist(...)`: made and initialised in one vectorcall (no argument tuple or dict).
PyObject* persist_vectorcall(PyObject* type, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  PyObject* v[n_args];
  if (!place_arguments(args, PyVectorcall_NARGS(nargsf), kwnames, v)) return nullptr;
  PyObject* self = persist_new(reinterpret_cast<PyTypeObject*>(type), nullptr, nullptr);
  if (self == nullptr) return nullptr;
  if (initialise(reinterpret_cast<Persist*>(self), v) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  return self;
}

// ---- entry --------------------------------------------------------------------------------------------------

const Device_limits& limits_of(Registry_object& registry, int device) {
  auto it = registry.limits.find(device);
  if (it != registry.limits.end()) return it->second;
  PyObject* props = PyObject_CallOneArg(hooks.properties, py::int_(device).ptr());
  if (props == nullptr) throw py::error_already_set();
  py::object p = py::reinterpret_steal<py::object>(props);
  Device_limits out;
  out.max_window = p.attr("access_policy_max_window_size").cast<long long>();
  out.persisting_max = p.attr("persisting_l2_cache_max_size").cast<long long>();
  out.supported = p.attr("supports_persistence").cast<bool>();
  return registry.limits.emplace(device, out).first->second;
}

[[noreturn]] void value_error(const std::string& message) {
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw py::error_already_set();
}

// After the scope was registered, something failed (a graph's update, a warning filter, an interrupt): the scope
// ends in compiled code and the first error stays the one to see; an error of the end is a note on it.
// `record` is the entry's own: what failed (a warning's display, say) may have ended it already, or entered the
// object again.
[[noreturn]] void end_after(Persist* self, const std::shared_ptr<Scope_object>& record, py::error_already_set& error) {
  py::object executables = self->executables ? py::reinterpret_borrow<py::object>(self->executables) : py::none();
  py::object changed = self->changed ? py::reinterpret_borrow<py::object>(self->changed) : py::none();
  try {
    finish_scope(*record, executables, changed, error.value());
  } catch (py::error_already_set&) {
    // noted on `error` already where it can be
  }
  if (self->live == record) self->live.reset();
  throw error;
}

// Clears `entering` when the entry returns, however it does.
struct Entering {
  explicit Entering(Persist* self) : self(self) { self->entering = true; }
  ~Entering() { self->entering = false; }
  Persist* self;
};

PyObject* apply(Persist* self);
void describe_idle(Persist* self);

PyObject* enter(Persist* self) {
  if (self->live) {
    PyErr_SetString(PyExc_RuntimeError,
                    "this persist scope is already active; create a new one with l2ctl.persist(...)");
    throw py::error_already_set();
  }
  if (self->buffer_ref == nullptr) {  // made by Persist.__new__ alone, or its __init__ failed
    PyErr_SetString(PyExc_RuntimeError, "this persist scope was not initialised: make it with l2ctl.persist(...)");
    throw py::error_already_set();
  }
  if (self->entering) {
    PyErr_SetString(PyExc_RuntimeError, "this scope is already active (entered in another thread?); create a new one");
    throw py::error_already_set();
  }
  if (!self->enabled) {  // a "no persistence" policy: nothing to apply; the object still says where and why
    describe_idle(self);
    return Py_NewRef(self);
  }
  self->idle = false;
  Py_CLEAR(self->reason);
  if (self->strict) return apply(self);
  try {
    return apply(self);
  } catch (py::error_already_set& error) {
    // Best effort: the device cannot persist (no device, pre-Ampere, MIG, a limit refused under MPS). The entry
    // is atomic, so nothing was applied; anything else (a user's argument, an interrupt) is raised as it is.
    if (!error.matches(names().not_supported)) throw;
    PyObject* reason = PyObject_Str(error.value().ptr());
    if (reason == nullptr) throw py::error_already_set();
    Py_XSETREF(self->reason, reason);
  }
  describe_idle(self);
  PyObject* r = PyObject_CallOneArg(hooks.unavailable, reinterpret_cast<PyObject*>(self));  // warns (once)
  if (r == nullptr) throw py::error_already_set();
  Py_DECREF(r);
  return Py_NewRef(self);
}

// A scope entered without applying anything (`reason` says why): where it would have applied, as far as that can
// be known without a device that persists; the device -1 where there is none. Changes nothing.
void describe_idle(Persist* self) {
  const Entering entering(self);  // the Python it calls must not initialise the object again meanwhile
  self->idle = true;
  self->has_window = self->clipped = false;
  Py_CLEAR(self->window);
  self->device = -1;
  self->has_slots = false;
  self->first_slot = 0;
  try {
    if (self->stream_ref != nullptr) {
      self->first_slot = self->handle;
      self->has_slots = true;
      int device = self->stream_device;
      if (device < 0) {
        PyObject* d = PyObject_CallOneArg(hooks.stream_device, self->stream_ref);
        if (d == nullptr) throw py::error_already_set();
        device = static_cast<int>(as_ll(d));
        Py_DECREF(d);
      }
      self->device = device;
    } else {
      py::object target = py::reinterpret_steal<py::object>(PyObject_CallOneArg(hooks.resolve_target, self->target));
      if (!target) throw py::error_already_set();
      for (py::handle slot : target.attr(L2CTL_NAME("slots"))) {
        self->first_slot = py::reinterpret_borrow<py::tuple>(slot)[1].cast<std::uintptr_t>();
        self->has_slots = true;
        break;
      }
      self->device = target.attr(L2CTL_NAME("device")).cast<int>();
    }
  } catch (py::error_already_set& error) {
    if (!error.matches(names().not_supported)) throw;  // no device: -1
  }
}

// The entry proper: the scope registered and the device changed through the planner.
PyObject* apply(Persist* self) {
  const Entering entering(self);
  py::object backend;
  const std::shared_ptr<Registry_object> registry = active_registry(&backend);
  int device;
  std::vector<pl::Slot> slots;
  py::object owner, changed, executables, target;
  if (self->stream_ref != nullptr) {  // a stream: the common case
    device = self->stream_device;
    if (device < 0) {
      PyObject* d = PyObject_CallOneArg(hooks.stream_device, self->stream_ref);
      if (d == nullptr) throw py::error_already_set();
      device = static_cast<int>(as_ll(d));
      Py_DECREF(d);
    }
    PyObject* stream_owner = PyTuple_GET_ITEM(self->stream_ref, 3);
    if (self->own_stream) {
      PyObject* ref = own_ref(stream_owner);  // checked again: it may have been closed since the scope was made
      if (ref == nullptr) value_error("the stream is closed");
      Py_DECREF(ref);
    } else if (self->stream_checked != device || self->stream_checked_on != registry->serial) {
      PyObject* r = PyObject_CallFunctionObjArgs(hooks.check_stream_context, self->stream_ref, py::int_(device).ptr(),
                                                 nullptr);
      if (r == nullptr) throw py::error_already_set();
      Py_DECREF(r);
      self->stream_checked = device;
      self->stream_checked_on = registry->serial;
      if (self->stream_object != nullptr) mark_checked(self->stream_object, device, registry->serial);
    }
    slots.push_back(registry->planner.slot(pl::stream_slot, self->handle));
    owner = py::reinterpret_borrow<py::object>(stream_owner);
  }
  PyObject* buffer_owner = PyTuple_GET_ITEM(self->buffer_ref, 4);
  if (self->allocation) {
    PyObject* ref = own_ref(buffer_owner);  // an l2ctl buffer freed since the scope was made
    if (ref == nullptr) value_error("the device buffer has been freed");
    Py_DECREF(ref);
  }
  // A graph-like target: resolved now (its predicate runs here), after the buffer was found alive.
  pl::Plan_window window;
  if (self->stream_ref == nullptr) {
    py::object resolved = py::reinterpret_steal<py::object>(PyObject_CallOneArg(hooks.resolve_target, self->target));
    if (!resolved) throw py::error_already_set();
    target = resolved;
    device = target.attr(L2CTL_NAME("device")).cast<int>();
    slots = [&] {
      std::vector<pl::Slot> out;
      for (py::handle s : target.attr(L2CTL_NAME("slots"))) {
        py::tuple t = py::reinterpret_borrow<py::tuple>(s);
        out.push_back(pl::Slot{t[0].cast<int>(), t[1].cast<std::uintptr_t>(), t[2].cast<std::uint64_t>()});
      }
      return out;
    }();
    owner = target.attr(L2CTL_NAME("owner"));
    executables = target.attr(L2CTL_NAME("executables"));
  }
  if (self->buffer_device >= 0 && self->buffer_device != device) {
    value_error("the buffer is on device " + std::to_string(self->buffer_device) + " but the " +
                (self->stream_ref != nullptr ? "stream" : "target") + " is on device " + std::to_string(device) + "; " +
                (self->stream_ref != nullptr ? "use a stream of the buffer's device"
                                             : "for a graph of another device, pass l2ctl.graph.as_graph(g, device=N)"));
  }
  const Device_limits limits = limits_of(*registry, device);
  if (!limits.supported) {
    PyObject* r = PyObject_CallOneArg(hooks.require_persistence, py::int_(device).ptr());  // raises, saying why
    if (r == nullptr) throw py::error_already_set();
    Py_DECREF(r);
  }
  const long long full = self->num_bytes < 0 ? self->nbytes - self->offset : self->num_bytes;
  const bool clipped = limits.max_window > 0 && full > limits.max_window;
  const long long nbytes = clipped ? limits.max_window : full;
  if (!self->allocation && (self->buffer_checked != device || self->buffer_checked_on != registry->serial)) {
    // A remembered object's whole range, checked once per device and backend (a sub-range needs no more); any
    // other buffer's window range, as given (_device remembers it while the owner lives).
    const bool whole = self->buffer_object != nullptr;
    const std::uintptr_t start = whole ? self->ptr : self->ptr + static_cast<std::uintptr_t>(self->offset);
    const long long extent = whole ? self->nbytes : nbytes;
    PyObject* r = PyObject_CallFunctionObjArgs(
        hooks.check_owned_pointer, py::int_(start).ptr(), py::int_(extent).ptr(), py::int_(device).ptr(),
        buffer_owner, py::str("the buffer").ptr(), nullptr);
    if (r == nullptr) throw py::error_already_set();
    Py_DECREF(r);
    if (self->buffer_object != nullptr) {
      self->buffer_checked = device;
      self->buffer_checked_on = registry->serial;
      mark_checked(self->buffer_object, device, registry->serial);
    }
  }
  const bool fit = std::isnan(self->requested);
  window.base = self->ptr + static_cast<std::uintptr_t>(self->offset);
  window.num_bytes = static_cast<std::size_t>(nbytes);
  window.hit_ratio = fit ? 1.0 : self->requested;
  window.hit_prop = self->hit_prop;
  window.miss_prop = self->miss_prop;
  long long request = self->limit_bytes;
  if (self->limit == Limit::max || self->limit == Limit::exact) {
    try {
      request = pl::requested_set_aside(self->limit == Limit::max ? pl::Set_aside_form::max : pl::Set_aside_form::bytes,
                                        request, 0.0, limits.persisting_max, self->clamp);
    } catch (const std::invalid_argument& e) {
      value_error(std::string("device ") + std::to_string(device) + ": " + e.what() +
                  " (clamp=True grants the max instead, with a warning)");
    }
  }
  const bool clamped = self->limit == Limit::exact && request != self->limit_bytes;
  if (target) {  // a graph-like target may refuse a window that would not reach what it launches
    // The window object only for a target that looks at it (its `admit`).
    py::object requested_window = target.attr(L2CTL_NAME("admit")).is_none() ? py::none() : window_object(window);
    py::object after = py::reinterpret_steal<py::object>(
        PyObject_CallFunctionObjArgs(hooks.after_changes, target.ptr(), requested_window.ptr(), nullptr));
    if (!after) throw py::error_already_set();
    if (!after.is_none()) changed = after;
  }
  // The registry's record of the scope.
  auto record = std::make_shared<Scope_object>();
  pl::Scope& core = *record->core;
  core.device = device;
  core.slots = std::move(slots);
  core.has_window = true;
  core.window = core.effective = window;
  switch (self->limit) {
    case Limit::none:
      core.request = pl::Request::none;
      break;
    case Limit::automatic:
      core.request = pl::Request::automatic;
      record->limit = py::reinterpret_borrow<py::object>(L2CTL_NAME("auto").ptr());
      break;
    default:
      core.request = pl::Request::exact;
      core.request_bytes = request;
      record->limit = py::int_(request);
  }
  core.share = self->share;
  core.reset_on_exit = self->reset_on_exit;
  core.fit_hit_ratio = fit;
  record->owner = py::make_tuple(owner ? owner : py::none(), py::reinterpret_borrow<py::object>(buffer_owner));
  py::object holder = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(self));
  const pl::Entered entered = enter_scope(registry, record, limits.persisting_max, holder, backend);
  // Registered (self->live is the record), and the device matches. From here an error ends the scope (end_after).
  self->device = device;
  self->clipped = clipped;
  self->has_slots = !core.slots.empty();
  self->first_slot = self->has_slots ? core.slots.front().handle : 0;
  self->entered_window = core.window;  // the hit ratio resolved
  self->has_window = true;
  Py_CLEAR(self->window);
  Py_XSETREF(self->changed, changed ? Py_NewRef(changed.ptr()) : nullptr);
  Py_XSETREF(self->executables, executables && !executables.is_none() ? Py_NewRef(executables.ptr()) : nullptr);
  try {
    if (self->changed != nullptr) {
      PyObject* r = PyObject_CallOneArg(self->changed, scope_object(record).ptr());
      if (r == nullptr) throw py::error_already_set();
      Py_DECREF(r);
    }
    const bool thrash = window.hit_prop == l2ctl::access_persisting && pl::oversubscribed(entered.demand, entered.limit);
    if (clipped || entered.capped || thrash || clamped) {
      py::object clip = clipped ? py::object(py::make_tuple(full, nbytes, limits.max_window)) : py::object(py::none());
      py::object clamp = clamped ? py::object(py::make_tuple(self->limit_bytes, request)) : py::object(py::none());
      PyObject* r = PyObject_CallFunctionObjArgs(hooks.announce, reinterpret_cast<PyObject*>(self), clip.ptr(),
                                                 py::int_(entered.limit).ptr(), py::float_(entered.demand).ptr(),
                                                 entered.capped ? Py_True : Py_False, clamp.ptr(), nullptr);
      if (r == nullptr) throw py::error_already_set();
      Py_DECREF(r);
    }
  } catch (py::error_already_set& error) {
    end_after(self, record, error);
  }
  return Py_NewRef(self);
}

PyObject* persist_enter(PyObject* self, PyObject*) {
  try {
    return enter(reinterpret_cast<Persist*>(self));
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (py::builtin_exception& e) {  // py::type_error and the like: the Python type they name
    e.set_error();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* persist_exit(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->live) Py_RETURN_NONE;
  const std::shared_ptr<Scope_object> record = self->live;
  py::object executables = self->executables ? py::reinterpret_borrow<py::object>(self->executables) : py::none();
  py::object changed = self->changed ? py::reinterpret_borrow<py::object>(self->changed) : py::none();
  py::object exc = nargs >= 2 ? py::reinterpret_borrow<py::object>(args[1]) : py::none();
  // Reset only if it still names this scope: `changed` (Python) may have let the object be entered again.
  try {
    finish_scope(*record, executables, changed, exc);
  } catch (py::error_already_set& e) {
    if (self->live == record) self->live.reset();
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    if (self->live == record) self->live.reset();
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  // The registry told this object already (compiled_holders.forget), unless the scope was ended before
  // (restore_all): either way no scope is live on it any more.
  if (self->live == record) self->live.reset();
  Py_RETURN_NONE;
}

// ---- attributes ------------------------------------------------------------------------------------------------

PyObject* get_window(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->has_window) return Py_NewRef(hooks.no_window);
  if (self->window == nullptr) {
    try {
      self->window = window_object(self->entered_window).release().ptr();
    } catch (py::error_already_set& e) {
      e.restore();
      return nullptr;
    }
  }
  return Py_NewRef(self->window);
}

PyObject* get_clipped(PyObject* o, void*) { return PyBool_FromLong(reinterpret_cast<Persist*>(o)->clipped); }
PyObject* get_active(PyObject* o, void*) { return PyBool_FromLong(static_cast<bool>(reinterpret_cast<Persist*>(o)->live)); }

PyObject* get_device(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (self->device < 0 && !self->idle) {
    PyErr_SetString(PyExc_RuntimeError, "the scope has not been entered");
    return nullptr;
  }
  return PyLong_FromLong(self->device);
}

PyObject* get_stream(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->has_slots && !self->idle) {
    PyErr_SetString(PyExc_RuntimeError, "the scope has not been entered");
    return nullptr;
  }
  return PyLong_FromUnsignedLongLong(self->first_slot);
}

// `_scope`: the registry's live scope or None (its Python object made when asked for).
PyObject* get_scope(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->live) Py_RETURN_NONE;
  try {
    return scope_object(self->live).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}

int set_scope(PyObject* o, PyObject* value, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (value == nullptr || value == Py_None) {
    self->live.reset();
    return 0;
  }
  try {
    self->live = py::handle(value).cast<std::shared_ptr<Scope_object>>();
    return 0;
  } catch (py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "_scope is a registry Scope or None");
    return -1;
  }
}

PyObject* get_reason(PyObject* o, void*) {
  PyObject* reason = reinterpret_cast<Persist*>(o)->reason;
  return Py_NewRef(reason != nullptr ? reason : Py_None);
}

PyObject* get_requested(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (std::isnan(self->requested)) Py_RETURN_NONE;
  return PyFloat_FromDouble(self->requested);
}

PyGetSetDef persist_getset[] = {
    {"window", get_window, nullptr,
     "The window as applied (hit ratio resolved); empty before entry and for a \"no persistence\" policy.", nullptr},
    {"clipped", get_clipped, nullptr, "Whether the window was clipped to accessPolicyMaxWindowSize.", nullptr},
    {"active", get_active, nullptr, "Whether the scope is live.", nullptr},
    {"device", get_device, nullptr, "The device of the stream (or graph) the window is on, once entered.", nullptr},
    {"stream", get_stream, nullptr, "The handle of the stream (or graph node) the window is on, once entered.", nullptr},
    {"reason", get_reason, nullptr,
     "Why the scope changes nothing (a \"no persistence\" policy, or with strict=False a device that cannot "
     "persist), or None.", nullptr},
    {"_scope", get_scope, set_scope, "The registry's live scope, or None.", nullptr},
    {"_requested_hit_ratio", get_requested, nullptr, "The hit ratio asked for (None: fitted to the set-aside).",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef persist_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Persist, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyObject* persist_stop(PyObject* o, PyObject*) { return persist_exit(o, nullptr, 0); }

PyMethodDef persist_methods[] = {
    {"__enter__", persist_enter, METH_NOARGS, "Apply the window (and limit) through the registry."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(persist_exit)), METH_FASTCALL,
     "End the scope: the device holds what the live scopes still ask for."},
    {"start", persist_enter, METH_NOARGS,
     "Start the scope and return it (what `with` does on entry): for a scope that lives as long as an app or a "
     "model, ended by stop(), by garbage collection or at interpreter exit."},
    {"stop", persist_stop, METH_NOARGS,
     "End the scope (what `with` does on exit); nothing when it is not live."},
    {"close", persist_stop, METH_NOARGS, "stop(), by the name files and contextlib.closing use."},
    {nullptr, nullptr, 0, nullptr}};

// ---- the other scopes' compiled entries ----------------------------------------------------------------------------

// `__enter__` of the scoped window: `self._prepare_entry()` (Python: resolves the target and checks the window,
// changing nothing) gives (scope, maximum, changed, executables); the entry and what follows are compiled, and an
// error after the entry ends the scope here.
py::object holder_enter(py::object self) {
  py::tuple prepared = self.attr(L2CTL_NAME("_prepare_entry"))();
  py::object scope = prepared[0], changed = prepared[2], executables = prepared[3];
  py::object backend;
  const std::shared_ptr<Registry_object> registry = active_registry(&backend);
  enter_scope(registry, scope.cast<std::shared_ptr<Scope_object>>(), prepared[1].cast<long long>(), self, backend);
  self.attr(L2CTL_NAME("_changed")) = changed;
  self.attr(L2CTL_NAME("_executables")) = executables;
  if (!changed.is_none()) {
    try {
      changed(scope);
    } catch (py::error_already_set& error) {
      try {
        finish_scope(scope.cast<Scope_object&>(), executables, changed, error.value());
      } catch (py::error_already_set&) {
      }
      throw;
    }
  }
  return self;
}

// `__enter__` of a set_aside scope: the request, standing until now, ends with the block.
py::object set_aside_enter(py::object self) {
  py::object scope = self.attr(L2CTL_NAME("_scope"));
  scope.cast<Scope_object&>().core->standing = false;
  return self;
}

// This thread's stack of current l2ctl streams (`_interop.current_streams()`).
py::list current_streams() {
  // Leaked on purpose: a static py::object would be released at exit without the GIL.
  static py::object* current = new py::object(py::module_::import("l2ctl._interop").attr("_current"));
  return current->attr(L2CTL_NAME("streams"));
}

// `with stream:`: a closed stream is refused; otherwise the stream joins this thread's stack of current streams.
py::object stream_enter(py::object self) {
  PyObject* ref = own_ref(self.ptr());
  if (ref == nullptr) value_error("the stream is closed");
  Py_DECREF(ref);
  current_streams().append(self);
  return self;
}

// `with stream:` ended: the innermost entry of this stream leaves this thread's stack of current streams, by
// list operations alone (no Python code runs, so no interrupt leaves the stream current).
py::object stream_exit(py::object self, py::object, py::object, py::object) {
  py::list streams = current_streams();
  for (Py_ssize_t i = static_cast<Py_ssize_t>(streams.size()) - 1; i >= 0; --i)
    if (PyList_GET_ITEM(streams.ptr(), i) == self.ptr()) {
      PySequence_DelItem(streams.ptr(), i);
      break;
    }
  return py::none();
}

bool persist_is_live(PyObject* holder) { return static_cast<bool>(reinterpret_cast<Persist*>(holder)->live); }

void persist_take(PyObject* holder, const std::shared_ptr<Scope_object>& record) {
  reinterpret_cast<Persist*>(holder)->live = record;
}

void persist_forget(PyObject* holder, const Scope_object* record) {
  auto* self = reinterpret_cast<Persist*>(holder);
  if (self->live.get() == record) self->live.reset();
}

// `with graph.capture(stream) as g:` began: the capture and its record (`_capturing`) with no bytecode between. A
// call cut short in the backend (the simulator's Python) may have begun it: the stream is asked, and ended.
// `_capturing`: False before the capture, True while it runs, None once it ended (one capture per object: its Graph
// object has been given its graph, or the partial one was destroyed).
py::object capture_enter(py::object self) {
  const py::object state = self.attr(L2CTL_NAME("_capturing"));
  if (state.is_none()) {
    PyErr_SetString(PyExc_RuntimeError, "this capture has ended; make a new one with graph.capture(...)");
    throw py::error_already_set();
  }
  if (state.cast<bool>()) {
    PyErr_SetString(PyExc_RuntimeError, "this capture is already under way; make a new one with graph.capture(...)");
    throw py::error_already_set();
  }
  py::object backend = self.attr(L2CTL_NAME("_backend"));
  py::object stream = self.attr(L2CTL_NAME("_stream"));
  try {
    backend.attr(L2CTL_NAME("begin_capture"))(stream, self.attr(L2CTL_NAME("_mode")));
  } catch (py::error_already_set&) {
    try {
      if (backend.attr(L2CTL_NAME("is_capturing"))(stream).cast<bool>()) {
        const py::object handle = backend.attr(L2CTL_NAME("end_capture"))(stream);
        if (handle.cast<std::uintptr_t>() != 0) backend.attr(L2CTL_NAME("Graph"))(handle, true).attr("destroy")();
      }
    } catch (py::error_already_set&) {
      // the first error is the one to see
    }
    throw;
  }
  self.attr(L2CTL_NAME("_capturing")) = true;
  return self.attr(L2CTL_NAME("_graph"));
}

// The capture ended: its graph given to the Graph object, or, when the block raised, destroyed (the block's
// error is the one to see).
py::object capture_exit(py::object self, py::object, py::object exc, py::object) {
  const py::object state = self.attr(L2CTL_NAME("_capturing"));
  if (state.is_none() || !state.cast<bool>()) return py::none();
  py::object backend = self.attr(L2CTL_NAME("_backend"));
  py::object handle;
  try {
    handle = backend.attr(L2CTL_NAME("end_capture"))(self.attr(L2CTL_NAME("_stream")));
  } catch (py::error_already_set&) {
    self.attr(L2CTL_NAME("_capturing")) = py::none();
    if (!exc.is_none()) return py::none();  // the capture may already be invalidated; the block's error matters
    throw;
  }
  self.attr(L2CTL_NAME("_capturing")) = py::none();
  if (!exc.is_none()) {
    try {
      if (handle.cast<std::uintptr_t>() != 0) backend.attr(L2CTL_NAME("Graph"))(handle, true).attr("destroy")();
    } catch (py::error_already_set&) {
    }
    return py::none();
  }
  self.attr(L2CTL_NAME("_graph")).attr(L2CTL_NAME("_impl")) = backend.attr(L2CTL_NAME("Graph"))(handle, true);
  return py::none();
}

py::object instance_method(py::cpp_function f) {
  return py::reinterpret_steal<py::object>(PyInstanceMethod_New(f.ptr()));
}

}  // namespace

void bind_scope_types(py::module_& planner) {
  for (int i = 0; i < n_args; ++i) interned_args[i] = PyUnicode_InternFromString(arg_names[i]);

  PyType_Slot slots[] = {
      {Py_tp_new, reinterpret_cast<void*>(persist_new)},
      {Py_tp_init, reinterpret_cast<void*>(persist_init)},
      {Py_tp_dealloc, reinterpret_cast<void*>(persist_dealloc)},
      {Py_tp_finalize, reinterpret_cast<void*>(persist_finalize)},
      {Py_tp_traverse, reinterpret_cast<void*>(persist_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(persist_clear)},
      {Py_tp_methods, persist_methods},
      {Py_tp_getset, persist_getset},
      {Py_tp_members, persist_members},
      {0, nullptr}};
  PyType_Spec spec = {"l2ctl.Persist", sizeof(Persist), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  persist_type = reinterpret_cast<PyTypeObject*>(type);
  // Calls of the type itself skip the argument tuple and dict (CPython reads tp_vectorcall of a type).
  persist_type->tp_vectorcall = persist_vectorcall;
  planner.attr("Persist") = py::reinterpret_steal<py::object>(type);
  compiled_holders.type = persist_type;
  compiled_holders.is_live = persist_is_live;
  compiled_holders.take = persist_take;
  compiled_holders.forget = persist_forget;

  planner.def(
      "set_scope_hooks",
      [](py::kwargs k) {
        auto take = [&](const char* name) { return Py_NewRef(k[name].ptr()); };
        hooks.prepare = take("prepare");
        hooks.stream_device = take("stream_device");
        hooks.check_stream_context = take("check_stream_context");
        hooks.check_owned_pointer = take("check_owned_pointer");
        hooks.properties = take("properties");
        hooks.require_persistence = take("require_persistence");
        hooks.resolve_target = take("resolve_target");
        hooks.after_changes = take("after_changes");
        hooks.announce = take("announce");
        hooks.unavailable = take("unavailable");
        hooks.stream_type = take("stream_type");
        hooks.buffer_type = take("buffer_type");
        hooks.persisting = take("persisting");
        hooks.streaming = take("streaming");
        hooks.no_window = take("no_window");
        hooks.set = true;
      },
      "Python functions and objects of l2ctl's that the compiled scope calls (set by l2ctl._persist).");
  planner.attr("holder_enter") = instance_method(py::cpp_function(&holder_enter, py::name("__enter__")));
  planner.attr("set_aside_enter") = instance_method(py::cpp_function(&set_aside_enter, py::name("__enter__")));
  planner.attr("stream_enter") = instance_method(py::cpp_function(&stream_enter, py::name("__enter__")));
  planner.attr("stream_exit") = instance_method(py::cpp_function(&stream_exit, py::name("__exit__"), py::arg("self"),
                                                                 py::arg("exc_type"), py::arg("exc"), py::arg("tb")));
  planner.attr("capture_enter") = instance_method(py::cpp_function(&capture_enter, py::name("__enter__")));
  planner.attr("capture_exit") = instance_method(
      py::cpp_function(&capture_exit, py::name("__exit__"), py::arg("self"), py::arg("exc_type"), py::arg("exc"),
                       py::arg("tb")));
}

}  // namespace l2ctl_bindings
