// What the planner's bindings (planner_bindings.cpp) share with the compiled scope objects (scope_types.cpp): the
// registry's lock, the planner's scope record as Python sees it, one registry per backend, the lock for one
// call, and the translation of planner errors into the Python exceptions they stand for.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "l2ctl/planner.hpp"

namespace l2ctl_bindings {

namespace py = pybind11;
namespace pl = l2ctl::planner;

// One lock for every backend, as a Python object too (`_registry.lock`: acquire/release/with, reentrant for its
// owner). Entry points refuse the thread that holds it. Waiting happens with the GIL released: the holder may
// need the GIL to finish (the simulator's calls).
struct Registry_lock {
  std::timed_mutex mutex;
  std::atomic<std::thread::id> owner{};
  int depth = 0;

  bool owned() const { return owner.load() == std::this_thread::get_id(); }

  bool acquire(bool blocking, double timeout) {
    if (owned()) {
      ++depth;
      return true;
    }
    bool got = mutex.try_lock();
    if (!got && blocking) {
      py::gil_scoped_release released;
      if (timeout < 0) {
        mutex.lock();
        got = true;
      } else {
        got = mutex.try_lock_for(std::chrono::duration<double>(timeout));
      }
    }
    if (got) {
      owner = std::this_thread::get_id();
      depth = 1;
    }
    return got;
  }

  void release() {
    if (!owned()) throw py::value_error("cannot release the registry's lock: this thread does not hold it");
    if (--depth == 0) {
      owner = std::thread::id();
      mutex.unlock();
    }
  }
};

// An attribute name made once, interned (`obj.attr(L2CTL_NAME("x"))`): pybind11's `attr("x")` makes a new string at
// every call, which the hot path (a scope's entry and end) cannot afford.
#define L2CTL_NAME(text) ([] {                                           \
  static PyObject* const interned = PyUnicode_InternFromString(text); \
  return py::handle(interned);                                        \
}())

extern Registry_lock* lock_instance;
extern std::atomic<std::uint64_t> fork_epoch;

struct Registry_object;

// `_registry.Scope`: what one scope asks of its device (the planner's Scope), and what Python ties to it.
struct Scope_object : std::enable_shared_from_this<Scope_object> {
  pl::Scope_ptr core = std::make_shared<pl::Scope>();
  py::object window = py::none();  // as asked, None until first read when the scope was made in C++ (lazy)
  py::object limit = py::none();
  py::object owner = py::none();
  py::object backend = py::none();
  py::object holder = py::none();  // a weak reference to the object whose `_scope` names this one while live
  std::shared_ptr<Registry_object> registry;
};

// What the planner keeps of a registered scope (its `anchor`): the record, which keeps the scope's owners alive.
// Its Python object is made only when Python asks for it (scope_object), since a compiled scope never needs one.
struct Anchor {
  std::shared_ptr<Scope_object> record;
};

// The Python object of a record (the one that exists, or a new one).
py::object scope_object(const std::shared_ptr<Scope_object>& record);

// What a scope needs of a device's properties, per backend (properties never change while a backend lives).
struct Device_limits {
  long long max_window = 0;      // accessPolicyMaxWindowSize
  long long persisting_max = 0;  // persistingL2CacheMaxSize
  bool supported = false;        // L2 persistence available
};

struct Registry_object {
  Registry_object(py::handle backend, bool cuda);
  pl::Registry planner;
  std::uint64_t epoch;
  // Unique in the process (never an address a later registry could reuse): what checks are remembered against.
  std::uint64_t serial;
  std::map<int, Device_limits> limits;  // filled by the scope objects from l2ctl._device.properties
};

// The lock for one call into a registry: the reentry check, the wait (GIL released), and at the end, after the
// lock is released, the references the call dropped (and the holders that named those scopes told).
class Locked {
 public:
  explicit Locked(Registry_object* registry);
  ~Locked();
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  Registry_object* registry_;
};

struct Python_names {
  py::object window_type, property_type, cuda_error, not_supported, namespace_type, weakref_type;
};
Python_names& names();

pl::Plan_window to_window(py::handle w);
py::object window_object(const pl::Plan_window& w);
py::object exception_object(const std::exception_ptr& cause);
[[noreturn]] void raise(py::handle error);

// Every planner error as the Python exception it stands for (py::error_already_set), so that callers in C++
// (a scope's __enter__ and __exit__) see one kind of error.
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const pl::Call_failed& failure) {
    py::object error = exception_object(failure.cause);
    if (!failure.note.empty() && py::hasattr(error, "add_note")) error.attr("add_note")(failure.note);
    raise(error);
  } catch (const pl::Limit_refused& refused) {
    py::object cause = exception_object(refused.cause);
    py::object error = names().not_supported(refused.what());
    error.attr("__cause__") = cause;
    raise(error);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    throw py::error_already_set();
  }
}

// Registers `scope_obj` (a Scope_object) with `registry` and makes the device match, for `holder` (the object
// whose `_scope` names it while live; None: none): the entry every scope object makes.
// A compiled holder (persist's scope) is told of its scope without Python: `is_live(holder)` (null for any other
// type), `take(holder, record)`, and `forget(holder, record)` when the scope left the registry another way
// (returns whether `holder` is such a holder). Set by scope_types.cpp.
struct Compiled_holders {
  PyTypeObject* type = nullptr;
  bool (*is_live)(PyObject* holder) = nullptr;
  void (*take)(PyObject* holder, const std::shared_ptr<Scope_object>& record) = nullptr;
  void (*forget)(PyObject* holder, const Scope_object* record) = nullptr;
};
extern Compiled_holders compiled_holders;

pl::Entered enter_scope(const std::shared_ptr<Registry_object>& registry, const std::shared_ptr<Scope_object>& record,
                        long long maximum, const py::object& holder, const py::object& backend);
// A scope's end: marked ending first; ended on the registry it was entered with.
void end_scope(Scope_object& scope);
// A holder's scope ended (its executables marked stale, the end, then `changed(scope)`); with `exc` (the block's
// exception, or None), an error of the end is a note on it instead of raised.
void finish_scope(Scope_object& record, const py::object& executables, const py::object& changed,
                  const py::object& exc);
// The registry of the backend in use (`_registry._planner(_backend._active)`), and that backend.
std::shared_ptr<Registry_object> active_registry(py::object* backend);

}  // namespace l2ctl_bindings
