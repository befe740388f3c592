#include "l2ctl/context.hpp"

#include <cuda_runtime_api.h>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/stream.hpp"

namespace l2ctl {

namespace {
struct ContextCalls {
  PFN_cuStreamGetCtx_v9020 stream_context = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_attribute = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain_primary = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 release_primary = nullptr;
};

const ContextCalls& calls() {
  static const ContextCalls c = [] {
    ContextCalls found;
    found.stream_context = driver_entry<PFN_cuStreamGetCtx_v9020>("cuStreamGetCtx", 12000);
    found.pointer_attribute = driver_entry<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute", 12000);
    found.retain_primary = driver_entry<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain", 12000);
    found.release_primary = driver_entry<PFN_cuDevicePrimaryCtxRelease_v11000>("cuDevicePrimaryCtxRelease", 12000);
    return found;
  }();
  return c;
}

// The primary context of `device` (0 where the driver cannot tell): retained and released at once, since
// l2ctl only compares it.
std::uintptr_t primary_context(int device) {
  const ContextCalls& c = calls();
  CUcontext primary = nullptr;
  if (c.retain_primary == nullptr || c.release_primary == nullptr ||
      c.retain_primary(&primary, static_cast<CUdevice>(device)) != CUDA_SUCCESS)
    return 0;
  (void)c.release_primary(static_cast<CUdevice>(device));
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
  const ContextCalls& c = calls();
  if (c.stream_context != nullptr &&
      c.stream_context(reinterpret_cast<CUstream>(stream), &context) == CUDA_SUCCESS)
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
  const ContextCalls& c = calls();
  if (c.pointer_attribute == nullptr ||
      c.pointer_attribute(&context, CU_POINTER_ATTRIBUTE_CONTEXT, static_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return out;
  out.context = reinterpret_cast<std::uintptr_t>(context);
  out.primary = primary_context(attributes.device);
  return out;
}

}  // namespace l2ctl
