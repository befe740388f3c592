// An access-policy window as a value, without CUDA: the one window shape of the C++ side. The planner plans with it,
// the backends apply it; window.hpp converts it to CUDA's struct, and the bindings to Python's AccessPolicyWindow
// (planner_bindings.cpp: window_object, to_window). The planner (planner.hpp) and its unit tests need no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace l2ctl {

// cudaAccessProperty's values (checked against CUDA's enum in window.cpp).
enum AccessProperty : int { access_normal = 0, access_streaming = 1, access_persisting = 2 };

// The hit ratio as the caller gave it (double precision: the planner plans with it); CUDA keeps it as a float.
struct Window {
  std::uintptr_t base = 0;
  std::size_t num_bytes = 0;
  double hit_ratio = 0.0;
  int hit_prop = access_normal;
  int miss_prop = access_normal;
  // The persisting lines it asks for: hit ratio x bytes when its hits persist.
  double demand() const { return hit_prop == access_persisting ? hit_ratio * static_cast<double>(num_bytes) : 0.0; }
  bool operator==(const Window& o) const {
    return base == o.base && num_bytes == o.num_bytes && hit_ratio == o.hit_ratio && hit_prop == o.hit_prop &&
           miss_prop == o.miss_prop;
  }
  bool operator!=(const Window& o) const { return !(*this == o); }
};

// What holds a window: a cudaStream_t or a cudaGraphNode_t (kernel node), both passed as handles. Its values are the
// planner's slot kinds (planner.hpp) and what Python calls them (l2ctl._registry.STREAM, NODE).
enum class WindowHolder : int { stream = 0, kernel_node = 1 };

}  // namespace l2ctl
