// CUDA graphs: capture, kernel nodes, instantiation and replay (node windows: window.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace l2ctl {

// A cudaGraph_t, owned (destroyed with the object) or borrowed from another library.
class Graph {
 public:
  Graph(std::uintptr_t handle, bool owned) : graph_(handle), owned_(owned) {}
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  std::uintptr_t handle() const;
  bool owned() const { return owned_; }
  void destroy();

 private:
  std::uintptr_t graph_ = 0;
  bool owned_ = false;
};

class GraphExec {
 public:
  explicit GraphExec(std::uintptr_t graph);
  ~GraphExec();
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  std::uintptr_t handle() const;
  void launch(std::uintptr_t stream) const;
  // cudaGraphExecUpdate from `graph`; false when CUDA refuses the update (topology changed, ...).
  bool update(std::uintptr_t graph);
  void destroy();

 private:
  std::uintptr_t exec_ = 0;
};

struct KernelNode {
  std::uintptr_t node = 0;
  std::string function;  // the kernel's name, "" when CUDA cannot tell
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
};

void begin_capture(std::uintptr_t stream, int mode);
std::uintptr_t end_capture(std::uintptr_t stream);  // returns a new cudaGraph_t the caller owns
bool is_capturing(std::uintptr_t stream);

std::size_t graph_node_count(std::uintptr_t graph);
std::vector<KernelNode> graph_kernel_nodes(std::uintptr_t graph);

}  // namespace l2ctl
