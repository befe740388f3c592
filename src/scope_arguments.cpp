// persist()'s arguments: their common forms taken without Python (take_common), any other form through the Host's
// `prepare` (take_prepared), and the table of torch and CuPy objects resolved once while they live.
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "persist_type.hpp"

namespace l2ctl_bindings {

const char* const arg_names[n_args] = {"stream",    "buf",       "hit_ratio",     "num_bytes", "offset",
                                       "hit_prop",  "miss_prop", "set_aside",     "reset_on_exit", "share",
                                       "policy",    "strict",    "clamp"};
PyObject* interned_args[n_args];

void intern_argument_names() {
  for (int i = 0; i < n_args; ++i) interned_args[i] = PyUnicode_InternFromString(arg_names[i]);
}

namespace {

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
  bool stale = false;            // to be erased when the table is no longer in use
};

// Any allocation may run the garbage collector, and with it Python (a gc callback, a finalizer) that makes
// another scope, which looks objects up and remembers them: so while pointers into the table are held
// (`users`), entries are marked stale instead of erased, never overwritten, and the eviction at the bound waits.
// Entries leave the table before their references are dropped (dropping them may run Python too).
struct Object_table {
  std::unordered_map<const void*, Resolved> entries;
  int users = 0;
  bool evict_all = false;  // the bound was reached while in use
  bool has_stale = false;
};
Object_table& table() {
  static auto* known = new Object_table;  // leaked: released at exit without the GIL otherwise
  return *known;
}
constexpr std::size_t resolved_bound = 1024;

// The entries to drop, taken out of the table first: their references go when the returned vector does.
std::vector<Resolved> take_evicted(Object_table& t) {
  std::vector<Resolved> out;
  for (auto it = t.entries.begin(); it != t.entries.end();) {
    if (t.evict_all || it->second.stale) {
      out.push_back(std::move(it->second));
      it = t.entries.erase(it);
    } else {
      ++it;
    }
  }
  t.evict_all = t.has_stale = false;
  return out;
}

void forget(Object_table& t, std::unordered_map<const void*, Resolved>::iterator it) {
  it->second.stale = true;
  t.has_stale = true;
  if (t.users == 0) take_evicted(t);
}

constexpr Py_ssize_t stream_owner_field = 3;  // StreamRef.owner
constexpr Py_ssize_t buffer_owner_field = 4;  // BufferRef.owner

// `ref` (a StreamRef or BufferRef: a named tuple) with `owner` in field `index` (a new reference).
PyObject* with_owner(PyObject* ref, Py_ssize_t index, PyObject* owner) {
  PyTypeObject* type = Py_TYPE(ref);
  const Py_ssize_t n = PyTuple_GET_SIZE(ref);
  const py::object keep = py::reinterpret_borrow<py::object>(ref);  // the allocation may run the collector
  PyObject* out = type->tp_alloc(type, n);  // as tuple.__new__(type, items) makes it
  if (out == nullptr) throw py::error_already_set();
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(i == index ? owner : PyTuple_GET_ITEM(ref, i)));
  return out;
}

// The entry of `obj` resolved as a stream (`stream`) or as a buffer, or null. Valid while an Object_table_use
// lives.
Resolved* known_object(PyObject* obj, bool stream) {
  Object_table& t = table();
  auto it = t.entries.find(obj);
  if (it == t.entries.end() || it->second.stale || it->second.stream != stream) return nullptr;
  if (!weak_target(it->second.weak.ptr()).is(py::handle(obj))) {  // another object at a freed one's address
    forget(t, it);
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
    it = t.entries.find(obj);
    if (it == t.entries.end() || it->second.stale || it->second.stream != stream || !it->second.stamp.is(stamp))
      return nullptr;
    if (!same) {
      forget(t, it);
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
  Resolved entry{py::reinterpret_steal<py::object>(weak),
                 py::reinterpret_steal<py::object>(
                     with_owner(ref.ptr(), stream ? stream_owner_field : buffer_owner_field, Py_None)),
                 stamp_of, stamp, stream};
  // From here no Python runs until the table holds the entry.
  Object_table& t = table();
  auto it = t.entries.find(obj);
  if (it != t.entries.end()) {
    if (t.users > 0) return;  // in use: resolved again next time
    std::swap(it->second, entry);  // what it held goes with `entry`, after the table changed
    return;
  }
  std::vector<Resolved> evicted;
  if (t.entries.size() >= resolved_bound) {
    t.evict_all = true;
    if (t.users == 0) evicted = take_evicted(t);
  }
  t.entries.emplace(obj, std::move(entry));
}

}  // namespace

Object_table_use::Object_table_use() { ++table().users; }

Object_table_use::~Object_table_use() {
  Object_table& t = table();
  if (--t.users > 0 || !(t.evict_all || t.has_stale)) return;
  try {
    take_evicted(t);
  } L2CTL_THREAD_ENDED catch (...) {  // no memory for the list: the eviction waits for the next use
    PyErr_Clear();
  }
}

void mark_checked(PyObject* obj, int device, std::uint64_t registry) {
  Object_table& t = table();
  auto it = t.entries.find(obj);
  if (it != t.entries.end() && !it->second.stale && weak_target(it->second.weak.ptr()).is(py::handle(obj))) {
    it->second.checked_device = device;
    it->second.checked_on = registry;
  }
}

// ---- the arguments ---------------------------------------------------------------------------------------------
long long as_ll(PyObject* value) {
  const long long out = PyLong_AsLongLong(value);
  if (out == -1 && PyErr_Occurred()) throw py::error_already_set();
  return out;
}

// An address or handle (an int in [0, 2**64)). PyLong_AsUnsignedLong where it is 64 bits: CPython's
// PyLong_AsUnsignedLongLong goes through a byte array, several times slower on every scope's path.
std::uintptr_t as_address(PyObject* value) {
#if ULONG_MAX == UINT64_MAX
  using Unsigned = unsigned long;
  const Unsigned out = PyLong_AsUnsignedLong(value);
#else
  using Unsigned = unsigned long long;
  const Unsigned out = PyLong_AsUnsignedLongLong(value);
#endif
  if (out == static_cast<Unsigned>(-1) && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<std::uintptr_t>(out);
}

// A StreamRef (handle, device, source, owner) into the scope's fields.
void take_stream_ref(Persist* self, PyObject* ref) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 4) throw py::type_error("a stream reference is a StreamRef");
  PyObject* handle = PyTuple_GET_ITEM(ref, 0);
  self->handle = as_address(handle);
  PyObject* device = PyTuple_GET_ITEM(ref, 1);
  self->stream_device = device == Py_None ? -1 : static_cast<int>(as_ll(device));
  // An l2ctl.Stream, or one of a subclass: checked for being closed at entry, before the device is touched.
  self->own_stream = PyObject_TypeCheck(PyTuple_GET_ITEM(ref, 3), reinterpret_cast<PyTypeObject*>(host.stream_type));
  Py_INCREF(ref);
  Py_XSETREF(self->stream_ref, ref);
}

// A BufferRef (ptr, nbytes, device, source, owner, allocation) into the scope's fields.
void take_buffer_ref(Persist* self, PyObject* ref) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 6) throw py::type_error("a buffer reference is a BufferRef");
  self->ptr = as_address(PyTuple_GET_ITEM(ref, 0));
  self->nbytes = as_ll(PyTuple_GET_ITEM(ref, 1));
  PyObject* device = PyTuple_GET_ITEM(ref, 2);
  self->buffer_device = device == Py_None ? -1 : static_cast<int>(as_ll(device));
  self->allocation = PyTuple_GET_ITEM(ref, 5) == Py_True;
  Py_INCREF(ref);
  Py_XSETREF(self->buffer_ref, ref);
}

std::atomic<std::uint64_t> own_released{0};

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
  if (v[a_hit_prop] != nullptr && v[a_hit_prop] != host.access[l2ctl::access_persisting]) return false;
  if (v[a_miss_prop] != nullptr && v[a_miss_prop] != host.access[l2ctl::access_streaming]) return false;
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
  if (Py_TYPE(stream) == reinterpret_cast<PyTypeObject*>(host.stream_type)) {
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
  if (Py_TYPE(buf) == reinterpret_cast<PyTypeObject*>(host.buffer_type)) {
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
  if (args[a_hit_prop] == nullptr) args[a_hit_prop] = host.access[l2ctl::access_persisting];
  if (args[a_miss_prop] == nullptr) args[a_miss_prop] = host.access[l2ctl::access_streaming];
  if (args[a_set_aside] == nullptr) args[a_set_aside] = L2CTL_NAME("auto").ptr();
  if (args[a_reset_on_exit] == nullptr) args[a_reset_on_exit] = Py_True;
  if (args[a_share] == nullptr) args[a_share] = Py_False;
  if (args[a_policy] == nullptr) args[a_policy] = Py_None;
  if (args[a_strict] == nullptr) args[a_strict] = Py_True;
  if (args[a_clamp] == nullptr) args[a_clamp] = Py_False;
  PyObject* result = PyObject_Vectorcall(host.prepare, args, n_args, nullptr);
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
  } else if (PyFloat_Check(limit.ptr())) {  // a fraction of the max, checked by _prepare (check_set_aside)
    self->limit = Limit::fraction;
    self->limit_fraction = PyFloat_AS_DOUBLE(limit.ptr());
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

}  // namespace l2ctl_bindings
