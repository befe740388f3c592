#include "l2ctl/counters.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>
#include <dlfcn.h>

#include <mutex>
#include <unordered_map>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {

// Every CUPTI entry point l2ctl uses, resolved from the dlopen'ed library (one list: the struct and cupti_load).
#define L2CTL_CUPTI_FUNCTIONS(X)                                                                                  \
  X(cuptiGetResultString) X(cuptiSubscribe) X(cuptiUnsubscribe) X(cuptiEnableDomain) X(cuptiEnableCallback)          \
  X(cuptiProfilerInitialize) X(cuptiProfilerDeInitialize) X(cuptiProfilerGetCounterAvailability)                     \
  X(cuptiDeviceGetChipName) X(cuptiProfilerHostInitialize) X(cuptiProfilerHostDeinitialize)                          \
  X(cuptiProfilerHostConfigAddMetrics) X(cuptiProfilerHostGetConfigImageSize) X(cuptiProfilerHostGetConfigImage)     \
  X(cuptiProfilerHostGetNumOfPasses) X(cuptiProfilerHostEvaluateToGpuValues) X(cuptiRangeProfilerEnable)             \
  X(cuptiRangeProfilerDisable) X(cuptiRangeProfilerGetCounterDataSize)                                               \
  X(cuptiRangeProfilerCounterDataImageInitialize) X(cuptiRangeProfilerSetConfig) X(cuptiRangeProfilerStart)          \
  X(cuptiRangeProfilerStop) X(cuptiRangeProfilerDecodeData) X(cuptiRangeProfilerGetCounterDataInfo)                  \
  X(cuptiRangeProfilerCounterDataGetRangeInfo)

struct Cupti {
  void* handle = nullptr;
#define L2CTL_CUPTI_FIELD(name) decltype(&::name) name = nullptr;
  L2CTL_CUPTI_FUNCTIONS(L2CTL_CUPTI_FIELD)
#undef L2CTL_CUPTI_FIELD
};

Cupti g_cupti;
std::mutex g_load_mutex;

void resolve(void* lib, const char* name, void** slot) {
  *slot = dlsym(lib, name);
  if (*slot == nullptr) throw CuptiError(std::string("dlsym(") + name + ")", -1, "the CUPTI library lacks this symbol");
}

void check_cupti(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = "unknown";
  if (g_cupti.cuptiGetResultString != nullptr) g_cupti.cuptiGetResultString(result, &message);
  throw CuptiError(call, static_cast<int>(result), message);
}

#define L2CTL_CUPTI(call, params) check_cupti(g_cupti.call(&params), #call)
#define L2CTL_PARAMS(type, var) type var{}; var.structSize = type##_STRUCT_SIZE

// Auto ranges are named by index; the kernel names come from the driver-API launch callbacks, one per
// launch, in launch order (replays happen inside the call and add no callbacks).
struct LaunchLog {
  std::mutex mutex;  // launches may come from several threads
  std::vector<std::string> names;
};

void CUPTIAPI on_driver_call(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || data == nullptr) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || info->functionName == nullptr) return;
  if (std::string(info->functionName).rfind("cuLaunch", 0) != 0) return;
  auto* log = static_cast<LaunchLog*>(userdata);
  std::lock_guard<std::mutex> lock(log->mutex);
  log->names.push_back(info->symbolName != nullptr ? info->symbolName : "");
}

}  // namespace

void cupti_load(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (g_cupti.handle != nullptr) return;
  void* lib = dlopen(path.empty() ? "libcupti.so" : path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw CuptiError("dlopen(" + (path.empty() ? std::string("libcupti.so") : path) + ")", -1, why ? why : "");
  }
  Cupti c;
  try {
#define L2CTL_RESOLVE(name) resolve(lib, #name, reinterpret_cast<void**>(&c.name));
    L2CTL_CUPTI_FUNCTIONS(L2CTL_RESOLVE)
#undef L2CTL_RESOLVE
  } catch (...) {
    dlclose(lib);
    throw;
  }
  c.handle = lib;
  g_cupti = c;
}

bool cupti_loaded() { return g_cupti.handle != nullptr; }

struct RangeProfiler::State {
  int device = 0;
  CUcontext context = nullptr;
  std::vector<std::string> metrics;
  std::vector<const char*> names;
  std::size_t max_ranges = 0;
  bool initialized = false;
  CUpti_Profiler_Host_Object* host = nullptr;
  CUpti_RangeProfiler_Object* profiler = nullptr;
  std::vector<uint8_t> availability, config, counter_data;
  bool running = false;
  CUpti_SubscriberHandle subscriber = nullptr;
  LaunchLog launches;
  bool user_replay = false;
  bool all_passes = false;
  std::size_t pass_index = 0;
  std::size_t target_level = 1;
  bool launch_log_active = false;  // the launch callbacks were subscribed for the current/last pass
  void set_config();
};

RangeProfiler::RangeProfiler(int device, std::vector<std::string> metrics, std::size_t max_ranges, bool user_replay)
    : state_(std::make_unique<State>()) {
  if (!cupti_loaded()) throw CuptiError("RangeProfiler", -1, "libcupti is not loaded (call cupti_load first)");
  if (metrics.empty()) throw std::invalid_argument("at least one metric is needed");
  State& s = *state_;
  s.device = device;
  s.metrics = std::move(metrics);
  for (const auto& m : s.metrics) s.names.push_back(m.c_str());
  s.max_ranges = max_ranges;
  s.user_replay = user_replay;

  // The primary context of `device`, through the runtime (no link against libcuda).
  {
    DeviceGuard guard(device);
    L2CTL_CHECK(cudaFree(nullptr), "device " + std::to_string(device));  // makes the primary context current
    const auto ctx_get_current = driver().cuCtxGetCurrent;
    if (ctx_get_current == nullptr)
      throw CuptiError("cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)", -1, "symbol not found");
    if (ctx_get_current(&s.context) != CUDA_SUCCESS || s.context == nullptr)
      throw CuptiError("cuCtxGetCurrent", -1, "no current context");
  }
  try {
    L2CTL_PARAMS(CUpti_Profiler_Initialize_Params, init);
    L2CTL_CUPTI(cuptiProfilerInitialize, init);
    s.initialized = true;

    L2CTL_PARAMS(CUpti_Device_GetChipName_Params, chip);
    chip.deviceIndex = static_cast<std::size_t>(device);
    L2CTL_CUPTI(cuptiDeviceGetChipName, chip);
    chip_ = chip.pChipName;

    L2CTL_PARAMS(CUpti_Profiler_GetCounterAvailability_Params, avail);
    avail.ctx = s.context;
    L2CTL_CUPTI(cuptiProfilerGetCounterAvailability, avail);
    s.availability.resize(avail.counterAvailabilityImageSize);
    avail.pCounterAvailabilityImage = s.availability.data();
    L2CTL_CUPTI(cuptiProfilerGetCounterAvailability, avail);

    L2CTL_PARAMS(CUpti_Profiler_Host_Initialize_Params, host);
    host.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    host.pChipName = chip.pChipName;
    host.pCounterAvailabilityImage = s.availability.data();
    L2CTL_CUPTI(cuptiProfilerHostInitialize, host);
    s.host = host.pHostObject;

    L2CTL_PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params, add);
    add.pHostObject = s.host;
    add.ppMetricNames = s.names.data();
    add.numMetrics = s.names.size();
    L2CTL_CUPTI(cuptiProfilerHostConfigAddMetrics, add);

    L2CTL_PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params, size);
    size.pHostObject = s.host;
    L2CTL_CUPTI(cuptiProfilerHostGetConfigImageSize, size);
    s.config.resize(size.configImageSize);
    L2CTL_PARAMS(CUpti_Profiler_Host_GetConfigImage_Params, image);
    image.pHostObject = s.host;
    image.configImageSize = s.config.size();
    image.pConfigImage = s.config.data();
    L2CTL_CUPTI(cuptiProfilerHostGetConfigImage, image);

    L2CTL_PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params, passes);
    passes.configImageSize = s.config.size();
    passes.pConfigImage = s.config.data();
    L2CTL_CUPTI(cuptiProfilerHostGetNumOfPasses, passes);
    passes_ = passes.numOfPasses;

    L2CTL_PARAMS(CUpti_RangeProfiler_Enable_Params, enable);
    enable.ctx = s.context;
    L2CTL_CUPTI(cuptiRangeProfilerEnable, enable);
    s.profiler = enable.pRangeProfilerObject;

    L2CTL_PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params, data_size);
    data_size.pRangeProfilerObject = s.profiler;
    data_size.pMetricNames = s.names.data();
    data_size.numMetrics = s.names.size();
    data_size.maxNumOfRanges = max_ranges;
    data_size.maxNumRangeTreeNodes = static_cast<uint32_t>(max_ranges);
    L2CTL_CUPTI(cuptiRangeProfilerGetCounterDataSize, data_size);
    s.counter_data.resize(data_size.counterDataSize);
    L2CTL_PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params, data_init);
    data_init.pRangeProfilerObject = s.profiler;
    data_init.counterDataSize = s.counter_data.size();
    data_init.pCounterData = s.counter_data.data();
    L2CTL_CUPTI(cuptiRangeProfilerCounterDataImageInitialize, data_init);

    s.set_config();
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void RangeProfiler::State::set_config() {
  L2CTL_PARAMS(CUpti_RangeProfiler_SetConfig_Params, config);
  config.pRangeProfilerObject = profiler;
  config.configSize = this->config.size();
  config.pConfig = this->config.data();
  config.counterDataImageSize = counter_data.size();
  config.pCounterDataImage = counter_data.data();
  config.range = CUPTI_AutoRange;
  config.replayMode = user_replay ? CUPTI_UserReplay : CUPTI_KernelReplay;
  config.maxRangesPerPass = max_ranges;
  config.numNestingLevels = 1;
  config.minNestingLevel = 1;
  config.passIndex = pass_index;
  config.targetNestingLevel = static_cast<uint16_t>(target_level);
  L2CTL_CUPTI(cuptiRangeProfilerSetConfig, config);
}

RangeProfiler::~RangeProfiler() { release(); }

void RangeProfiler::release() noexcept {
  if (!state_) return;
  State& s = *state_;
  if (s.subscriber != nullptr) {
    (void)g_cupti.cuptiUnsubscribe(s.subscriber);
    s.subscriber = nullptr;
  }
  if (s.running) {
    L2CTL_PARAMS(CUpti_RangeProfiler_Stop_Params, stop);
    stop.pRangeProfilerObject = s.profiler;
    (void)g_cupti.cuptiRangeProfilerStop(&stop);
    s.running = false;
  }
  if (s.profiler != nullptr) {
    L2CTL_PARAMS(CUpti_RangeProfiler_Disable_Params, disable);
    disable.pRangeProfilerObject = s.profiler;
    (void)g_cupti.cuptiRangeProfilerDisable(&disable);
    s.profiler = nullptr;
  }
  if (s.host != nullptr) {
    L2CTL_PARAMS(CUpti_Profiler_Host_Deinitialize_Params, deinit);
    deinit.pHostObject = s.host;
    (void)g_cupti.cuptiProfilerHostDeinitialize(&deinit);
    s.host = nullptr;
  }
  if (s.initialized) {
    L2CTL_PARAMS(CUpti_Profiler_DeInitialize_Params, deinit);
    (void)g_cupti.cuptiProfilerDeInitialize(&deinit);
    s.initialized = false;
  }
}

void RangeProfiler::start() {
  State& s = *state_;
  if (s.running) throw std::logic_error("the profiler is already running");
  if (s.user_replay && s.pass_index > 0) s.set_config();
  {
    std::lock_guard<std::mutex> lock(s.launches.mutex);
    s.launches.names.clear();
  }
  // Where another subscriber holds the callbacks, or the domain cannot be enabled, names fall back to range indices.
  if (s.subscriber == nullptr &&
      g_cupti.cuptiSubscribe(&s.subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_driver_call), &s.launches) ==
          CUPTI_SUCCESS &&
      g_cupti.cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    (void)g_cupti.cuptiUnsubscribe(s.subscriber);
    s.subscriber = nullptr;
  }
  s.launch_log_active = s.subscriber != nullptr;
  L2CTL_PARAMS(CUpti_RangeProfiler_Start_Params, start);
  start.pRangeProfilerObject = s.profiler;
  L2CTL_CUPTI(cuptiRangeProfilerStart, start);
  s.running = true;
}

long long RangeProfiler::launches() const {
  State& s = *state_;
  if (!s.launch_log_active) return -1;
  std::lock_guard<std::mutex> lock(s.launches.mutex);
  return static_cast<long long>(s.launches.names.size());
}

bool RangeProfiler::end_pass() {
  State& s = *state_;
  if (!s.running) throw std::logic_error("the profiler is not running");
  {
    DeviceGuard guard(s.device);
    L2CTL_CHECK(cudaDeviceSynchronize(), "device " + std::to_string(s.device));
  }
  L2CTL_PARAMS(CUpti_RangeProfiler_Stop_Params, stop);
  stop.pRangeProfilerObject = s.profiler;
  L2CTL_CUPTI(cuptiRangeProfilerStop, stop);
  s.running = false;
  if (s.subscriber != nullptr) {
    (void)g_cupti.cuptiUnsubscribe(s.subscriber);
    s.subscriber = nullptr;
  }
  s.pass_index = stop.passIndex;
  s.target_level = stop.targetNestingLevel;
  s.all_passes = stop.isAllPassSubmitted != 0;
  return s.all_passes;
}

std::vector<RangeValues> RangeProfiler::stop() {
  State& s = *state_;
  if (s.running) end_pass();
  if (s.user_replay && !s.all_passes) throw std::logic_error("user replay: not every pass has been run yet");
  L2CTL_PARAMS(CUpti_RangeProfiler_DecodeData_Params, decode);
  decode.pRangeProfilerObject = s.profiler;
  L2CTL_CUPTI(cuptiRangeProfilerDecodeData, decode);

  L2CTL_PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params, info);
  info.pCounterDataImage = s.counter_data.data();
  info.counterDataImageSize = s.counter_data.size();
  L2CTL_CUPTI(cuptiRangeProfilerGetCounterDataInfo, info);
  std::vector<RangeValues> out;
  for (std::size_t i = 0; i < info.numTotalRanges; ++i) {
    RangeValues r;
    L2CTL_PARAMS(CUpti_RangeProfiler_CounterData_GetRangeInfo_Params, range);
    range.pCounterDataImage = s.counter_data.data();
    range.counterDataImageSize = s.counter_data.size();
    range.rangeIndex = i;
    range.rangeDelimiter = "/";
    L2CTL_CUPTI(cuptiRangeProfilerCounterDataGetRangeInfo, range);
    r.name = info.numTotalRanges == s.launches.names.size() ? s.launches.names[i]
                                                        : (range.rangeName != nullptr ? range.rangeName : "");
    r.values.assign(s.names.size(), 0.0);
    L2CTL_PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params, eval);
    eval.pHostObject = s.host;
    eval.pCounterDataImage = s.counter_data.data();
    eval.counterDataImageSize = s.counter_data.size();
    eval.rangeIndex = i;
    eval.ppMetricNames = s.names.data();
    eval.numMetrics = s.names.size();
    eval.pMetricValues = r.values.data();
    L2CTL_CUPTI(cuptiProfilerHostEvaluateToGpuValues, eval);
    out.push_back(std::move(r));
  }
  if (decode.numOfRangeDropped > 0 && out.size() < s.max_ranges)
    throw CuptiError("cuptiRangeProfilerDecodeData", -2,
                     std::to_string(decode.numOfRangeDropped) + " kernel ranges were dropped");
  return out;
}

// ---- the launch recorder (eager discovery) ------------------------------------------------------------

namespace {

// The parameters CUPTI passes for cuLaunchKernel(_ptsz) and cuLaunchKernelEx(_ptsz): generated_cuda_meta.h's
// cuLaunchKernel_params and cuLaunchKernelEx_params, written out because that header compiles only inside the
// driver's own build (it names the driver's _v1 types).
struct DriverLaunchParams {
  CUfunction f;
  unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  void** kernelParams;
  void** extra;
};
struct DriverLaunchExParams {
  const CUlaunchConfig* config;
  CUfunction f;
  void** kernelParams;
  void** extra;
};

// The recorder the callbacks write to (null: none), and the lock every callback holds while it does: CUPTI may
// still deliver a callback after cuptiUnsubscribe returns, so a recorder stops by clearing this pointer under the
// lock first; a late callback then finds nothing, never a recorder that was freed. One at a time: CUPTI allows
// one subscriber.
std::mutex g_recording_mutex;
LaunchRecorder::State* g_recording = nullptr;
}  // namespace

struct LaunchRecorder::State {
  std::size_t max_launches = 0;
  std::size_t dropped = 0, unreadable = 0;
  std::vector<LaunchArguments> launches;
  // (offset, size) of each parameter, per kernel: read once
  std::unordered_map<CUfunction, std::vector<std::pair<std::size_t, std::size_t>>> layouts;
  std::vector<std::pair<CUcontext, int>> devices;  // context -> device, read once per context
  CUpti_SubscriberHandle subscriber = nullptr;

  const std::vector<std::pair<std::size_t, std::size_t>>& layout(CUfunction fn) {
    auto found = layouts.find(fn);
    if (found != layouts.end()) return found->second;
    std::vector<std::pair<std::size_t, std::size_t>> params;
    const DriverCalls& d = driver();
    // cuLaunchKernel also takes a CUkernel in place of a CUfunction (the CUDA 12+ runtime launches so): when the
    // function query finds no parameter, the kernel query is asked.
    const auto kernel_query = reinterpret_cast<PFN_cuFuncGetParamInfo_v12040>(d.cuKernelGetParamInfo);
    for (auto* query : {d.cuFuncGetParamInfo, kernel_query}) {
      for (std::size_t i = 0; query != nullptr; ++i) {  // the count is stored nowhere: ask until there is none
        std::size_t offset = 0, size = 0;
        if (query(fn, i, &offset, &size) != CUDA_SUCCESS) break;
        params.emplace_back(offset, size);
      }
      if (!params.empty()) break;
    }
    return layouts.emplace(fn, std::move(params)).first->second;
  }

  int device_of(CUcontext context) {
    for (const auto& [ctx, dev] : devices)
      if (ctx == context) return dev;
    CUdevice dev = -1;
    const auto get_device = driver().cuCtxGetDevice;
    if (get_device == nullptr || get_device(&dev) != CUDA_SUCCESS) dev = -1;  // the launch's, current now
    devices.emplace_back(context, static_cast<int>(dev));
    return static_cast<int>(dev);
  }

  // One launch: true when recorded (or dropped for room), false when its arguments could not be read. Called
  // under g_recording_mutex.
  bool record(const CUpti_CallbackData* info, CUfunction fn, CUstream stream, void** params, void** extra) {
    if (launches.size() >= max_launches) {
      ++dropped;
      return true;
    }
    LaunchArguments launch;
    if (params != nullptr && fn != nullptr) {
      // A kernel without parameters (or whose layout the driver cannot tell) is kept with no words, so that
      // every step counts the same launches.
      const auto& layout = this->layout(fn);
      for (unsigned i = 0; i < layout.size() && params[i] != nullptr; ++i)
        append_words(launch.words, i, params[i], layout[i].second);
    } else if (extra != nullptr) {  // one packed buffer: CU_LAUNCH_PARAM_BUFFER_POINTER, its size, END
      const unsigned char* buffer = nullptr;
      std::size_t size = 0;
      for (std::size_t k = 0; k < 16 && extra[k] != CU_LAUNCH_PARAM_END; k += 2) {
        if (extra[k] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = static_cast<const unsigned char*>(extra[k + 1]);
        if (extra[k] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<const std::size_t*>(extra[k + 1]);
      }
      if (buffer == nullptr) return false;
      append_words(launch.words, 0, buffer, size);
    } else {
      return false;
    }
    launch.kernel = info->symbolName != nullptr ? info->symbolName : "";
    launch.stream = reinterpret_cast<std::uintptr_t>(stream);
    launch.device = device_of(info->context);
    launches.push_back(std::move(launch));
    return true;
  }
};

namespace {

void CUPTIAPI on_launch(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || info == nullptr || info->callbackSite != CUPTI_API_ENTER) return;
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  LaunchRecorder::State* state = g_recording;
  if (state == nullptr) return;
  bool read = true;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {  // the two parameter structs are the same
      const auto* p = static_cast<const DriverLaunchParams*>(info->functionParams);
      read = state->record(info, p->f, p->hStream, p->kernelParams, p->extra);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const auto* p = static_cast<const DriverLaunchExParams*>(info->functionParams);
      read = state->record(info, p->f, p->config != nullptr ? p->config->hStream : nullptr, p->kernelParams,
                           p->extra);
      break;
    }
    default:
      return;
  }
  if (!read) ++state->unreadable;
}

}  // namespace

LaunchRecorder::LaunchRecorder(std::size_t max_launches) : state_(std::make_unique<State>()) {
  if (!cupti_loaded()) throw CuptiError("LaunchRecorder", -1, "libcupti is not loaded (call cupti_load first)");
  if (driver().cuFuncGetParamInfo == nullptr)
    throw NotSupported("reading a launch's arguments (cuFuncGetParamInfo) needs a driver of CUDA 12.4 or newer "
                       "(r550+); this driver is CUDA " + cuda_version_text(driver_version()));
  state_->max_launches = max_launches;
}

LaunchRecorder::~LaunchRecorder() { release(); }

void LaunchRecorder::release() noexcept {
  if (!state_ || state_->subscriber == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_recording_mutex);
    if (g_recording == state_.get()) g_recording = nullptr;  // from now on a callback finds nothing to write to
  }
  (void)g_cupti.cuptiUnsubscribe(state_->subscriber);
  state_->subscriber = nullptr;
}

void LaunchRecorder::start() {
  State& s = *state_;
  if (s.subscriber != nullptr) throw std::logic_error("the recorder is already recording");
  check_cupti(g_cupti.cuptiSubscribe(&s.subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_launch), nullptr),
              "cuptiSubscribe");
  try {
    for (CUpti_CallbackId id : {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
                                CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
                                CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz})
      check_cupti(g_cupti.cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id), "cuptiEnableCallback");
  } catch (...) {
    release();
    throw;
  }
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  s.launches.clear();
  s.dropped = s.unreadable = 0;
  g_recording = &s;
}

std::vector<LaunchArguments> LaunchRecorder::stop() {
  release();
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  return std::move(state_->launches);
}

std::size_t LaunchRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  return state_->dropped;
}

std::size_t LaunchRecorder::unreadable() const {
  std::lock_guard<std::mutex> lock(g_recording_mutex);
  return state_->unreadable;
}

}  // namespace l2ctl
