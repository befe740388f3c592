// l2ctl._core: a thin pybind11 layer over the C++ core. Every call that can take time releases the GIL; a
// scope's stream-attribute changes (apply_window with one holder and no limit or reset, well under a microsecond)
// keep it, since giving it up costs more than they do. C++ errors become l2ctl's Python exceptions through one
// translation (error_translation.cpp): CudaError as l2ctl.CudaError (defined in Python, so that it can be raised
// and caught without the extension, e.g. by the test backend).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "l2ctl/context.hpp"
#include "l2ctl/counters.hpp"
#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/graph.hpp"
#include "l2ctl/kernel_args.hpp"
#include "l2ctl/kernels.hpp"
#include "l2ctl/memory.hpp"
#include "l2ctl/event.hpp"
#include "l2ctl/state.hpp"
#include "l2ctl/stream.hpp"
#include "l2ctl/window.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

#include "error_translation.hpp"

namespace l2ctl_bindings {
void bind_planner(py::module_& m);        // planner_bindings.cpp
void bind_driver_timing(py::module_& m);  // driver_timing.cpp
}

namespace {

// f() with the GIL released; its result is converted to Python after the GIL is back.
template <typename F>
auto unlocked(F&& f) {
  l2ctl_bindings::Gil_released released;
  return f();
}
using release = py::call_guard<l2ctl_bindings::Gil_released>;

// f() with the GIL released, as work that interpreter exit waits for (NVRTC: l2ctl_bindings::Exit_gate).
template <typename F>
auto compiling(F&& f) {
  l2ctl_bindings::Gil_released released;
  l2ctl_bindings::Exit_gate::Pass pass(*l2ctl_bindings::exit_gate);  // left before the GIL is taken back
  return f();
}
using WindowTuple = std::tuple<std::uintptr_t, std::size_t, float, int, int>;

// What making the kernels' image did, as l2ctl.kernels.compile_info() reports it.
py::dict image_info(const l2ctl::KernelImage& image) {
  return py::dict("arch"_a = image.arch, "image"_a = image.cubin ? "cubin" : "ptx",
                  "source"_a = image.from_cache ? "cache" : "compiled", "seconds"_a = image.seconds,
                  "cache_file"_a = image.cache_file, "cache_note"_a = image.cache_note, "nvrtc"_a = image.nvrtc_path,
                  "nvrtc_version"_a = std::to_string(image.nvrtc_major) + "." + std::to_string(image.nvrtc_minor));
}

l2ctl::Window make_window(const WindowTuple& t) {
  l2ctl::Window w;
  std::tie(w.base, w.num_bytes, w.hit_ratio, w.hit_prop, w.miss_prop) = t;
  return w;
}

// get_<what>_window(handle) and set_<what>_window(handle, base, num_bytes, hit_ratio, hit_prop, miss_prop),
// defined once for every holder of a window.
void bind_window_accessors(py::module_& m, const std::string& what, l2ctl::WindowHolder holder) {
  m.def(
      ("get_" + what + "_window").c_str(),
      [holder](std::uintptr_t handle) {
        const l2ctl::Window w = l2ctl::get_window(holder, handle);
        return WindowTuple(w.base, w.num_bytes, w.hit_ratio, w.hit_prop, w.miss_prop);
      },
      py::arg(what.c_str()), release());
  m.def(
      ("set_" + what + "_window").c_str(),
      [holder](std::uintptr_t handle, std::uintptr_t base, std::size_t num_bytes, float hit_ratio, int hit_prop,
               int miss_prop) {
        l2ctl::set_window(holder, handle, make_window(WindowTuple(base, num_bytes, hit_ratio, hit_prop, miss_prop)));
      },
      py::arg(what.c_str()), "base"_a, "num_bytes"_a, "hit_ratio"_a, "hit_prop"_a, "miss_prop"_a, release());
}

// (context, primary context) of a stream or a pointer, found with the GIL released.
template <l2ctl::Contexts (*find)(std::uintptr_t)>
py::tuple contexts(std::uintptr_t handle) {
  const l2ctl::Contexts c = unlocked([&] { return find(handle); });
  return py::make_tuple(c.context, c.primary);
}

// Argument words as (parameter, offset, value) tuples.
py::list words_list(const std::vector<l2ctl::ArgumentWord>& words) {
  py::list out;
  for (const auto& w : words) out.append(py::make_tuple(w.param, w.offset, w.value));
  return out;
}

std::vector<l2ctl::WindowChange> window_changes(const std::vector<std::tuple<std::uintptr_t, WindowTuple>>& items,
                                                l2ctl::WindowHolder holder) {
  std::vector<l2ctl::WindowChange> out;
  out.reserve(items.size());
  for (const auto& [handle, window] : items) out.push_back({holder, handle, make_window(window)});
  return out;
}
// apply_window(device, kind, handles, base, num_bytes, hit_ratio, hit_prop, miss_prop, read_previous, limit,
// at_least, reset_lines, journal): one window on every handle (kind 0: streams, 1: graph kernel nodes), with the
// limit and the reset of apply_state; returns (limit before, limit after, [previous windows]), and appends that
// same tuple to `journal` (a list, or None) before returning: no Python code runs between the device's change
// and that append, so a caller interrupted as the call returns still finds what it read. A scope's commonest
// change, so it is a METH_FASTCALL function that reads its positional arguments itself: pybind11's dispatcher
// (argument loaders, overload resolution, keyword matching) costs more than the CUDA calls of a scope's side
// (about 0.25 us on an H100 host). The GIL is released only around the slow calls (a limit change, a reset,
// many holders): a stream attribute alone returns in well under a microsecond.
constexpr const char* apply_window_doc =
    "apply_window(device: int, kind: int, handles: Sequence[int], base: int, num_bytes: int, hit_ratio: float, "
    "hit_prop: int, miss_prop: int, read_previous: bool, limit: int, at_least: bool, reset_lines: bool, "
    "journal: list | None = None) -> tuple\n\n"
    "One window on every handle, with apply_state's limit and reset (positional arguments only).";

// The result of a batch: returned, and appended to the journal first when there is one.
PyObject* journaled(PyObject* result, PyObject* journal) {
  if (result != nullptr && journal != nullptr && journal != Py_None && PyList_Append(journal, result) != 0) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

PyObject* apply_window(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 12 && nargs != 13) {
    PyErr_Format(PyExc_TypeError, "apply_window() takes 12 or 13 positional arguments (%zd given)", nargs);
    return nullptr;
  }
  PyObject* journal = nargs == 13 ? args[12] : nullptr;
  if (journal != nullptr && journal != Py_None && !PyList_Check(journal)) {
    PyErr_SetString(PyExc_TypeError, "apply_window(): journal must be a list or None");
    return nullptr;
  }
  const long device = PyLong_AsLong(args[0]);
  const long kind = PyLong_AsLong(args[1]);
  l2ctl::Window window;
  window.base = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(args[3]));
  window.num_bytes = static_cast<std::size_t>(PyLong_AsUnsignedLongLong(args[4]));
  window.hit_ratio = static_cast<float>(PyFloat_AsDouble(args[5]));
  window.hit_prop = static_cast<int>(PyLong_AsLong(args[6]));
  window.miss_prop = static_cast<int>(PyLong_AsLong(args[7]));
  const int read_previous = PyObject_IsTrue(args[8]);
  const long long limit = PyLong_AsLongLong(args[9]);
  const int at_least = PyObject_IsTrue(args[10]);
  const int reset_lines = PyObject_IsTrue(args[11]);
  if (PyErr_Occurred()) return nullptr;
  PyObject* sequence = PySequence_Fast(args[2], "apply_window(): handles must be a sequence of ints");
  if (sequence == nullptr) return nullptr;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
  PyObject** items = PySequence_Fast_ITEMS(sequence);
  const l2ctl::WindowHolder holder = kind == 0 ? l2ctl::WindowHolder::stream : l2ctl::WindowHolder::kernel_node;
  std::vector<l2ctl::WindowChange> changes;
  changes.reserve(static_cast<std::size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i)
    changes.push_back({holder, static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(items[i])), window});
  Py_DECREF(sequence);
  if (PyErr_Occurred()) return nullptr;
  l2ctl::StateResult r;
  try {
    if (limit >= 0 || reset_lines || count > 1) {
      l2ctl_bindings::Gil_released unlocked;
      r = l2ctl::apply_state(static_cast<int>(device), limit, at_least != 0, changes, reset_lines != 0,
                             read_previous != 0);
    } else {
      r = l2ctl::apply_state(static_cast<int>(device), limit, at_least != 0, changes, false, read_previous != 0);
    }
  } L2CTL_THREAD_ENDED catch (...) {
    l2ctl_bindings::set_python_error(std::current_exception());
    return nullptr;
  }
  PyObject* previous = PyList_New(static_cast<Py_ssize_t>(r.previous.size()));
  if (previous == nullptr) return nullptr;
  for (std::size_t i = 0; i < r.previous.size(); ++i) {
    const l2ctl::Window& w = r.previous[i];
    PyObject* item = Py_BuildValue("(KKdii)", static_cast<unsigned long long>(w.base),
                                   static_cast<unsigned long long>(w.num_bytes), static_cast<double>(w.hit_ratio),
                                   w.hit_prop, w.miss_prop);
    if (item == nullptr) {
      Py_DECREF(previous);
      return nullptr;
    }
    PyList_SET_ITEM(previous, static_cast<Py_ssize_t>(i), item);
  }
  return journaled(Py_BuildValue("(LLN)", r.previous_limit, r.granted_limit, previous), journal);
}

PyMethodDef apply_window_def = {"apply_window",
                                reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(apply_window)),
                                METH_FASTCALL, apply_window_doc};
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "l2ctl C++/CUDA core (thin bindings; use the l2ctl package instead)";
  m.attr("__version__") = L2CTL_VERSION;

  py::register_exception_translator([](std::exception_ptr p) { l2ctl_bindings::set_python_error(p); });

  // Devices and the set-aside.
  m.def("device_count", &l2ctl::device_count, release());
  m.def("device_count_error", &l2ctl::device_count_error, release());
  m.def("current_device", &l2ctl::current_device, release());
  m.def(
      "device_properties",
      [](int device) {
        l2ctl::DeviceProperties p = unlocked([&] { return l2ctl::device_properties(device); });
        return py::dict("index"_a = p.index, "name"_a = p.name, "major"_a = p.major, "minor"_a = p.minor,
                        "multiprocessor_count"_a = p.multiprocessor_count, "l2_cache_size"_a = p.l2_cache_size,
                        "persisting_l2_cache_max_size"_a = p.persisting_l2_cache_max_size,
                        "access_policy_max_window_size"_a = p.access_policy_max_window_size,
                        "total_global_memory"_a = p.total_global_memory, "memory_bus_width"_a = p.memory_bus_width,
                        "pci_bus_id"_a = p.pci_bus_id, "uuid"_a = p.uuid);
      },
      "device"_a);
  m.def("get_persisting_limit", &l2ctl::get_persisting_limit, "device"_a, release());
  m.def("set_persisting_limit", &l2ctl::set_persisting_limit, "device"_a, "nbytes"_a, release());
  m.def("reset_persisting_lines", &l2ctl::reset_persisting_lines, "device"_a, release());
  m.def("driver_version", &l2ctl::driver_version, release());
  m.def("runtime_version", &l2ctl::runtime_version, release());
  m.def("device_synchronize", &l2ctl::device_synchronize, "device"_a, release());

  // Streams and windows.
  py::class_<l2ctl::Stream>(m, "Stream")
      .def(py::init<int, bool, int>(), "device"_a, "non_blocking"_a = true, "priority"_a = 0, release())
      .def_property_readonly("handle", &l2ctl::Stream::handle)
      .def_property_readonly("device", &l2ctl::Stream::device)
      .def_property_readonly("closed", &l2ctl::Stream::closed)
      .def("synchronize", &l2ctl::Stream::synchronize, release())
      .def("query", &l2ctl::Stream::query, release())
      .def("close", &l2ctl::Stream::close, release());
  m.def("stream_device", &l2ctl::stream_device, "stream"_a, release());
  m.def("stream_context", &contexts<l2ctl::stream_context>, "stream"_a);
  m.def("pointer_context", &contexts<l2ctl::pointer_context>, "ptr"_a);
  m.def("stream_synchronize", &l2ctl::stream_synchronize, "stream"_a, release());
  bind_window_accessors(m, "stream", l2ctl::WindowHolder::stream);

  py::class_<l2ctl::Event>(m, "Event")
      .def(py::init<int>(), "device"_a = -1, release())
      .def("record", &l2ctl::Event::record, "stream"_a, release())
      .def("wait_on", &l2ctl::Event::wait_on, "stream"_a, release())
      .def("synchronize", &l2ctl::Event::synchronize, release())
      .def("query", &l2ctl::Event::query)
      .def("elapsed_since", &l2ctl::Event::elapsed_since, "start"_a, release());

  // Memory.
  py::class_<l2ctl::DeviceMemory>(m, "DeviceMemory")
      .def(py::init<int, std::size_t>(), "device"_a, "nbytes"_a, release())
      .def_property_readonly("ptr", &l2ctl::DeviceMemory::ptr)
      .def_property_readonly("nbytes", &l2ctl::DeviceMemory::nbytes)
      .def_property_readonly("device", &l2ctl::DeviceMemory::device)
      .def_property_readonly("freed", &l2ctl::DeviceMemory::freed)
      .def("free", &l2ctl::DeviceMemory::free, release());
  m.def(
      "pointer_info",
      [](std::uintptr_t ptr) {
        l2ctl::PointerInfo info = unlocked([&] { return l2ctl::pointer_info(ptr); });
        return py::make_tuple(info.memory_type, info.device, info.range_base, info.range_size);
      },
      "ptr"_a);
  m.def(
      "copy_host_to_device",
      [](std::uintptr_t dst, py::buffer src, std::uintptr_t stream) {
        py::buffer_info info = src.request();
        std::size_t bytes = static_cast<std::size_t>(info.size) * static_cast<std::size_t>(info.itemsize);
        l2ctl_bindings::Gil_released unlocked;
        l2ctl::copy_host_to_device(dst, info.ptr, bytes, stream);
      },
      "dst"_a, "src"_a, "stream"_a);
  m.def(
      "copy_device_to_host",
      [](py::buffer dst, std::uintptr_t src, std::uintptr_t stream) {
        py::buffer_info info = dst.request(true);
        std::size_t bytes = static_cast<std::size_t>(info.size) * static_cast<std::size_t>(info.itemsize);
        l2ctl_bindings::Gil_released unlocked;
        l2ctl::copy_device_to_host(info.ptr, src, bytes, stream);
      },
      "dst"_a, "src"_a, "stream"_a);
  m.def("copy_device_to_device", &l2ctl::copy_device_to_device, "dst"_a, "src"_a, "nbytes"_a, "stream"_a, release());
  m.def("memset_device", &l2ctl::memset_device, "dst"_a, "value"_a, "nbytes"_a, "stream"_a, release());

  // Graphs.
  py::class_<l2ctl::Graph>(m, "Graph")
      .def(py::init<std::uintptr_t, bool>(), "handle"_a, "owned"_a)
      .def_property_readonly("handle", &l2ctl::Graph::handle)
      .def_property_readonly("owned", &l2ctl::Graph::owned)
      .def("destroy", &l2ctl::Graph::destroy, release());
  py::class_<l2ctl::GraphExec>(m, "GraphExec")
      .def(py::init<std::uintptr_t>(), "graph"_a, release())
      .def_property_readonly("handle", &l2ctl::GraphExec::handle)
      .def("launch", &l2ctl::GraphExec::launch, "stream"_a, release())
      .def("update", &l2ctl::GraphExec::update, "graph"_a, release())
      .def("destroy", &l2ctl::GraphExec::destroy, release());
  m.def("begin_capture", &l2ctl::begin_capture, "stream"_a, "mode"_a, release());
  m.def("end_capture", &l2ctl::end_capture, "stream"_a, release());
  m.def("is_capturing", &l2ctl::is_capturing, "stream"_a, release());
  m.def("graph_node_count", &l2ctl::graph_node_count, "graph"_a, release());
  m.def(
      "graph_kernel_nodes",
      [](std::uintptr_t graph) {
        std::vector<l2ctl::KernelNode> nodes = unlocked([&] { return l2ctl::graph_kernel_nodes(graph); });
        py::list out;
        for (const auto& k : nodes)
          out.append(py::make_tuple(k.node, k.function, py::make_tuple(k.grid[0], k.grid[1], k.grid[2]),
                                    py::make_tuple(k.block[0], k.block[1], k.block[2])));
        return out;
      },
      "graph"_a);
  m.def(
      "kernel_node_words",
      [](std::uintptr_t node) { return words_list(unlocked([&] { return l2ctl::kernel_node_words(node); })); },
      "node"_a);
  m.def("address_range", &l2ctl::address_range, "address"_a, release());
  bind_window_accessors(m, "node", l2ctl::WindowHolder::kernel_node);

  // The hottest call, without pybind11's dispatcher (see apply_window above).
  m.add_object("apply_window", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&apply_window_def, nullptr,
                                                                                   m.attr("__name__").ptr())));

  // Device state in one crossing (see l2ctl/state.hpp).
  m.def(
      "apply_state",
      [](int device, long long limit, bool at_least,
         const std::vector<std::tuple<std::uintptr_t, WindowTuple>>& stream_windows,
         const std::vector<std::tuple<std::uintptr_t, WindowTuple>>& node_windows, bool reset_lines,
         bool read_previous, py::object journal) {
        std::vector<l2ctl::WindowChange> changes = window_changes(stream_windows, l2ctl::WindowHolder::stream);
        std::vector<l2ctl::WindowChange> nodes = window_changes(node_windows, l2ctl::WindowHolder::kernel_node);
        changes.insert(changes.end(), nodes.begin(), nodes.end());
        l2ctl::StateResult r =
            unlocked([&] { return l2ctl::apply_state(device, limit, at_least, changes, reset_lines, read_previous); });
        py::list previous;
        for (const l2ctl::Window& w : r.previous)
          previous.append(py::make_tuple(w.base, w.num_bytes, w.hit_ratio, w.hit_prop, w.miss_prop));
        py::tuple result = py::make_tuple(r.previous_limit, r.granted_limit, previous);
        if (!journal.is_none()) journal.cast<py::list>().append(result);  // before returning: see apply_window
        return result;
      },
      "device"_a, "limit"_a, "at_least"_a, "stream_windows"_a, "node_windows"_a, "reset_lines"_a,
      "read_previous"_a, "journal"_a = py::none());

  // The planner: the registry of device state (planner_bindings.cpp).
  l2ctl_bindings::bind_planner(m);
  l2ctl_bindings::bind_driver_timing(m);

  // Hardware counters (CUPTI, loaded on first use).
  m.def("cupti_load", &l2ctl::cupti_load, "path"_a, release());
  m.def("cupti_loaded", &l2ctl::cupti_loaded);
  py::class_<l2ctl::RangeProfiler>(m, "RangeProfiler")
      .def(py::init<int, std::vector<std::string>, std::size_t, bool>(), "device"_a, "metrics"_a, "max_ranges"_a,
           "user_replay"_a = false, release())
      .def("start", &l2ctl::RangeProfiler::start, release())
      .def("end_pass", &l2ctl::RangeProfiler::end_pass, release())
      .def("stop",
           [](l2ctl::RangeProfiler& self) {
             std::vector<l2ctl::RangeValues> ranges = unlocked([&] { return self.stop(); });
             py::list out;
             for (const auto& r : ranges) out.append(py::make_tuple(r.name, r.values));
             return out;
           })
      .def("launches", &l2ctl::RangeProfiler::launches)
      .def_property_readonly("passes", &l2ctl::RangeProfiler::passes)
      .def_property_readonly("chip", &l2ctl::RangeProfiler::chip);
  // Kernel arguments as launched (eager discovery): CUPTI's launch callbacks.
  py::class_<l2ctl::LaunchRecorder>(m, "LaunchRecorder")
      .def(py::init<std::size_t>(), "max_launches"_a)
      .def("start", &l2ctl::LaunchRecorder::start, release())
      .def("stop",
           [](l2ctl::LaunchRecorder& self) {
             std::vector<l2ctl::LaunchArguments> launches = unlocked([&] { return self.stop(); });
             py::list out;
             for (const auto& l : launches)
               out.append(py::make_tuple(l.kernel, l.stream, l.device, words_list(l.words)));
             return out;
           })
      .def_property_readonly("dropped", &l2ctl::LaunchRecorder::dropped)
      .def_property_readonly("unreadable", &l2ctl::LaunchRecorder::unreadable);

  // Kernels: compiled by NVRTC, cached on disk, loaded per device.
  m.def(
      "load_kernels",
      [](int device, const std::vector<std::string>& nvrtc, const std::string& cache_dir) {
        return image_info(compiling([&] { return l2ctl::load_kernels(device, nvrtc, cache_dir); }));
      },
      "device"_a, "nvrtc"_a, "cache_dir"_a);
  m.def(
      "kernel_image",
      [](int arch, bool ptx, const std::vector<std::string>& nvrtc, const std::string& cache_dir) {
        l2ctl::KernelImage image = compiling([&] { return l2ctl::kernel_image(arch, ptx, nvrtc, cache_dir); });
        return py::make_tuple(py::bytes(image.data), image_info(image));
      },
      "arch"_a, "ptx"_a, "nvrtc"_a, "cache_dir"_a);
  m.def(
      "reset_data",
      [](int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len, std::uintptr_t lut,
         std::size_t lut_len, int variant, unsigned blocks_per_sm) {
        l2ctl::LaunchShape s = unlocked([&] {
          return l2ctl::reset_data(device, stream, out, out_len, lut, lut_len,
                                   static_cast<l2ctl::ResetVariant>(variant), blocks_per_sm);
        });
        return py::make_tuple(s.blocks, s.threads, s.vector_out, s.vector_lut);
      },
      "device"_a, "stream"_a, "out"_a, "out_len"_a, "lut"_a, "lut_len"_a, "variant"_a, "blocks_per_sm"_a = 0);
  m.def("reset_data_verify", &l2ctl::reset_data_verify, "device"_a, "stream"_a, "out"_a, "out_len"_a, "lut"_a,
        "lut_len"_a, release());
  m.def("write_index", &l2ctl::write_index, "device"_a, "stream"_a, "buf"_a, "len"_a, release());
  m.def("count_index_mismatches", &l2ctl::count_index_mismatches, "device"_a, "stream"_a, "buf"_a, "len"_a, release());
  m.def("copy_words", &l2ctl::copy_words, "device"_a, "stream"_a, "dst"_a, "src"_a, "len"_a, release());
  m.def("count_mismatches", &l2ctl::count_mismatches, "device"_a, "stream"_a, "a"_a, "b"_a, "len"_a, release());
  m.def("read_sum", &l2ctl::read_sum, "device"_a, "stream"_a, "buf"_a, "len"_a, "partials"_a, release());
  m.def("max_read_partials", &l2ctl::max_read_partials, "device"_a, release());
  m.def("stride_read", &l2ctl::stride_read, "device"_a, "stream"_a, "buf"_a, "threads"_a, "stride_words"_a,
        "partials"_a, "block_threads"_a = 256, release());
  m.def("sum_u64", &l2ctl::sum_u64, "device"_a, "stream"_a, "values"_a, "count"_a, release());
  m.def("sparse_vector", &l2ctl::sparse_vector, "device"_a, "stream"_a, "values"_a, "indices"_a, "dense"_a,
        "dense_len"_a, "result"_a, "len"_a, "streaming"_a, release());
  m.def("stream_analysis", &l2ctl::stream_analysis, "device"_a, "stream"_a, "data"_a, "categories"_a, "weights"_a,
        "weights_len"_a, "results"_a, "len"_a, "streaming"_a, release());

  l2ctl_bindings::checked_allocations(m);  // last: every class of the module made
}
