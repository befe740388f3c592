// `l2ctl.persist`'s scope as a plain CPython type (`_core._planner.Persist`): made in one vectorcall, entered in
// four steps (resolve where the window goes, check and plan it, record the scope in the registry, announce what
// the entry did), ended by `__exit__`, `stop()` or its finalizer. persist_type.hpp says why it is not a pybind11
// class.
#include <Python.h>
#include <structmember.h>

#include <cmath>
#include <string>
#include <vector>

#include "persist_type.hpp"

namespace l2ctl_bindings {

PyTypeObject* persist_type = nullptr;

namespace {



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

// What an entry learnt, forgotten (`idle`: the object describes an entry that changed nothing).
void forget_entry(Persist* self, bool idle) {
  self->idle = idle;
  self->has_window = self->clipped = self->has_slots = false;
  self->device = -1;
  self->first_slot = 0;
  Py_CLEAR(self->window);
}

// The arguments in vectorcall's form: placed by name, their common forms taken in C++, any other through _prepare.
int initialise(Persist* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (self->live) {
    PyErr_SetString(PyExc_RuntimeError, "this persist scope is live: end it before initialising it again");
    return -1;
  }
  if (self->entering) {
    PyErr_SetString(PyExc_RuntimeError, "this persist scope is being entered: it cannot be initialised again now");
    return -1;
  }
  if (!host.registered) {
    PyErr_SetString(PyExc_RuntimeError, "l2ctl's compiled layer has no Host: use l2ctl.persist");
    return -1;
  }
  PyObject* v[n_args];
  if (!place_arguments(args, nargs, kwnames, v)) return -1;
  return guarded(
      [&] {
        self->own_released = own_released.load();  // first: a close from now on is seen at entry
        bool common;
        {
          const Object_table_use use;  // take_common holds pointers into the table of foreign objects
          common = take_common(self, v);
        }
        if (!common) take_prepared(self, args, nargs, kwnames, v);
        forget_entry(self, false);
        Py_CLEAR(self->changed);
        Py_CLEAR(self->executables);
        return 0;
      },
      -1);
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
  return initialise(reinterpret_cast<Persist*>(self), flat.data(), nargs, names ? names.ptr() : nullptr);
}

// `persist(...)`: made and initialised in one vectorcall (no argument tuple or dict).
PyObject* persist_vectorcall(PyObject* type, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  PyObject* self = persist_new(reinterpret_cast<PyTypeObject*>(type), nullptr, nullptr);
  if (self == nullptr) return nullptr;
  if (initialise(reinterpret_cast<Persist*>(self), args, PyVectorcall_NARGS(nargsf), kwnames) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  return self;
}

// ---- entry --------------------------------------------------------------------------------------------------

// `f(args...)` for a Host callable whose result is not needed.
template <typename... Args>
void call_host(PyObject* f, Args... args) {
  PyObject* r = PyObject_CallFunctionObjArgs(f, args..., nullptr);
  if (r == nullptr) throw py::error_already_set();
  Py_DECREF(r);
}

int device_of_stream(Persist* self) {
  if (self->stream_device >= 0) return self->stream_device;
  PyObject* d = PyObject_CallOneArg(host.stream_device, self->stream_ref);
  if (d == nullptr) throw py::error_already_set();
  const int device = static_cast<int>(as_ll(d));
  Py_DECREF(d);
  return device;
}

// A graph-like target resolved (the Host's `resolve_target`: its predicate runs here), a Target.
py::object resolved_target(Persist* self) {
  py::object target = py::reinterpret_steal<py::object>(PyObject_CallOneArg(host.resolve_target, self->target));
  if (!target) throw py::error_already_set();
  if (!host.target.holds(target.ptr())) throw py::type_error("l2ctl._targets.resolve_target must return a Target");
  return target;
}

// Clears `entering` when the entry returns, however it does.
struct Entering {
  explicit Entering(Persist* self) : self(self) { self->entering = true; }
  ~Entering() { self->entering = false; }
  Persist* self;
};

// Where the scope's window goes: a stream, or a graph-like target resolved at entry.
struct Where {
  int device = -1;
  std::vector<pl::Slot> slots;
  py::object owner, target, executables;  // target: a graph-like target's resolution, or empty
};

// Step 1, resolve: the stream's device and slot (l2ctl's own stream found open, a foreign stream's context checked
// once per device and backend), l2ctl's own buffer found alive, then a graph-like target resolved (its predicate
// runs here). Changes nothing.
Where resolve(Persist* self, Registry_object& registry) {
  Where where;
  if (self->stream_ref != nullptr) {  // a stream: the common case
    where.device = device_of_stream(self);
    PyObject* stream_owner = host.stream_ref(self->stream_ref, Stream_ref::owner);
    if (self->own_stream) {
      if (self->own_released != own_released.load()) {  // it may have been closed since the scope was made
        PyObject* ref = own_ref(stream_owner);
        if (ref == nullptr) value_error("the stream is closed");
        Py_DECREF(ref);
      }
    } else if (self->stream_checked != where.device || self->stream_checked_on != registry.serial) {
      call_host(host.check_stream_context, self->stream_ref, py::int_(where.device).ptr());
      self->stream_checked = where.device;
      self->stream_checked_on = registry.serial;
      if (self->stream_object != nullptr) mark_checked(self->stream_object, where.device, registry.serial);
    }
    where.slots.push_back(registry.planner.slot(pl::stream_slot, self->handle));
    where.owner = py::reinterpret_borrow<py::object>(stream_owner);
  }
  if (self->allocation && self->own_released != own_released.load()) {
    PyObject* ref = own_ref(host.buffer_ref(self->buffer_ref, Buffer_ref::owner));  // an l2ctl buffer freed since the scope was made
    if (ref == nullptr) value_error("the device buffer has been freed");
    Py_DECREF(ref);
  }
  if (self->stream_ref == nullptr) {
    where.target = resolved_target(self);
    const auto& field = host.target;
    where.device = py::handle(field(where.target.ptr(), Target_record::device)).cast<int>();
    where.slots = slots_of(field(where.target.ptr(), Target_record::slots));
    where.owner = py::reinterpret_borrow<py::object>(field(where.target.ptr(), Target_record::owner));
    where.executables = py::reinterpret_borrow<py::object>(field(where.target.ptr(), Target_record::executables));
  }
  return where;
}

// What the check planned: the window, the limit asked for, and what the warnings need.
struct Plan {
  Device_limits limits;
  l2ctl::Window window;
  long long full = 0, nbytes = 0, request = 0;
  bool clipped = false, clamped = false, fit = false;
  py::object changed;  // what to call with the scope after its slots changed, or empty
};

// Step 2, check: the buffer on the target's device, a device that can persist, the buffer's pointer range (once
// per device and backend for a remembered object), the window clipped to the device's largest, the set-aside by
// the planner's rule, and a graph-like target's admission of the window. Changes nothing.
Plan check(Persist* self, Registry_object& registry, const Where& where) {
  const int device = where.device;
  const bool stream = self->stream_ref != nullptr;
  if (self->buffer_device >= 0 && self->buffer_device != device) {
    value_error("the buffer is on device " + std::to_string(self->buffer_device) + " but the " +
                (stream ? "stream" : "target") + " is on device " + std::to_string(device) + "; " +
                (stream ? "use a stream of the buffer's device"
                        : "for a graph of another device, pass l2ctl.graph.as_graph(g, device=N)"));
  }
  Plan plan;
  plan.limits = limits_of(registry, device);
  if (!plan.limits.supported) call_host(host.require_persistence, py::int_(device).ptr());  // raises, saying why
  // The byte range was checked when the scope was made (its fault is none): clipped to the device's largest window.
  const pl::Clipped_window clip = pl::clip_window(self->offset, self->num_bytes, self->nbytes, plan.limits.max_window);
  plan.full = clip.asked;
  plan.clipped = clip.clipped;
  plan.nbytes = clip.num_bytes;
  if (!self->allocation && (self->buffer_checked != device || self->buffer_checked_on != registry.serial)) {
    // A remembered object's whole range, checked once per device and backend (a sub-range needs no more); any
    // other buffer's window range, as given (_device remembers it while the owner lives).
    const bool whole = self->buffer_object != nullptr;
    const std::uintptr_t start = whole ? self->ptr : self->ptr + static_cast<std::uintptr_t>(self->offset);
    call_host(host.check_owned_pointer, py::int_(start).ptr(), py::int_(whole ? self->nbytes : plan.nbytes).ptr(),
              py::int_(device).ptr(), host.buffer_ref(self->buffer_ref, Buffer_ref::owner), py::str("the buffer").ptr());
    if (whole) {
      self->buffer_checked = device;
      self->buffer_checked_on = registry.serial;
      mark_checked(self->buffer_object, device, registry.serial);
    }
  }
  plan.fit = std::isnan(self->requested);
  plan.window.base = self->ptr + static_cast<std::uintptr_t>(self->offset);
  plan.window.num_bytes = static_cast<std::size_t>(plan.nbytes);
  plan.window.hit_ratio = plan.fit ? 1.0 : self->requested;
  plan.window.hit_prop = self->hit_prop;
  plan.window.miss_prop = self->miss_prop;
  plan.request = self->limit_bytes;
  if (self->limit == Limit::max || self->limit == Limit::exact || self->limit == Limit::fraction) {
    try {
      plan.request = pl::requested_set_aside(
          self->limit == Limit::max        ? pl::Set_aside_form::max
          : self->limit == Limit::fraction ? pl::Set_aside_form::fraction
                                           : pl::Set_aside_form::bytes,
          plan.request, self->limit_fraction, plan.limits.persisting_max, self->clamp);
    } catch (const std::invalid_argument& e) {
      value_error(std::string("device ") + std::to_string(device) + ": " + e.what() +
                  " (clamp=True grants the max instead, with a warning)");
    }
  }
  plan.clamped = self->limit == Limit::exact && plan.request != self->limit_bytes;
  if (where.target) {  // a graph-like target may refuse a window that would not reach what it launches
    // The window object only for a target that looks at it (its `admit`).
    const bool admits = host.target(where.target.ptr(), Target_record::admit) != Py_None;
    py::object asked = admits ? window_object(plan.window) : py::none();
    py::object after = py::reinterpret_steal<py::object>(
        PyObject_CallFunctionObjArgs(host.after_changes, where.target.ptr(), asked.ptr(), nullptr));
    if (!after) throw py::error_already_set();
    if (!after.is_none()) plan.changed = after;
  }
  return plan;
}

// Step 3, record: the registry's record of the scope, entered (the device changed through the planner, atomic),
// and what the object says of it from now on.
std::pair<std::shared_ptr<Scope_object>, pl::Entered> record(Persist* self, Where& where, const Plan& plan,
                                                             const std::shared_ptr<Registry_object>& registry,
                                                             const py::object& backend) {
  auto scope = std::make_shared<Scope_object>();
  pl::Scope& core = *scope->core;
  core.device = where.device;
  core.slots = std::move(where.slots);
  core.has_window = true;
  core.window = core.effective = plan.window;
  switch (self->limit) {
    case Limit::none:
      core.request = pl::Request::none;
      break;
    case Limit::automatic:
      core.request = pl::Request::automatic;
      scope->limit = py::reinterpret_borrow<py::object>(L2CTL_NAME("auto").ptr());
      break;
    default:
      core.request = pl::Request::exact;
      core.request_bytes = plan.request;
      scope->limit = py::int_(plan.request);
  }
  core.share = self->share;
  core.reset_on_exit = self->reset_on_exit;
  core.fit_hit_ratio = plan.fit;
  scope->owner = py::make_tuple(where.owner ? where.owner : py::none(),
                                py::reinterpret_borrow<py::object>(host.buffer_ref(self->buffer_ref, Buffer_ref::owner)));
  py::object holder = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(self));
  const pl::Entered entered = enter_scope(registry, scope, plan.limits.persisting_max, holder, backend);
  // Registered (self->live is the record), and the device matches. Nothing below allocates before `announce`.
  self->device = where.device;
  self->clipped = plan.clipped;
  self->has_slots = !core.slots.empty();
  self->first_slot = self->has_slots ? core.slots.front().handle : 0;
  self->entered_window = core.window;  // the hit ratio resolved
  self->has_window = true;
  Py_CLEAR(self->window);
  Py_XSETREF(self->changed, plan.changed ? Py_NewRef(plan.changed.ptr()) : nullptr);
  Py_XSETREF(self->executables,
             where.executables && !where.executables.is_none() ? Py_NewRef(where.executables.ptr()) : nullptr);
  return {scope, entered};
}

// Step 4, announce: the target told its slots changed, then the entry's warnings (a clipped window, a clamped or
// capped set-aside, windows asking more than the set-aside holds). Python that may raise: the caller ends the
// scope then.
void announce(Persist* self, const std::shared_ptr<Scope_object>& scope, const pl::Entered& entered, const Plan& plan) {
  if (self->changed != nullptr) {
    PyObject* r = PyObject_CallOneArg(self->changed, scope_object(scope).ptr());
    if (r == nullptr) throw py::error_already_set();
    Py_DECREF(r);
  }
  const bool thrash =
      plan.window.hit_prop == l2ctl::access_persisting && pl::oversubscribed(entered.demand, entered.limit);
  if (!(plan.clipped || entered.capped || thrash || plan.clamped)) return;
  py::object clip = plan.clipped ? py::object(py::make_tuple(plan.full, plan.nbytes, plan.limits.max_window))
                                 : py::object(py::none());
  py::object clamp = plan.clamped ? py::object(py::make_tuple(self->limit_bytes, plan.request)) : py::object(py::none());
  call_host(host.announce, reinterpret_cast<PyObject*>(self), clip.ptr(), py::int_(entered.limit).ptr(),
            py::float_(entered.demand).ptr(), entered.capped ? Py_True : Py_False, clamp.ptr(),
            py::float_(entered.asked).ptr());
}

// finish_scope with the object's stale-making executables and `changed` callback.
void finish(Persist* self, Scope_object& scope, const py::object& exc) {
  const auto held = [](PyObject* o) { return o != nullptr ? py::reinterpret_borrow<py::object>(o) : py::none(); };
  finish_scope(scope, held(self->executables), held(self->changed), exc);
}

// After the scope was registered, something failed (a graph's update, a warning filter, an interrupt, an
// allocation): the scope ends in compiled code and the first error stays the one to see; an error of the end is a
// note on it. `scope` is the entry's own: what failed (a warning's display, say) may have ended it already, or
// entered the object again.
[[noreturn]] void end_after(Persist* self, const std::shared_ptr<Scope_object>& scope) {
  const std::exception_ptr failure = std::current_exception();
  try {
    set_python_error(failure);
    py::error_already_set error;
    try {
      finish(self, *scope, error.value());
    } L2CTL_THREAD_ENDED catch (...) {
      // noted on `error` already where it can be
    }
    if (self->live == scope) self->live.reset();
    throw error;
  } catch (py::error_already_set&) {
    throw;
  } L2CTL_THREAD_ENDED catch (...) {  // no memory to say so: the scope still ends
    try {
      end_scope(*scope);
    } L2CTL_THREAD_ENDED catch (...) {
    }
    if (self->live == scope) self->live.reset();
    std::rethrow_exception(failure);
  }
}

// The entry proper: the four steps.
void apply(Persist* self) {
  const Entering entering(self);
  py::object backend;
  const std::shared_ptr<Registry_object> registry = active_registry(&backend);
  Where where = resolve(self, *registry);
  const Plan plan = check(self, *registry, where);
  const auto [scope, entered] = record(self, where, plan, registry, backend);
  try {
    announce(self, scope, entered, plan);
  } L2CTL_THREAD_ENDED catch (...) {
    end_after(self, scope);
  }
}

void describe_idle(Persist* self) {
  const Entering entering(self);  // the Python it calls must not initialise the object again meanwhile
  forget_entry(self, true);
  try {
    if (self->stream_ref != nullptr) {
      self->first_slot = self->handle;
      self->has_slots = true;
      self->device = device_of_stream(self);
    } else {
      const py::object target = resolved_target(self);
      const std::vector<pl::Slot> slots = slots_of(host.target(target.ptr(), Target_record::slots));
      self->has_slots = !slots.empty();
      self->first_slot = self->has_slots ? slots.front().handle : 0;
      self->device = py::handle(host.target(target.ptr(), Target_record::device)).cast<int>();
    }
  } catch (py::error_already_set& error) {
    if (!error.matches(host.not_supported)) throw;  // no device: -1
  }
}


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
  if (self->strict) {
    apply(self);
    return Py_NewRef(self);
  }
  try {
    apply(self);
    return Py_NewRef(self);
  } catch (py::error_already_set& error) {
    // Best effort: the device cannot persist (no device, pre-Ampere, MIG, a limit refused under MPS). The entry
    // is atomic, so nothing was applied; anything else (a user's argument, an interrupt) is raised as it is.
    if (!error.matches(host.not_supported)) throw;
    PyObject* reason = PyObject_Str(error.value().ptr());
    if (reason == nullptr) throw py::error_already_set();
    Py_XSETREF(self->reason, reason);
  }
  describe_idle(self);
  call_host(host.unavailable, reinterpret_cast<PyObject*>(self));  // warns (once)
  return Py_NewRef(self);
}

PyObject* persist_enter(PyObject* self, PyObject*) {
  return guarded([&] { return enter(reinterpret_cast<Persist*>(self)); });
}

PyObject* persist_exit(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->live) Py_RETURN_NONE;
  const std::shared_ptr<Scope_object> live = self->live;
  PyObject* out = guarded([&] {
    finish(self, *live, nargs >= 2 ? py::reinterpret_borrow<py::object>(args[1]) : py::none());
    return Py_NewRef(Py_None);
  });
  // Reset only if it still names this scope: `changed` (Python) may have let the object be entered again. The
  // registry told this object already (compiled_holders.forget), unless the scope was ended before (restore_all):
  // either way no scope is live on it any more.
  if (self->live == live) self->live.reset();
  return out;
}

// ---- attributes ------------------------------------------------------------------------------------------------

PyObject* get_window(PyObject* o, void*) {
  auto* self = reinterpret_cast<Persist*>(o);
  if (!self->has_window) return Py_NewRef(host.no_window);
  if (self->window == nullptr)
    self->window = guarded([&] { return window_object(self->entered_window).release().ptr(); });
  return Py_XNewRef(self->window);
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
  return guarded([&] { return scope_object(self->live).release().ptr(); });
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

bool persist_is_live(PyObject* holder) { return static_cast<bool>(reinterpret_cast<Persist*>(holder)->live); }

void persist_take(PyObject* holder, const std::shared_ptr<Scope_object>& record) {
  reinterpret_cast<Persist*>(holder)->live = record;
}

void persist_forget(PyObject* holder, const Scope_object* record) {
  auto* self = reinterpret_cast<Persist*>(holder);
  if (self->live.get() == record) self->live.reset();
}

}  // namespace

void bind_persist(py::module_& planner) {
  intern_argument_names();
  py::tuple arguments(static_cast<std::size_t>(n_args));
  for (int i = 0; i < n_args; ++i) arguments[i] = py::reinterpret_borrow<py::str>(interned_args[i]);
  planner.attr("PERSIST_ARGUMENTS") = arguments;  // what the registration checks _prepare's parameters against
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
}

}  // namespace l2ctl_bindings
