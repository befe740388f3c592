// Hardware counters per kernel launch, in-process, through CUPTI's range profiler (auto ranges, kernel
// replay). libcupti is opened with dlopen on first use, so the extension loads where CUPTI is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace l2ctl
