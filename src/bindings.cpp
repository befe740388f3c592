// l2ctl._core: a thin pybind11 layer over the C++ core. Every call that can take time releases the GIL (the
// planner's own calls keep it for a stream attribute alone: backend_calls.cpp). C++ errors become l2ctl's Python
// exceptions through one translation (error_translation.cpp): CudaError as l2ctl.CudaError (defined in Python, so
// that it can be raised and caught without the extension, e.g. by the test backend).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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
#include "l2ctl/stream.hpp"
#include "l2ctl/window.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

#include "error_translation.hpp"
#include "host.hpp"

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

// What making the kernels' image did, as l2ctl.kernels.compile_info() reports it.
py::dict image_info(const l2ctl::KernelImage& image) {
  return py::dict("arch"_a = image.arch, "image"_a = image.cubin ? "cubin" : "ptx",
                  "source"_a = image.from_cache ? "cache" : "compiled", "seconds"_a = image.seconds,
                  "cache_file"_a = image.cache_file, "cache_note"_a = image.cache_note, "nvrtc"_a = image.nvrtc_path,
                  "nvrtc_version"_a = std::to_string(image.nvrtc_major) + "." + std::to_string(image.nvrtc_minor));
}

// get_<what>_window(handle) -> AccessPolicyWindow: CUDA's own read, defined once for every holder of a window. No
// call of the extension's sets one: the planner makes every change (backend_calls.cpp).
void bind_window_reader(py::module_& m, const std::string& what, l2ctl::WindowHolder holder) {
  m.def(
      ("get_" + what + "_window").c_str(),
      [holder](std::uintptr_t handle) {
        return l2ctl_bindings::window_object(unlocked([&] { return l2ctl::get_window(holder, handle); }));
      },
      py::arg(what.c_str()));
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
  bind_window_reader(m, "stream", l2ctl::WindowHolder::stream);

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
  bind_window_reader(m, "node", l2ctl::WindowHolder::kernel_node);

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
