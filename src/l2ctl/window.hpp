// Access-policy windows, wherever CUDA keeps one: a stream attribute or a graph kernel-node attribute.
// One conversion to CUDA's struct and one get/set path serve both holders.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace l2ctl {

struct Window {
  std::uintptr_t base = 0;
  std::size_t num_bytes = 0;
  float hit_ratio = 0.0f;
  int hit_prop = cudaAccessPropertyNormal;
  int miss_prop = cudaAccessPropertyNormal;
};

// What holds a window: a cudaStream_t or a cudaGraphNode_t (kernel node), both passed as handles.
enum class WindowHolder { stream, kernel_node };

Window get_window(WindowHolder holder, std::uintptr_t handle);
void set_window(WindowHolder holder, std::uintptr_t handle, const Window& window);

// "base 0x..., num_bytes N, hitRatio R, hitProp P, missProp M" for error details.
std::string describe(const Window& window);

}  // namespace l2ctl
