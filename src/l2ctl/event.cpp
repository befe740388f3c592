#include "l2ctl/event.hpp"

#include <memory>

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

Event::Event(int device) {
  std::unique_ptr<DeviceGuard> guard;
  if (device >= 0) guard = std::make_unique<DeviceGuard>(device);
  L2CTL_CHECK(cudaEventCreate(&event_), "device " + std::to_string(device));
}

Event::~Event() { (void)cudaEventDestroy(event_); }

void Event::record(std::uintptr_t stream) {
  L2CTL_CHECK(cudaEventRecord(event_, reinterpret_cast<cudaStream_t>(stream)), "stream " + hex(stream));
}

void Event::wait_on(std::uintptr_t stream) const {
  L2CTL_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), event_, 0), "stream " + hex(stream));
}

void Event::synchronize() const { L2CTL_CHECK(cudaEventSynchronize(event_), ""); }

bool Event::query() const {
  const cudaError_t code = cudaEventQuery(event_);
  if (code == cudaErrorNotReady) {
    clear_last_error();
    return false;
  }
  L2CTL_CHECK(code, "");
  return true;
}

float Event::elapsed_since(const Event& start) const {
  L2CTL_CHECK(cudaEventSynchronize(event_), "");
  float ms = 0.0f;
  L2CTL_CHECK(cudaEventElapsedTime(&ms, start.event_, event_), "");
  return ms;
}

}  // namespace l2ctl
