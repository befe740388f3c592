#include "error_translation.hpp"

#include <cstring>
#include <new>
#include <stdexcept>

#include "host.hpp"
#include "l2ctl/counters.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl_bindings {

namespace {

// `type(*args)` raised; without a Host (l2ctl not imported yet) a RuntimeError with the message.
template <typename... Args>
void set_l2ctl_error(PyObject* Host::*type, const char* message, Args&&... args) {
  if (!host.registered) {
    PyErr_SetString(PyExc_RuntimeError, message);
    return;
  }
  py::handle cls = host.*type;
  py::object error = cls(std::forward<Args>(args)...);
  PyErr_SetObject(cls.ptr(), error.ptr());
}

PyObject* allocated_or_thrown(PyTypeObject* type, Py_ssize_t items) {
  PyObject* out = PyType_GenericAlloc(type, items);
  if (out == nullptr) throw py::error_already_set();
  return out;
}

PyObject* new_or_null(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  return guarded([&] { return py::detail::pybind11_object_new(type, args, kwargs); });
}

void check_classes(PyObject* module) {
  PyObject* names = PyModule_GetDict(module);  // borrowed
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(names, &pos, &key, &value)) {
    if (PyModule_Check(value)) {
      check_classes(value);
    } else if (PyType_Check(value)) {
      auto* type = reinterpret_cast<PyTypeObject*>(value);
      if (type->tp_new != py::detail::pybind11_object_new) continue;
      type->tp_alloc = allocated_or_thrown;
      type->tp_new = new_or_null;
      PyType_Modified(type);
    }
  }
}

}  // namespace

void checked_allocations(py::module_& module) { check_classes(module.ptr()); }

void set_python_error(const std::exception_ptr& cause) {
  try {
    try {
      std::rethrow_exception(cause);
    } catch (py::error_already_set& e) {
      e.restore();
      return;
    } L2CTL_THREAD_ENDED catch (...) {
    }
    // Any other exception with CPython's MemoryError pending: an allocation failed under it (pybind11 then
    // throws "Could not allocate ..." or a cast_error), and the MemoryError is the error.
    if (PyErr_Occurred() != nullptr && PyErr_ExceptionMatches(PyExc_MemoryError)) return;
    try {
      std::rethrow_exception(cause);
    } catch (const py::builtin_exception& e) {  // py::type_error and the like: the Python type they name
      e.set_error();
    } catch (const l2ctl::CudaError& e) {
      set_l2ctl_error(&Host::cuda_error, e.what(), e.call(), e.code(), e.name(), e.description(), e.details());
    } catch (const l2ctl::CuptiError& e) {
      set_l2ctl_error(&Host::cupti_error, e.what(), e.call(), e.code(), e.what());
    } catch (const l2ctl::KernelsUnavailable& e) {
      set_l2ctl_error(&Host::kernels_unavailable, e.what(), e.what());
    } catch (const l2ctl::NotSupported& e) {
      set_l2ctl_error(&Host::not_supported, e.what(), e.what());
    } catch (const pl::Call_failed&) {
      raise_planner_error(cause);
    } catch (const pl::Limit_refused&) {
      raise_planner_error(cause);
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::overflow_error& e) {
      PyErr_SetString(PyExc_OverflowError, e.what());
    } catch (const std::exception& e) {
      // pybind11's own failed allocations (a tuple, a str) are "Could not allocate ...": MemoryError.
      PyErr_SetString(std::strncmp(e.what(), "Could not allocate", 18) == 0 ? PyExc_MemoryError : PyExc_RuntimeError,
                      e.what());
    } L2CTL_THREAD_ENDED catch (...) {
      PyErr_SetString(PyExc_RuntimeError, "l2ctl: an unknown C++ exception");
    }
  } catch (py::error_already_set& e) {  // making the exception failed (raise_planner_error raises this way too)
    e.restore();
  } L2CTL_THREAD_ENDED catch (...) {
    PyErr_NoMemory();
  }
}

void add_note(py::handle error, const std::string& note) {
  if (py::hasattr(error, "add_note")) {
    error.attr("add_note")(note);
    return;
  }
  py::object notes = py::getattr(error, "__notes__", py::none());
  if (!PyList_Check(notes.ptr())) {
    notes = py::list();
    error.attr("__notes__") = notes;
  }
  notes.cast<py::list>().append(note);
}

// Planner errors as Python exceptions: a failed call as the backend raised it; a refused limit as
// NotSupportedError from the CUDA error.
py::object exception_object(const std::exception_ptr& cause) {
  try {
    std::rethrow_exception(cause);
  } catch (py::error_already_set& e) {
    return e.value();
  } catch (const l2ctl::CudaError& e) {
    return py::handle(registered_host().cuda_error)(e.call(), e.code(), e.name(), e.description(), e.details());
  } L2CTL_THREAD_ENDED catch (...) {
    return py::none();
  }
}

[[noreturn]] void raise(py::handle error) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_planner_error(const std::exception_ptr& cause) {
  try {
    std::rethrow_exception(cause);
  } catch (const pl::Call_failed& failure) {
    py::object error = exception_object(failure.cause);
    if (!failure.note.empty()) add_note(error, failure.note);
    raise(error);
  } catch (const pl::Limit_refused& refused) {
    py::object cause_object = exception_object(refused.cause);
    py::object error = py::handle(registered_host().not_supported)(refused.what());
    error.attr("__cause__") = cause_object;
    raise(error);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    throw py::error_already_set();
  }
}

}  // namespace l2ctl_bindings
