// Owned device memory and pointer classification.
#pragma once

#include <cstddef>
#include <cstdint>

namespace l2ctl {

// cudaMalloc'd bytes on one device, freed with the object or by free().
class DeviceMemory {
 public:
  DeviceMemory(int device, std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  std::uintptr_t ptr() const;
  std::size_t nbytes() const { return bytes_; }
  int device() const { return device_; }
  bool freed() const { return ptr_ == nullptr; }
  void free();

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

struct PointerInfo {
  int memory_type = 0;  // cudaMemoryType: 0 unregistered host, 1 host, 2 device, 3 managed
  int device = -1;
  // The allocation that holds the pointer (cuMemGetAddressRange); 0, 0 where the driver knows none
  // (host memory) or cannot tell.
  std::uintptr_t range_base = 0;
  std::size_t range_size = 0;
};

// What the pointer is, on which device, and the allocation around it: one call for the checks a
// window or a kernel argument needs.
PointerInfo pointer_info(std::uintptr_t ptr);

void copy_host_to_device(std::uintptr_t dst, const void* src, std::size_t bytes, std::uintptr_t stream);
void copy_device_to_host(void* dst, std::uintptr_t src, std::size_t bytes, std::uintptr_t stream);
void memset_device(std::uintptr_t dst, int value, std::size_t bytes, std::uintptr_t stream);

}  // namespace l2ctl
