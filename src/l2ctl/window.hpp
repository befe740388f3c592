// Access-policy windows, wherever CUDA keeps one: a stream attribute or a graph kernel-node attribute.
// One conversion to CUDA's struct and one get/set path serve both holders.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "l2ctl/window_value.hpp"

namespace l2ctl {

static_assert(int{access_normal} == int{cudaAccessPropertyNormal} &&
                  int{access_streaming} == int{cudaAccessPropertyStreaming} &&
                  int{access_persisting} == int{cudaAccessPropertyPersisting},
              "window_value.hpp's AccessProperty must be CUDA's values");

Window get_window(WindowHolder holder, std::uintptr_t handle);
void set_window(WindowHolder holder, std::uintptr_t handle, const Window& window);

// "base 0x..., num_bytes N, hitRatio R, hitProp P, missProp M" for error details.
std::string describe(const Window& window);

}  // namespace l2ctl
