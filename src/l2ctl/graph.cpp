#include "l2ctl/graph.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>

#include "l2ctl/driver.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/stream.hpp"

namespace l2ctl {

namespace {
cudaGraph_t as_graph(std::uintptr_t h) { return reinterpret_cast<cudaGraph_t>(h); }
std::string on_node(std::uintptr_t h) { return "node " + hex(h); }
std::string on_graph(std::uintptr_t h) { return "graph " + hex(h); }

// Name and launch shape through the driver; false where the driver cannot tell (too old a driver).
bool describe_with_driver(cudaGraphNode_t node, KernelNode& k) {
  const DriverCalls& d = driver();
  if (d.cuGraphKernelNodeGetParams == nullptr) return false;
  CUDA_KERNEL_NODE_PARAMS_v2 params{};
  if (d.cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS) return false;
  k.grid[0] = params.gridDimX; k.grid[1] = params.gridDimY; k.grid[2] = params.gridDimZ;
  k.block[0] = params.blockDimX; k.block[1] = params.blockDimY; k.block[2] = params.blockDimZ;
  const char* name = nullptr;
  if (params.func != nullptr && d.cuFuncGetName != nullptr && d.cuFuncGetName(&name, params.func) == CUDA_SUCCESS &&
      name != nullptr)
    k.function = name;
  else if (params.kern != nullptr && d.cuKernelGetName != nullptr &&
           d.cuKernelGetName(&name, params.kern) == CUDA_SUCCESS && name != nullptr)
    k.function = name;
  return true;
}

// The runtime's description: enough for nodes of l2ctl's own kernels where the driver gives nothing.
void describe_with_runtime(cudaGraphNode_t node, KernelNode& k) {
  cudaKernelNodeParams params{};
  if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
    clear_last_error();
    return;
  }
  k.grid[0] = params.gridDim.x; k.grid[1] = params.gridDim.y; k.grid[2] = params.gridDim.z;
  k.block[0] = params.blockDim.x; k.block[1] = params.blockDim.y; k.block[2] = params.blockDim.z;
  const char* name = nullptr;
  if (params.func != nullptr && cudaFuncGetName(&name, params.func) == cudaSuccess && name != nullptr)
    k.function = name;
  else
    clear_last_error();
}
}  // namespace

Graph::~Graph() {
  if (owned_ && graph_ != 0) (void)cudaGraphDestroy(as_graph(graph_));
}

std::uintptr_t Graph::handle() const {
  if (graph_ == 0) throw std::invalid_argument("the graph has been destroyed");
  return graph_;
}

void Graph::destroy() {
  if (graph_ == 0) return;
  std::uintptr_t g = graph_;
  graph_ = 0;
  if (owned_) L2CTL_CHECK(cudaGraphDestroy(as_graph(g)), on_graph(g));
}

GraphExec::GraphExec(std::uintptr_t graph) {
  cudaGraphExec_t exec = nullptr;
  L2CTL_CHECK(cudaGraphInstantiate(&exec, as_graph(graph), 0), on_graph(graph));
  exec_ = reinterpret_cast<std::uintptr_t>(exec);
}

GraphExec::~GraphExec() {
  if (exec_ != 0) (void)cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec_));
}

std::uintptr_t GraphExec::handle() const {
  if (exec_ == 0) throw std::invalid_argument("the graph executable has been destroyed");
  return exec_;
}

void GraphExec::launch(std::uintptr_t stream) const {
  L2CTL_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(handle()), as_stream(stream)),
              "stream " + hex(stream));
}

bool GraphExec::update(std::uintptr_t graph) {
  cudaGraphExecUpdateResultInfo info{};
  cudaError_t code = cudaGraphExecUpdate(reinterpret_cast<cudaGraphExec_t>(handle()), as_graph(graph), &info);
  if (code == cudaErrorGraphExecUpdateFailure) {
    clear_last_error();
    return false;
  }
  L2CTL_CHECK(code, on_graph(graph));
  return true;
}

void GraphExec::destroy() {
  if (exec_ == 0) return;
  std::uintptr_t e = exec_;
  exec_ = 0;
  L2CTL_CHECK(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(e)), "");
}

void begin_capture(std::uintptr_t stream, int mode) {
  L2CTL_CHECK(cudaStreamBeginCapture(as_stream(stream), static_cast<cudaStreamCaptureMode>(mode)),
              "stream " + hex(stream) + ", mode " + std::to_string(mode));
}

std::uintptr_t end_capture(std::uintptr_t stream) {
  cudaGraph_t graph = nullptr;
  L2CTL_CHECK(cudaStreamEndCapture(as_stream(stream), &graph), "stream " + hex(stream));
  return reinterpret_cast<std::uintptr_t>(graph);
}

bool is_capturing(std::uintptr_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  L2CTL_CHECK(cudaStreamIsCapturing(as_stream(stream), &status), "stream " + hex(stream));
  return status != cudaStreamCaptureStatusNone;
}

std::size_t graph_node_count(std::uintptr_t graph) {
  std::size_t count = 0;
  L2CTL_CHECK(cudaGraphGetNodes(as_graph(graph), nullptr, &count), on_graph(graph));
  return count;
}

std::vector<KernelNode> graph_kernel_nodes(std::uintptr_t graph) {
  std::size_t count = graph_node_count(graph);
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) L2CTL_CHECK(cudaGraphGetNodes(as_graph(graph), nodes.data(), &count), on_graph(graph));
  std::vector<KernelNode> out;
  for (std::size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type{};
    L2CTL_CHECK(cudaGraphNodeGetType(nodes[i], &type), on_node(reinterpret_cast<std::uintptr_t>(nodes[i])));
    if (type != cudaGraphNodeTypeKernel) continue;
    KernelNode k;
    k.node = reinterpret_cast<std::uintptr_t>(nodes[i]);
    if (!describe_with_driver(nodes[i], k) || k.function.empty()) describe_with_runtime(nodes[i], k);
    out.push_back(k);
  }
  return out;
}

}  // namespace l2ctl
