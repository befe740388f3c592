// `register_host`: the Host checked field by field (a missing field, a field that is not callable, not a type,
// not an exception class: a TypeError naming it) and kept; once per process.
#include "host.hpp"

#include <cstddef>
#include <vector>

#include "l2ctl/window_value.hpp"

namespace l2ctl_bindings {

Host host;

namespace {

enum class Kind { callable, type, exception };

struct Field {
  const char* name;
  Kind kind;
  PyObject* Host::*slot;
};

#define L2CTL_CALLABLE(name) {#name, Kind::callable, &Host::name},
#define L2CTL_TYPE(name) {#name, Kind::type, &Host::name},
#define L2CTL_EXCEPTION(name) {#name, Kind::exception, &Host::name},
const Field fields[] = {L2CTL_HOST_FIELDS(L2CTL_CALLABLE, L2CTL_TYPE, L2CTL_EXCEPTION)};
#undef L2CTL_CALLABLE
#undef L2CTL_TYPE
#undef L2CTL_EXCEPTION

const char* kind_name(Kind kind) {
  return kind == Kind::callable ? "callable" : kind == Kind::type ? "type" : "exception";
}

[[noreturn]] void refuse(const char* field, const char* why) {
  PyErr_Format(PyExc_TypeError, "l2ctl._host.Host.%s: %s", field, why);
  throw py::error_already_set();
}

void register_host(py::handle given) {
  Host checked;
  std::vector<py::object> kept;  // released into the Host once every field passed
  for (const Field& f : fields) {
    PyObject* value = PyObject_GetAttrString(given.ptr(), f.name);
    if (value == nullptr) {
      PyErr_Clear();
      refuse(f.name, "missing");
    }
    py::object owned = py::reinterpret_steal<py::object>(value);
    const bool is_type = PyType_Check(value);
    if (f.kind == Kind::callable && !PyCallable_Check(value)) refuse(f.name, "not callable");
    if (f.kind == Kind::type && !is_type) refuse(f.name, "not a type");
    if (f.kind == Kind::exception &&
        !(is_type && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(value),
                                      reinterpret_cast<PyTypeObject*>(PyExc_BaseException))))
      refuse(f.name, "not an exception class");
    checked.*f.slot = owned.ptr();
    kept.push_back(std::move(owned));
  }
  py::object access[3];
  for (int value = 0; value < 3; ++value) access[value] = py::handle(checked.property_type)(value);
  py::object no_window = py::handle(checked.window_type)();
  if (host.registered) {
    PyErr_SetString(PyExc_RuntimeError, "l2ctl's Host is registered already (once per process, by l2ctl._host)");
    throw py::error_already_set();
  }
  for (py::object& field : kept) field.release();
  for (int value = 0; value < 3; ++value) checked.access[value] = access[value].release().ptr();
  checked.no_window = no_window.release().ptr();
  checked.registered = true;
  host = checked;
}

}  // namespace

const Host& registered_host() {
  if (!host.registered) {
    PyErr_SetString(PyExc_RuntimeError, "l2ctl's compiled layer has no Host: import l2ctl (l2ctl._host registers it)");
    throw py::error_already_set();
  }
  return host;
}

py::object window_object(const l2ctl::Window& w) {
  const Host& h = registered_host();
  const auto property = [&](int value) {
    return value >= 0 && value < 3 ? py::reinterpret_borrow<py::object>(h.access[value]) : py::handle(h.property_type)(value);
  };
  const py::object items[] = {py::int_(w.base), py::int_(w.num_bytes), py::float_(w.hit_ratio), property(w.hit_prop),
                              property(w.miss_prop)};
  // Made as tuple.__new__ makes a named tuple: no Python code runs.
  auto* type = reinterpret_cast<PyTypeObject*>(h.window_type);
  PyObject* out = type->tp_alloc(type, 5);
  if (out == nullptr) throw py::error_already_set();
  for (Py_ssize_t i = 0; i < 5; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(items[i].ptr()));
  return py::reinterpret_steal<py::object>(out);
}

l2ctl::Window to_window(py::handle w) {
  const py::tuple t(py::reinterpret_borrow<py::object>(w));
  if (t.size() != 5) throw py::type_error("a window is (base, num_bytes, hit_ratio, hit_prop, miss_prop)");
  return l2ctl::Window{t[0].cast<std::uintptr_t>(), t[1].cast<std::size_t>(), t[2].cast<double>(), t[3].cast<int>(),
                       t[4].cast<int>()};
}

void bind_host(py::module_& planner) {
  planner.def("register_host", &register_host, py::arg("host"),
              "Keep l2ctl._host.Host, what the compiled layer calls of Python, checked field by field (once).");
  py::list names;
  for (const Field& f : fields) names.append(py::make_tuple(f.name, kind_name(f.kind)));
  planner.attr("HOST_FIELDS") = py::tuple(names);
}

}  // namespace l2ctl_bindings
