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

// Every driver call l2ctl makes, by its driver name, found once (nullptr where the driver lacks it): the type
// PFN_<name>_v<type>, asked for with the ABI of CUDA `abi`.
struct DriverCalls {
#define L2CTL_DRIVER_CALL(name, type, abi) PFN_##name##_v##type name = driver_entry<PFN_##name##_v##type>(#name, abi);
  L2CTL_DRIVER_CALL(cuCtxGetCurrent, 4000, 12000)
  L2CTL_DRIVER_CALL(cuCtxGetDevice, 2000, 2000)
  L2CTL_DRIVER_CALL(cuStreamGetCtx, 9020, 12000)
  L2CTL_DRIVER_CALL(cuPointerGetAttribute, 4000, 12000)
  L2CTL_DRIVER_CALL(cuDevicePrimaryCtxRetain, 7000, 12000)
  L2CTL_DRIVER_CALL(cuDevicePrimaryCtxRelease, 11000, 12000)
  L2CTL_DRIVER_CALL(cuMemGetAddressRange, 3020, 12000)
  // Why the driver for kernel nodes: the runtime describes a node only through its own registered host stubs,
  // so for nodes that another library's runtime (PyTorch's libcudart) or the driver API (Triton) created, it
  // gives no name, no launch shape and no arguments; the driver knows every node's CUfunction or CUkernel.
  L2CTL_DRIVER_CALL(cuGraphKernelNodeGetParams, 12000, 12000)
  L2CTL_DRIVER_CALL(cuFuncGetName, 12030, 12030)
  L2CTL_DRIVER_CALL(cuKernelGetName, 12030, 12030)
  L2CTL_DRIVER_CALL(cuFuncGetParamInfo, 12040, 12040)
  L2CTL_DRIVER_CALL(cuKernelGetParamInfo, 12040, 12040)
  L2CTL_DRIVER_CALL(cuLibraryLoadData, 12000, 12000)
  L2CTL_DRIVER_CALL(cuLibraryUnload, 12000, 12000)
  L2CTL_DRIVER_CALL(cuLibraryGetModule, 12000, 12000)
  L2CTL_DRIVER_CALL(cuLibraryGetKernel, 12000, 12000)
  L2CTL_DRIVER_CALL(cuLaunchKernel, 4000, 4000)
  L2CTL_DRIVER_CALL(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, 6050)
#undef L2CTL_DRIVER_CALL
};

inline const DriverCalls& driver() {
  static const DriverCalls calls;
  return calls;
}

}  // namespace l2ctl
