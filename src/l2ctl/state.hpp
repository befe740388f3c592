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

struct StateResult {
  long long previous_limit = -1;  // the limit before the call, when the limit was asked about
  long long granted_limit = -1;   // the limit after it (read back), likewise
  std::vector<Window> previous;   // what each changed holder held before, when asked for
};

// In order: the limit when `limit` >= 0 (`at_least`: raised to `limit` only if it is below, never lowered),
// the window changes (reading each holder's window first when `read_previous`), then a reset of persisting
// lines when asked. On a failing call it puts back the limit and the windows whose previous value it read,
// then throws that call's CudaError (a window changed without `read_previous` stays changed).
StateResult apply_state(int device, long long limit, bool at_least, const std::vector<WindowChange>& windows,
                        bool reset_lines, bool read_previous);

}  // namespace l2ctl
