#include "l2ctl/state.hpp"

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

StateResult apply_state(int device, long long limit, bool at_least, const std::vector<WindowChange>& windows,
                        bool reset_lines, bool read_previous) {
  StateResult result;
  bool limit_changed = false;
  std::size_t applied = 0;
  // Reserved before anything changes: no allocation can fail between a change and the record of what it read.
  if (read_previous) result.previous.reserve(windows.size());
  try {
    if (limit >= 0) {
      const auto current = static_cast<long long>(get_persisting_limit(device));
      result.previous_limit = result.granted_limit = current;
      if (at_least ? current < limit : current != limit) {
        result.granted_limit = static_cast<long long>(set_persisting_limit(device, static_cast<std::size_t>(limit)));
        limit_changed = true;
      }
    }
    for (const WindowChange& change : windows) {
      if (read_previous) result.previous.push_back(get_window(change.holder, change.handle));
      set_window(change.holder, change.handle, change.window);
      ++applied;
    }
    if (reset_lines) reset_persisting_lines(device);
  } catch (const CudaError&) {
    // Best effort: the caller gets the first error, and the state it knew as far as possible.
    for (std::size_t i = 0; read_previous && i < applied; ++i) {
      try {
        set_window(windows[i].holder, windows[i].handle, result.previous[i]);
      } catch (const CudaError&) {
      }
    }
    if (limit_changed) {
      try {
        set_persisting_limit(device, static_cast<std::size_t>(result.previous_limit));
      } catch (const CudaError&) {
      }
    }
    throw;
  }
  return result;
}

}  // namespace l2ctl
