#include "l2ctl/kernel_args.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {
// Found once through the runtime, as graph.cpp's describer: import needs no driver.
struct ArgumentReader {
  PFN_cuGraphKernelNodeGetParams_v12000 params = nullptr;
  PFN_cuFuncGetParamInfo_v12040 func_param = nullptr;
  PFN_cuKernelGetParamInfo_v12040 kernel_param = nullptr;
  PFN_cuMemGetAddressRange_v3020 range = nullptr;
};

const ArgumentReader& reader() {
  static const ArgumentReader r = [] {
    ArgumentReader d;
    d.params = driver_entry<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
    d.func_param = driver_entry<PFN_cuFuncGetParamInfo_v12040>("cuFuncGetParamInfo", 12040);
    d.kernel_param = driver_entry<PFN_cuKernelGetParamInfo_v12040>("cuKernelGetParamInfo", 12040);
    d.range = driver_entry<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange", 3020);
    return d;
  }();
  return r;
}
}  // namespace

std::vector<ArgumentWord> kernel_node_words(std::uintptr_t node) {
  const ArgumentReader& r = reader();
  std::vector<ArgumentWord> words;
  if (r.params == nullptr || (r.func_param == nullptr && r.kernel_param == nullptr))
    throw NotSupported("reading a kernel node's arguments (cuFuncGetParamInfo) needs a driver of CUDA 12.4 or newer "
                       "(r550+); this driver is CUDA " + cuda_version_text(driver_version()));
  CUDA_KERNEL_NODE_PARAMS_v2 params{};
  if (r.params(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS || params.kernelParams == nullptr)
    return words;
  // The parameter count is not stored anywhere: ask for each index until the driver says there is none.
  for (unsigned i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    CUresult found = CUDA_ERROR_INVALID_VALUE;
    if (params.func != nullptr && r.func_param != nullptr)
      found = r.func_param(params.func, i, &offset, &size);
    else if (params.kern != nullptr && r.kernel_param != nullptr)
      found = r.kernel_param(params.kern, i, &offset, &size);
    if (found != CUDA_SUCCESS || params.kernelParams[i] == nullptr) break;
    const auto* bytes = static_cast<const unsigned char*>(params.kernelParams[i]);
    // A parameter's value starts aligned to its own alignment; pointers inside structs (torch's TensorInfo)
    // sit at 8-byte offsets from it.
    for (std::size_t at = 0; at + 8 <= size; at += 8) {
      std::uint64_t value = 0;
      std::memcpy(&value, bytes + at, 8);
      if (value != 0) words.push_back({i, static_cast<unsigned>(at), value});
    }
  }
  return words;
}

std::pair<std::uintptr_t, std::size_t> address_range(std::uintptr_t address) {
  const ArgumentReader& r = reader();
  if (r.range == nullptr || address == 0) return {0, 0};
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (r.range(&base, &size, static_cast<CUdeviceptr>(address)) != CUDA_SUCCESS) return {0, 0};
  return {static_cast<std::uintptr_t>(base), size};
}

}  // namespace l2ctl
