// The registry's lock (one for every backend) and what a fork does to it.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "gil.hpp"

namespace l2ctl_bindings {

namespace py = pybind11;

// One lock for every backend, as a Python object too (`_registry.lock`: acquire/release/with, reentrant for its
// owner). Entry points refuse the thread that holds it. Waiting happens with the GIL released: the holder may
// need the GIL to finish (the simulator's calls).
struct Registry_lock {
  std::timed_mutex mutex;
  std::atomic<std::thread::id> owner{};
  int depth = 0;
  // Set at interpreter exit, once every device is restored: the exit's thread keeps the lock for good, so a daemon
  // thread still running enters no scope the restore would miss, and waits without the GIL, where CPython's
  // finalization never ends it.
  bool closed = false;

  bool owned() const { return owner.load() == std::this_thread::get_id(); }

  // `interruptible`: a signal's Python handler runs while waiting, and what it raises (KeyboardInterrupt) ends the
  // wait (only where giving up is safe: before a change, as `threading.Lock.acquire` does); otherwise the signal
  // waits for the lock's return.
  bool acquire(bool blocking, double timeout, bool interruptible = false) {
    if (owned()) {
      ++depth;
      return true;
    }
    bool got = mutex.try_lock();
    if (!got && blocking && !interruptible) {
      Gil_released released;
      if (timeout < 0) {
        mutex.lock();
        got = true;
      } else {
        got = mutex.try_lock_for(std::chrono::duration<double>(timeout));
      }
      if (got) released.unlock_if_ended(&mutex);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout < 0 ? 0 : timeout);
    while (!got && blocking && interruptible) {
      {
        Gil_released released;
        got = mutex.try_lock_for(std::chrono::milliseconds(20));
        if (got) released.unlock_if_ended(&mutex);
      }
      if (got || (timeout >= 0 && std::chrono::steady_clock::now() >= deadline)) break;
      if (PyErr_CheckSignals() < 0) throw py::error_already_set();
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

extern Registry_lock* lock_instance;  // never freed: the at-fork hook and atexit may use it late
// Moves at each fork: registries made before it are unreachable in the child.
extern std::atomic<std::uint64_t> fork_epoch;

struct Registry_object;

// The lock for one call into a registry: the reentry check, the wait (GIL released), and at the end, after the
// lock is released, the references the call dropped (and the holders that named those scopes told).
class Locked {
 public:
  // `interruptible`: a Ctrl-C while waiting for the lock ends the wait (for calls that have changed nothing yet).
  explicit Locked(Registry_object* registry, bool interruptible = false);
  ~Locked();
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  Registry_object* registry_;
};

// Registries with scopes whose end a finalizer asked for inside an l2ctl call on the lock's own thread (the GIL
// guards it): the call in progress ends them as it returns.
std::vector<std::shared_ptr<Registry_object>>& deferred_ends();

// `_planner.RegistryLock` and `registry_lock`, and the at-fork hook.
void bind_lock(py::module_& planner);

}  // namespace l2ctl_bindings
