#include "l2ctl/stream.hpp"

#include <string>

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {
std::string on_stream(std::uintptr_t handle) { return "stream " + hex(reinterpret_cast<void*>(handle)); }
bool is_special(std::uintptr_t handle) { return handle <= 2; }
}  // namespace

cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

Stream::Stream(int device, bool non_blocking, int priority) : device_(device) {
  DeviceGuard guard(device);
  unsigned flags = non_blocking ? cudaStreamNonBlocking : cudaStreamDefault;
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

void Stream::synchronize() const {
  L2CTL_CHECK(cudaStreamSynchronize(checked()), on_stream(handle()));
}

bool Stream::query() const {
  cudaError_t code = cudaStreamQuery(checked());
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

std::string describe(const Window& w) {
  return "base " + hex(reinterpret_cast<void*>(w.base)) + ", num_bytes " + std::to_string(w.num_bytes) +
         ", hitRatio " + std::to_string(w.hit_ratio) + ", hitProp " + std::to_string(w.hit_prop) + ", missProp " +
         std::to_string(w.miss_prop);
}

Window get_stream_window(std::uintptr_t stream) {
  cudaStreamAttrValue value{};
  L2CTL_CHECK(cudaStreamGetAttribute(as_stream(stream), cudaStreamAttributeAccessPolicyWindow, &value),
              on_stream(stream));
  return from_cuda(value.accessPolicyWindow);
}

void set_stream_window(std::uintptr_t stream, const Window& window) {
  cudaStreamAttrValue value{};
  value.accessPolicyWindow = to_cuda(window);
  L2CTL_CHECK(cudaStreamSetAttribute(as_stream(stream), cudaStreamAttributeAccessPolicyWindow, &value),
              on_stream(stream) + ", " + describe(window));
}

EventPair::EventPair() {
  L2CTL_CHECK(cudaEventCreate(&start_), "");
  cudaError_t code = cudaEventCreate(&stop_);
  if (code != cudaSuccess) {
    (void)cudaEventDestroy(start_);
    L2CTL_CHECK(code, "");
  }
}

EventPair::~EventPair() {
  (void)cudaEventDestroy(start_);
  (void)cudaEventDestroy(stop_);
}

void EventPair::record_start(std::uintptr_t stream) {
  L2CTL_CHECK(cudaEventRecord(start_, as_stream(stream)), on_stream(stream));
}

void EventPair::record_stop(std::uintptr_t stream) {
  L2CTL_CHECK(cudaEventRecord(stop_, as_stream(stream)), on_stream(stream));
}

float EventPair::elapsed_ms() const {
  L2CTL_CHECK(cudaEventSynchronize(stop_), "");
  float ms = 0.0f;
  L2CTL_CHECK(cudaEventElapsedTime(&ms, start_, stop_), "");
  return ms;
}

Event::Event() { L2CTL_CHECK(cudaEventCreate(&event_), ""); }

Event::~Event() { (void)cudaEventDestroy(event_); }

void Event::record(std::uintptr_t stream) { L2CTL_CHECK(cudaEventRecord(event_, as_stream(stream)), on_stream(stream)); }

void Event::wait_on(std::uintptr_t stream) const {
  L2CTL_CHECK(cudaStreamWaitEvent(as_stream(stream), event_, 0), on_stream(stream));
}

void Event::synchronize() const { L2CTL_CHECK(cudaEventSynchronize(event_), ""); }

float Event::elapsed_since(const Event& start) const {
  L2CTL_CHECK(cudaEventSynchronize(event_), "");
  float ms = 0.0f;
  L2CTL_CHECK(cudaEventElapsedTime(&ms, start.event_, event_), "");
  return ms;
}

}  // namespace l2ctl
