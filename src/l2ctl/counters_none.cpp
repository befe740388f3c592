// The counters and launch-recorder API for a build without the CUPTI headers: every entry point says why
// they are unavailable (CuptiError code -2), so the rest of the extension builds and works without CUPTI.
#include "l2ctl/counters.hpp"

namespace l2ctl {

namespace {
[[noreturn]] void unavailable(const char* call) {
  throw CuptiError(call, -2,
                   "this l2ctl was built without the CUPTI headers (cupti_range_profiler.h was not found at "
                   "build time); rebuild with the CUDA toolkit's CUPTI (extras/CUPTI/include) to read counters or "
                   "kernel arguments");
}
}  // namespace

void cupti_load(const std::string&) { unavailable("cupti_load"); }
bool cupti_loaded() { return false; }

struct RangeProfiler::State {};

RangeProfiler::RangeProfiler(int, std::vector<std::string>, std::size_t, bool) { unavailable("RangeProfiler"); }
RangeProfiler::~RangeProfiler() = default;
void RangeProfiler::release() noexcept {}
void RangeProfiler::start() { unavailable("RangeProfiler::start"); }
bool RangeProfiler::end_pass() { unavailable("RangeProfiler::end_pass"); }
std::vector<RangeValues> RangeProfiler::stop() { unavailable("RangeProfiler::stop"); }
long long RangeProfiler::launches() const { return -1; }

struct LaunchRecorder::State {};

LaunchRecorder::LaunchRecorder(std::size_t) { unavailable("LaunchRecorder"); }
LaunchRecorder::~LaunchRecorder() = default;
void LaunchRecorder::release() noexcept {}
void LaunchRecorder::start() { unavailable("LaunchRecorder::start"); }
std::vector<LaunchArguments> LaunchRecorder::stop() { unavailable("LaunchRecorder::stop"); }
std::size_t LaunchRecorder::dropped() const { return 0; }
std::size_t LaunchRecorder::unreadable() const { return 0; }

}  // namespace l2ctl
