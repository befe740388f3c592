#include "l2ctl/kernel_args.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

void append_words(std::vector<ArgumentWord>& words, unsigned param, const void* bytes, std::size_t size) {
  for (std::size_t at = 0; at + 8 <= size; at += 8) {
    std::uint64_t value = 0;
    std::memcpy(&value, static_cast<const unsigned char*>(bytes) + at, 8);
    if (value != 0) words.push_back({param, static_cast<unsigned>(at), value});
  }
}

std::vector<ArgumentWord> kernel_node_words(std::uintptr_t node) {
  const DriverCalls& d = driver();
  std::vector<ArgumentWord> words;
  if (d.cuGraphKernelNodeGetParams == nullptr || (d.cuFuncGetParamInfo == nullptr && d.cuKernelGetParamInfo == nullptr))
    throw NotSupported("reading a kernel node's arguments (cuFuncGetParamInfo) needs a driver of CUDA 12.4 or newer "
                       "(r550+); this driver is CUDA " + cuda_version_text(driver_version()));
  CUDA_KERNEL_NODE_PARAMS_v2 params{};
  if (d.cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS ||
      params.kernelParams == nullptr)
    return words;
  // The parameter count is not stored anywhere: ask for each index until the driver says there is none.
  for (unsigned i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    CUresult found = CUDA_ERROR_INVALID_VALUE;
    if (params.func != nullptr && d.cuFuncGetParamInfo != nullptr)
      found = d.cuFuncGetParamInfo(params.func, i, &offset, &size);
    else if (params.kern != nullptr && d.cuKernelGetParamInfo != nullptr)
      found = d.cuKernelGetParamInfo(params.kern, i, &offset, &size);
    if (found != CUDA_SUCCESS || params.kernelParams[i] == nullptr) break;
    append_words(words, i, params.kernelParams[i], size);
  }
  return words;
}

std::pair<std::uintptr_t, std::size_t> address_range(std::uintptr_t address) {
  const auto range = driver().cuMemGetAddressRange;
  if (range == nullptr || address == 0) return {0, 0};
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (range(&base, &size, static_cast<CUdeviceptr>(address)) != CUDA_SUCCESS) return {0, 0};
  return {static_cast<std::uintptr_t>(base), size};
}

}  // namespace l2ctl
