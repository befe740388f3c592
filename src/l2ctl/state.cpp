#include "l2ctl/state.hpp"

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/window.hpp"

namespace l2ctl {

planner::Batch_result apply_batch(const planner::Batch& batch) {
  planner::Batch_result result;
  bool limit_changed = false;
  std::size_t applied = 0;
  const auto holder = [](const planner::Slot& slot) { return static_cast<WindowHolder>(slot.kind); };
  // Reserved before anything changes: no allocation can fail between a change and the record of what it read.
  if (batch.read_previous) result.previous.reserve(batch.changes.size());
  try {
    if (batch.limit >= 0) {
      const auto current = static_cast<long long>(get_persisting_limit(batch.device));
      result.previous_limit = result.granted_limit = current;
      if (batch.at_least ? current < batch.limit : current != batch.limit) {
        result.granted_limit =
            static_cast<long long>(set_persisting_limit(batch.device, static_cast<std::size_t>(batch.limit)));
        limit_changed = true;
      }
    }
    for (const auto& [slot, window] : batch.changes) {
      if (batch.read_previous) result.previous.push_back(get_window(holder(slot), slot.handle));
      set_window(holder(slot), slot.handle, window);
      ++applied;
    }
    if (batch.reset_lines) reset_persisting_lines(batch.device);
  } catch (const CudaError&) {
    // Best effort: the caller gets the first error, and the state it knew as far as possible.
    for (std::size_t i = 0; batch.read_previous && i < applied; ++i) {
      try {
        set_window(holder(batch.changes[i].first), batch.changes[i].first.handle, result.previous[i]);
      } catch (const CudaError&) {
      }
    }
    if (limit_changed) {
      try {
        set_persisting_limit(batch.device, static_cast<std::size_t>(result.previous_limit));
      } catch (const CudaError&) {
      }
    }
    throw;
  }
  return result;
}

}  // namespace l2ctl
