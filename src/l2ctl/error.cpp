#include "l2ctl/error.hpp"

#include <cstdint>
#include <cstdio>

namespace l2ctl {

namespace {
std::string compose(const std::string& call, cudaError_t code, const std::string& details) {
  std::string text = call + " failed: " + cudaGetErrorName(code) + " (" + std::to_string(static_cast<int>(code)) +
                     "): " + cudaGetErrorString(code);
  if (!details.empty()) text += " [" + details + "]";
  return text;
}
}  // namespace

CudaError::CudaError(std::string call, cudaError_t code, std::string details)
    : std::runtime_error(compose(call, code, details)),
      call_(std::move(call)),
      code_(code),
      name_(cudaGetErrorName(code)),
      description_(cudaGetErrorString(code)),
      details_(std::move(details)) {}

void fail(cudaError_t code, const char* call, const std::string& details) {
  clear_last_error();
  throw CudaError(call, code, details);
}

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string hex(std::uintptr_t address) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

std::string hex(const void* pointer) { return hex(reinterpret_cast<std::uintptr_t>(pointer)); }

}  // namespace l2ctl
