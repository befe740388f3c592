// A batch of device-state changes in one call, so that a persist scope crosses from Python into the core
// once per side: windows on streams and kernel nodes, the set-aside limit, a reset of persisting lines.
#pragma once

#include <cstdint>
#include <vector>

#include "l2ctl/window.hpp"

namespace l2ctl {

struct WindowChange {
  WindowHolder holder = WindowHolder::stream;
  std::uintptr_t handle = 0;
  Window window;
};

// Applies the window changes in order, then the limit (when `limit` >= 0), then resets persisting lines
// (when asked). Returns the limit the driver granted, read back, or -1 when the limit was left alone.
// Throws CudaError at the first failing call; the changes before it stay applied.
long long apply_state(int device, long long limit, const std::vector<WindowChange>& windows, bool reset_lines);

}  // namespace l2ctl
