// C++ errors as the Python exceptions they stand for, written once: `set_python_error` (every C++ exception,
// with a catch-all), used by pybind11's translator (bindings.cpp) and by the plain CPython entry points
// (`guarded`); `translated` turns the planner's errors into Python ones for callers in C++.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "gil.hpp"
#include "l2ctl/planner.hpp"

namespace l2ctl_bindings {

namespace py = pybind11;
namespace pl = l2ctl::planner;

// Sets the Python error `cause` stands for: a Python error as it is; l2ctl's CudaError, CuptiError,
// KernelsUnavailable and NotSupported as l2ctl's exceptions; an allocation failure (std::bad_alloc, or pybind11's
// "Could not allocate" after CPython's own MemoryError) as MemoryError; std::invalid_argument as ValueError; any
// other exception as RuntimeError.
void set_python_error(const std::exception_ptr& cause);

// f() for a CPython slot: its result, or null with the Python error set (`failed`: what null is for the slot).
template <typename F>
auto guarded(F&& f, decltype(f()) failed = {}) -> decltype(f()) {
  try {
    return f();
  } L2CTL_THREAD_ENDED catch (...) {
    set_python_error(std::current_exception());
    return failed;
  }
}

[[noreturn]] inline void value_error(const std::string& message) {
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw py::error_already_set();
}

// pybind11 makes an instance without checking what tp_alloc returned (make_new_instance writes into it): every
// pybind11 class of `module` and its submodules allocates through a tp_alloc that raises a failed allocation as a
// C++ exception (pybind11 unwinds it to our translation), and a tp_new that turns it into MemoryError.
void checked_allocations(py::module_& module);

// `note` added to the exception `error`: its add_note (3.11+), or on 3.10 its `__notes__` list, where PEP 678 keeps
// notes (3.10's traceback does not print them, but they stay on the error).
void add_note(py::handle error, const std::string& note);

py::object exception_object(const std::exception_ptr& cause);
[[noreturn]] void raise(py::handle error);
[[noreturn]] void raise_planner_error(const std::exception_ptr& cause);

// Every planner error as the Python exception it stands for (py::error_already_set), so that callers in C++
// (a scope's __enter__ and __exit__) see one kind of error.
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const pl::Call_failed&) {
    raise_planner_error(std::current_exception());
  } catch (const pl::Limit_refused&) {
    raise_planner_error(std::current_exception());
  } catch (const std::invalid_argument&) {
    raise_planner_error(std::current_exception());
  }
}

}  // namespace l2ctl_bindings
