#include "l2ctl/device.hpp"

#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <cstdio>

#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {
std::string on_device(int device) { return "device " + std::to_string(device); }
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  L2CTL_CHECK(cudaGetDevice(&previous_), "");
  if (previous_ != device) {
    L2CTL_CHECK(cudaSetDevice(device), on_device(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess) return count;
  clear_last_error();
  return 0;
}

namespace {
bool driver_library_present() {
  // The runtime reports "insufficient driver" both when no driver is installed and when it is too old;
  // whether libcuda can be loaded at all tells the two apart.
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}
}  // namespace

std::string device_count_error() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code == cudaSuccess) return count > 0 ? "" : "cudaGetDeviceCount reported 0 devices";
  clear_last_error();
  const std::string cuda = std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code);
  if (code == cudaErrorInsufficientDriver) {
    int runtime = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    if (!driver_library_present()) return "no NVIDIA driver is installed (libcuda.so.1 not found; " + cuda + ")";
    // l2ctl's wheel links CUDA 12's runtime, which every supported driver runs; a source build beside a CUDA 13
    // toolkit only links 13's, and an older driver then needs that wheel, not a new driver.
    const std::string other = runtime >= 13000 ? ", or install l2ctl's wheel (built against the CUDA 12 runtime, it "
                                                 "runs under CUDA 12 drivers as well)" : "";
    return "the NVIDIA driver is older than the CUDA " + cuda_version_text(runtime) +
           " runtime l2ctl was built with; update the driver" + other + " (" + cuda + ")";
  }
  return cuda;
}

int current_device() {
  int device = 0;
  L2CTL_CHECK(cudaGetDevice(&device), "");
  return device;
}

DeviceProperties device_properties(int device) {
  cudaDeviceProp prop{};
  L2CTL_CHECK(cudaGetDeviceProperties(&prop, device), on_device(device));
  DeviceProperties out;
  out.index = device;
  out.name = prop.name;
  out.major = prop.major;
  out.minor = prop.minor;
  out.multiprocessor_count = prop.multiProcessorCount;
  out.l2_cache_size = static_cast<std::size_t>(prop.l2CacheSize);
  out.persisting_l2_cache_max_size = static_cast<std::size_t>(prop.persistingL2CacheMaxSize);
  out.access_policy_max_window_size = static_cast<std::size_t>(prop.accessPolicyMaxWindowSize);
  out.total_global_memory = prop.totalGlobalMem;
  out.memory_bus_width = prop.memoryBusWidth;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) out.pci_bus_id = bus;
  else clear_last_error();
  char uuid[64];
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  out.uuid = uuid;
  return out;
}

std::size_t get_persisting_limit(int device) {
  DeviceGuard guard(device);
  std::size_t value = 0;
  L2CTL_CHECK(cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize), on_device(device));
  return value;
}

std::size_t set_persisting_limit(int device, std::size_t bytes) {
  DeviceGuard guard(device);
  L2CTL_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes),
              on_device(device) + ", requested " + std::to_string(bytes) + " bytes");
  std::size_t granted = 0;
  L2CTL_CHECK(cudaDeviceGetLimit(&granted, cudaLimitPersistingL2CacheSize), on_device(device));
  return granted;
}

void reset_persisting_lines(int device) {
  DeviceGuard guard(device);
  L2CTL_CHECK(cudaCtxResetPersistingL2Cache(), on_device(device));
}

int driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) == cudaSuccess) return version;
  clear_last_error();
  return 0;
}

int runtime_version() {
  int version = 0;
  L2CTL_CHECK(cudaRuntimeGetVersion(&version), "");
  return version;
}

void device_synchronize(int device) {
  DeviceGuard guard(device);
  L2CTL_CHECK(cudaDeviceSynchronize(), on_device(device));
}

}  // namespace l2ctl
