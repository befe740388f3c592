// `register_host`: the Host checked field by field (a missing field, a field that is not callable, not a type,
// not an exception class: a TypeError naming it) and kept; once per process.
#include "host.hpp"

#include <cstddef>
#include <string>
#include <vector>

#include "persist_type.hpp"

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

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  PyErr_Format(PyExc_TypeError, "l2ctl._host.%s: %s", field.c_str(), why.c_str());
  throw py::error_already_set();
}

// `key`'s name in l2ctl._host.Names (a str), interned.
PyObject* name_of(py::handle names, const char* key) {
  PyObject* value = PyObject_GetAttrString(names.ptr(), key);
  if (value == nullptr) PyErr_Clear();
  if (value == nullptr || !PyUnicode_CheckExact(value)) {
    Py_XDECREF(value);
    refuse(std::string("Names.") + key, "missing (a str: the attribute's name)");
  }
  PyUnicode_InternInPlace(&value);
  return value;
}

// `record` of the Host's `field` type, whose fields `names` are found by name: a NamedTuple's positions
// (`_fields`), or the fields a dataclass declares (`__dataclass_fields__`, read by name).
template <typename Fields>
void resolve(Record<Fields>& record, const char* field, py::handle type, const char* const (&names)[Fields::count]) {
  record.type = reinterpret_cast<PyTypeObject*>(type.ptr());
  const py::object fields = py::getattr(type, "_fields", py::none());
  const py::object declared = py::getattr(type, "__dataclass_fields__", py::none());
  for (int i = 0; i < Fields::count; ++i) {
    record.name[i] = PyUnicode_InternFromString(names[i]);
    if (record.name[i] == nullptr) throw py::error_already_set();
    if (!fields.is_none()) {
      const Py_ssize_t at = PySequence_Index(fields.ptr(), record.name[i]);
      if (at < 0) PyErr_Clear();
      record.at[i] = at;
    }
    const bool found = fields.is_none() ? !declared.is_none() && declared.contains(py::handle(record.name[i])) : record.at[i] >= 0;
    if (!found) refuse(std::string("Host.") + field, std::string("no field ") + names[i] + " (src/host.hpp reads it)");
  }
}

#define L2CTL_NAME_TEXT(name) #name,
const char* const stream_ref_fields[] = {L2CTL_STREAM_REF_FIELDS(L2CTL_NAME_TEXT)};
const char* const buffer_ref_fields[] = {L2CTL_BUFFER_REF_FIELDS(L2CTL_NAME_TEXT)};
const char* const target_fields[] = {L2CTL_TARGET_FIELDS(L2CTL_NAME_TEXT)};
const char* const policy_fields[] = {L2CTL_POLICY_FIELDS(L2CTL_NAME_TEXT)};

void register_host(py::handle given) {
  Host checked;
  std::vector<py::object> kept;  // released into the Host once every field passed
  for (const Field& f : fields) {
    PyObject* value = PyObject_GetAttrString(given.ptr(), f.name);
    const std::string field = std::string("Host.") + f.name;
    if (value == nullptr) {
      PyErr_Clear();
      refuse(field, "missing");
    }
    py::object owned = py::reinterpret_steal<py::object>(value);
    const bool is_type = PyType_Check(value);
    if (f.kind == Kind::callable && !PyCallable_Check(value)) refuse(field, "not callable");
    if (f.kind == Kind::type && !is_type) refuse(field, "not a type");
    if (f.kind == Kind::exception &&
        !(is_type && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(value),
                                      reinterpret_cast<PyTypeObject*>(PyExc_BaseException))))
      refuse(field, "not an exception class");
    checked.*f.slot = owned.ptr();
    kept.push_back(std::move(owned));
  }
#define L2CTL_INTERN(key) checked.name.key = name_of(checked.names, #key);
  L2CTL_HOST_NAMES(L2CTL_INTERN)
#undef L2CTL_INTERN
  resolve(checked.stream_ref, "stream_ref_type", checked.stream_ref_type, stream_ref_fields);
  resolve(checked.buffer_ref, "buffer_ref_type", checked.buffer_ref_type, buffer_ref_fields);
  resolve(checked.target, "target_type", checked.target_type, target_fields);
  resolve(checked.policy, "policy_type", checked.policy_type, policy_fields);
  const Persist_arguments arguments = check_persist_arguments(checked.prepare, checked.request_type);
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
  persist_arguments = arguments;
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
