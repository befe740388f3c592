// Device-wide L2 state: properties, the persisting set-aside limit, and resetting persisting lines.
#pragma once

#include <cstddef>
#include <string>

namespace l2ctl {

// Makes `device` current for the lifetime of the guard and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

struct DeviceProperties {
  int index = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  int multiprocessor_count = 0;
  std::size_t l2_cache_size = 0;
  std::size_t persisting_l2_cache_max_size = 0;
  std::size_t access_policy_max_window_size = 0;
  std::size_t total_global_memory = 0;
  int memory_bus_width = 0;
  std::string pci_bus_id;
  std::string uuid;
};

// Number of visible devices; 0 when there is no device or no usable driver (never throws for those).
int device_count();
// Why device_count() is 0, as CUDA reports it ("cudaErrorNoDevice: ..."), or "" when devices exist.
std::string device_count_error();
DeviceProperties device_properties(int device);
int current_device();

// cudaLimitPersistingL2CacheSize, in bytes.
std::size_t get_persisting_limit(int device);
// Sets the limit and returns what the driver granted, read back: the driver rounds requests to its
// granularity (up, to multiples of max/10, on the H100 and H200 with driver 580).
std::size_t set_persisting_limit(int device, std::size_t bytes);
// cudaCtxResetPersistingL2Cache on the primary context of `device`.
void reset_persisting_lines(int device);

int driver_version();
int runtime_version();

void device_synchronize(int device);

}  // namespace l2ctl
