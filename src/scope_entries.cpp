// The compiled entries and ends of the other scopes: the scoped window and the set_aside scope (one compiled
// `__exit__`, scope_exit), `with l2ctl.Stream()`, and `graph.capture`. Every `with` block l2ctl gives enters and
// ends in compiled code, so no Python code of l2ctl's runs between the device's change and its record.
#include "persist_type.hpp"

namespace l2ctl_bindings {

namespace {

// `__enter__` of the scoped window: `self._prepare_entry()` (Python: resolves the target and checks the window,
// changing nothing on the device; it keeps what the end calls and marks stale, `_changed` and `_executables`) gives
// the scope; the entry and what follows are compiled, and an error after the entry ends the scope here.
py::object holder_enter(py::object self) {
  const py::object scope = self.attr(host.name.prepare_entry)();
  const auto record = scope.cast<std::shared_ptr<Scope_object>>();
  py::object backend;
  const std::shared_ptr<Registry_object> registry = active_registry(&backend);
  enter_scope(registry, record, limits_of(*registry, record->core->device).persisting_max, self, backend);
  const py::object changed = self.attr(host.name.changed);
  if (!changed.is_none()) {
    try {
      changed(scope);
    } catch (py::error_already_set& error) {
      try {
        finish_scope(*record, self.attr(host.name.executables), changed, error.value());
      } catch (py::error_already_set&) {
      }
      throw;
    }
  }
  return self;
}

// `__enter__` of a set_aside scope: the request, standing until now, ends with the block.
py::object set_aside_enter(py::object self) {
  py::object scope = self.attr(host.name.scope);
  scope.cast<Scope_object&>().core->standing = false;
  return self;
}

// This thread's stack of current l2ctl streams (the Host's `current_streams`).
py::list current_streams() {
  PyObject* streams = PyObject_CallNoArgs(registered_host().current_streams);
  if (streams == nullptr) throw py::error_already_set();
  if (!PyList_Check(streams)) {
    Py_DECREF(streams);
    throw py::type_error("l2ctl._host.Host.current_streams() must return a list");
  }
  return py::reinterpret_steal<py::list>(streams);
}

// `with stream:`: a closed stream is refused; otherwise the stream joins this thread's stack of current streams.
py::object stream_enter(py::object self) {
  PyObject* ref = own_ref(self.ptr());
  if (ref == nullptr) value_error("the stream is closed");
  Py_DECREF(ref);
  current_streams().append(self);
  return self;
}

// `with stream:` ended: the innermost entry of this stream leaves this thread's stack of current streams, by
// list operations alone (no Python code runs, so no interrupt leaves the stream current).
py::object stream_exit(py::object self, py::object, py::object, py::object) {
  py::list streams = current_streams();
  for (Py_ssize_t i = static_cast<Py_ssize_t>(streams.size()) - 1; i >= 0; --i)
    if (PyList_GET_ITEM(streams.ptr(), i) == self.ptr()) {
      PySequence_DelItem(streams.ptr(), i);
      break;
    }
  return py::none();
}

// `with graph.capture(stream) as g:` began: the capture and its record (`_capturing`) with no bytecode between. A
// call cut short in the backend (the simulator's Python) may have begun it: the stream is asked, and ended.
// `_capturing`: False before the capture, True while it runs, None once it ended (one capture per object: its Graph
// object has been given its graph, or the partial one was destroyed).
py::object capture_enter(py::object self) {
  const py::object state = self.attr(host.name.capturing);
  if (state.is_none()) {
    PyErr_SetString(PyExc_RuntimeError, "this capture has ended; make a new one with graph.capture(...)");
    throw py::error_already_set();
  }
  if (state.cast<bool>()) {
    PyErr_SetString(PyExc_RuntimeError, "this capture is already under way; make a new one with graph.capture(...)");
    throw py::error_already_set();
  }
  py::object backend = self.attr(host.name.backend);
  py::object stream = self.attr(host.name.stream);
  try {
    backend.attr(L2CTL_NAME("begin_capture"))(stream, self.attr(host.name.mode));
  } catch (py::error_already_set&) {
    try {
      if (backend.attr(L2CTL_NAME("is_capturing"))(stream).cast<bool>()) {
        const py::object handle = backend.attr(L2CTL_NAME("end_capture"))(stream);
        if (handle.cast<std::uintptr_t>() != 0) backend.attr(L2CTL_NAME("Graph"))(handle, true).attr("destroy")();
      }
    } catch (py::error_already_set&) {
      // the first error is the one to see
    }
    throw;
  }
  self.attr(host.name.capturing) = true;
  return self.attr(host.name.graph);
}

// The capture ended: its graph given to the Graph object, or, when the block raised, destroyed (the block's
// error is the one to see).
py::object capture_exit(py::object self, py::object, py::object exc, py::object) {
  const py::object state = self.attr(host.name.capturing);
  if (state.is_none() || !state.cast<bool>()) return py::none();
  py::object backend = self.attr(host.name.backend);
  py::object handle;
  try {
    handle = backend.attr(L2CTL_NAME("end_capture"))(self.attr(host.name.stream));
  } catch (py::error_already_set&) {
    self.attr(host.name.capturing) = py::none();
    if (!exc.is_none()) return py::none();  // the capture may already be invalidated; the block's error matters
    throw;
  }
  self.attr(host.name.capturing) = py::none();
  if (!exc.is_none()) {
    try {
      if (handle.cast<std::uintptr_t>() != 0) backend.attr(L2CTL_NAME("Graph"))(handle, true).attr("destroy")();
    } catch (py::error_already_set&) {
    }
    return py::none();
  }
  self.attr(host.name.graph).attr(host.name.impl) = backend.attr(L2CTL_NAME("Graph"))(handle, true);
  return py::none();
}

py::object instance_method(py::cpp_function f) {
  return py::reinterpret_steal<py::object>(PyInstanceMethod_New(f.ptr()));
}
// `__exit__` of the scoped window and the set_aside scope: the object's live scope (`_scope`) ended, with its
// `_executables` and `_changed` (finish_scope).
py::object scope_exit(py::object self, py::object, py::object exc, py::object) {
  py::object scope = py::getattr(self, host.name.scope, py::none());
  if (scope.is_none()) return py::none();
  finish_scope(scope.cast<Scope_object&>(), py::getattr(self, host.name.executables, py::none()),
               py::getattr(self, host.name.changed, py::none()), exc);
  return py::none();
}

}  // namespace

void bind_scope_entries(py::module_& planner) {
  using namespace pybind11::literals;
  auto exit_method = [](auto f) {
    return instance_method(py::cpp_function(f, py::name("__exit__"), "self"_a, "exc_type"_a, "exc"_a, "tb"_a));
  };
  planner.attr("holder_enter") = instance_method(py::cpp_function(&holder_enter, py::name("__enter__")));
  planner.attr("set_aside_enter") = instance_method(py::cpp_function(&set_aside_enter, py::name("__enter__")));
  planner.attr("stream_enter") = instance_method(py::cpp_function(&stream_enter, py::name("__enter__")));
  planner.attr("stream_exit") = exit_method(&stream_exit);
  planner.attr("capture_enter") = instance_method(py::cpp_function(&capture_enter, py::name("__enter__")));
  planner.attr("capture_exit") = exit_method(&capture_exit);
  // `__exit__` of the scoped window and the set_aside scope: compiled, so that no Python code of l2ctl's runs
  // between the with statement's end and the scope's (an interrupt there would leave it live). An instance
  // method: it binds to the scope object as a def in the class body does.
  planner.attr("scope_exit") = exit_method(&scope_exit);
}

}  // namespace l2ctl_bindings
