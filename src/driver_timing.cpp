// The driver calls a scope makes, timed in C++ in one loop each (no Python between them): what `bench overhead`
// records beside the scopes, so a scope's cost is read against the floor its calls set on the same host.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <vector>

#include "gil.hpp"
#include "l2ctl/device.hpp"
#include "l2ctl/window.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace l2ctl_bindings {

namespace {

template <typename F>
double microseconds_per(int iterations, F&& op) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) op();
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  return took.count() / iterations;
}

// One scope's worth of window calls on each holder: read what it holds, set the window, set it back.
void scope_calls(l2ctl::WindowHolder holder, const std::vector<std::uintptr_t>& handles, const l2ctl::Window& window) {
  for (std::uintptr_t handle : handles) {
    const l2ctl::Window previous = l2ctl::get_window(holder, handle);
    l2ctl::set_window(holder, handle, window);
    l2ctl::set_window(holder, handle, previous);
  }
}

}  // namespace

void bind_driver_timing(py::module_& core) {
  py::module_ m = core.def_submodule("_driver_timing", "a scope's driver calls timed in C++ (bench overhead)");
  m.def(
      "time_calls",
      [](int device, std::uintptr_t stream, const std::vector<std::uintptr_t>& nodes, std::uintptr_t base,
         std::size_t num_bytes, std::size_t up, std::size_t down, int iterations) {
        l2ctl::Window window;
        window.base = base;
        window.num_bytes = num_bytes;
        window.hit_ratio = 0.75f;
        window.hit_prop = l2ctl::access_persisting;
        window.miss_prop = l2ctl::access_streaming;
        const std::vector<std::uintptr_t> streams{stream};
        py::dict out;
        double lean, with_reset, graph, limits;
        {
          l2ctl_bindings::Gil_released released;
          lean = microseconds_per(iterations, [&] { scope_calls(l2ctl::WindowHolder::stream, streams, window); });
          with_reset = microseconds_per(iterations, [&] {
            scope_calls(l2ctl::WindowHolder::stream, streams, window);
            l2ctl::reset_persisting_lines(device);
          });
          graph = nodes.empty() ? -1.0 : microseconds_per(iterations, [&] {
            scope_calls(l2ctl::WindowHolder::kernel_node, nodes, window);
          });
          limits = microseconds_per(iterations, [&] {
            l2ctl::set_persisting_limit(device, up);
            l2ctl::set_persisting_limit(device, down);
          });
        }
        out["cpp_lean_calls"] = lean;
        out["cpp_default_calls"] = with_reset;
        if (graph >= 0) out["cpp_graph_32_calls"] = graph;
        out["cpp_set_limit_pair"] = limits;
        return out;
      },
      "device"_a, "stream"_a, "nodes"_a, "base"_a, "num_bytes"_a, "up"_a, "down"_a, "iterations"_a);
}

}  // namespace l2ctl_bindings
