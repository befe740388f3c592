// Driver API calls, found at run time through the runtime: l2ctl never links libcuda, so the module imports
// where no driver is installed and fails only when a device call is made.
#pragma once

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>  // the driver API's function types

#include "l2ctl/error.hpp"

namespace l2ctl {

// The driver's `symbol` with the ABI of CUDA `version` (e.g. 12000), or nullptr where the driver lacks it.
template <typename F>
F driver_entry(const char* symbol, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    clear_last_error();
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

}  // namespace l2ctl
