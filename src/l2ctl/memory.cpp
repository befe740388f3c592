#include "l2ctl/memory.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/stream.hpp"

namespace l2ctl {

DeviceMemory::DeviceMemory(int device, std::size_t bytes) : bytes_(bytes), device_(device) {
  DeviceGuard guard(device);
  L2CTL_CHECK(cudaMalloc(&ptr_, bytes), "device " + std::to_string(device) + ", " + std::to_string(bytes) + " bytes");
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

std::uintptr_t DeviceMemory::ptr() const {
  if (ptr_ == nullptr) throw std::invalid_argument("the device buffer has been freed");
  return reinterpret_cast<std::uintptr_t>(ptr_);
}

void DeviceMemory::free() {
  if (ptr_ == nullptr) return;
  void* p = ptr_;
  ptr_ = nullptr;
  L2CTL_CHECK(cudaFree(p), "pointer " + hex(p) + ", " + std::to_string(bytes_) + " bytes");
}

PointerInfo pointer_info(std::uintptr_t ptr) {
  cudaPointerAttributes attributes{};
  L2CTL_CHECK(cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(ptr)), "pointer " + hex(ptr));
  PointerInfo info;
  info.memory_type = static_cast<int>(attributes.type);
  info.device = attributes.device;
  const bool on_device = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  if (on_device && attributes.device >= 0) {
    if (const auto fn = driver().cuMemGetAddressRange) {
      DeviceGuard guard(attributes.device);
      CUdeviceptr base = 0;
      std::size_t size = 0;
      if (fn(&base, &size, static_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
        info.range_base = static_cast<std::uintptr_t>(base);
        info.range_size = size;
      }
    }
  }
  return info;
}

namespace {
std::string copy_details(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
  return "dst " + hex(dst) + ", src " + hex(src) + ", " +
         std::to_string(bytes) + " bytes";
}
}  // namespace

void copy_host_to_device(std::uintptr_t dst, const void* src, std::size_t bytes, std::uintptr_t stream) {
  L2CTL_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice, as_stream(stream)),
              copy_details(dst, reinterpret_cast<std::uintptr_t>(src), bytes));
  L2CTL_CHECK(cudaStreamSynchronize(as_stream(stream)), "");
}

void copy_device_to_host(void* dst, std::uintptr_t src, std::size_t bytes, std::uintptr_t stream) {
  L2CTL_CHECK(cudaMemcpyAsync(dst, reinterpret_cast<const void*>(src), bytes, cudaMemcpyDeviceToHost, as_stream(stream)),
              copy_details(reinterpret_cast<std::uintptr_t>(dst), src, bytes));
  L2CTL_CHECK(cudaStreamSynchronize(as_stream(stream)), "");
}

void memset_device(std::uintptr_t dst, int value, std::size_t bytes, std::uintptr_t stream) {
  L2CTL_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(dst), value, bytes, as_stream(stream)),
              "dst " + hex(dst) + ", " + std::to_string(bytes) + " bytes");
}

}  // namespace l2ctl
