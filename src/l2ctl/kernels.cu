#include "l2ctl/kernels.hpp"

#include <cuda/annotated_ptr>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include "l2ctl/cache_hints.cuh"
#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {

using hints::evict;
using hints::load_op;
using hints::store_op;

constexpr unsigned kThreads = 256;

cudaStream_t as_stream(std::uintptr_t h) { return reinterpret_cast<cudaStream_t>(h); }
template <class T>
T* as_ptr(std::uintptr_t p) { return reinterpret_cast<T*>(p); }

int sm_count(int device) {
  int count = 0;
  L2CTL_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "device " + std::to_string(device));
  return count;
}

// Blocks for a grid-stride kernel: enough to fill every SM at the kernel's occupancy (or at the
// caller's blocks_per_sm), never more than the work needs.
template <class Kernel>
unsigned grid_for(Kernel kernel, int device, unsigned threads, std::size_t work_items, unsigned blocks_per_sm = 0) {
  int per_sm = static_cast<int>(blocks_per_sm);
  if (per_sm == 0) {
    L2CTL_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), 0),
                "threads " + std::to_string(threads));
    per_sm = std::max(per_sm, 1);
  }
  std::size_t full = static_cast<std::size_t>(sm_count(device)) * static_cast<std::size_t>(per_sm);
  std::size_t needed = (work_items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(full, needed)));
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; thread 0 gets the result. Block size a multiple of 32, at most 1024.
__device__ unsigned long long block_sum(unsigned long long v) {
  __shared__ unsigned long long partial[32];
  v = warp_sum(v);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x >> 5) ? partial[lane] : 0ull;
    v = warp_sum(v);
  }
  return v;
}

// ---- reset data --------------------------------------------------------------------------------

enum class LutLoad { plain, evict_last, annotated };
enum class OutStore { plain, streaming };

template <LutLoad L>
struct LutReader {
  const int* lut;
  std::uint64_t policy;
  __device__ explicit LutReader(const int* p) : lut(p), policy(0) {
    if constexpr (L == LutLoad::evict_last) policy = hints::make_policy<evict::last>(1.0f);
  }
  __device__ __forceinline__ int one(unsigned j) const {
    if constexpr (L == LutLoad::evict_last) return hints::load_with_policy(lut + j, policy);
    else if constexpr (L == LutLoad::annotated) {
      cuda::annotated_ptr<const int, cuda::access_property::persisting> p(lut);
      return p[j];
    } else return lut[j];
  }
  __device__ __forceinline__ int4 four(unsigned j) const {  // j is a multiple of 4
    const int4* q = reinterpret_cast<const int4*>(lut + j);
    if constexpr (L == LutLoad::evict_last) return hints::load_with_policy(q, policy);
    else if constexpr (L == LutLoad::annotated) {
      cuda::annotated_ptr<const int4, cuda::access_property::persisting> p(reinterpret_cast<const int4*>(lut));
      return p[j >> 2];
    } else return *q;
  }
};

template <OutStore S, class T>
__device__ __forceinline__ void put(T* address, T value) {
  if constexpr (S == OutStore::streaming) hints::store<store_op::cs>(address, value);
  else *address = value;
}

// Grid-stride fill with a running modulo: one 64-bit modulo per thread before the loop, none inside.
template <LutLoad L, OutStore S, bool VecOut, bool VecLut>
__device__ __forceinline__ void reset_data_body(int* __restrict__ out, std::size_t n, const int* __restrict__ lut,
                                                unsigned m) {
  const LutReader<L> reader(lut);
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  if constexpr (VecOut) {
    const std::size_t nvec = n / 4;
    int4* out4 = reinterpret_cast<int4*>(out);
    unsigned j = static_cast<unsigned>((4 * thread) % m);
    const unsigned step = static_cast<unsigned>((4 * threads) % m);
#pragma unroll 4
    for (std::size_t v = thread; v < nvec; v += threads) {
      int4 value;
      if constexpr (VecLut) {
        value = reader.four(j);
      } else {
        unsigned k1 = j + 1, k2 = j + 2, k3 = j + 3;
        while (k1 >= m) k1 -= m;  // at most 3 passes, only when m < 4
        while (k2 >= m) k2 -= m;
        while (k3 >= m) k3 -= m;
        value = make_int4(reader.one(j), reader.one(k1), reader.one(k2), reader.one(k3));
      }
      put<S>(out4 + v, value);
      j += step;
      if (j >= m) j -= m;
    }
    const std::size_t tail = 4 * nvec + thread;  // the last n % 4 words
    if (tail < n) put<S>(out + tail, reader.one(static_cast<unsigned>(tail % m)));
  } else {
    unsigned j = static_cast<unsigned>(thread % m);
    const unsigned step = static_cast<unsigned>(threads % m);
#pragma unroll 4
    for (std::size_t i = thread; i < n; i += threads) {
      put<S>(out + i, reader.one(j));
      j += step;
      if (j >= m) j -= m;
    }
  }
}

// One named kernel per variant, so the PTX of each can be inspected by name.
#define L2CTL_RESET_KERNEL(NAME, L, S)                                                                   \
  template <bool VecOut, bool VecLut>                                                                    \
  __global__ void __launch_bounds__(kThreads) NAME(int* __restrict__ out, std::size_t n,                 \
                                                   const int* __restrict__ lut, unsigned m) {            \
    reset_data_body<L, S, VecOut, VecLut>(out, n, lut, m);                                               \
  }
L2CTL_RESET_KERNEL(reset_data_plain_kernel, LutLoad::plain, OutStore::plain)
L2CTL_RESET_KERNEL(reset_data_streaming_kernel, LutLoad::plain, OutStore::streaming)
L2CTL_RESET_KERNEL(reset_data_evict_last_kernel, LutLoad::evict_last, OutStore::plain)
L2CTL_RESET_KERNEL(reset_data_hinted_kernel, LutLoad::evict_last, OutStore::streaming)
L2CTL_RESET_KERNEL(reset_data_annotated_kernel, LutLoad::annotated, OutStore::plain)
#undef L2CTL_RESET_KERNEL

// The source blog's kernel shape, kept as a labelled reference: a 64-bit modulo per element.
__global__ void reset_data_seed_kernel(int* __restrict__ out, std::size_t n, const int* __restrict__ lut,
                                       std::size_t m) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = lut[i % m];
}


using ResetKernel = void (*)(int*, std::size_t, const int*, unsigned);

template <bool VecOut, bool VecLut>
ResetKernel pick_reset(ResetVariant variant) {
  switch (variant) {
    case ResetVariant::plain: return reset_data_plain_kernel<VecOut, VecLut>;
    case ResetVariant::streaming: return reset_data_streaming_kernel<VecOut, VecLut>;
    case ResetVariant::evict_last: return reset_data_evict_last_kernel<VecOut, VecLut>;
    case ResetVariant::hinted: return reset_data_hinted_kernel<VecOut, VecLut>;
    case ResetVariant::annotated: return reset_data_annotated_kernel<VecOut, VecLut>;
    default: throw std::invalid_argument("unknown reset-data variant " + std::to_string(static_cast<int>(variant)));
  }
}

__global__ void reset_data_verify_kernel(const int* __restrict__ out, std::size_t n, const int* __restrict__ lut,
                                         std::size_t m, unsigned long long* __restrict__ mismatches) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad += out[i] != lut[i % m];
  bad = block_sum(bad);
  if (threadIdx.x == 0 && bad != 0) atomicAdd(mismatches, bad);
}

// ---- ceilings ----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) write_index_kernel(unsigned* __restrict__ buf, std::size_t n) {
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t nvec = n / 4;
  uint4* buf4 = reinterpret_cast<uint4*>(buf);
#pragma unroll 4
  for (std::size_t v = thread; v < nvec; v += threads) {
    const unsigned base = static_cast<unsigned>(4 * v);
    buf4[v] = make_uint4(base, base + 1, base + 2, base + 3);
  }
  const std::size_t tail = 4 * nvec + thread;
  if (tail < n) buf[tail] = static_cast<unsigned>(tail);
}

__global__ void count_index_mismatch_kernel(const unsigned* __restrict__ buf, std::size_t n,
                                            unsigned long long* __restrict__ mismatches) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad += buf[i] != static_cast<unsigned>(i);
  bad = block_sum(bad);
  if (threadIdx.x == 0 && bad != 0) atomicAdd(mismatches, bad);
}

__global__ void __launch_bounds__(kThreads) copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                        std::size_t nvec, unsigned* __restrict__ dst1,
                                                        const unsigned* __restrict__ src1, std::size_t n) {
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
#pragma unroll 4
  for (std::size_t v = thread; v < nvec; v += threads) dst[v] = src[v];
  const std::size_t tail = 4 * nvec + thread;
  if (tail < n) dst1[tail] = src1[tail];
}

__global__ void count_mismatch_kernel(const unsigned* __restrict__ a, const unsigned* __restrict__ b, std::size_t n,
                                      unsigned long long* __restrict__ mismatches) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad += a[i] != b[i];
  bad = block_sum(bad);
  if (threadIdx.x == 0 && bad != 0) atomicAdd(mismatches, bad);
}

__global__ void __launch_bounds__(kThreads) read_sum_kernel(const uint4* __restrict__ buf4, std::size_t nvec,
                                                            const unsigned* __restrict__ buf, std::size_t n,
                                                            unsigned long long* __restrict__ partials) {
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long sum = 0;
#pragma unroll 4
  for (std::size_t v = thread; v < nvec; v += threads) {
    const uint4 x = buf4[v];
    sum += static_cast<unsigned long long>(x.x) + x.y + x.z + x.w;
  }
  const std::size_t tail = 4 * nvec + thread;
  if (tail < n) sum += buf[tail];
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void stride_read_kernel(const unsigned* __restrict__ buf, std::size_t threads, unsigned stride_words,
                                   unsigned long long* __restrict__ partials) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long v = t < threads ? buf[t * stride_words] : 0ull;
  v = block_sum(v);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;  // keeps every load alive
}

__global__ void sum_u64_kernel(const unsigned long long* __restrict__ values, std::size_t n,
                               unsigned long long* __restrict__ total) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long s = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    s += values[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(total, s);
}

// ---- cache streaming scenarios -----------------------------------------------------------------

template <bool Streaming>
__global__ void sparse_vector_kernel(const float* __restrict__ values, const int* __restrict__ indices,
                                     const float* __restrict__ dense, unsigned dense_len, float* __restrict__ result,
                                     std::size_t n) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float value;
  int index;
  if constexpr (Streaming) {
    value = hints::load<load_op::cs>(values + t);
    index = hints::load<load_op::cs>(indices + t);
  } else {
    value = values[t];
    index = indices[t];
  }
  const float hot = dense[static_cast<unsigned>(index) % dense_len];
  result[t] = value * hot + sinf(value * 0.1f);
}

template <bool Streaming>
__global__ void stream_analysis_kernel(const float* __restrict__ data, const int* __restrict__ categories,
                                       const float* __restrict__ weights, unsigned weights_len,
                                       float* __restrict__ results, std::size_t n) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // 8 consecutive elements per thread, as in the source document
    const std::size_t k = t * 8 + i;
    float x;
    int c;
    if constexpr (Streaming) {
      x = hints::load<load_op::cs>(data + k);
      c = hints::load<load_op::cs>(categories + k);
    } else {
      x = data[k];
      c = categories[k];
    }
    const float w = weights[static_cast<unsigned>(c) % weights_len];
    sum += x * w + cosf(x * 0.01f);
  }
  results[t] = sum;
}

unsigned long long read_counter_and_free(unsigned long long* counter, cudaStream_t stream) {
  unsigned long long host = 0;
  cudaError_t code = cudaMemcpyAsync(&host, counter, sizeof host, cudaMemcpyDeviceToHost, stream);
  if (code == cudaSuccess) code = cudaStreamSynchronize(stream);
  (void)cudaFreeAsync(counter, stream);
  L2CTL_CHECK(code, "reading a device counter");
  return host;
}

unsigned long long* new_counter(cudaStream_t stream) {
  unsigned long long* counter = nullptr;
  L2CTL_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&counter), sizeof *counter, stream), "8 bytes");
  cudaError_t code = cudaMemsetAsync(counter, 0, sizeof *counter, stream);
  if (code != cudaSuccess) {
    (void)cudaFreeAsync(counter, stream);
    L2CTL_CHECK(code, "");
  }
  return counter;
}

template <class Kernel, class... Args>
unsigned long long run_counting(int device, std::uintptr_t stream, Kernel kernel, std::size_t work, const char* name,
                                Args... args) {
  DeviceGuard guard(device);
  cudaStream_t s = as_stream(stream);
  unsigned long long* counter = new_counter(s);
  const unsigned blocks = grid_for(kernel, device, kThreads, work);
  kernel<<<blocks, kThreads, 0, s>>>(args..., counter);
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) {
    (void)cudaFreeAsync(counter, s);
    throw CudaError(std::string("launch of ") + name, launch, "");
  }
  return read_counter_and_free(counter, s);
}

bool aligned16(std::uintptr_t p) { return (p & 15u) == 0; }

}  // namespace

LaunchShape reset_data(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len, std::uintptr_t lut,
                       std::size_t lut_len, ResetVariant variant, unsigned blocks_per_sm) {
  if (lut_len == 0 || lut_len > 0x7fffffffu) throw std::invalid_argument("lut length must be in [1, 2^31)");
  DeviceGuard guard(device);
  LaunchShape shape;
  cudaStream_t s = as_stream(stream);
  if (variant == ResetVariant::seed) {
    shape.blocks = 32;
    shape.threads = 1024;
    reset_data_seed_kernel<<<32, 1024, 0, s>>>(as_ptr<int>(out), out_len, as_ptr<const int>(lut), lut_len);
    check_launch("reset_data_seed_kernel");
    return shape;
  }
  const bool scalar = variant == ResetVariant::scalar;
  if (scalar) variant = ResetVariant::plain;
  shape.vector_out = !scalar && aligned16(out);
  shape.vector_lut = shape.vector_out && aligned16(lut) && lut_len % 4 == 0;
  ResetKernel kernel = shape.vector_lut   ? pick_reset<true, true>(variant)
                       : shape.vector_out ? pick_reset<true, false>(variant)
                                          : pick_reset<false, false>(variant);
  const std::size_t work = shape.vector_out ? out_len / 4 + 1 : out_len;
  shape.threads = kThreads;
  shape.blocks = grid_for(kernel, device, kThreads, work, blocks_per_sm);
  kernel<<<shape.blocks, kThreads, 0, s>>>(as_ptr<int>(out), out_len, as_ptr<const int>(lut),
                                          static_cast<unsigned>(lut_len));
  check_launch("reset_data", "variant " + std::to_string(static_cast<int>(variant)) + ", out_len " +
                                 std::to_string(out_len) + ", lut_len " + std::to_string(lut_len));
  return shape;
}

unsigned long long reset_data_verify(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len,
                                     std::uintptr_t lut, std::size_t lut_len) {
  if (lut_len == 0) throw std::invalid_argument("lut length must be positive");
  return run_counting(device, stream, reset_data_verify_kernel, out_len, "reset_data_verify_kernel",
                      as_ptr<const int>(out), out_len, as_ptr<const int>(lut), lut_len);
}

void write_index(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len) {
  if (!aligned16(buf)) throw std::invalid_argument("write_index needs a 16-byte aligned buffer");
  DeviceGuard guard(device);
  const unsigned blocks = grid_for(write_index_kernel, device, kThreads, len / 4 + 1);
  write_index_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(as_ptr<unsigned>(buf), len);
  check_launch("write_index_kernel", std::to_string(len) + " words");
}

unsigned long long count_index_mismatches(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len) {
  return run_counting(device, stream, count_index_mismatch_kernel, len, "count_index_mismatch_kernel",
                      as_ptr<const unsigned>(buf), len);
}

void copy_words(int device, std::uintptr_t stream, std::uintptr_t dst, std::uintptr_t src, std::size_t len) {
  if (!aligned16(dst) || !aligned16(src)) throw std::invalid_argument("copy_words needs 16-byte aligned buffers");
  DeviceGuard guard(device);
  const unsigned blocks = grid_for(copy_kernel, device, kThreads, len / 4 + 1);
  copy_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(as_ptr<uint4>(dst), as_ptr<const uint4>(src), len / 4,
                                                         as_ptr<unsigned>(dst), as_ptr<const unsigned>(src), len);
  check_launch("copy_kernel", std::to_string(len) + " words");
}

unsigned long long count_mismatches(int device, std::uintptr_t stream, std::uintptr_t a, std::uintptr_t b,
                                    std::size_t len) {
  return run_counting(device, stream, count_mismatch_kernel, len, "count_mismatch_kernel", as_ptr<const unsigned>(a),
                      as_ptr<const unsigned>(b), len);
}

unsigned max_read_partials(int device) {
  DeviceGuard guard(device);
  return grid_for(read_sum_kernel, device, kThreads, static_cast<std::size_t>(-1) / 2);
}

unsigned read_sum(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len, std::uintptr_t partials) {
  if (!aligned16(buf)) throw std::invalid_argument("read_sum needs a 16-byte aligned buffer");
  DeviceGuard guard(device);
  const unsigned blocks = grid_for(read_sum_kernel, device, kThreads, len / 4 + 1);
  read_sum_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(as_ptr<const uint4>(buf), len / 4,
                                                             as_ptr<const unsigned>(buf), len,
                                                             as_ptr<unsigned long long>(partials));
  check_launch("read_sum_kernel", std::to_string(len) + " words");
  return blocks;
}

unsigned stride_read(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t threads,
                     unsigned stride_words, std::uintptr_t partials, unsigned block_threads) {
  if (block_threads == 0 || block_threads % 32 != 0 || block_threads > 1024)
    throw std::invalid_argument("block_threads must be a multiple of 32 in [32, 1024]");
  DeviceGuard guard(device);
  const std::size_t blocks = (threads + block_threads - 1) / block_threads;
  if (blocks == 0 || blocks > 0x7fffffffu) throw std::invalid_argument("thread count out of range");
  stride_read_kernel<<<static_cast<unsigned>(blocks), block_threads, 0, as_stream(stream)>>>(
      as_ptr<const unsigned>(buf), threads, stride_words, as_ptr<unsigned long long>(partials));
  check_launch("stride_read_kernel", std::to_string(threads) + " threads, stride " + std::to_string(stride_words) +
                                         " words");
  return static_cast<unsigned>(blocks);
}

unsigned long long sum_u64(int device, std::uintptr_t stream, std::uintptr_t values, std::size_t count) {
  return run_counting(device, stream, sum_u64_kernel, count, "sum_u64_kernel",
                      as_ptr<const unsigned long long>(values), count);
}

void sparse_vector(int device, std::uintptr_t stream, std::uintptr_t values, std::uintptr_t indices,
                   std::uintptr_t dense, std::size_t dense_len, std::uintptr_t result, std::size_t len,
                   bool streaming) {
  if (dense_len == 0 || dense_len > 0xffffffffu) throw std::invalid_argument("dense length out of range");
  DeviceGuard guard(device);
  const std::size_t blocks = (len + kThreads - 1) / kThreads;
  auto kernel = streaming ? sparse_vector_kernel<true> : sparse_vector_kernel<false>;
  kernel<<<static_cast<unsigned>(std::max<std::size_t>(blocks, 1)), kThreads, 0, as_stream(stream)>>>(
      as_ptr<const float>(values), as_ptr<const int>(indices), as_ptr<const float>(dense),
      static_cast<unsigned>(dense_len), as_ptr<float>(result), len);
  check_launch("sparse_vector_kernel", std::to_string(len) + " elements");
}

void stream_analysis(int device, std::uintptr_t stream, std::uintptr_t data, std::uintptr_t categories,
                     std::uintptr_t weights, std::size_t weights_len, std::uintptr_t results, std::size_t len,
                     bool streaming) {
  if (weights_len == 0 || weights_len > 0xffffffffu) throw std::invalid_argument("weights length out of range");
  DeviceGuard guard(device);
  const std::size_t blocks = (len + kThreads - 1) / kThreads;
  auto kernel = streaming ? stream_analysis_kernel<true> : stream_analysis_kernel<false>;
  kernel<<<static_cast<unsigned>(std::max<std::size_t>(blocks, 1)), kThreads, 0, as_stream(stream)>>>(
      as_ptr<const float>(data), as_ptr<const int>(categories), as_ptr<const float>(weights),
      static_cast<unsigned>(weights_len), as_ptr<float>(results), len);
  check_launch("stream_analysis_kernel", std::to_string(len) + " outputs");
}

}  // namespace l2ctl
