// One error path for every CUDA call l2ctl makes: a failing cudaError_t becomes a CudaError that names
// the call, the error and the numbers involved (device, bytes, pointer, ...).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace l2ctl {

class CudaError : public std::runtime_error {
 public:
  CudaError(std::string call, cudaError_t code, std::string details);

  const std::string& call() const noexcept { return call_; }
  int code() const noexcept { return static_cast<int>(code_); }
  const std::string& name() const noexcept { return name_; }
  const std::string& description() const noexcept { return description_; }
  const std::string& details() const noexcept { return details_; }

 private:
  std::string call_;
  cudaError_t code_;
  std::string name_;
  std::string description_;
  std::string details_;
};

// What this driver or machine cannot do (l2ctl.NotSupportedError): a feature newer than the driver.
class NotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// l2ctl's kernels cannot be compiled or loaded here (l2ctl.KernelsUnavailableError): no NVRTC, NVRTC failed, or
// its code is newer than the driver. The message says which and what to install.
class KernelsUnavailable : public NotSupported {
 public:
  using NotSupported::NotSupported;
};

// "12.4" for a CUDA version number (12040), as cudaDriverGetVersion gives it.
std::string cuda_version_text(int version);

// Throws CudaError for a failed call (never returns). Clears CUDA's "last error" first, so that a later
// launch check sees only its own error.
[[noreturn]] void fail(cudaError_t code, const char* call, const std::string& details);

// Clears the "last error" left by a failed call that l2ctl handles itself.
inline void clear_last_error() noexcept { (void)cudaGetLastError(); }

std::string hex(const void* pointer);
std::string hex(std::uintptr_t address);

}  // namespace l2ctl

// `details` is an expression evaluated only when the call fails: successful calls build no strings.
#define L2CTL_CHECK(expr, details)                                            \
  do {                                                                        \
    const cudaError_t l2ctl_status_ = (expr);                                 \
    if (l2ctl_status_ != cudaSuccess) ::l2ctl::fail(l2ctl_status_, #expr, (details)); \
  } while (0)
