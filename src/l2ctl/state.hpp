// A planner's batch made on the CUDA runtime in one call (Cuda_calls::apply_batch): the set-aside limit, windows on
// streams and kernel nodes, a reset of persisting lines.
#pragma once

#include "l2ctl/planner.hpp"

namespace l2ctl {

// In order: the limit when `batch.limit` >= 0 (`at_least`: raised to it only if it is below, never lowered), the
// windows (reading each holder's window first when `read_previous`), then a reset of persisting lines when asked.
// On a failing call it puts back the limit and the windows whose previous value it read, then throws that call's
// CudaError (a window changed without `read_previous` stays changed). The result's storage is reserved before
// anything changes.
planner::Batch_result apply_batch(const planner::Batch& batch);

}  // namespace l2ctl
