// Streams, their access-policy windows, and events for timing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace l2ctl {

struct Window {
  std::uintptr_t base = 0;
  std::size_t num_bytes = 0;
  float hit_ratio = 0.0f;
  int hit_prop = cudaAccessPropertyNormal;
  int miss_prop = cudaAccessPropertyNormal;
};

// The one conversion between l2ctl's Window and CUDA's struct, for streams and graph nodes alike.
inline cudaAccessPolicyWindow to_cuda(const Window& w) {
  cudaAccessPolicyWindow out{};
  out.base_ptr = reinterpret_cast<void*>(w.base);
  out.num_bytes = w.num_bytes;
  out.hitRatio = w.hit_ratio;
  out.hitProp = static_cast<cudaAccessProperty>(w.hit_prop);
  out.missProp = static_cast<cudaAccessProperty>(w.miss_prop);
  return out;
}

inline Window from_cuda(const cudaAccessPolicyWindow& w) {
  Window out;
  out.base = reinterpret_cast<std::uintptr_t>(w.base_ptr);
  out.num_bytes = w.num_bytes;
  out.hit_ratio = w.hitRatio;
  out.hit_prop = static_cast<int>(w.hitProp);
  out.miss_prop = static_cast<int>(w.missProp);
  return out;
}

// "base 0x..., num_bytes N, hitRatio R, hitProp P, missProp M" for error details.
std::string describe(const Window& w);

// An owned, non-blocking stream; destroyed with the object or by close().
class Stream {
 public:
  Stream(int device, bool non_blocking, int priority);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  std::uintptr_t handle() const;
  int device() const { return device_; }
  bool closed() const { return stream_ == nullptr; }
  void synchronize() const;
  bool query() const;  // true when all work is done
  void close();

 private:
  cudaStream_t checked() const;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

cudaStream_t as_stream(std::uintptr_t handle);

// The device a stream belongs to. Special handles (0 legacy, 1 cudaStreamLegacy, 2 per-thread)
// resolve to the current device.
int stream_device(std::uintptr_t handle);
void stream_synchronize(std::uintptr_t handle);

Window get_stream_window(std::uintptr_t stream);
void set_stream_window(std::uintptr_t stream, const Window& window);

// A pair of events around work on a stream; elapsed time in milliseconds.
class EventPair {
 public:
  EventPair();
  ~EventPair();
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  void record_start(std::uintptr_t stream);
  void record_stop(std::uintptr_t stream);
  float elapsed_ms() const;  // waits for the stop event

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// One event: recorded on a stream, waited on by another stream, or timed against another event.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(std::uintptr_t stream);
  void wait_on(std::uintptr_t stream) const;  // work queued on `stream` after this waits for the event
  void synchronize() const;
  float elapsed_since(const Event& start) const;  // ms from `start` to this event

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace l2ctl
