// l2ctl._fastpath: the registry's hot path in C, for the commonest case: the lone scope on a device (nothing
// else live there) that asks for no limit or for "auto", shares nothing and fixes its hit ratio. Its entry and
// its exit each take the registry's lock, update the device's state and call backend.apply_window once. The
// logic is python/l2ctl/_registry.py's (docs/DESIGN.md, "The registry"): this file only does, without the
// interpreter, what the general plan would decide for that case, and declines (returns None / False, having
// changed nothing) every other case, which the registry then plans in Python. It calls whatever backend it is
// given, the CUDA extension or the simulator, so the simulator's tests run this very code.
//
// DeviceState is the registry's per-device record (the fields _registry.py documents), a C type so that this
// code reads its fields directly; Python reads and writes them as ordinary attributes. PersistCore is
// l2ctl.Persist's base: its fields, and an entry and exit that take a lone stream scope to the code above
// without the interpreter (the rest goes to Persist's Python methods).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr long kPersisting = 2;  // cudaAccessPropertyPersisting

struct DeviceState {
  PyObject_HEAD
  int device;
  long long maximum;
  PyObject* scopes;           // dict: scope id -> Scope, in entry order
  PyObject* base_windows;     // dict: slot -> what it returns to
  PyObject* applied_windows;  // dict: slot -> what l2ctl last applied
  PyObject* base_limit;       // None or int (so are the next three)
  PyObject* applied_request;
  PyObject* applied_limit;
  PyObject* observed_limit;
  double in_force_demand;
  char auto_capped;
  char dirty;
  PyObject* auto_bounds;  // None or (granularity, tax-free cap)
  Py_ssize_t shared;
  Py_ssize_t autos;
  Py_ssize_t limited;
};

// Set by configure(): the registry's lock (its bound acquire/release), its id counter, and what to call under
// the lock when a batch fails (it learns what the device holds and says which exception to raise).
struct Config {
  PyObject* acquire = nullptr;
  PyObject* release = nullptr;
  PyObject* ids = nullptr;
  PyObject* on_failure = nullptr;
};
Config config;

// Interned names: the Scope fields read here, and the backend call.
PyObject *s_slots, *s_window, *s_limit, *s_share, *s_fit_hit_ratio, *s_reset_on_exit, *s_id, *s_effective,
    *s_auto, *s_apply_window, *s_get_persisting_limit;

// The exception being raised, taken (a new reference, normalised, with its traceback; null when none).
PyObject* take_error() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value != nullptr && traceback != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
#endif
}

// Raise `error` again (steals the reference; null: nothing).
void restore_error(PyObject* error) {
  if (error == nullptr) return;
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(error);
#else
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(error))), error, PyException_GetTraceback(error));
#endif
}

void set_object(PyObject** field, PyObject* value) {  // steals nothing; value may be null (None)
  PyObject* old = *field;
  *field = value ? value : Py_None;
  Py_INCREF(*field);
  Py_XDECREF(old);
}

// ---- the DeviceState type --------------------------------------------------------------------------

int state_init(PyObject* self_object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<DeviceState*>(self_object);
  static const char* names[] = {"device", "maximum", nullptr};
  int device = 0;
  long long maximum = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL", const_cast<char**>(names), &device, &maximum)) return -1;
  self->device = device;
  self->maximum = maximum;
  for (PyObject** dict : {&self->scopes, &self->base_windows, &self->applied_windows}) {
    PyObject* fresh = PyDict_New();
    if (fresh == nullptr) return -1;
    Py_XSETREF(*dict, fresh);
  }
  for (PyObject** field : {&self->base_limit, &self->applied_request, &self->applied_limit, &self->observed_limit,
                           &self->auto_bounds})
    set_object(field, Py_None);
  self->in_force_demand = 0.0;
  self->auto_capped = self->dirty = 0;
  self->shared = self->autos = self->limited = 0;
  return 0;
}

int state_traverse(PyObject* self_object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<DeviceState*>(self_object);
  Py_VISIT(Py_TYPE(self_object));
  Py_VISIT(self->scopes);
  Py_VISIT(self->base_windows);
  Py_VISIT(self->applied_windows);
  Py_VISIT(self->base_limit);
  Py_VISIT(self->applied_request);
  Py_VISIT(self->applied_limit);
  Py_VISIT(self->observed_limit);
  Py_VISIT(self->auto_bounds);
  return 0;
}

int state_clear(PyObject* self_object) {
  auto* self = reinterpret_cast<DeviceState*>(self_object);
  Py_CLEAR(self->scopes);
  Py_CLEAR(self->base_windows);
  Py_CLEAR(self->applied_windows);
  Py_CLEAR(self->base_limit);
  Py_CLEAR(self->applied_request);
  Py_CLEAR(self->applied_limit);
  Py_CLEAR(self->observed_limit);
  Py_CLEAR(self->auto_bounds);
  return 0;
}

// The dealloc of a garbage-collected heap type whose fields `clear` drops (it holds a reference to its type).
template <int (*clear)(PyObject*)>
void gc_dealloc(PyObject* self_object) {
  PyTypeObject* type = Py_TYPE(self_object);
  PyObject_GC_UnTrack(self_object);
  clear(self_object);
  type->tp_free(self_object);
  Py_DECREF(type);
}

PyObject* state_repr(PyObject* self_object) {
  auto* self = reinterpret_cast<DeviceState*>(self_object);
  return PyUnicode_FromFormat("<l2ctl registry state of device %d: %zd scopes, limit %R (base %R)>", self->device,
                              self->scopes ? PyDict_GET_SIZE(self->scopes) : 0, self->applied_limit,
                              self->base_limit);
}

#define STATE_MEMBER(name, kind, flags) {#name, kind, offsetof(DeviceState, name), flags, nullptr}
PyMemberDef state_members[] = {
    STATE_MEMBER(device, T_INT, READONLY),
    STATE_MEMBER(maximum, T_LONGLONG, READONLY),
    STATE_MEMBER(scopes, T_OBJECT_EX, READONLY),
    STATE_MEMBER(base_windows, T_OBJECT_EX, READONLY),
    STATE_MEMBER(applied_windows, T_OBJECT_EX, READONLY),
    STATE_MEMBER(base_limit, T_OBJECT, 0),
    STATE_MEMBER(applied_request, T_OBJECT, 0),
    STATE_MEMBER(applied_limit, T_OBJECT, 0),
    STATE_MEMBER(observed_limit, T_OBJECT, 0),
    STATE_MEMBER(in_force_demand, T_DOUBLE, 0),
    STATE_MEMBER(auto_capped, T_BOOL, 0),
    STATE_MEMBER(dirty, T_BOOL, 0),
    STATE_MEMBER(auto_bounds, T_OBJECT, 0),
    STATE_MEMBER(shared, T_PYSSIZET, 0),
    STATE_MEMBER(autos, T_PYSSIZET, 0),
    STATE_MEMBER(limited, T_PYSSIZET, 0),
    {nullptr, 0, 0, 0, nullptr},
};
#undef STATE_MEMBER

PyType_Slot state_slots[] = {
    {Py_tp_doc, const_cast<char*>("DeviceState(device, maximum): what the registry knows of one device "
                                  "(see l2ctl/_registry.py).")},
    {Py_tp_init, reinterpret_cast<void*>(state_init)},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_traverse, reinterpret_cast<void*>(state_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(state_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(gc_dealloc<state_clear>)},
    {Py_tp_repr, reinterpret_cast<void*>(state_repr)},
    {Py_tp_members, state_members},
    {0, nullptr},
};

PyType_Spec state_spec = {"l2ctl._fastpath.DeviceState", sizeof(DeviceState), 0,
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, state_slots};
PyTypeObject* state_type = nullptr;

// ---- helpers ---------------------------------------------------------------------------------------

// The registry's lock, held for the life of one of these objects (an RLock: the failure hook re-enters it).
class Locked {
 public:
  Locked() { ok_ = call(config.acquire); }
  ~Locked() {
    if (!ok_) return;
    PyObject* raised = take_error();  // released without losing an exception being raised
    if (!call(config.release)) PyErr_WriteUnraisable(config.release);
    restore_error(raised);
  }
  bool ok() const { return ok_; }

 private:
  static bool call(PyObject* fn) {
    PyObject* r = PyObject_CallNoArgs(fn);
    Py_XDECREF(r);
    return r != nullptr;
  }
  bool ok_;
};

// A new reference to a Scope attribute (null with an exception set).
PyObject* field(PyObject* scope, PyObject* name) { return PyObject_GetAttr(scope, name); }

int truth(PyObject* scope, PyObject* name) {
  PyObject* value = field(scope, name);
  if (value == nullptr) return -1;
  const int t = PyObject_IsTrue(value);
  Py_DECREF(value);
  return t;
}

long long round_up(long long n, long long step) { return (n + step - 1) / step * step; }

// All slots (kind, handle, generation) of one kind, the kind in *kind; false when not (then the general plan).
bool one_kind(PyObject* slots, long* kind) {
  const Py_ssize_t n = PyTuple_GET_SIZE(slots);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* slot = PyTuple_GET_ITEM(slots, i);
    if (!PyTuple_CheckExact(slot) || PyTuple_GET_SIZE(slot) != 3) return false;
    const long k = PyLong_AsLong(PyTuple_GET_ITEM(slot, 0));
    if (k == -1 && PyErr_Occurred()) return false;
    if (i == 0)
      *kind = k;
    else if (k != *kind)
      return false;
  }
  return n > 0;
}

// Whether a slot is live: its generation is the handle's current one (a closed stream's slot is not).
int live(PyObject* generations, PyObject* slot) {
  if (PyDict_GET_SIZE(generations) == 0) return 1;
  PyObject* key = PyTuple_Pack(2, PyTuple_GET_ITEM(slot, 0), PyTuple_GET_ITEM(slot, 1));
  if (key == nullptr) return -1;
  PyObject* current = PyDict_GetItemWithError(generations, key);  // borrowed
  Py_DECREF(key);
  if (current == nullptr) {
    if (PyErr_Occurred()) return -1;
    const long generation = PyLong_AsLong(PyTuple_GET_ITEM(slot, 2));
    if (generation == -1 && PyErr_Occurred()) return -1;
    return generation == 0;
  }
  return PyObject_RichCompareBool(current, PyTuple_GET_ITEM(slot, 2), Py_EQ);
}

// Whether dict[key] differs from value (a missing key differs).
int differs(PyObject* dict, PyObject* key, PyObject* value) {
  PyObject* held = PyDict_GetItemWithError(dict, key);  // borrowed
  if (held == nullptr) return PyErr_Occurred() ? -1 : 1;
  return PyObject_RichCompareBool(held, value, Py_NE);
}

// The handles of `slots` (each (kind, handle, generation)) as a tuple, what apply_window takes; null on error.
PyObject* handles_of(const std::vector<PyObject*>& slots) {
  PyObject* handles = PyTuple_New(static_cast<Py_ssize_t>(slots.size()));
  if (handles == nullptr) return nullptr;
  for (std::size_t i = 0; i < slots.size(); ++i)
    PyTuple_SET_ITEM(handles, static_cast<Py_ssize_t>(i), Py_NewRef(PyTuple_GET_ITEM(slots[i], 1)));
  return handles;
}

// backend.apply_window(...) with one window on `handles` (a tuple); a new reference to its result.
PyObject* apply_window(PyObject* backend, int device, long kind, PyObject* handles, PyObject* window, bool fresh,
                       long long limit, bool at_least, bool reset) {
  PyObject* method = PyObject_GetAttr(backend, s_apply_window);
  if (method == nullptr) return nullptr;
  PyObject* args[12] = {nullptr};
  args[0] = PyLong_FromLong(device);
  args[1] = PyLong_FromLong(kind);
  args[2] = handles;
  Py_INCREF(handles);
  for (Py_ssize_t i = 0; i < 5; ++i) {
    args[3 + i] = PyTuple_GET_ITEM(window, i);
    Py_INCREF(args[3 + i]);
  }
  args[8] = PyBool_FromLong(fresh);
  args[9] = PyLong_FromLongLong(limit);
  args[10] = PyBool_FromLong(at_least);
  args[11] = PyBool_FromLong(reset);
  PyObject* result = nullptr;
  if (args[0] && args[1] && args[9]) result = PyObject_Vectorcall(method, args, 12, nullptr);
  for (PyObject* a : args) Py_XDECREF(a);
  Py_DECREF(method);
  if (result != nullptr && (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 3)) {
    Py_DECREF(result);
    PyErr_SetString(PyExc_TypeError, "backend.apply_window must return (limit before, limit after, previous)");
    return nullptr;
  }
  return result;
}

// A batch failed (its exception is set): the registry's hook learns what the device holds, under the lock,
// and returns the exception to raise (a refused limit becomes NotSupportedError), which is set instead.
void batch_failed(PyObject* backend, DeviceState* state, PyObject* slots, bool entering) {
  PyObject* error = take_error();
  PyObject* raised = PyObject_CallFunctionObjArgs(config.on_failure, backend, reinterpret_cast<PyObject*>(state),
                                                  slots, error ? error : Py_None, entering ? Py_True : Py_False,
                                                  nullptr);
  if (raised == nullptr || !PyExceptionInstance_Check(raised)) {
    // The hook itself failed: the batch's own error is the one to see.
    Py_XDECREF(raised);
    PyErr_Clear();
    restore_error(error);
    return;
  }
  Py_XDECREF(error);
  restore_error(raised);
}

bool check_configured() {
  if (config.acquire == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "l2ctl._fastpath.configure() was not called");
    return false;
  }
  return true;
}

// ---- enter_lone ------------------------------------------------------------------------------------

// The lone scope's entry under the lock; Py_None (new reference) when the case is not the lone scope's.
PyObject* enter_locked(PyObject* backend, DeviceState* state, PyObject* scope, PyObject* generations) {
  if (PyDict_GET_SIZE(state->scopes) != 0 || state->dirty) Py_RETURN_NONE;
  PyObject* request = field(scope, s_limit);
  if (request == nullptr) return nullptr;
  bool is_auto = false;
  if (request != Py_None) {
    is_auto = PyUnicode_Check(request) && PyUnicode_Compare(request, s_auto) == 0;
    if (!is_auto) {  // an exact request: the general plan (its cudaDeviceSetLimit dwarfs the planning)
      Py_DECREF(request);
      Py_RETURN_NONE;
    }
  }
  Py_DECREF(request);
  if (is_auto && !PyTuple_Check(state->auto_bounds)) Py_RETURN_NONE;  // the granularity is probed there first
  int flag = truth(scope, s_share);
  if (flag != 0) return flag < 0 ? nullptr : Py_NewRef(Py_None);
  flag = truth(scope, s_fit_hit_ratio);
  if (flag != 0) return flag < 0 ? nullptr : Py_NewRef(Py_None);
  PyObject* window = field(scope, s_window);
  if (window == nullptr) return nullptr;
  PyObject* slots = field(scope, s_slots);
  if (slots == nullptr) {
    Py_DECREF(window);
    return nullptr;
  }
  PyObject* result = nullptr;
  PyObject* applied = nullptr;
  PyObject* seen = nullptr;
  std::vector<PyObject*> changed;  // the slots to write (borrowed from `slots`)
  long kind = 0;
  do {
    if (!PyTuple_Check(window) || PyTuple_GET_SIZE(window) != 5 || !PyTuple_CheckExact(slots) ||
        !one_kind(slots, &kind)) {
      if (PyErr_Occurred()) break;
      result = Py_NewRef(Py_None);
      break;
    }
    const double hit_ratio = PyFloat_AsDouble(PyTuple_GET_ITEM(window, 2));
    const double num_bytes = PyLong_AsDouble(PyTuple_GET_ITEM(window, 1));
    const long hit_prop = PyLong_AsLong(PyTuple_GET_ITEM(window, 3));
    if (PyErr_Occurred()) break;
    const Py_ssize_t n = PyTuple_GET_SIZE(slots);
    changed.reserve(static_cast<std::size_t>(n));
    bool any_live = false, fresh = false, failed = false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* slot = PyTuple_GET_ITEM(slots, i);
      const int alive = live(generations, slot);
      if (alive < 0) { failed = true; break; }
      if (!alive) continue;  // a closed stream is not written
      any_live = true;
      const int differ = differs(state->applied_windows, slot, window);
      if (differ < 0) { failed = true; break; }
      if (!differ) continue;
      const int known = PyDict_Contains(state->base_windows, slot);
      if (known < 0) { failed = true; break; }
      fresh = fresh || !known;
      changed.push_back(slot);
    }
    if (failed) break;
    const double demand = any_live && hit_prop == kPersisting ? hit_ratio * num_bytes : 0.0;
    // The limit: "auto" raises it to the demand rounded up to the granularity, never past the tax-free cap
    // (_registry._auto_request); with the base unknown, "at least" that (the same call reads the base).
    long long limit = -1;
    bool at_least = false, capped = false;
    if (is_auto) {
      long long need = 0;
      if (demand > 0) {
        const long long step = std::max(1LL, PyLong_AsLongLong(PyTuple_GET_ITEM(state->auto_bounds, 0)));
        const long long cap = PyLong_AsLongLong(PyTuple_GET_ITEM(state->auto_bounds, 1));
        if (PyErr_Occurred()) break;
        const long long wanted = round_up(static_cast<long long>(std::ceil(demand)), step);
        need = std::max(0LL, std::min(cap, wanted));
        capped = need < std::min(state->maximum, wanted);
      }
      if (state->base_limit == Py_None) {
        limit = need;
        at_least = true;
      } else {
        const long long base = PyLong_AsLongLong(state->base_limit);
        if (base == -1 && PyErr_Occurred()) break;
        const long long wanted = std::max(base, need);
        PyObject* wanted_object = PyLong_FromLongLong(wanted);
        if (wanted_object == nullptr) break;
        const int same = PyObject_RichCompareBool(wanted_object, state->applied_request, Py_EQ);
        Py_DECREF(wanted_object);
        if (same < 0) break;
        if (!same) limit = wanted;
      }
    }
    if (limit < 0 && state->applied_limit == Py_None && state->observed_limit == Py_None) {
      // What the scope's warnings compare with, read before anything changes (a failure here changes nothing).
      PyObject* device = PyLong_FromLong(state->device);
      PyObject* read = device ? PyObject_CallMethodOneArg(backend, s_get_persisting_limit, device) : nullptr;
      Py_XDECREF(device);
      PyObject* as_int = read ? PyNumber_Long(read) : nullptr;
      Py_XDECREF(read);
      if (as_int == nullptr) break;
      set_object(&state->observed_limit, as_int);
      Py_DECREF(as_int);
    }
    const Py_ssize_t count = static_cast<Py_ssize_t>(changed.size());
    if (count > 0 || limit >= 0) {
      PyObject* handles = handles_of(changed);
      if (handles == nullptr) break;
      applied = apply_window(backend, state->device, kind, handles, window, fresh, limit, at_least, false);
      Py_DECREF(handles);
      if (applied == nullptr) {
        batch_failed(backend, state, slots, true);
        break;
      }
      PyObject* previous = PyTuple_GET_ITEM(applied, 2);  // a list (or tuple) of windows
      if (fresh && (!(PyList_Check(previous) || PyTuple_Check(previous)) || PySequence_Fast_GET_SIZE(previous) < count)) {
        PyErr_SetString(PyExc_TypeError, "backend.apply_window returned fewer previous windows than handles");
        batch_failed(backend, state, slots, true);
        break;
      }
      // From here on nothing may fail half-way: the device holds the window.
      for (Py_ssize_t i = 0; i < count && !failed; ++i) {
        PyObject* slot = changed[static_cast<std::size_t>(i)];
        if (fresh) {
          const int known = PyDict_Contains(state->base_windows, slot);
          if (known < 0 || (!known && PyDict_SetItem(state->base_windows, slot, PySequence_Fast_GET_ITEM(previous, i)) < 0))
            failed = true;
        }
        if (!failed && PyDict_SetItem(state->applied_windows, slot, window) < 0) failed = true;
      }
      if (failed) break;
      if (limit >= 0) {  // _registry._record_limit
        PyObject* before = PyNumber_Long(PyTuple_GET_ITEM(applied, 0));
        PyObject* after = PyNumber_Long(PyTuple_GET_ITEM(applied, 1));
        PyObject* asked = at_least ? Py_NewRef(after) : PyLong_FromLongLong(limit);
        if (before == nullptr || after == nullptr || asked == nullptr) {
          Py_XDECREF(before);
          Py_XDECREF(after);
          Py_XDECREF(asked);
          break;
        }
        if (state->base_limit == Py_None) set_object(&state->base_limit, before);
        set_object(&state->applied_request, asked);
        set_object(&state->applied_limit, after);
        set_object(&state->observed_limit, after);
        Py_DECREF(before);
        Py_DECREF(after);
        Py_DECREF(asked);
      }
    }
    // Registered: the scope is in force with its own window.
    PyObject* key = PyIter_Next(config.ids);
    if (key == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the registry's id counter ended");
      break;
    }
    const bool ok = PyObject_SetAttr(scope, s_id, key) == 0 && PyObject_SetAttr(scope, s_effective, window) == 0 &&
                    PyDict_SetItem(state->scopes, key, scope) == 0;
    Py_DECREF(key);
    if (!ok) break;
    if (is_auto) {
      state->limited = state->autos = 1;
      state->auto_capped = capped;
    }
    state->in_force_demand = demand;
    seen = state->applied_limit != Py_None ? state->applied_limit : state->observed_limit;
    result = Py_BuildValue("(OdO)", seen, demand, (is_auto && capped) ? Py_True : Py_False);
  } while (false);
  Py_XDECREF(applied);
  Py_DECREF(window);
  Py_DECREF(slots);
  return result;
}

// enter_locked under the registry's lock (its outcomes; null when the lock could not be taken).
PyObject* enter_under_lock(PyObject* backend, DeviceState* state, PyObject* scope, PyObject* generations) {
  Locked locked;
  return locked.ok() ? enter_locked(backend, state, scope, generations) : nullptr;
}

constexpr const char* enter_lone_doc =
    "enter_lone(backend, state, scope, generations) -> (limit, demand, capped) | None\n\n"
    "Register a lone scope and apply its window in one backend call (see _registry.enter); None when the "
    "case is not the lone scope's (nothing changed).";

PyObject* enter_lone(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyObject_TypeCheck(args[1], state_type) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "enter_lone(backend, state: DeviceState, scope, generations: dict)");
    return nullptr;
  }
  if (!check_configured()) return nullptr;
  return enter_under_lock(args[0], reinterpret_cast<DeviceState*>(args[1]), args[2], args[3]);
}

// ---- exit_lone -------------------------------------------------------------------------------------

// The lone scope's exit under the lock: 1 done (or the scope was not registered), 0 not the lone case, -1 error.
int exit_locked(PyObject* backend, DeviceState* state, PyObject* scope) {
  PyObject* key = field(scope, s_id);
  if (key == nullptr) return -1;
  PyObject* registered = PyDict_GetItemWithError(state->scopes, key);  // borrowed
  if (registered != scope) {
    Py_DECREF(key);
    return PyErr_Occurred() ? -1 : 1;  // ended already (exit is idempotent)
  }
  if (PyDict_GET_SIZE(state->scopes) != 1 || state->dirty) {
    Py_DECREF(key);
    return 0;
  }
  const int share = truth(scope, s_share);
  const int reset = share == 0 ? truth(scope, s_reset_on_exit) : 0;
  PyObject* slots = share == 0 && reset >= 0 ? field(scope, s_slots) : nullptr;
  if (slots == nullptr) {  // a shared scope (the general plan rebalances the others), or an error
    Py_DECREF(key);
    return share > 0 ? 0 : -1;
  }
  int outcome = -1;
  std::vector<PyObject*> changed;  // the slots to write back (borrowed from `slots`)
  do {
    long kind = 0;
    if (!PyTuple_CheckExact(slots) || !one_kind(slots, &kind)) {
      outcome = PyErr_Occurred() ? -1 : 0;
      break;
    }
    // Every slot back to its base (none for a handle that died): one crossing when they share one base.
    PyObject* base = nullptr;  // borrowed, the common base
    bool failed = false, mixed = false;
    const Py_ssize_t n = PyTuple_GET_SIZE(slots);
    for (Py_ssize_t i = 0; i < n && !failed && !mixed; ++i) {
      PyObject* slot = PyTuple_GET_ITEM(slots, i);
      PyObject* own = PyDict_GetItemWithError(state->base_windows, slot);
      if (own == nullptr) {
        failed = PyErr_Occurred() != nullptr;
        continue;
      }
      const int differ = differs(state->applied_windows, slot, own);
      if (differ < 0) { failed = true; break; }
      if (!differ) continue;
      if (base == nullptr) {
        base = own;
      } else if (own != base) {
        const int same = PyObject_RichCompareBool(own, base, Py_EQ);
        if (same < 0) { failed = true; break; }
        mixed = !same;
      }
      if (!mixed) changed.push_back(slot);
    }
    if (failed) break;
    if (mixed) {  // several bases: the general plan's batch
      outcome = 0;
      break;
    }
    long long limit = -1;
    if (state->base_limit != Py_None) {
      const int same = PyObject_RichCompareBool(state->applied_request, state->base_limit, Py_EQ);
      if (same < 0) break;
      if (!same) {
        limit = PyLong_AsLongLong(state->base_limit);
        if (limit == -1 && PyErr_Occurred()) break;
      }
    }
    if (PyDict_DelItem(state->scopes, key) < 0) break;
    if (!changed.empty() || limit >= 0 || reset) {
      PyObject* empty = nullptr;
      if (base == nullptr) {
        empty = Py_BuildValue("(iidii)", 0, 0, 0.0, 0, 0);
        if (empty == nullptr) break;
      }
      PyObject* handle_tuple = handles_of(changed);
      PyObject* applied = handle_tuple == nullptr ? nullptr
                                                  : apply_window(backend, state->device, kind, handle_tuple,
                                                                 base ? base : empty, false, limit, false, reset != 0);
      Py_XDECREF(handle_tuple);
      Py_XDECREF(empty);
      if (applied == nullptr) {
        state->limited = state->autos = state->shared = 0;
        batch_failed(backend, state, slots, false);
        break;
      }
      if (limit >= 0) {
        PyObject* after = PyNumber_Long(PyTuple_GET_ITEM(applied, 1));
        if (after != nullptr) set_object(&state->observed_limit, after);
        Py_XDECREF(after);
      }
      Py_DECREF(applied);
    }
    // Nothing live: the device is forgotten until a scope needs it again (_registry._forget_device).
    PyDict_Clear(state->base_windows);
    PyDict_Clear(state->applied_windows);
    set_object(&state->base_limit, Py_None);
    set_object(&state->applied_limit, Py_None);
    set_object(&state->applied_request, Py_None);
    state->limited = state->autos = state->shared = 0;
    outcome = PyErr_Occurred() ? -1 : 1;
  } while (false);
  Py_DECREF(slots);
  Py_DECREF(key);
  return outcome;
}

// exit_locked under the registry's lock (its outcomes; -1 when the lock could not be taken).
int exit_under_lock(PyObject* backend, DeviceState* state, PyObject* scope) {
  Locked locked;
  return locked.ok() ? exit_locked(backend, state, scope) : -1;
}

constexpr const char* exit_lone_doc =
    "exit_lone(backend, state, scope) -> bool\n\n"
    "End the lone scope on a device in one backend call (see _registry.exit); False when the case is not the "
    "lone scope's (nothing changed).";

PyObject* exit_lone(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyObject_TypeCheck(args[1], state_type)) {
    PyErr_SetString(PyExc_TypeError, "exit_lone(backend, state: DeviceState, scope)");
    return nullptr;
  }
  if (!check_configured()) return nullptr;
  const int outcome = exit_under_lock(args[0], reinterpret_cast<DeviceState*>(args[1]), args[2]);
  if (outcome < 0) return nullptr;
  return PyBool_FromLong(outcome);
}

// ---- PersistCore: a persist scope's fields, and its entry and exit on a stream ----------------------

// l2ctl.Persist's base: the fields Persist.__init__ sets (checked there), and __enter__/__exit__ that take the
// commonest case without the interpreter: a scope on a stream of a known device, over a whole l2ctl buffer (or
// any buffer, checked by the configured check_owned_pointer) that fits the device's largest window, with a
// fixed hit ratio, no limit or "auto", not shared, on a device whose properties and registry record are known
// and where it is the lone scope. Every other case (and every argument or state error) goes to Persist's
// Python methods, which are the general path; this one decides nothing they would not.
struct PersistCore {
  PyObject_HEAD
  PyObject* enabled;
  PyObject* ref;            // StreamRef or None (a graph target)
  PyObject* target_object;  // what was passed as the stream
  PyObject* buffer;         // BufferRef
  PyObject* offset;
  PyObject* num_bytes;
  PyObject* hit_prop;
  PyObject* miss_prop;
  PyObject* requested_hit_ratio;
  PyObject* limit_request;
  PyObject* reset_on_exit;
  PyObject* share;
  PyObject* scope;    // the registry's Scope while live
  PyObject* slots;
  PyObject* changed;  // what to call after a graph's windows changed
  PyObject* window;
  PyObject* device;
  PyObject* clipped;
};

// Set by configure_persist(): where the hot path reads what Persist's Python would (the active backend, the
// registry's last-backend tuple, the properties cache), the types it makes, and the checks it delegates.
struct PersistConfig {
  PyObject* backend_module = nullptr;   // l2ctl._backend (its _active)
  PyObject* registry_module = nullptr;  // l2ctl._registry (its _registry.last, CHECK_FAST_PATHS, _verify_fast_path)
  PyObject* properties_last = nullptr;  // l2ctl._device._last: [backend, {device: DeviceProperties}]
  PyObject* scope_type = nullptr;       // _registry.Scope
  PyObject* window_type = nullptr;      // AccessPolicyWindow (a tuple subclass)
  PyObject* check_owned_pointer = nullptr;
};
PersistConfig persist_config;

PyObject *s_active, *s_registry, *s_last, *s_check_fast_paths, *s_verify_fast_path, *s_supports_persistence,
    *s_access_policy_max_window_size, *s_device, *s_enter_general, *s_exit_general, *s_announce, *s_the_buffer,
    *s_add_note;

PyObject* persist_core_field(PyObject* value) { return value ? value : Py_None; }  // borrowed, null as None

// A new reference to the registry's tuple (backend, states, generations) when it is `backend`'s; null (no
// error set) when it is not, null with an error set on failure.
PyObject* registry_last(PyObject* backend) {
  PyObject* registry = PyObject_GetAttr(persist_config.registry_module, s_registry);
  if (registry == nullptr) return nullptr;
  PyObject* last = PyObject_GetAttr(registry, s_last);
  Py_DECREF(registry);
  if (last == nullptr) return nullptr;
  if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 3 || PyTuple_GET_ITEM(last, 0) != backend ||
      !PyDict_Check(PyTuple_GET_ITEM(last, 1)) || !PyDict_Check(PyTuple_GET_ITEM(last, 2))) {
    Py_DECREF(last);
    return nullptr;
  }
  return last;
}

// The tests' cross-check of every fast path against the general plan (_registry.CHECK_FAST_PATHS).
bool verify_if_checking(PyObject* backend, DeviceState* state) {
  PyObject* flag = PyObject_GetAttr(persist_config.registry_module, s_check_fast_paths);
  if (flag == nullptr) return false;
  const int on = PyObject_IsTrue(flag);
  Py_DECREF(flag);
  if (on <= 0) return on == 0;
  PyObject* verified = PyObject_CallMethodObjArgs(persist_config.registry_module, s_verify_fast_path, backend,
                                                  reinterpret_cast<PyObject*>(state), nullptr);
  Py_XDECREF(verified);
  return verified != nullptr;
}

// A window (an AccessPolicyWindow, made as tuple.__new__ makes a tuple subclass) of these five values.
PyObject* make_window(PyObject* ptr, PyObject* nbytes, PyObject* hit_ratio, PyObject* hit_prop, PyObject* miss_prop) {
  auto* type = reinterpret_cast<PyTypeObject*>(persist_config.window_type);
  PyObject* window = type->tp_alloc(type, 5);
  if (window == nullptr) return nullptr;
  PyObject* items[5] = {ptr, nbytes, hit_ratio, hit_prop, miss_prop};
  for (Py_ssize_t i = 0; i < 5; ++i) PyTuple_SET_ITEM(window, i, Py_NewRef(items[i]));
  return window;
}

// The stream scope's entry with the fields it reads held (Python code runs below: a foreign buffer's check,
// the Scope's constructor, the lock; the fields may be reassigned meanwhile): 1 entered (the scope's fields
// set; *announce when a warning is due), 0 not this path's case (nothing changed), -1 an error (nothing
// changed, or what the registry's failure hook left).
int enter_stream_held(PersistCore* self, PyObject* ref, PyObject* buffer, PyObject* requested, PyObject* request,
                      PyObject* reset_on_exit, PyObject** announce) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) != 4 || !PyTuple_Check(buffer) || PyTuple_GET_SIZE(buffer) != 6)
    return 0;
  PyObject* device = PyTuple_GET_ITEM(ref, 1);
  PyObject* buffer_device = PyTuple_GET_ITEM(buffer, 2);
  if (!PyLong_CheckExact(device) || !PyFloat_CheckExact(requested) || self->share != Py_False ||
      (reset_on_exit != Py_True && reset_on_exit != Py_False) || persist_core_field(self->num_bytes) != Py_None ||
      self->offset == nullptr || !PyLong_CheckExact(self->offset) || PyObject_IsTrue(self->offset) != 0 ||
      !PyLong_CheckExact(PyTuple_GET_ITEM(buffer, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(buffer, 1)))
    return 0;  // (an exact int's truth cannot fail)
  if (request != Py_None && !(PyUnicode_Check(request) && PyUnicode_Compare(request, s_auto) == 0)) {
    if (PyErr_Occurred()) PyErr_Clear();
    return 0;
  }
  if (buffer_device != Py_None) {  // another device's buffer: the general path says so
    const int same = PyObject_RichCompareBool(buffer_device, device, Py_EQ);
    if (same <= 0) return same;
  }
  PyObject* backend = PyObject_GetAttr(persist_config.backend_module, s_active);
  if (backend == nullptr) return -1;
  int outcome = -1;
  PyObject *last = nullptr, *window = nullptr, *slots = nullptr, *scope = nullptr, *seen = nullptr;
  do {
    // The device's properties as properties() caches them for this backend (not known yet: the general path).
    PyObject* cache = persist_config.properties_last;
    if (!PyList_Check(cache) || PyList_GET_SIZE(cache) != 2 || PyList_GET_ITEM(cache, 0) != backend ||
        !PyDict_Check(PyList_GET_ITEM(cache, 1))) {
      outcome = 0;
      break;
    }
    PyObject* props = PyDict_GetItemWithError(PyList_GET_ITEM(cache, 1), device);  // borrowed
    if (props == nullptr) {
      outcome = PyErr_Occurred() ? -1 : 0;
      break;
    }
    Py_INCREF(props);
    const int supported = truth(props, s_supports_persistence);
    PyObject* max_window_object = supported > 0 ? field(props, s_access_policy_max_window_size) : nullptr;
    Py_DECREF(props);
    if (supported <= 0 || max_window_object == nullptr) {
      outcome = supported == 0 ? 0 : -1;  // unsupported: the general path raises, saying why
      break;
    }
    const long long max_window = PyLong_AsLongLong(max_window_object);
    Py_DECREF(max_window_object);
    const long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(buffer, 1));
    if (PyErr_Occurred()) break;
    if (nbytes > max_window) {  // clipped, with a warning: the general path
      outcome = 0;
      break;
    }
    last = registry_last(backend);
    if (last == nullptr) {
      outcome = PyErr_Occurred() ? -1 : 0;
      break;
    }
    PyObject* state_object = PyDict_GetItemWithError(PyTuple_GET_ITEM(last, 1), device);  // borrowed
    if (state_object == nullptr || !PyObject_TypeCheck(state_object, state_type)) {
      outcome = PyErr_Occurred() ? -1 : 0;
      break;
    }
    auto* state = reinterpret_cast<DeviceState*>(state_object);
    if (PyDict_GET_SIZE(state->scopes) != 0 || state->dirty) {  // not the lone scope: the general plan
      outcome = 0;
      break;
    }
    const int allocation = PyObject_IsTrue(PyTuple_GET_ITEM(buffer, 5));
    if (allocation < 0) break;
    if (!allocation) {  // a foreign buffer: its range is checked (and remembered) as the general path does
      PyObject* checked = PyObject_CallFunctionObjArgs(persist_config.check_owned_pointer, PyTuple_GET_ITEM(buffer, 0),
                                                       PyTuple_GET_ITEM(buffer, 1), device, PyTuple_GET_ITEM(buffer, 4),
                                                       s_the_buffer, nullptr);
      if (checked == nullptr) break;
      Py_DECREF(checked);
    }
    // The slot: (STREAM, handle, generation), as _registry.stream_slot makes it.
    PyObject* generations = PyTuple_GET_ITEM(last, 2);
    PyObject* handle = PyTuple_GET_ITEM(ref, 0);
    PyObject* zero = PyLong_FromLong(0);
    if (zero == nullptr) break;
    PyObject* generation = zero;
    if (PyDict_GET_SIZE(generations) != 0) {
      PyObject* key = PyTuple_Pack(2, zero, handle);
      PyObject* known = key ? PyDict_GetItemWithError(generations, key) : nullptr;  // borrowed
      Py_XDECREF(key);
      if (known == nullptr && PyErr_Occurred()) {
        Py_DECREF(zero);
        break;
      }
      if (known != nullptr) generation = known;
    }
    PyObject* slot = PyTuple_Pack(3, zero, handle, generation);
    Py_DECREF(zero);
    slots = slot ? PyTuple_Pack(1, slot) : nullptr;
    Py_XDECREF(slot);
    if (slots == nullptr) break;
    window = make_window(PyTuple_GET_ITEM(buffer, 0), PyTuple_GET_ITEM(buffer, 1), requested,
                         persist_core_field(self->hit_prop), persist_core_field(self->miss_prop));
    if (window == nullptr) break;
    PyObject* owners = PyTuple_Pack(2, PyTuple_GET_ITEM(ref, 3), PyTuple_GET_ITEM(buffer, 4));
    if (owners == nullptr) break;
    // Scope(device, slots, window, limit, share, reset_on_exit, fit_hit_ratio, standing, orphaned, owner)
    PyObject* args[10] = {device, slots, window, request, Py_False, reset_on_exit, Py_False, Py_False, Py_False,
                          owners};
    scope = PyObject_Vectorcall(persist_config.scope_type, args, 10, nullptr);
    Py_DECREF(owners);
    if (scope == nullptr) break;
    seen = enter_under_lock(backend, state, scope, generations);
    if (seen == nullptr) break;
    if (seen == Py_None) {
      outcome = 0;
      break;
    }
    if (!verify_if_checking(backend, state)) break;
    // Entered: what the scope describes, as the general path sets it.
    Py_XSETREF(self->scope, Py_NewRef(scope));
    Py_XSETREF(self->slots, Py_NewRef(slots));
    Py_XSETREF(self->changed, Py_NewRef(Py_None));
    Py_XSETREF(self->device, Py_NewRef(device));
    Py_XSETREF(self->clipped, Py_NewRef(Py_False));
    Py_XSETREF(self->window, Py_NewRef(window));
    // Nothing to tell unless "auto" was capped or the windows ask more than the set-aside (_announce's cases).
    PyObject* limit = PyTuple_GET_ITEM(seen, 0);
    const double demand = PyFloat_AsDouble(PyTuple_GET_ITEM(seen, 1));
    const long hit_prop = PyLong_AsLong(PyTuple_GET_ITEM(window, 3));
    const double limit_value = limit == Py_None ? 0.0 : PyLong_AsDouble(limit);
    if (PyErr_Occurred()) PyErr_Clear();  // then the announcement decides
    if (PyTuple_GET_ITEM(seen, 2) == Py_True || (hit_prop == kPersisting && !(demand <= limit_value)))
      *announce = Py_NewRef(seen);
    outcome = 1;
  } while (false);
  Py_XDECREF(seen);
  Py_XDECREF(scope);
  Py_XDECREF(window);
  Py_XDECREF(slots);
  Py_XDECREF(last);
  Py_DECREF(backend);
  return outcome;
}

// The stream scope's entry (enter_stream_held's outcomes), when the registry and this path are configured.
int enter_stream(PersistCore* self, PyObject** announce) {
  if (persist_config.backend_module == nullptr || config.acquire == nullptr) return 0;
  if (persist_core_field(self->scope) != Py_None || self->enabled != Py_True || self->ref == nullptr ||
      self->buffer == nullptr)
    return 0;
  PyObject* held[5] = {Py_NewRef(self->ref), Py_NewRef(self->buffer),
                       Py_NewRef(persist_core_field(self->requested_hit_ratio)),
                       Py_NewRef(persist_core_field(self->limit_request)),
                       Py_NewRef(persist_core_field(self->reset_on_exit))};
  const int outcome = enter_stream_held(self, held[0], held[1], held[2], held[3], held[4], announce);
  for (PyObject* object : held) Py_DECREF(object);
  return outcome;
}

PyObject* persist_enter(PyObject* self_object, PyObject*) {
  auto* self = reinterpret_cast<PersistCore*>(self_object);
  PyObject* announce = nullptr;
  const int entered = enter_stream(self, &announce);
  if (entered < 0) return nullptr;
  if (entered == 0) return PyObject_CallMethodNoArgs(self_object, s_enter_general);
  if (announce != nullptr) {  // the warnings, in Python (a filter may raise: then the scope ends there)
    PyObject* none = PyObject_CallMethodObjArgs(self_object, s_announce, Py_None, PyTuple_GET_ITEM(announce, 0),
                                                PyTuple_GET_ITEM(announce, 1), PyTuple_GET_ITEM(announce, 2), nullptr);
    Py_DECREF(announce);
    if (none == nullptr) return nullptr;
    Py_DECREF(none);
  }
  return Py_NewRef(self_object);
}

PyObject* persist_exit(PyObject* self_object, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "__exit__(exc_type, exc, traceback)");
    return nullptr;
  }
  auto* self = reinterpret_cast<PersistCore*>(self_object);
  PyObject* scope = self->scope;  // taken: the scope ends once, whatever happens below
  if (scope == nullptr || scope == Py_None) Py_RETURN_NONE;
  self->scope = Py_NewRef(Py_None);
  int outcome = 0;
  PyObject* backend = nullptr;
  if (persist_config.backend_module != nullptr && config.acquire != nullptr &&
      persist_core_field(self->changed) == Py_None) {
    backend = PyObject_GetAttr(persist_config.backend_module, s_active);
    PyObject* last = backend ? registry_last(backend) : nullptr;
    PyObject* device = last ? field(scope, s_device) : nullptr;
    PyObject* state = device ? PyDict_GetItemWithError(PyTuple_GET_ITEM(last, 1), device) : nullptr;  // borrowed
    Py_XDECREF(device);
    if (state != nullptr && PyObject_TypeCheck(state, state_type)) {
      outcome = exit_under_lock(backend, reinterpret_cast<DeviceState*>(state), scope);
      if (outcome > 0 && !verify_if_checking(backend, reinterpret_cast<DeviceState*>(state))) outcome = -1;
    } else if (PyErr_Occurred()) {
      outcome = -1;
    }
    Py_XDECREF(last);
  }
  Py_XDECREF(backend);
  PyObject* result = nullptr;
  if (outcome == 0) {  // the general path (another scope live, a graph, a failed device): Persist._exit_general
    result = PyObject_CallMethodObjArgs(self_object, s_exit_general, scope, args[1], nullptr);
  } else if (outcome > 0) {
    result = Py_NewRef(Py_None);
  } else if (args[1] == Py_None) {
    result = nullptr;  // ending the scope failed, and nothing else is being raised: this is the error
  } else {
    // The block raised and ending the scope failed too: the block's error is the one to see, with a note.
    PyObject* error = take_error();
    PyObject* note = PyUnicode_FromFormat("l2ctl: restoring device state after the error also failed: %R",
                                          error ? error : Py_None);
    PyObject* noted = note && PyObject_HasAttr(args[1], s_add_note)
                          ? PyObject_CallMethodObjArgs(args[1], s_add_note, note, nullptr)
                          : nullptr;
    Py_XDECREF(noted);
    Py_XDECREF(note);
    Py_XDECREF(error);
    PyErr_Clear();
    result = Py_NewRef(Py_None);
  }
  Py_DECREF(scope);
  return result;
}

#define PERSIST_FIELDS(X)                                                                                        \
  X(enabled, "_enabled") X(ref, "_ref") X(target_object, "_target_object") X(buffer, "_buffer")                  \
  X(offset, "_offset") X(num_bytes, "_num_bytes") X(hit_prop, "_hit_prop") X(miss_prop, "_miss_prop")            \
  X(requested_hit_ratio, "_requested_hit_ratio") X(limit_request, "_limit_request")                              \
  X(reset_on_exit, "_reset_on_exit") X(share, "_share") X(scope, "_scope") X(slots, "_slots")                    \
  X(changed, "_changed") X(window, "window") X(device, "device") X(clipped, "clipped")

int persist_traverse(PyObject* self_object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<PersistCore*>(self_object);
  Py_VISIT(Py_TYPE(self_object));
#define VISIT_FIELD(name, text) Py_VISIT(self->name);
  PERSIST_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
  return 0;
}

int persist_clear(PyObject* self_object) {
  auto* self = reinterpret_cast<PersistCore*>(self_object);
#define CLEAR_FIELD(name, text) Py_CLEAR(self->name);
  PERSIST_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
  return 0;
}

PyMemberDef persist_members[] = {
#define MEMBER_FIELD(name, text) {text, T_OBJECT_EX, offsetof(PersistCore, name), 0, nullptr},
    PERSIST_FIELDS(MEMBER_FIELD)
#undef MEMBER_FIELD
    {nullptr, 0, 0, 0, nullptr},
};

PyMethodDef persist_methods[] = {
    {"__enter__", persist_enter, METH_NOARGS, "Enter the scope (the stream case here, any other in _enter_general)."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(persist_exit)), METH_FASTCALL,
     "End the scope (the lone scope's case here, any other in _exit_general)."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot persist_slots[] = {
    {Py_tp_doc, const_cast<char*>("The fields of an l2ctl.Persist and its entry and exit (see l2ctl/_persist.py).")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_traverse, reinterpret_cast<void*>(persist_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(persist_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(gc_dealloc<persist_clear>)},
    {Py_tp_members, persist_members},
    {Py_tp_methods, persist_methods},
    {0, nullptr},
};

PyType_Spec persist_spec = {"l2ctl._fastpath.PersistCore", sizeof(PersistCore), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE, persist_slots};

PyObject* configure_persist(PyObject*, PyObject* args) {
  PyObject *backend_module, *registry_module, *properties_last, *scope_type, *window_type, *check_owned_pointer;
  if (!PyArg_ParseTuple(args, "OOO!O!O!O:configure_persist", &backend_module, &registry_module, &PyList_Type,
                        &properties_last, &PyType_Type, &scope_type, &PyType_Type, &window_type,
                        &check_owned_pointer))
    return nullptr;
  if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(window_type), &PyTuple_Type) ||
      !PyCallable_Check(check_owned_pointer)) {
    PyErr_SetString(PyExc_TypeError, "configure_persist: the window type must be a tuple subclass and the check "
                                     "a callable");
    return nullptr;
  }
  PyObject* const values[] = {backend_module, registry_module, properties_last, scope_type, window_type,
                              check_owned_pointer};
  PyObject** const fields[] = {&persist_config.backend_module, &persist_config.registry_module,
                               &persist_config.properties_last, &persist_config.scope_type,
                               &persist_config.window_type, &persist_config.check_owned_pointer};
  for (std::size_t i = 0; i < 6; ++i) Py_XSETREF(*fields[i], Py_NewRef(values[i]));
  Py_RETURN_NONE;
}

// ---- configure -------------------------------------------------------------------------------------

PyObject* configure(PyObject*, PyObject* args) {
  PyObject *lock, *ids, *on_failure;
  if (!PyArg_ParseTuple(args, "OOO:configure", &lock, &ids, &on_failure)) return nullptr;
  if (!PyIter_Check(ids) || !PyCallable_Check(on_failure)) {
    PyErr_SetString(PyExc_TypeError, "configure(lock, ids: iterator, on_failure: callable)");
    return nullptr;
  }
  PyObject* acquire = PyObject_GetAttrString(lock, "acquire");
  PyObject* release = PyObject_GetAttrString(lock, "release");
  if (acquire == nullptr || release == nullptr) {
    Py_XDECREF(acquire);
    Py_XDECREF(release);
    return nullptr;
  }
  Py_XSETREF(config.acquire, acquire);
  Py_XSETREF(config.release, release);
  Py_INCREF(ids);
  Py_XSETREF(config.ids, ids);
  Py_INCREF(on_failure);
  Py_XSETREF(config.on_failure, on_failure);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"enter_lone", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(enter_lone)), METH_FASTCALL,
     enter_lone_doc},
    {"exit_lone", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(exit_lone)), METH_FASTCALL,
     exit_lone_doc},
    {"configure_persist", configure_persist, METH_VARARGS,
     "configure_persist(backend_module, registry_module, properties_last, scope_type, window_type, "
     "check_owned_pointer): what PersistCore's stream path reads and calls."},
    {"configure", configure, METH_VARARGS,
     "configure(lock, ids, on_failure): the registry's lock, scope-id counter and failed-batch hook."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fastpath",
                          "The registry's lone-scope path in C (see l2ctl/_registry.py).", -1, methods,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fastpath() {
  struct Name {
    PyObject** slot;
    const char* text;
  };
  for (Name n : {Name{&s_slots, "slots"}, Name{&s_window, "window"}, Name{&s_limit, "limit"},
                 Name{&s_share, "share"}, Name{&s_fit_hit_ratio, "fit_hit_ratio"},
                 Name{&s_reset_on_exit, "reset_on_exit"}, Name{&s_id, "id"}, Name{&s_effective, "effective"},
                 Name{&s_auto, "auto"}, Name{&s_apply_window, "apply_window"},
                 Name{&s_get_persisting_limit, "get_persisting_limit"}, Name{&s_active, "_active"},
                 Name{&s_registry, "_registry"}, Name{&s_last, "last"}, Name{&s_check_fast_paths, "CHECK_FAST_PATHS"},
                 Name{&s_verify_fast_path, "_verify_fast_path"},
                 Name{&s_supports_persistence, "supports_persistence"},
                 Name{&s_access_policy_max_window_size, "access_policy_max_window_size"}, Name{&s_device, "device"},
                 Name{&s_enter_general, "_enter_general"}, Name{&s_exit_general, "_exit_general"},
                 Name{&s_announce, "_announce"}, Name{&s_the_buffer, "the buffer"}, Name{&s_add_note, "add_note"}}) {
    *n.slot = PyUnicode_InternFromString(n.text);
    if (*n.slot == nullptr) return nullptr;
  }
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  state_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&state_spec));
  if (state_type == nullptr || PyModule_AddObjectRef(module, "DeviceState", reinterpret_cast<PyObject*>(state_type)) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  PyObject* persist_type = PyType_FromSpec(&persist_spec);
  if (persist_type == nullptr || PyModule_AddObjectRef(module, "PersistCore", persist_type) < 0) {
    Py_XDECREF(persist_type);
    Py_DECREF(module);
    return nullptr;
  }
  Py_DECREF(persist_type);
  return module;
}
