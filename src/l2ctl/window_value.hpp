// An access-policy window as a value, without CUDA: what the planner plans with and the backends apply.
// window.hpp converts it to CUDA's struct; the planner (planner.hpp) and its unit tests need no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace l2ctl {

// cudaAccessProperty's values (checked against CUDA's enum in window.cpp).
enum AccessProperty : int { access_normal = 0, access_streaming = 1, access_persisting = 2 };

struct Window {
  std::uintptr_t base = 0;
  std::size_t num_bytes = 0;
  float hit_ratio = 0.0f;
  int hit_prop = access_normal;
  int miss_prop = access_normal;
};

// What holds a window: a cudaStream_t or a cudaGraphNode_t (kernel node), both passed as handles.
enum class WindowHolder { stream, kernel_node };

}  // namespace l2ctl
