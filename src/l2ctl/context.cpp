#include "l2ctl/context.hpp"

#include <cuda_runtime_api.h>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/stream.hpp"

namespace l2ctl {

namespace {
// The primary context of `device` (0 where the driver cannot tell): retained and released at once, since
// l2ctl only compares it.
std::uintptr_t primary_context(int device) {
  const DriverCalls& d = driver();
  CUcontext primary = nullptr;
  if (d.cuDevicePrimaryCtxRetain == nullptr || d.cuDevicePrimaryCtxRelease == nullptr ||
      d.cuDevicePrimaryCtxRetain(&primary, static_cast<CUdevice>(device)) != CUDA_SUCCESS)
    return 0;
  (void)d.cuDevicePrimaryCtxRelease(static_cast<CUdevice>(device));
  return reinterpret_cast<std::uintptr_t>(primary);
}
}  // namespace

Contexts stream_context(std::uintptr_t stream) {
  Contexts out;
  const int device = stream_device(stream);
  out.primary = primary_context(device);
  if (stream <= 2) {
    out.context = out.primary;
    return out;
  }
  CUcontext context = nullptr;
  const auto get_context = driver().cuStreamGetCtx;
  if (get_context != nullptr && get_context(reinterpret_cast<CUstream>(stream), &context) == CUDA_SUCCESS)
    out.context = reinterpret_cast<std::uintptr_t>(context);
  return out;
}

Contexts pointer_context(std::uintptr_t ptr) {
  Contexts out;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(ptr)) != cudaSuccess ||
      attributes.device < 0 ||
      (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)) {
    clear_last_error();
    return out;
  }
  CUcontext context = nullptr;
  const auto get_attribute = driver().cuPointerGetAttribute;
  if (get_attribute == nullptr ||
      get_attribute(&context, CU_POINTER_ATTRIBUTE_CONTEXT, static_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return out;
  out.context = reinterpret_cast<std::uintptr_t>(context);
  out.primary = primary_context(attributes.device);
  return out;
}

}  // namespace l2ctl
