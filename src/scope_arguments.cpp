// persist()'s arguments: their common forms taken without Python (take_common), any other form through the Host's
// `prepare` (take_prepared), and the table of torch and CuPy objects resolved once while they live.
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "persist_type.hpp"

namespace l2ctl_bindings {

#define L2CTL_TEXT(name) #name,
const char* const arg_names[n_args] = {L2CTL_PERSIST_ARGUMENTS(L2CTL_TEXT)};
const char* const resolved_names[n_resolved] = {L2CTL_PERSIST_RESOLVED(L2CTL_TEXT)};
PyObject* interned_args[n_args];
PyObject* interned_resolved[n_resolved];
Persist_arguments persist_arguments;

void intern_argument_names() {
  for (int i = 0; i < n_args; ++i) interned_args[i] = PyUnicode_InternFromString(arg_names[i]);
  for (int i = 0; i < n_resolved; ++i) interned_resolved[i] = PyUnicode_InternFromString(resolved_names[i]);
}

namespace {
[[noreturn]] void refuse(const char* field, const std::string& why) {
  PyErr_Format(PyExc_TypeError, "l2ctl._host.Host.%s: %s (src/persist_type.hpp)", field, why.c_str());
  throw py::error_already_set();
}
}  // namespace

Persist_arguments check_persist_arguments(py::handle prepare, py::handle request_type) {
  Persist_arguments out;
  const py::object code = py::getattr(prepare, "__code__", py::none());
  if (code.is_none()) refuse("prepare", "not a Python function");
  const int positional = code.attr("co_argcount").cast<int>();
  const py::tuple names = code.attr("co_varnames");
  const int count = positional + code.attr("co_kwonlyargcount").cast<int>();
  const py::object defaults = py::getattr(prepare, "__defaults__", py::none());
  out.n_positional = positional;
  out.n_required = positional - (defaults.is_none() ? 0 : static_cast<int>(py::len(defaults)));
  bool seen[n_args] = {};
  for (int i = 0; i < count; ++i) {
    int found = 0;
    while (found < n_args && py::str(names[i]).cast<std::string>() != arg_names[found]) ++found;
    if (found == n_args) refuse("prepare", "its parameter " + py::str(names[i]).cast<std::string>() + " is no argument of persist");
    seen[found] = true;
    if (i < positional) out.positional[i] = static_cast<Arg>(found);
  }
  for (int a = 0; a < n_args; ++a)
    if (!seen[a]) refuse("prepare", std::string("persist's argument ") + arg_names[a] + " is not a parameter");
  // The Request's fields: one per argument but `policy`, and the resolved ones.
  const py::object keys = py::getattr(request_type, "__required_keys__", py::none());
  std::size_t expected = n_resolved;
  for (int a = 0; a < n_args; ++a)
    if (a != a_policy && (++expected, keys.is_none() || !keys.contains(py::handle(interned_args[a]))))
      refuse("request_type", std::string("no field ") + arg_names[a]);
  for (int r = 0; r < n_resolved; ++r)
    if (!keys.contains(py::handle(interned_resolved[r]))) refuse("request_type", std::string("no field ") + resolved_names[r]);
  if (py::len(keys) != expected) refuse("request_type", "a field the compiled scope does not read");
  return out;
}

namespace {

// ---- foreign objects, resolved once ----------------------------------------------------------------------------

// A torch or CuPy stream or array resolved by l2ctl._interop, remembered while the object lives (a weak
// reference), with what was checked of it on which device. `stamp`: for objects whose memory can move under the
// same object (a torch tensor's set_ or resize_), `stamp_of(obj)` must still equal it, or it is resolved again.
// `ref` is kept without its owner (the object itself): the table must not keep the object, and a tensor's memory,
// alive; `with_owner` puts it back at each use. `stream`: what the object was resolved as (a stream or a buffer).
struct Known_object {
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
  std::unordered_map<const void*, Known_object> entries;
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
std::vector<Known_object> take_evicted(Object_table& t) {
  std::vector<Known_object> out;
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

void forget(Object_table& t, std::unordered_map<const void*, Known_object>::iterator it) {
  it->second.stale = true;
  t.has_stale = true;
  if (t.users == 0) take_evicted(t);
}

// `ref` (a StreamRef or BufferRef: a named tuple) with `owner` in its field at `index` (a new reference).
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
Known_object* known_object(PyObject* obj, bool stream) {
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

Py_ssize_t owner_at(bool stream) {
  return stream ? host.stream_ref.at[Stream_ref::owner] : host.buffer_ref.at[Buffer_ref::owner];
}

void remember_object(PyObject* obj, const py::object& ref, const py::object& stamp_of, const py::object& stamp,
                     bool stream) {
  PyObject* weak = PyWeakref_NewRef(obj, nullptr);
  if (weak == nullptr) {  // not weakly referable: resolved at every scope
    PyErr_Clear();
    return;
  }
  Known_object entry{py::reinterpret_steal<py::object>(weak),
                 py::reinterpret_steal<py::object>(
                     with_owner(ref.ptr(), stream ? owner_at(true) : owner_at(false), Py_None)),
                 stamp_of, stamp, stream};
  // From here no Python runs until the table holds the entry.
  Object_table& t = table();
  auto it = t.entries.find(obj);
  if (it != t.entries.end()) {
    if (t.users > 0) return;  // in use: resolved again next time
    std::swap(it->second, entry);  // what it held goes with `entry`, after the table changed
    return;
  }
  std::vector<Known_object> evicted;
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

int device_or_unknown(PyObject* device) { return device == Py_None ? -1 : static_cast<int>(as_ll(device)); }

// A StreamRef into the scope's fields (read by name: host.hpp); None: no stream (a graph-like target, resolved at
// entry).
void take_stream_ref(Persist* self, PyObject* ref) {
  if (ref == Py_None) {
    Py_CLEAR(self->stream_ref);
    self->handle = 0;
    self->stream_device = -1;
    self->own_stream = false;
    return;
  }
  const auto& field = host.stream_ref;
  if (!field.holds(ref)) throw py::type_error("a stream reference is an l2ctl StreamRef");
  self->handle = as_address(field(ref, Stream_ref::handle));
  self->stream_device = device_or_unknown(field(ref, Stream_ref::device));
  // An l2ctl.Stream, or one of a subclass: checked for being closed at entry, before the device is touched.
  self->own_stream = PyObject_TypeCheck(field(ref, Stream_ref::owner), reinterpret_cast<PyTypeObject*>(host.stream_type));
  Py_XSETREF(self->stream_ref, Py_NewRef(ref));
}

// A BufferRef into the scope's fields.
void take_buffer_ref(Persist* self, PyObject* ref) {
  const auto& field = host.buffer_ref;
  if (!field.holds(ref)) throw py::type_error("a buffer reference is an l2ctl BufferRef");
  self->ptr = as_address(field(ref, Buffer_ref::ptr));
  self->nbytes = as_ll(field(ref, Buffer_ref::nbytes));
  self->buffer_device = device_or_unknown(field(ref, Buffer_ref::device));
  self->allocation = field(ref, Buffer_ref::allocation) == Py_True;
  Py_XSETREF(self->buffer_ref, Py_NewRef(ref));
}

std::atomic<std::uint64_t> own_released{0};

// An l2ctl Stream's or DeviceBuffer's reference (`_ref`), or NULL when it is closed or freed (new reference).
PyObject* own_ref(PyObject* obj) {
  PyObject* ref = PyObject_GetAttr(obj, host.name.ref.ptr());
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

// `policy=`: an l2ctl Policy (the Host's `policy_type` exactly: its fields were checked when it was made), enabled
// and without a byte range, read into the hit ratio and set-aside it asks for. False for anything else (a tuned
// policy, a subclass, a disabled one, one with a range): _prepare takes those.
bool fast_policy(PyObject* policy, double* requested, Limit* kind, long long* bytes) {
  if (Py_TYPE(policy) != reinterpret_cast<PyTypeObject*>(host.policy_type)) return false;
  const auto field = [policy](Policy_record::Field f) {
    PyObject* value = PyObject_GetAttr(policy, host.policy.name[f]);
    if (value == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(value);
  };
  const py::object enabled = field(Policy_record::enabled), offset = field(Policy_record::offset),
                   num_bytes = field(Policy_record::num_bytes);
  if (enabled.ptr() != Py_True || !num_bytes.is_none() || !PyLong_CheckExact(offset.ptr())) return false;
  int overflow = 0;
  if (PyLong_AsLongLongAndOverflow(offset.ptr(), &overflow) != 0 || overflow) return false;
  const py::object hit_ratio = field(Policy_record::hit_ratio);
  if (!hit_ratio.is_none() && !fast_hit_ratio(hit_ratio.ptr(), requested)) return false;
  return fast_limit(field(Policy_record::set_aside).ptr(), kind, bytes);
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
  Known_object* stream_known = nullptr;
  Known_object* buffer_known = nullptr;
  int stream_checked = -1, buffer_checked = -1;
  std::uint64_t stream_checked_on = 0, buffer_checked_on = 0;
  bool graph_like = false;
  if (Py_TYPE(stream) == reinterpret_cast<PyTypeObject*>(host.stream_type)) {
    PyObject* ref = own_ref(stream);
    if (ref == nullptr) return false;  // closed: _prepare says so
    stream_ref = py::reinterpret_steal<py::object>(ref);
  } else if (PyObject_HasAttr(reinterpret_cast<PyObject*>(Py_TYPE(stream)), host.name.l2ctl_target.ptr())) {
    graph_like = true;  // an l2ctl graph, a node selection, torch_captures(): resolved at entry (as _prepare does)
  } else if ((stream_known = known_object(stream, true)) != nullptr) {
    stream_ref = py::reinterpret_steal<py::object>(with_owner(stream_known->ref.ptr(), owner_at(true), stream));
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
    buffer_ref = py::reinterpret_steal<py::object>(with_owner(buffer_known->ref.ptr(), owner_at(false), buf));
    buffer_checked = buffer_known->checked_device;
    buffer_checked_on = buffer_known->checked_on;
  } else {
    return false;
  }
  take_stream_ref(self, graph_like ? Py_None : stream_ref.ptr());
  Py_XSETREF(self->target, graph_like ? Py_NewRef(stream) : nullptr);
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

// Any other form: l2ctl._persist._prepare takes the arguments as they were given (`args`, vectorcall's form), checks
// and normalises every one (the one place their rules are written), and returns its Request, read here by field
// name; it says which foreign objects may be remembered. `v`: the same arguments placed.
void take_prepared(Persist* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject* const* v) {
  PyObject* result = PyObject_Vectorcall(host.prepare, args, static_cast<std::size_t>(nargs), kwnames);
  if (result == nullptr) throw py::error_already_set();
  const py::object request = py::reinterpret_steal<py::object>(result);
  const auto field = [&](PyObject* name) {
    PyObject* value = PyDict_Check(result) ? PyDict_GetItemWithError(result, name) : nullptr;
    if (value == nullptr && PyErr_Occurred() == nullptr)
      PyErr_Format(PyExc_TypeError, "l2ctl._persist._prepare returned no %R (its Request)", name);
    if (value == nullptr) throw py::error_already_set();
    return py::handle(value);
  };
  const auto arg = [&](Arg a) { return field(interned_args[a]); };
  const auto found = [&](Resolved r) { return field(interned_resolved[r]); };
  const py::handle stream_ref = arg(a_stream);
  take_stream_ref(self, stream_ref.ptr());
  Py_XSETREF(self->target, Py_NewRef(found(r_target).ptr()));
  take_buffer_ref(self, arg(a_buf).ptr());
  self->offset = arg(a_offset).cast<long long>();
  self->num_bytes = arg(a_num_bytes).is_none() ? -1 : arg(a_num_bytes).cast<long long>();
  self->hit_prop = arg(a_hit_prop).cast<int>();
  self->miss_prop = arg(a_miss_prop).cast<int>();
  self->requested = arg(a_hit_ratio).is_none() ? std::nan("") : arg(a_hit_ratio).cast<double>();
  PyObject* limit = arg(a_set_aside).ptr();
  if (PyFloat_Check(limit)) {  // a fraction of the max, checked by _prepare (check_set_aside)
    self->limit = Limit::fraction;
    self->limit_fraction = PyFloat_AS_DOUBLE(limit);
  } else if (!fast_limit(limit, &self->limit, &self->limit_bytes)) {
    throw py::type_error("l2ctl._persist._prepare returned a set-aside of no known form");
  }
  self->reset_on_exit = arg(a_reset_on_exit).cast<bool>();
  self->share = arg(a_share).cast<bool>();
  self->strict = arg(a_strict).cast<bool>();
  self->clamp = arg(a_clamp).cast<bool>();
  const py::handle reason = found(r_reason);
  self->enabled = reason.is_none();
  Py_XSETREF(self->reason, reason.is_none() ? nullptr : Py_NewRef(reason.ptr()));
  Py_CLEAR(self->stream_object);
  Py_CLEAR(self->buffer_object);
  self->stream_checked = self->buffer_checked = -1;
  if (found(r_remember_stream).cast<bool>()) {
    remember_object(v[a_stream], py::reinterpret_borrow<py::object>(stream_ref), py::none(), py::none(), true);
    Py_XSETREF(self->stream_object, Py_NewRef(v[a_stream]));
  }
  const py::handle stamp = found(r_buffer_stamp);
  if (!stamp.is_none()) {
    const py::tuple pair = py::reinterpret_borrow<py::tuple>(stamp);
    remember_object(v[a_buf], py::reinterpret_borrow<py::object>(arg(a_buf)), pair[0], pair[1], false);
    Py_XSETREF(self->buffer_object, Py_NewRef(v[a_buf]));
  }
}

// Arguments placed by name from positional values and keyword names (vectorcall's form); the positional ones go
// where the registration found them (_prepare's parameters).
bool place_arguments(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  const Persist_arguments& known = persist_arguments;
  for (int i = 0; i < n_args; ++i) out[i] = nullptr;
  if (nargs > known.n_positional) {
    PyErr_Format(PyExc_TypeError, "persist() takes from %d to %d positional arguments but %zd were given",
                 known.n_required, known.n_positional, nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[known.positional[i]] = args[i];
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
  for (int i = 0; i < known.n_required; ++i)
    if (out[known.positional[i]] == nullptr) {
      PyErr_Format(PyExc_TypeError, "persist() missing required argument '%s'", arg_names[known.positional[i]]);
      return false;
    }
  return true;
}

}  // namespace l2ctl_bindings
