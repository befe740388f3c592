// Streams: owned streams and the device of any stream handle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace l2ctl {

// An owned stream (non-blocking unless asked otherwise); destroyed with the object or by close().
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

}  // namespace l2ctl
