// l2ctl._fastpath: the registry's hot path in C, for the commonest case: the lone scope on a device (nothing
// else live there) that asks for no limit or for "auto", shares nothing and fixes its hit ratio. Its entry and
// its exit each take the registry's lock, update the device's state and call backend.apply_window once. The
// logic is python/l2ctl/_registry.py's (docs/DESIGN.md, "The registry"): this file only does, without the
// interpreter, what the general plan would decide for that case, and declines (returns None / False, having
// changed nothing) every other case, which the registry then plans in Python. It calls whatever backend it is
// given, the CUDA extension or the simulator, so the simulator's tests run this very code.
//
// DeviceState is the registry's per-device record (the fields _registry.py documents), a C type so that this
// code reads its fields directly; Python reads and writes them as ordinary attributes.
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

void state_dealloc(PyObject* self_object) {
  PyTypeObject* type = Py_TYPE(self_object);
  PyObject_GC_UnTrack(self_object);
  state_clear(self_object);
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
    {Py_tp_dealloc, reinterpret_cast<void*>(state_dealloc)},
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
  Locked locked;
  if (!locked.ok()) return nullptr;
  return enter_locked(args[0], reinterpret_cast<DeviceState*>(args[1]), args[2], args[3]);
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
  Locked locked;
  if (!locked.ok()) return nullptr;
  const int outcome = exit_locked(args[0], reinterpret_cast<DeviceState*>(args[1]), args[2]);
  if (outcome < 0) return nullptr;
  return PyBool_FromLong(outcome);
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
                 Name{&s_get_persisting_limit, "get_persisting_limit"}}) {
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
  return module;
}
