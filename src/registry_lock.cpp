// The registry's lock, the lock for one call (Locked: the reentry check, the ends deferred by finalizers, the
// references a call dropped released after the lock), and the fork's hook.
#include "registry_lock.hpp"

#include <pthread.h>

#include "planner_bindings.hpp"

namespace l2ctl_bindings {

Registry_lock* lock_instance = nullptr;
Exit_gate* exit_gate = new Exit_gate;  // never freed: threads may sleep at it as the process ends
std::atomic<std::uint64_t> fork_epoch{0};

namespace {

void after_fork_in_child() {
  // A forked child starts with a lock nobody holds (another thread of the parent may have held it) and an epoch
  // that makes the parent's registries unreachable (the facade makes new ones).
  new (lock_instance) Registry_lock();
  new (exit_gate) Exit_gate();
  ++fork_epoch;
}

// The error being raised, kept aside while `f` runs and put back after it (f's own errors are dropped).
template <typename F>
void keeping_error(F&& f) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  f();
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

}  // namespace

const char* const closed_hint =
    "l2ctl restored every device at interpreter exit and enters no scope after it (an atexit handler or a finalizer "
    "that runs later called it)";

std::vector<std::shared_ptr<Registry_object>>& deferred_ends() {
  static auto* registries = new std::vector<std::shared_ptr<Registry_object>>;
  return *registries;
}

Locked::Locked(Registry_object* registry, bool interruptible) : registry_(registry) {
  if (lock_instance->owned()) {
    PyErr_SetString(PyExc_RuntimeError, lock_instance->closed ? closed_hint : pl::reentry_hint);
    throw py::error_already_set();
  }
  lock_instance->acquire(true, -1, interruptible);
}

Locked::~Locked() {
  // The storage of the last call's list on this thread, handed to the registry in exchange for its list: a scope's
  // end then allocates no list. (A call made while this one releases, by a finalizer, finds none and makes one.)
  thread_local std::vector<std::shared_ptr<void>> spare;
  std::vector<std::shared_ptr<void>> released = std::move(spare);
  released.clear();
  if (registry_ != nullptr) registry_->planner.take_released(released);
  // Ends asked for by finalizers that ran inside this call (on this thread, the lock held): made now, before
  // the lock goes, so the device is back when this call returns. A failure stays a mark for the next call.
  while (!deferred_ends().empty()) {
    const std::shared_ptr<Registry_object> registry = deferred_ends().back();
    deferred_ends().pop_back();
    keeping_error([&] {
      try {
        registry->planner.settle_all();
      } L2CTL_THREAD_ENDED catch (...) {
      }
    });
    for (auto& anchor : registry->planner.take_released()) released.push_back(std::move(anchor));
  }
  lock_instance->release();
  if (released.empty()) {
    if (spare.capacity() == 0) spare = std::move(released);
    return;
  }
  // A scope that left the registry: its holder no longer names it. Then the references go, lock released.
  keeping_error([&] {  // an error on its way out stays the one to see
    for (const auto& anchor : released) try {
      const Scope_object& ended = *anchored(anchor);
      if (ended.holder.is_none()) continue;
      const py::object holder = weak_target(ended.holder.ptr());
      if (!holder) continue;
      if (Py_TYPE(holder.ptr()) == compiled_holders.type) {
        compiled_holders.forget(holder.ptr(), &ended);
        continue;
      }
      PyObject* named = PyObject_GetAttr(holder.ptr(), host.name.scope.ptr());
      if (named != nullptr && named != Py_None && py::isinstance<Scope_object>(named) &&
          &py::handle(named).cast<const Scope_object&>() == &ended)
        PyObject_SetAttr(holder.ptr(), host.name.scope.ptr(), Py_None);
      Py_XDECREF(named);
      PyErr_Clear();
    } L2CTL_THREAD_ENDED catch (...) {  // no memory for a name: the holder names the scope, no longer live
    }
    released.clear();
  });
  if (spare.capacity() == 0) spare = std::move(released);  // emptied above
}

void bind_lock(py::module_& m) {
  using namespace pybind11::literals;
  static Registry_lock* lock = new Registry_lock;
  lock_instance = lock;
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
  py::class_<Registry_lock, std::unique_ptr<Registry_lock, py::nodelete>>(m, "RegistryLock")
      .def(
          "acquire", [](Registry_lock& self, bool blocking, double timeout) { return self.acquire(blocking, timeout, true); },
          "blocking"_a = true, "timeout"_a = -1.0)
      .def("release", &Registry_lock::release)
      .def("_is_owned", &Registry_lock::owned)
      .def("close_for_exit",
           [](Registry_lock& self) {
             {
               Gil_released released;
               exit_gate->close();  // a compile in progress completes first
             }
             self.acquire(true, -1);  // an end in progress on another thread completes first
             self.closed = true;      // never released: the restore at exit is the last change l2ctl makes
           },
           "At interpreter exit, before the restore: compiles end, and this thread keeps the lock for good.")
      .def_property_readonly("closed", [](const Registry_lock& self) { return self.closed; })
      .def("__enter__", [](Registry_lock& self) { self.acquire(true, -1, true); })
      .def("__exit__", [](Registry_lock& self, py::args) { self.release(); });
  m.attr("registry_lock") = py::cast(lock, py::return_value_policy::reference);
}

}  // namespace l2ctl_bindings
