// What the planner's bindings (planner_bindings.cpp) share with the compiled scope objects (persist_scope.cpp,
// scope_entries.cpp): the planner's scope record as Python sees it, one registry per backend, a scope's entry and
// end.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>

#include "error_translation.hpp"
#include "host.hpp"
#include "l2ctl/planner.hpp"
#include "registry_lock.hpp"

namespace l2ctl_bindings {

namespace py = pybind11;
namespace pl = l2ctl::planner;

// An attribute name made once, interned (`obj.attr(L2CTL_NAME("x"))`): pybind11's `attr("x")` makes a new string at
// every call, which the hot path (a scope's entry and end) cannot afford. Made at first use; where that allocation
// fails, a MemoryError (py::error_already_set), and made again at the next use.
inline py::handle interned_name(PyObject*& slot, const char* text) {
  if (slot == nullptr && (slot = PyUnicode_InternFromString(text)) == nullptr) throw py::error_already_set();
  return slot;
}
#define L2CTL_NAME(text) (::l2ctl_bindings::interned_name([]() -> PyObject*& { \
  static PyObject* interned = nullptr;                                         \
  return interned;                                                             \
}(), text))

// The object a weak reference names (a new reference), or null when it is gone. PyWeakref_GetRef where the
// interpreter has it (3.13: PyWeakref_GetObject, which returns a borrowed reference, is deprecated).
inline py::object weak_target(PyObject* weak) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* out = nullptr;
  if (PyWeakref_GetRef(weak, &out) < 0) PyErr_Clear();
  return py::reinterpret_steal<py::object>(out);
#else
  PyObject* out = PyWeakref_GetObject(weak);
  if (out == nullptr) PyErr_Clear();
  if (out == nullptr || out == Py_None) return py::object();
  return py::reinterpret_borrow<py::object>(out);
#endif
}

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

// What the planner keeps of a registered scope (its `anchor`): a reference to the record, which keeps the scope's
// owners alive. Its Python object is made only when Python asks for it (scope_object), since a compiled scope never
// needs one.
inline Scope_object* anchored(const std::shared_ptr<void>& anchor) { return static_cast<Scope_object*>(anchor.get()); }

// The Python object of a record (the one that exists, or a new one).
py::object scope_object(const std::shared_ptr<Scope_object>& record);

// What a scope needs of a device's properties, per backend (properties never change while a backend lives).
struct Device_limits {
  long long max_window = 0;      // accessPolicyMaxWindowSize
  long long persisting_max = 0;  // persistingL2CacheMaxSize
  bool supported = false;        // L2 persistence available
};

struct Registry_object;
// The device's limits as `registry` knows them (asked of the Host's `properties` the first time).
const Device_limits& limits_of(Registry_object& registry, int device);
// Slots as Python holds them ((kind, handle, generation) tuples, the planner's own, made by slot_tuple).
std::vector<pl::Slot> slots_of(py::handle slots);

struct Registry_object {
  Registry_object(py::handle backend, bool cuda);
  pl::Registry planner;
  std::uint64_t epoch;
  // Unique in the process (never an address a later registry could reuse): what checks are remembered against.
  std::uint64_t serial;
  std::map<int, Device_limits> limits;  // filled by the scope objects from l2ctl._device.properties
};

// The planner's calls for `backend`: the CUDA runtime (`cuda`: the extension itself), else the backend's Python
// methods of the same names (backend_calls.cpp).
std::unique_ptr<pl::Calls> calls_for(py::handle backend, bool cuda);
// Registers `scope_obj` (a Scope_object) with `registry` and makes the device match, for `holder` (the object
// whose `_scope` names it while live; None: none): the entry every scope object makes.
// A compiled holder (persist's scope, of `type`) is told of its scope without Python: `is_live(holder)`,
// `take(holder, record)`, and `forget(holder, record)` when the scope left the registry another way. Set by
// persist_scope.cpp.
struct Compiled_holders {
  PyTypeObject* type = nullptr;
  bool (*is_live)(PyObject* holder) = nullptr;
  void (*take)(PyObject* holder, const std::shared_ptr<Scope_object>& record) = nullptr;
  void (*forget)(PyObject* holder, const Scope_object* record) = nullptr;
};
// Moves each time an l2ctl Stream is closed or a DeviceBuffer freed (after its _ref went): an entry whose count
// is unchanged since its scope took their references need not look at them again.
extern std::atomic<std::uint64_t> own_released;
extern Compiled_holders compiled_holders;

pl::Entered enter_scope(const std::shared_ptr<Registry_object>& registry, const std::shared_ptr<Scope_object>& record,
                        long long maximum, const py::object& holder, const py::object& backend);
// A scope's end: marked ending first; ended on the registry it was entered with.
void end_scope(Scope_object& scope);
// A holder's scope ended (its executables marked stale, the end, then `changed(scope)`); with `exc` (the block's
// exception, or None), an error of the end is a note on it instead of raised.
void finish_scope(Scope_object& record, const py::object& executables, const py::object& changed,
                  const py::object& exc);
// The bindings of the compiled scope objects: persist's scope (persist_scope.cpp) and the other scopes' entries
// (scope_entries.cpp).
void bind_persist(py::module_& planner);
void bind_scope_entries(py::module_& planner);

// The registry of the backend in use (`_registry._planner(_backend._active)`), and that backend.
std::shared_ptr<Registry_object> active_registry(py::object* backend);

}  // namespace l2ctl_bindings
