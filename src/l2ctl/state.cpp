#include "l2ctl/state.hpp"

#include "l2ctl/device.hpp"

namespace l2ctl {

long long apply_state(int device, long long limit, const std::vector<WindowChange>& windows, bool reset_lines) {
  for (const WindowChange& change : windows) set_window(change.holder, change.handle, change.window);
  long long granted = -1;
  if (limit >= 0) granted = static_cast<long long>(set_persisting_limit(device, static_cast<std::size_t>(limit)));
  if (reset_lines) reset_persisting_lines(device);
  return granted;
}

}  // namespace l2ctl
