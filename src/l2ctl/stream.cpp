#include "l2ctl/stream.hpp"

#include <stdexcept>
#include <string>

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {
std::string on_stream(std::uintptr_t handle) { return "stream " + hex(handle); }
bool is_special(std::uintptr_t handle) { return handle <= 2; }
}  // namespace

cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

Stream::Stream(int device, bool non_blocking, int priority) : device_(device) {
  DeviceGuard guard(device);
  const unsigned flags = non_blocking ? cudaStreamNonBlocking : cudaStreamDefault;
  L2CTL_CHECK(cudaStreamCreateWithPriority(&stream_, flags, priority),
              "device " + std::to_string(device) + ", priority " + std::to_string(priority));
}

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

cudaStream_t Stream::checked() const {
  if (stream_ == nullptr) throw std::invalid_argument("the stream is closed");
  return stream_;
}

std::uintptr_t Stream::handle() const { return reinterpret_cast<std::uintptr_t>(checked()); }

void Stream::synchronize() const { L2CTL_CHECK(cudaStreamSynchronize(checked()), on_stream(handle())); }

bool Stream::query() const {
  const cudaError_t code = cudaStreamQuery(checked());
  if (code == cudaErrorNotReady) {
    clear_last_error();
    return false;
  }
  L2CTL_CHECK(code, on_stream(handle()));
  return true;
}

void Stream::close() {
  if (stream_ == nullptr) return;
  cudaStream_t s = stream_;
  stream_ = nullptr;
  L2CTL_CHECK(cudaStreamDestroy(s), on_stream(reinterpret_cast<std::uintptr_t>(s)));
}

int stream_device(std::uintptr_t handle) {
  if (is_special(handle)) return current_device();
  int device = 0;
  L2CTL_CHECK(cudaStreamGetDevice(as_stream(handle), &device), on_stream(handle));
  return device;
}

void stream_synchronize(std::uintptr_t handle) {
  L2CTL_CHECK(cudaStreamSynchronize(as_stream(handle)), on_stream(handle));
}

}  // namespace l2ctl
