// Hardware counters per kernel launch, in-process, through CUPTI's range profiler (auto ranges, kernel
// replay), and the arguments of the kernels a process launches, through CUPTI's callback API (what eager
// discovery reads). libcupti is opened with dlopen on first use, so the extension loads where CUPTI is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "l2ctl/kernel_args.hpp"

namespace l2ctl {

// A CUPTI failure: `code` is the CUptiResult, `what()` names the call and CUPTI's message.
class CuptiError : public std::runtime_error {
 public:
  CuptiError(std::string call, int code, const std::string& message)
      : std::runtime_error(call + " failed: CUPTI error " + std::to_string(code) + ": " + message),
        call_(std::move(call)), code_(code) {}
  const std::string& call() const noexcept { return call_; }
  int code() const noexcept { return code_; }

 private:
  std::string call_;
  int code_;
};

// Opens libcupti from `path` (or the loader's search path when empty); idempotent. Throws CuptiError
// (code -1) with dlerror() when it cannot be opened or lacks the range profiler.
void cupti_load(const std::string& path);
bool cupti_loaded();

struct RangeValues {
  std::string name;             // the kernel (auto range) name
  std::vector<double> values;   // one per metric, in the order given
};

class RangeProfiler {
 public:
  // user_replay: the caller repeats its work once per pass (start, work, stop_pass until it returns
  // true, then stop); otherwise CUPTI replays each kernel itself, saving and restoring memory.
  RangeProfiler(int device, std::vector<std::string> metrics, std::size_t max_ranges, bool user_replay = false);
  ~RangeProfiler();
  RangeProfiler(const RangeProfiler&) = delete;
  RangeProfiler& operator=(const RangeProfiler&) = delete;

  void start();
  // User replay: ends one pass; true when every pass has been submitted (then call stop()).
  bool end_pass();
  // Stops collection and decodes it; returns one entry per profiled kernel launch.
  std::vector<RangeValues> stop();
  // Kernel launches seen so far in the current (or last) pass, from the driver-API callbacks; -1 when
  // the callbacks are unavailable (another subscriber holds them).
  long long launches() const;
  std::size_t passes() const { return passes_; }
  std::string chip() const { return chip_; }

 private:
  void release() noexcept;
  struct State;
  std::unique_ptr<State> state_;
  std::size_t passes_ = 0;
  std::string chip_;
};

// One kernel launch as its launch call gave it: the kernel, the stream, the device, and every nonzero 8-byte
// word of its arguments (as kernel_node_words reads a graph node's).
struct LaunchArguments {
  std::string kernel;
  std::uintptr_t stream = 0;
  int device = -1;
  std::vector<ArgumentWord> words;
};

// Records the arguments of every kernel launched in the process between start() and stop(), from CUPTI's
// callbacks on the driver's launch calls, cuLaunchKernel(Ex) and their _ptsz forms: Triton, CuPy and l2ctl call
// them, and the runtime's launches (torch's <<<>>>) go through them too, firing the same callbacks. The layout
// comes from cuFuncGetParamInfo (cuKernelGetParamInfo for a CUkernel launched as a function), cached per kernel.
// One subscriber per process: start() throws CuptiError 39 while another (counters, a profiler) holds CUPTI.
// stop() and the destructor unsubscribe. At most `max_launches` are kept; dropped() counts the rest.
class LaunchRecorder {
 public:
  explicit LaunchRecorder(std::size_t max_launches);
  ~LaunchRecorder();
  LaunchRecorder(const LaunchRecorder&) = delete;
  LaunchRecorder& operator=(const LaunchRecorder&) = delete;

  void start();
  std::vector<LaunchArguments> stop();
  std::size_t dropped() const;
  // Driver launches whose arguments could not be read (no layout from the driver, no packed buffer).
  std::size_t unreadable() const;

  struct State;

 private:
  void release() noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace l2ctl
