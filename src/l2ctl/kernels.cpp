// The launchers of l2ctl's kernels: plain C++ over the driver API. The kernels (kernels.cu) are compiled by NVRTC
// (nvrtc.cpp), loaded as a CUlibrary per device and launched with cuLaunchKernel on the caller's stream
// (a cudaStream_t is a CUstream).
#include "l2ctl/kernels.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "l2ctl/device.hpp"
#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {

// Driver results are reported through CudaError: the runtime's error codes equal the driver's.
static_assert(static_cast<int>(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) == static_cast<int>(cudaErrorUnsupportedPtxVersion));
static_assert(static_cast<int>(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) == static_cast<int>(cudaErrorLaunchOutOfResources));
static_assert(static_cast<int>(CUDA_ERROR_INVALID_HANDLE) == static_cast<int>(cudaErrorInvalidResourceHandle));

// Every kernel of kernels.cu, by its extern "C" name. The reset-data kernels come in groups of three shapes, in
// ResetVariant order (plain .. annotated).
enum Kernel : int {
  reset_first = 0,  // + 3 * variant + shape
  reset_seed = 15,
  reset_verify,
  write_index_k,
  count_index_mismatch_k,
  copy_k,
  count_mismatch_k,
  read_sum_k,
  stride_read_k,
  sum_u64_k,
  sparse_vector_k,
  sparse_vector_streaming_k,
  stream_analysis_k,
  stream_analysis_streaming_k,
  kernel_count
};
enum ResetShape : int { vec_lut = 0, vec_out = 1, scalar_shape = 2 };

const char* const kNames[kernel_count] = {
    "reset_data_plain_kernel_vec_lut",       "reset_data_plain_kernel_vec_out",
    "reset_data_plain_kernel_scalar",        "reset_data_streaming_kernel_vec_lut",
    "reset_data_streaming_kernel_vec_out",   "reset_data_streaming_kernel_scalar",
    "reset_data_evict_last_kernel_vec_lut",  "reset_data_evict_last_kernel_vec_out",
    "reset_data_evict_last_kernel_scalar",   "reset_data_hinted_kernel_vec_lut",
    "reset_data_hinted_kernel_vec_out",      "reset_data_hinted_kernel_scalar",
    "reset_data_annotated_kernel_vec_lut",   "reset_data_annotated_kernel_vec_out",
    "reset_data_annotated_kernel_scalar",    "reset_data_seed_kernel",
    "reset_data_verify_kernel",              "write_index_kernel",
    "count_index_mismatch_kernel",           "copy_kernel",
    "count_mismatch_kernel",                 "read_sum_kernel",
    "stride_read_kernel",                    "sum_u64_kernel",
    "sparse_vector_kernel",                  "sparse_vector_kernel_streaming",
    "stream_analysis_kernel",                "stream_analysis_kernel_streaming"};

// A loaded library, unloaded unless released to the table of loaded devices.
struct LibraryGuard {
  CUlibrary library = nullptr;
  ~LibraryGuard() {
    if (library != nullptr) (void)driver().cuLibraryUnload(library);
  }
};

void check(CUresult code, const char* call, const std::string& details) {
  if (code != CUDA_SUCCESS) fail(static_cast<cudaError_t>(code), call, details);
}

struct Loaded {
  KernelImage image;  // without its data, which the driver has copied
  CUfunction kernels[kernel_count] = {};  // CUkernel handles: context-free, launched in the stream's context
};
std::mutex g_mutex;
std::unordered_map<int, Loaded> g_loaded;  // device -> its kernels, for the life of the process

CUfunction function(int device, Kernel k) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_loaded.find(device);
  if (found == g_loaded.end())
    throw std::logic_error("l2ctl's kernels are not loaded on device " + std::to_string(device) +
                           " (l2ctl.kernels loads them on first use: call load_kernels first)");
  return found->second.kernels[k];
}

constexpr unsigned kThreads = kBlockThreads;

CUstream as_stream(std::uintptr_t h) { return reinterpret_cast<CUstream>(h); }

int sm_count(int device) {
  int count = 0;
  L2CTL_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
              "device " + std::to_string(device));
  return count;
}

// Blocks for a grid-stride kernel: enough to fill every SM at the kernel's occupancy (or at the
// caller's blocks_per_sm), never more than the work needs. The device's context is current (DeviceGuard).
unsigned grid_for(CUfunction kernel, int device, unsigned threads, std::size_t work_items, unsigned blocks_per_sm = 0) {
  int per_sm = static_cast<int>(blocks_per_sm);
  if (per_sm == 0) {
    const CUresult code =
        driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), 0);
    if (code != CUDA_SUCCESS)
      check(code, "cuOccupancyMaxActiveBlocksPerMultiprocessor", "threads " + std::to_string(threads));
    per_sm = std::max(per_sm, 1);
  }
  std::size_t full = static_cast<std::size_t>(sm_count(device)) * static_cast<std::size_t>(per_sm);
  std::size_t needed = (work_items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(full, needed)));
}

// cuLaunchKernel with `args` as the kernel's parameters (each of the parameter's exact size); `details()` names
// the numbers, built only on failure.
template <class Details, class... Args>
void launch(CUfunction kernel, Kernel k, unsigned blocks, unsigned threads, std::uintptr_t stream, Details details,
            Args... args) {
  void* params[] = {static_cast<void*>(&args)...};
  const CUresult code =
      driver().cuLaunchKernel(kernel, blocks, 1, 1, threads, 1, 1, 0, as_stream(stream), params, nullptr);
  if (code != CUDA_SUCCESS)
    throw CudaError(std::string("launch of ") + kNames[k], static_cast<cudaError_t>(code), details());
}

std::string no_details() { return std::string(); }

// A grid-stride kernel over `len` 32-bit words moved 16 bytes at a time (the ceiling kernels); returns its blocks.
template <class... Args>
unsigned launch_words(int device, std::uintptr_t stream, Kernel k, std::size_t len, Args... args) {
  DeviceGuard guard(device);
  const CUfunction kernel = function(device, k);
  const unsigned blocks = grid_for(kernel, device, kThreads, len / 4 + 1);
  launch(kernel, k, blocks, kThreads, stream, [&] { return std::to_string(len) + " words"; }, args...);
  return blocks;
}

// One thread per item (the cache-streaming scenarios); `items` names them in an error's details.
template <class... Args>
void launch_per_item(int device, std::uintptr_t stream, Kernel k, std::size_t len, const char* items, Args... args) {
  DeviceGuard guard(device);
  const std::size_t blocks = (len + kThreads - 1) / kThreads;
  launch(function(device, k), k, static_cast<unsigned>(std::max<std::size_t>(blocks, 1)), kThreads, stream,
         [&] { return std::to_string(len) + items; }, args...);
}

const void* as_ptr(std::uintptr_t p) { return reinterpret_cast<const void*>(p); }

// A kernel that counts into a device word (its last parameter), launched and read back (waits on the stream).
template <class... Args>
unsigned long long run_counting(int device, std::uintptr_t handle, Kernel k, std::size_t work, Args... args) {
  DeviceGuard guard(device);
  const CUfunction kernel = function(device, k);
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(handle);
  unsigned long long* counter = nullptr;
  L2CTL_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&counter), sizeof *counter, stream), "8 bytes");
  cudaError_t code = cudaMemsetAsync(counter, 0, sizeof *counter, stream);
  if (code != cudaSuccess) {
    (void)cudaFreeAsync(counter, stream);
    L2CTL_CHECK(code, "");
  }
  try {
    launch(kernel, k, grid_for(kernel, device, kThreads, work), kThreads, handle, no_details, args...,
           static_cast<const void*>(counter));
  } catch (...) {
    (void)cudaFreeAsync(counter, stream);
    throw;
  }
  unsigned long long host = 0;
  code = cudaMemcpyAsync(&host, counter, sizeof host, cudaMemcpyDeviceToHost, stream);
  if (code == cudaSuccess) code = cudaStreamSynchronize(stream);
  (void)cudaFreeAsync(counter, stream);
  L2CTL_CHECK(code, "reading a device counter");
  return host;
}

bool aligned16(std::uintptr_t p) { return (p & 15u) == 0; }

}  // namespace

KernelImage load_kernels(int device, const std::vector<std::string>& nvrtc, const std::string& cache_dir) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = g_loaded.find(device);
    if (found != g_loaded.end()) return found->second.image;
  }
  DeviceGuard guard(device);
  const DeviceProperties props = device_properties(device);
  KernelImage image = kernel_image(props.major * 10 + props.minor, false, nvrtc, cache_dir);
  const DriverCalls& d = driver();
  if (d.cuLibraryLoadData == nullptr || d.cuLibraryUnload == nullptr || d.cuLibraryGetModule == nullptr ||
      d.cuLibraryGetKernel == nullptr || d.cuLaunchKernel == nullptr ||
      d.cuOccupancyMaxActiveBlocksPerMultiprocessor == nullptr)
    throw NotSupported("l2ctl's kernels need a driver of CUDA 12.0 or newer (r525+, for cuLibraryLoadData); this "
                       "driver is CUDA " + cuda_version_text(driver_version()));
  // Loading is no stream operation: allowed while a stream is being captured (this thread's or another's).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  L2CTL_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "");
  LibraryGuard library;
  CUmodule module = nullptr;
  CUresult code = d.cuLibraryLoadData(&library.library, image.data.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  // Into this context now: a JIT error shows here.
  if (code == CUDA_SUCCESS) code = d.cuLibraryGetModule(&module, library.library);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  const std::string what =
      (image.cubin ? "sm_" : "compute_") + std::to_string(image.arch) + (image.cubin ? " CUBIN" : " PTX");
  if (code == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
    const std::string nvrtc_version = cuda_version_text(image.nvrtc_major * 1000 + image.nvrtc_minor * 10);
    throw KernelsUnavailable("l2ctl's kernels are " + what + " from NVRTC " + nvrtc_version +
                             ", which needs a driver of CUDA " + nvrtc_version + " or newer; this driver is CUDA " +
                             cuda_version_text(driver_version()) +
                             ": update the driver, or point L2CTL_NVRTC at an NVRTC no newer than it");
  }
  check(code, "cuLibraryLoadData", "device " + std::to_string(device) + ", " + what + ", " +
                                       std::to_string(image.data.size()) + " bytes");
  Loaded loaded;
  for (int k = 0; k < kernel_count; ++k) {
    CUkernel kernel = nullptr;
    check(d.cuLibraryGetKernel(&kernel, library.library, kNames[k]), "cuLibraryGetKernel", kNames[k]);
    loaded.kernels[k] = reinterpret_cast<CUfunction>(kernel);
  }
  image.data.clear();
  image.data.shrink_to_fit();
  loaded.image = image;
  std::lock_guard<std::mutex> lock(g_mutex);
  // Where another thread loaded the device meanwhile, its library is kept and this one unloaded.
  const auto [entry, added] = g_loaded.emplace(device, std::move(loaded));
  if (added) library.library = nullptr;  // kept for the life of the process
  return entry->second.image;
}

LaunchShape reset_data(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len, std::uintptr_t lut,
                       std::size_t lut_len, ResetVariant variant, unsigned blocks_per_sm) {
  if (lut_len == 0 || lut_len > 0x7fffffffu) throw std::invalid_argument("lut length must be in [1, 2^31)");
  DeviceGuard guard(device);
  LaunchShape shape;
  if (variant == ResetVariant::seed) {
    shape.blocks = 32;
    shape.threads = 1024;
    launch(function(device, reset_seed), reset_seed, 32, 1024, stream, no_details, as_ptr(out), out_len, as_ptr(lut),
           lut_len);
    return shape;
  }
  const bool scalar = variant == ResetVariant::scalar;
  if (scalar) variant = ResetVariant::plain;
  if (static_cast<int>(variant) < 0 || static_cast<int>(variant) > static_cast<int>(ResetVariant::annotated))
    throw std::invalid_argument("unknown reset-data variant " + std::to_string(static_cast<int>(variant)));
  shape.vector_out = !scalar && aligned16(out);
  shape.vector_lut = shape.vector_out && aligned16(lut) && lut_len % 4 == 0;
  const ResetShape form = shape.vector_lut ? vec_lut : shape.vector_out ? vec_out : scalar_shape;
  const Kernel k = static_cast<Kernel>(reset_first + 3 * static_cast<int>(variant) + form);
  const CUfunction kernel = function(device, k);
  const std::size_t work = shape.vector_out ? out_len / 4 + 1 : out_len;
  shape.threads = kThreads;
  shape.blocks = grid_for(kernel, device, kThreads, work, blocks_per_sm);
  launch(kernel, k, shape.blocks, kThreads, stream,
         [&] {
           return "variant " + std::to_string(static_cast<int>(variant)) + ", out_len " + std::to_string(out_len) +
                  ", lut_len " + std::to_string(lut_len);
         },
         as_ptr(out), out_len, as_ptr(lut), static_cast<unsigned>(lut_len));
  return shape;
}

unsigned long long reset_data_verify(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len,
                                     std::uintptr_t lut, std::size_t lut_len) {
  if (lut_len == 0) throw std::invalid_argument("lut length must be positive");
  return run_counting(device, stream, reset_verify, out_len, as_ptr(out), out_len, as_ptr(lut), lut_len);
}

void write_index(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len) {
  if (!aligned16(buf)) throw std::invalid_argument("write_index needs a 16-byte aligned buffer");
  launch_words(device, stream, write_index_k, len, as_ptr(buf), len);
}

unsigned long long count_index_mismatches(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len) {
  return run_counting(device, stream, count_index_mismatch_k, len, as_ptr(buf), len);
}

void copy_words(int device, std::uintptr_t stream, std::uintptr_t dst, std::uintptr_t src, std::size_t len) {
  if (!aligned16(dst) || !aligned16(src)) throw std::invalid_argument("copy_words needs 16-byte aligned buffers");
  launch_words(device, stream, copy_k, len, as_ptr(dst), as_ptr(src), len / 4, as_ptr(dst), as_ptr(src), len);
}

unsigned long long count_mismatches(int device, std::uintptr_t stream, std::uintptr_t a, std::uintptr_t b,
                                    std::size_t len) {
  return run_counting(device, stream, count_mismatch_k, len, as_ptr(a), as_ptr(b), len);
}

unsigned max_read_partials(int device) {
  DeviceGuard guard(device);
  return grid_for(function(device, read_sum_k), device, kThreads, static_cast<std::size_t>(-1) / 2);
}

unsigned read_sum(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len, std::uintptr_t partials) {
  if (!aligned16(buf)) throw std::invalid_argument("read_sum needs a 16-byte aligned buffer");
  return launch_words(device, stream, read_sum_k, len, as_ptr(buf), len / 4, as_ptr(buf), len, as_ptr(partials));
}

unsigned stride_read(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t threads,
                     unsigned stride_words, std::uintptr_t partials, unsigned block_threads) {
  if (block_threads == 0 || block_threads % 32 != 0 || block_threads > 1024)
    throw std::invalid_argument("block_threads must be a multiple of 32 in [32, 1024]");
  DeviceGuard guard(device);
  const std::size_t blocks = (threads + block_threads - 1) / block_threads;
  if (blocks == 0 || blocks > 0x7fffffffu) throw std::invalid_argument("thread count out of range");
  launch(function(device, stride_read_k), stride_read_k, static_cast<unsigned>(blocks), block_threads, stream,
         [&] { return std::to_string(threads) + " threads, stride " + std::to_string(stride_words) + " words"; },
         as_ptr(buf), threads, stride_words, as_ptr(partials));
  return static_cast<unsigned>(blocks);
}

unsigned long long sum_u64(int device, std::uintptr_t stream, std::uintptr_t values, std::size_t count) {
  return run_counting(device, stream, sum_u64_k, count, as_ptr(values), count);
}

void sparse_vector(int device, std::uintptr_t stream, std::uintptr_t values, std::uintptr_t indices,
                   std::uintptr_t dense, std::size_t dense_len, std::uintptr_t result, std::size_t len,
                   bool streaming) {
  if (dense_len == 0 || dense_len > 0xffffffffu) throw std::invalid_argument("dense length out of range");
  launch_per_item(device, stream, streaming ? sparse_vector_streaming_k : sparse_vector_k, len, " elements",
                  as_ptr(values), as_ptr(indices), as_ptr(dense), static_cast<unsigned>(dense_len), as_ptr(result),
                  len);
}

void stream_analysis(int device, std::uintptr_t stream, std::uintptr_t data, std::uintptr_t categories,
                     std::uintptr_t weights, std::size_t weights_len, std::uintptr_t results, std::size_t len,
                     bool streaming) {
  if (weights_len == 0 || weights_len > 0xffffffffu) throw std::invalid_argument("weights length out of range");
  launch_per_item(device, stream, streaming ? stream_analysis_streaming_k : stream_analysis_k, len, " outputs",
                  as_ptr(data), as_ptr(categories), as_ptr(weights), static_cast<unsigned>(weights_len),
                  as_ptr(results), len);
}

}  // namespace l2ctl
