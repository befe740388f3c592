// CUDA events: recorded on a stream, waited on by another stream, timed against another event.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace l2ctl {

class Event {
 public:
  // On `device` (-1: the current device). An event can only be recorded on streams of its own device.
  explicit Event(int device = -1);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(std::uintptr_t stream);
  void wait_on(std::uintptr_t stream) const;  // work queued on `stream` after this waits for the event
  void synchronize() const;
  bool query() const;  // completed (does not wait)
  float elapsed_since(const Event& start) const;  // ms from `start` to this event; waits for this event

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace l2ctl
