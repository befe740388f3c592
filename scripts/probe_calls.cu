// What each CUDA runtime call behind an L2 control costs on the host, measured in C++ (no Python):
// the floor under l2ctl's scopes. A diagnosis, not a benchmark. Build and run on the GPU machine:
//   nvcc -O2 -o /tmp/probe_calls scripts/probe_calls.cu && /tmp/probe_calls
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorName(e_), __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

__global__ void touch(int* out) { out[threadIdx.x] = threadIdx.x; }

template <class F>
double ns_per_call(F&& f, int calls = 4000, int rounds = 7) {
  for (int i = 0; i < 200; ++i) f(i);
  std::vector<double> samples;
  for (int r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f(i);
    auto stop = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / calls);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int main() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int* buf;
  CHECK(cudaMalloc(&buf, 4 << 20));
  size_t limit0 = 0, max_bytes = 0;
  CHECK(cudaDeviceGetLimit(&limit0, cudaLimitPersistingL2CacheSize));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  max_bytes = prop.persistingL2CacheMaxSize;

  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 32; ++i) touch<<<1, 32, 0, s>>>(buf);
  CHECK(cudaStreamEndCapture(s, &graph));
  size_t n = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));

  cudaLaunchAttributeValue window{}, empty{}, read{};
  window.accessPolicyWindow.base_ptr = buf;
  window.accessPolicyWindow.num_bytes = 4 << 20;
  window.accessPolicyWindow.hitRatio = 0.75f;
  window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  int dev = 0;
  size_t value = 0;
  cudaPointerAttributes pa{};
  const size_t up = std::min(max_bytes, limit0 + (4u << 20));

  struct Row { const char* name; double ns; };
  std::vector<Row> rows = {
      {"cudaGetDevice", ns_per_call([&](int) { CHECK(cudaGetDevice(&dev)); })},
      {"cudaSetDevice (same device)", ns_per_call([&](int) { CHECK(cudaSetDevice(0)); })},
      {"cudaStreamGetDevice", ns_per_call([&](int) { CHECK(cudaStreamGetDevice(s, &dev)); })},
      {"cudaStreamGetAttribute(window)",
       ns_per_call([&](int) { CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &read)); })},
      {"cudaStreamSetAttribute(window / empty)", ns_per_call([&](int i) {
         CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, i % 2 ? &empty : &window));
       })},
      {"cudaGraphKernelNodeGetAttribute(window)", ns_per_call([&](int i) {
         CHECK(cudaGraphKernelNodeGetAttribute(nodes[i % n], cudaKernelNodeAttributeAccessPolicyWindow, &read));
       })},
      {"cudaGraphKernelNodeSetAttribute(window / empty)", ns_per_call([&](int i) {
         CHECK(cudaGraphKernelNodeSetAttribute(nodes[i % n], cudaKernelNodeAttributeAccessPolicyWindow,
                                               (i / n) % 2 ? &empty : &window));
       })},
      {"cudaDeviceGetLimit(persisting)",
       ns_per_call([&](int) { CHECK(cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize)); })},
      {"cudaDeviceSetLimit(persisting, unchanged)",
       ns_per_call([&](int) { CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, limit0)); }, 1000)},
      {"cudaDeviceSetLimit(persisting, up / back)", ns_per_call([&](int i) {
         CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, i % 2 ? limit0 : up));
       }, 1000)},
      {"cudaCtxResetPersistingL2Cache", ns_per_call([&](int) { CHECK(cudaCtxResetPersistingL2Cache()); }, 1000)},
      {"cudaGetDeviceProperties", ns_per_call([&](int) { CHECK(cudaGetDeviceProperties(&prop, 0)); }, 1000)},
      {"cudaDeviceGetAttribute(L2 size)",
       ns_per_call([&](int) { CHECK(cudaDeviceGetAttribute(&dev, cudaDevAttrL2CacheSize, 0)); })},
      {"cudaPointerGetAttributes", ns_per_call([&](int) { CHECK(cudaPointerGetAttributes(&pa, buf)); })},
  };
  CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, limit0));
  CHECK(cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize));
  std::printf("%s, %zu kernel nodes; limit at start %zu, at end %zu\n", prop.name, n, limit0, value);
  for (const Row& r : rows) std::printf("%-50s %9.1f ns\n", r.name, r.ns);
  return value == limit0 ? 0 : 2;
}
