// The planner's bindings: the scope record, one registry per backend (its calls: backend_calls.cpp), a scope's entry
// and end. The GIL is held throughout a registry call except while waiting for the lock and around the CUDA calls
// backend_calls.cpp says. References a call drops (a scope leaving the registry) are dropped after the lock is
// released, so a finalizer they run is served.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>

#include "planner_bindings.hpp"

#include "l2ctl/planner.hpp"

namespace py = pybind11;
using namespace pybind11::literals;
namespace pl = l2ctl::planner;

namespace l2ctl_bindings {


py::tuple slot_tuple(const pl::Slot& s) { return py::make_tuple(s.kind, s.handle, s.generation); }

pl::Slot to_slot(py::handle h) {
  py::tuple t = py::reinterpret_borrow<py::tuple>(h);
  return pl::Slot{t[0].cast<int>(), t[1].cast<std::uintptr_t>(), t[2].cast<std::uint64_t>()};
}

// ---- scopes and registries ----------------------------------------------------------------------------------------

std::uint64_t next_registry_serial() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

Registry_object::Registry_object(py::handle backend, bool cuda)
    : planner(calls_for(backend, cuda)),
      epoch(fork_epoch.load()), serial(next_registry_serial()) {}

const char* const already_active = "this scope is already active (entered in another thread?); create a new one";

Compiled_holders compiled_holders;

// l2ctl._core itself: a registry made for it calls CUDA directly (Cuda_calls).
PyObject* core_module = nullptr;

py::object scope_object(const std::shared_ptr<Scope_object>& record) { return py::cast(record); }

py::object scope_object_of(const pl::Scope& scope) { return scope_object(anchored(scope.anchor)->shared_from_this()); }

pl::Request request_of(py::handle limit, long long* bytes) {
  if (limit.is_none()) return pl::Request::none;
  if (py::isinstance<py::str>(limit)) {
    if (limit.cast<std::string>() != "auto") throw py::value_error("a limit request is bytes, 'auto' or None");
    return pl::Request::automatic;
  }
  *bytes = limit.cast<long long>();
  return pl::Request::exact;
}

// A Registry method bound as `method(registry, args...)`: called under the registry's lock, its errors as Python's.
template <typename R, typename... Args>
auto locked_call(R (pl::Registry::*method)(Args...)) {
  return [method](Registry_object& r, Args... args) {
    return translated([&] {
      Locked locked(&r);
      return (r.planner.*method)(args...);
    });
  };
}

py::object device_state(Registry_object& registry, int device) {
  pl::Device_state* st = registry.planner.lookup(device);
  if (st == nullptr) return py::none();
  py::dict scopes, bases, applied;
  for (const auto& [id, scope] : st->scopes) scopes[py::int_(id)] = scope_object_of(*scope);
  for (const auto& [slot, w] : st->base_windows) bases[slot_tuple(slot)] = window_object(w);
  for (const auto& [slot, w] : st->applied_windows) applied[slot_tuple(slot)] = window_object(w);
  static py::object* namespace_type = new py::object(py::module_::import("types").attr("SimpleNamespace"));
  return (*namespace_type)(
      "device"_a = st->device, "maximum"_a = st->maximum, "scopes"_a = scopes, "base_limit"_a = st->base_limit,
      "applied_request"_a = st->applied_request, "applied_limit"_a = st->applied_limit, "base_windows"_a = bases,
      "applied_windows"_a = applied, "observed_limit"_a = st->observed_limit, "in_force_demand"_a = st->in_force_demand,
      "auto_capped"_a = st->auto_capped, "auto_bounds"_a = st->auto_bounds,
      "dirty"_a = st->dirty, "shared"_a = st->shared,
      "batch"_a = st->batch ? py::object(py::str("cut short")) : py::none());
}

// What a scope needs of a device's properties (the Host's `properties`), asked once per registry.
const Device_limits& limits_of(Registry_object& registry, int device) {
  auto it = registry.limits.find(device);
  if (it != registry.limits.end()) return it->second;
  PyObject* props = PyObject_CallOneArg(host.properties, py::int_(device).ptr());
  if (props == nullptr) throw py::error_already_set();
  py::object p = py::reinterpret_steal<py::object>(props);
  Device_limits out;
  out.max_window = p.attr("access_policy_max_window_size").cast<long long>();
  out.persisting_max = p.attr("persisting_l2_cache_max_size").cast<long long>();
  out.supported = p.attr("supports_persistence").cast<bool>();
  return registry.limits.emplace(device, out).first->second;
}

std::vector<pl::Slot> slots_of(py::handle slots) {
  std::vector<pl::Slot> out;
  for (py::handle slot : py::reinterpret_borrow<py::iterable>(slots)) out.push_back(to_slot(slot));
  return out;
}

// `_registry.Scope(device, slots=(), window=None, limit=None, share=False, reset_on_exit=False,
// fit_hit_ratio=False, standing=False, orphaned=False, owner=None)`.
std::shared_ptr<Scope_object> make_scope(const py::args& args, const py::kwargs& kwargs) {
  static const char* const names[] = {"device",        "slots",    "window",   "limit", "share", "reset_on_exit",
                                      "fit_hit_ratio", "standing", "orphaned", "owner"};
  constexpr std::size_t n = sizeof(names) / sizeof(names[0]);
  py::object v[n];
  if (args.size() > n) throw py::type_error("Scope() takes at most 10 arguments");
  for (std::size_t i = 0; i < args.size(); ++i) v[i] = args[i];
  for (auto item : kwargs) {
    std::size_t i = 0;
    while (i < n && !(PyUnicode_Check(item.first.ptr()) && PyUnicode_CompareWithASCIIString(item.first.ptr(), names[i]) == 0))
      ++i;
    if (i == n || v[i]) {
      PyErr_Format(PyExc_TypeError, i == n ? "Scope() got an unexpected keyword argument %R"
                                           : "Scope() got multiple values for argument %R", item.first.ptr());
      throw py::error_already_set();
    }
    v[i] = py::reinterpret_borrow<py::object>(item.second);
  }
  if (!v[0]) throw py::type_error("Scope() missing required argument 'device'");
  auto flag = [&](std::size_t i) { return v[i] && v[i].cast<bool>(); };
  auto s = std::make_shared<Scope_object>();
  pl::Scope& c = *s->core;
  c.device = v[0].cast<int>();
  if (v[1]) c.slots = slots_of(v[1]);
  const py::object window = v[2] ? v[2] : py::none();
  c.has_window = !window.is_none();
  if (c.has_window) c.window = c.effective = to_window(window);
  s->limit = v[3] ? v[3] : py::none();
  c.request = request_of(s->limit, &c.request_bytes);
  c.share = flag(4);
  c.reset_on_exit = flag(5);
  c.fit_hit_ratio = flag(6);
  c.standing = flag(7);
  c.orphaned = flag(8);
  s->window = window;
  s->owner = v[9] ? v[9] : py::none();
  return s;
}

pl::Entered enter_scope(const std::shared_ptr<Registry_object>& r, const std::shared_ptr<Scope_object>& record,
                        long long maximum, const py::object& holder, const py::object& backend) {
  Scope_object& scope = *record;
  scope.backend = backend;
  const bool compiled = !holder.is_none() && Py_TYPE(holder.ptr()) == compiled_holders.type;
  try {
    return translated([&] {
      Locked locked(r.get(), true);  // nothing changed yet: a Ctrl-C while waiting ends the entry
      if (!holder.is_none()) {
        const bool live = compiled ? compiled_holders.is_live(holder.ptr()) : !holder.attr(host.name.scope).is_none();
        if (live) {
          PyErr_SetString(PyExc_RuntimeError, already_active);
          throw py::error_already_set();
        }
        // A holder freed while live ends its scope at the next call (its __exit__ was cut short): the planner
        // asks the weak reference, which lives as long as the scope object.
        scope.holder = py::reinterpret_steal<py::object>(PyWeakref_NewRef(holder.ptr(), nullptr));
        if (!scope.holder) throw py::error_already_set();
        scope.core->holder = scope.holder.ptr();
        scope.core->holder_alive = [](const void* weak) {
          return static_cast<bool>(weak_target(static_cast<PyObject*>(const_cast<void*>(weak))));
        };
      }
      scope.registry = r;
      scope.core->anchor = std::shared_ptr<void>(record, record.get());  // shares the record's count: no allocation
      pl::Entered entered;
      try {
        entered = r->planner.enter(scope.core, maximum);
      } L2CTL_THREAD_ENDED catch (...) {
        scope.core->anchor.reset();
        throw;
      }
      if (compiled)
        compiled_holders.take(holder.ptr(), record);
      else if (!holder.is_none())
        holder.attr(host.name.scope) = scope_object(record);
      if (scope.core->fit_hit_ratio && scope.core->has_window && !scope.window.is_none())
        scope.window = window_object(scope.core->window);  // as fitted
      return entered;
    });
  } L2CTL_THREAD_ENDED catch (...) {
    scope.core->ending = true;  // registered and cut short: the next call ends it
    throw;
  }
}

// Moves whenever l2ctl._backend installs another backend (`backend_changed`): until it moves, the backend found
// last is the one in use, and no scope's entry asks Python.
std::atomic<std::uint64_t> backend_version{1};

// The registry of the backend in use (the Host's `planner_of(active_backend())`), asked again only when the backend
// changed (backend_version moved, or the last one is gone) or a fork made the last registry stale.
std::shared_ptr<Registry_object> active_registry(py::object* backend) {
  const Host& h = registered_host();
  // Leaked on purpose: released at exit without the GIL otherwise.
  static py::object* last_backend = new py::object();  // a weak reference
  // Weakly: a simulator's registry goes with the simulator (the facade keeps it in a WeakKeyDictionary).
  static std::weak_ptr<Registry_object>* last = new std::weak_ptr<Registry_object>();
  static std::uint64_t last_version = 0;  // the GIL guards these
  if (last_version == backend_version.load() && last_backend->ptr() != nullptr) {
    py::object known_backend = weak_target(last_backend->ptr());
    std::shared_ptr<Registry_object> known = last->lock();
    if (known_backend && known && known->epoch == fork_epoch.load()) {
      *backend = std::move(known_backend);
      return known;
    }
  }
  const std::uint64_t version = backend_version.load();  // read first: a change from now on is seen next time
  PyObject* found = PyObject_CallNoArgs(h.active_backend);
  if (found == nullptr) throw py::error_already_set();
  py::object active = py::reinterpret_steal<py::object>(found);
  std::shared_ptr<Registry_object> registry =
      py::handle(h.planner_of)(active).cast<std::shared_ptr<Registry_object>>();
  *last_backend = py::reinterpret_steal<py::object>(PyWeakref_NewRef(active.ptr(), nullptr));
  if (!*last_backend) PyErr_Clear();  // not weakly referable: asked every time
  *last = registry;
  last_version = *last_backend ? version : 0;
  *backend = std::move(active);
  return registry;
}

namespace {

// An error kept aside (PyErr_Fetch: nothing allocated) and raised later, or released unraised.
class Held_error {
 public:
  Held_error() = default;
  Held_error(Held_error&& o) noexcept
      : type_(std::exchange(o.type_, nullptr)), value_(std::exchange(o.value_, nullptr)),
        traceback_(std::exchange(o.traceback_, nullptr)) {}
  Held_error& operator=(Held_error&& o) noexcept {  // swapped: `o` releases what this one held
    std::swap(type_, o.type_);
    std::swap(value_, o.value_);
    std::swap(traceback_, o.traceback_);
    return *this;
  }
  ~Held_error() {
    Py_XDECREF(type_);
    Py_XDECREF(value_);
    Py_XDECREF(traceback_);
  }
  explicit operator bool() const { return type_ != nullptr; }
  void take() { PyErr_Fetch(&type_, &value_, &traceback_); }  // the error being raised
  // `error`'s repr as a note on the held one (best effort: the held error is the one to see).
  void note(const char* what, py::error_already_set& error) {
    try {
      PyErr_NormalizeException(&type_, &value_, &traceback_);
      if (value_ != nullptr) add_note(value_, std::string(what) + py::repr(error.value()).cast<std::string>());
    } L2CTL_THREAD_ENDED catch (...) {
    }
    PyErr_Clear();
  }
  [[noreturn]] void raise() {
    PyErr_Restore(std::exchange(type_, nullptr), std::exchange(value_, nullptr), std::exchange(traceback_, nullptr));
    throw py::error_already_set();
  }

 private:
  PyObject *type_ = nullptr, *value_ = nullptr, *traceback_ = nullptr;
};

// A scope's end: marked ending first; ended on the registry it was entered with (nothing if never entered,
// or entered before a fork). The end is made whole: a signal that came while it waited for the lock (another thread
// inside l2ctl holds it) has its handler run once the lock is taken, before the end's first call into a Python
// backend (the simulator), where what the handler raises (a KeyboardInterrupt) would cut the end short and leave
// its window on the device with no scope live until some later l2ctl call. What the handler raised is handed back,
// for the caller to raise once the end is made, as a signal that comes during a driver call is raised after it.
Held_error end_whole(Scope_object& scope) {
  Held_error interrupt;
  scope.core->ending = true;
  const std::shared_ptr<Registry_object> r = scope.registry;
  if (!r || r->epoch != fork_epoch.load()) return interrupt;
  if (lock_instance->owned()) {
    // A finalizer (or signal handler) ending a scope inside an l2ctl call on this thread: not refused, and not
    // made in the middle of that call's change; the call ends it as it returns (Locked), or, where the lock is
    // held by the user's `with _registry.lock:`, the next l2ctl call on the device does.
    deferred_ends().push_back(r);
    return interrupt;
  }
  try {
    translated([&] {
      Locked locked(r.get());
      if (PyErr_CheckSignals() < 0) interrupt.take();
      r->planner.exit(*scope.core);
    });
  } catch (py::error_already_set& error) {
    if (!interrupt) throw;
    // The interrupt is the error to see; the end that failed stays marked, and the next call makes it again.
    interrupt.note("l2ctl: the scope's end failed (the next l2ctl call on the device makes it again): ", error);
  } L2CTL_THREAD_ENDED catch (...) {
    if (!interrupt) throw;  // no memory to say why the end failed: the interrupt is still the error to see
  }
  return interrupt;
}

}  // namespace

void end_scope(Scope_object& scope) {
  Held_error interrupt = end_whole(scope);
  if (interrupt) interrupt.raise();
}

// A holder's scope ended: `executables` (an l2ctl Graph, or None) marked stale first, in compiled code (`changed`
// is Python and could be cut short, and an end that fails may have changed node windows already; either way the
// next launch remakes it), then the end, then `changed(scope)` (a graph's executables remade: Python, the one part
// of an end that is). The target hears of the end even when the end failed (a torch_captures scope stops watching
// streams). When `exc` (the block's exception) is given, an error of the end becomes a note on it.
void finish_scope(Scope_object& ending, const py::object& executables, const py::object& changed,
                  const py::object& exc) {
  ending.core->ending = true;
  if (!executables.is_none()) executables.attr(host.name.dirty) = true;
  auto noted = [&](py::error_already_set& error) {
    if (exc.is_none()) return false;
    add_note(exc, py::str("l2ctl: restoring device state after the error also failed: {!r}").format(error.value()));
    return true;
  };
  // `changed(scope)`, after the end: its Python object is made only now, so that an allocation failure (or any
  // error) in making it cannot keep the scope from ending.
  auto tell = [&] {
    if (!changed.is_none()) changed(scope_object(ending.shared_from_this()));
  };
  Held_error interrupt;  // a signal's, raised once the end and `changed` are made (end_whole)
  try {
    interrupt = end_whole(ending);
  } catch (py::error_already_set& error) {
    try {
      tell();
    } catch (py::error_already_set&) {
      // the end's error is the one to see
    }
    if (!noted(error)) throw;
    return;
  }
  try {
    tell();
  } catch (py::error_already_set& error) {
    if (interrupt)
      interrupt.note("l2ctl: the target's update after the scope's end failed: ", error);
    else if (!noted(error))
      throw;
  }
  if (interrupt) interrupt.raise();
}

void bind_planner(py::module_& core) {
  // A submodule, not backend functions: the backend contract (tests/simulator/test_backend_contract.py) holds
  // every public name of _core to the simulator, and the planner is what calls the backend.
  py::module_ m = core.def_submodule("_planner", "the planner: the registry of device state (planner.hpp)");
  core_module = core.ptr();
  bind_host(m);
  bind_lock(m);
  m.attr("REENTRY_HINT") = pl::reentry_hint;
  m.attr("MPS_HINT") = pl::mps_hint;

  py::class_<Scope_object, std::shared_ptr<Scope_object>>(m, "Scope")
      // Arguments read by make_scope, not by pybind11's keyword matching, which does not check the string it
      // allocates for each keyword (a segfault where that allocation fails: a scoped window's entry makes a Scope).
      .def(py::init([](const py::args& args, const py::kwargs& kwargs) { return make_scope(args, kwargs); }),
           "Scope(device, slots=(), window=None, limit=None, share=False, reset_on_exit=False, fit_hit_ratio=False, "
           "standing=False, orphaned=False, owner=None)")
      .def_property_readonly("device", [](const Scope_object& s) { return s.core->device; })
      .def_property_readonly("slots",
                             [](const Scope_object& s) {
                               py::tuple out(s.core->slots.size());
                               for (std::size_t i = 0; i < s.core->slots.size(); ++i) out[i] = slot_tuple(s.core->slots[i]);
                               return out;
                             })
      .def_property_readonly("window",
                             [](Scope_object& s) {
                               // Made when first read: a scope entered by a compiled scope object has no Python
                               // window until someone asks.
                               if (s.window.is_none() && s.core->has_window) s.window = window_object(s.core->window);
                               return s.window;
                             })
      .def_property_readonly("limit", [](const Scope_object& s) { return s.limit; })
      .def_property(
          "standing", [](const Scope_object& s) { return s.core->standing; },
          [](Scope_object& s, bool v) { s.core->standing = v; })
      .def_property(
          "orphaned", [](const Scope_object& s) { return s.core->orphaned; },
          [](Scope_object& s, bool v) { s.core->orphaned = v; })
      .def_property(
          "ending", [](const Scope_object& s) { return s.core->ending.load(); },
          [](Scope_object& s, bool v) { s.core->ending = v; })
      .def_property_readonly("owner", [](const Scope_object& s) { return s.owner; })
      .def_property_readonly("id", [](const Scope_object& s) { return s.core->id; })
      .def("__repr__", [](const Scope_object& s) {
        return py::str("Scope(id={}, device={}, slots={}, window={}, limit={!r}, standing={}, ending={})")
            .format(s.core->id, s.core->device, s.core->slots.size(),
                    s.core->has_window ? window_object(s.core->window) : py::object(py::none()), s.limit, s.core->standing,
                    s.core->ending.load());
      });

  py::class_<Registry_object, std::shared_ptr<Registry_object>>(m, "Registry")
      .def(py::init([](py::object backend) {
             const bool cuda = backend.ptr() == core_module;
             return std::make_shared<Registry_object>(backend, cuda);
           }),
           "backend"_a)
      .def("stream_slot", [](Registry_object& r, std::uintptr_t handle) { return slot_tuple(r.planner.slot(0, handle)); })
      .def("node_slots",
           [](Registry_object& r, py::iterable handles) {
             std::vector<py::object> out;
             for (py::handle h : handles) out.push_back(slot_tuple(r.planner.slot(1, h.cast<std::uintptr_t>())));
             return py::tuple(py::cast(out));
           })
      .def("enter",
           [](const std::shared_ptr<Registry_object>& r, py::object scope_obj, long long maximum, py::object holder,
              py::object backend) {
             const pl::Entered entered =
                 enter_scope(r, scope_obj.cast<std::shared_ptr<Scope_object>>(), maximum, holder, backend);
             return py::make_tuple(entered.limit, entered.demand, entered.capped);
           },
           "scope"_a, "maximum"_a, "holder"_a = py::none(), "backend"_a = py::none())
      .def("set_base_window",
           [](Registry_object& r, py::iterable slots, int device, long long maximum, py::tuple window) {
             translated([&] {
               Locked locked(&r);
               r.planner.set_base_window(slots_of(slots), device, maximum, to_window(window));
             });
           })
      .def("forget_slots",
           [](Registry_object& r, int kind, py::iterable handles) {
             std::vector<std::uintptr_t> out;
             for (py::handle h : handles) out.push_back(h.cast<std::uintptr_t>());
             translated([&] {
               Locked locked(&r);
               r.planner.forget_slots(kind, out);
             });
           })
      .def("known_limit", locked_call(&pl::Registry::known_limit))
      .def("observed_limit", locked_call(&pl::Registry::observed_limit))
      .def("snapshot",
           [](Registry_object& r, int device, long long maximum) {
             return translated([&] {
               Locked locked(&r);
               pl::Snapshot snap = r.planner.snapshot(device, maximum);
               py::list in_force;
               for (const auto& [scope, w] : snap.in_force)
                 in_force.append(py::make_tuple(scope_object_of(*scope), window_object(w)));
               return py::make_tuple(snap.limit, in_force, snap.demand);
             });
           })
      .def("live_scopes",
           [](Registry_object& r, int device) {
             return translated([&] {
               Locked locked(&r);
               py::list out;
               for (const pl::Scope_ptr& scope : r.planner.live_scopes(device)) out.append(scope_object_of(*scope));
               return out;
             });
           })
      .def("reset_lines", locked_call(&pl::Registry::reset_lines))
      .def("granularity", locked_call(&pl::Registry::granularity))
      .def_property_readonly("slot_epoch", [](const Registry_object& r) { return r.planner.slot_epoch(); },
                             "Moves whenever a handle's generation does: slots made before may be stale.")
      .def("known_granularity",
           [](Registry_object& r, int device) {
             Locked locked(&r);
             return r.planner.known_granularity(device);
           })
      .def("restore_all",
           [](Registry_object& r) {
             // At interpreter exit: taken like a plain lock (the exit may run on a thread that holds it).
             const bool owned = lock_instance->owned();
             if (!owned) lock_instance->acquire(true, -1);
             r.planner.restore_all();
             auto released = r.planner.take_released();
             if (!owned) lock_instance->release();
             released.clear();
           })
      .def("device_state", [](Registry_object& r, int device) { return device_state(r, device); })
      .def("devices",
           [](Registry_object& r) {
             std::vector<int> out;
             for (const auto& [device, st] : r.planner.states()) out.push_back(device);
             return out;
           })
      .def_property_readonly("stale", [](const Registry_object& r) { return r.epoch != fork_epoch.load(); });

  bind_persist(m);
  bind_scope_entries(m);
  m.def("exit_scope", &end_scope, "scope"_a);
  m.def("own_released", [] { ++own_released; },
        "An l2ctl Stream was closed or a DeviceBuffer freed (its _ref is None): scopes look at theirs again.");
  m.def("backend_changed", [] { ++backend_version; },
        "l2ctl._backend installed another backend: the next scope asks the Host which one is in use.");

  m.def(
      "add_slots",
      [](Scope_object& scope, py::iterable slots, py::object owner) {
        const std::shared_ptr<Registry_object> r = scope.registry;
        if (!r || r->epoch != fork_epoch.load() || scope.core->ending) return false;
        const std::vector<pl::Slot> more = slots_of(slots);
        // The owner is kept first: while the planner covers the new slot, its stream must stay alive.
        if (!owner.is_none()) scope.owner = py::make_tuple(scope.owner, owner);
        const int added = translated([&] {
          Locked locked(r.get());
          return r->planner.add_slots(*scope.core, more);
        });
        return added >= 0;
      },
      "scope"_a, "slots"_a, "owner"_a = py::none());

  // The arithmetic of "auto" and sharing (_plan.py's names call these: one copy of the rules).
  m.attr("plan_default_limit_fraction") = pl::default_limit_fraction;
  m.def("plan_round_up", &pl::round_up, "nbytes"_a, "granularity"_a);
  m.def("plan_tax_free_limit", &pl::tax_free_limit, "maximum"_a, "granularity"_a);
  m.def("plan_granted_set_aside", &pl::granted_set_aside, "request"_a, "maximum"_a, "clamp"_a);
  m.attr("plan_hit_ratio_tolerance") = pl::hit_ratio_tolerance;
  m.def("plan_check_hit_ratio", [](double ratio) {
    const pl::Checked_hit_ratio checked = pl::check_hit_ratio(ratio);
    return std::make_pair(checked.value, static_cast<int>(checked.fault));
  }, "ratio"_a);
  m.def("plan_oversubscribed", &pl::oversubscribed, "demand"_a, "limit"_a);
  m.def("plan_requested_set_aside", [](const std::string& form, long long bytes, double fraction, long long maximum,
                                       bool clamp) {
    const pl::Set_aside_form f = form == "max" ? pl::Set_aside_form::max
                                 : form == "fraction" ? pl::Set_aside_form::fraction
                                 : form == "bytes" ? pl::Set_aside_form::bytes
                                                   : throw std::invalid_argument("form: 'bytes', 'max' or 'fraction'");
    return pl::requested_set_aside(f, bytes, fraction, maximum, clamp);
  }, "form"_a, "bytes"_a, "fraction"_a, "maximum"_a, "clamp"_a);
  m.def("plan_set_aside_fraction_refusal", &pl::set_aside_fraction_refusal, "fraction"_a);
  m.def("plan_clip_window", [](long long offset, long long num_bytes, long long buffer_bytes, long long max_window) {
    const pl::Clipped_window w = pl::clip_window(offset, num_bytes, buffer_bytes, max_window);
    return py::make_tuple(w.num_bytes, w.clipped, static_cast<int>(w.fault));
  }, "offset"_a, "num_bytes"_a, "buffer_bytes"_a, "max_window"_a);
  m.def("plan_auto_set_aside", &pl::auto_set_aside, "demand"_a, "current"_a, "granularity"_a, "maximum"_a);
  m.def("plan_default_hit_ratio", &pl::default_hit_ratio, "granted"_a, "window_bytes"_a);
  m.def("plan_fit_window", [](long long room, long long window_bytes) {
    const pl::Fitted_window fitted = pl::fit_window(room, window_bytes);
    return std::make_pair(fitted.num_bytes, fitted.hit_ratio);
  }, "room"_a, "window_bytes"_a);
  m.def("plan_shared_hit_ratios", &pl::shared_hit_ratios, "requests"_a, "set_aside"_a);
}

}  // namespace l2ctl_bindings
