// One error path for every CUDA call l2ctl makes: a failing cudaError_t becomes a CudaError that names
// the call, the error and the numbers involved (device, bytes, pointer, ...).
#pragma once

#include <cuda_runtime_api.h>

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

// Throws CudaError when `code` is not cudaSuccess. `details` is only built on failure.
void check(cudaError_t code, const char* call, const std::string& details = {});

// Clears the sticky-free "last error" left by a failed call so that later launch checks see only
// their own error.
inline void clear_last_error() noexcept { (void)cudaGetLastError(); }

// Checks the launch of a kernel: the configuration error of this launch, if any.
void check_launch(const char* kernel, const std::string& details = {});

std::string hex(const void* pointer);

}  // namespace l2ctl

#define L2CTL_CHECK(expr, details) ::l2ctl::check((expr), #expr, (details))
