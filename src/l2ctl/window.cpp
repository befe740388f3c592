#include "l2ctl/window.hpp"

#include "l2ctl/error.hpp"

namespace l2ctl {

namespace {

// Stream and kernel-node attribute values are both cudaLaunchAttributeValue since CUDA 12.
cudaLaunchAttributeValue to_cuda(const Window& w) {
  cudaLaunchAttributeValue value{};
  value.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(w.base);
  value.accessPolicyWindow.num_bytes = w.num_bytes;
  value.accessPolicyWindow.hitRatio = static_cast<float>(w.hit_ratio);  // CUDA keeps a float
  value.accessPolicyWindow.hitProp = static_cast<cudaAccessProperty>(w.hit_prop);
  value.accessPolicyWindow.missProp = static_cast<cudaAccessProperty>(w.miss_prop);
  return value;
}

Window from_cuda(const cudaLaunchAttributeValue& value) {
  const cudaAccessPolicyWindow& w = value.accessPolicyWindow;
  Window out;
  out.base = reinterpret_cast<std::uintptr_t>(w.base_ptr);
  out.num_bytes = w.num_bytes;
  out.hit_ratio = w.hitRatio;
  out.hit_prop = static_cast<int>(w.hitProp);
  out.miss_prop = static_cast<int>(w.missProp);
  return out;
}

std::string holder_name(WindowHolder holder, std::uintptr_t handle) {
  return (holder == WindowHolder::stream ? "stream " : "kernel node ") + hex(handle);
}

}  // namespace

Window get_window(WindowHolder holder, std::uintptr_t handle) {
  cudaLaunchAttributeValue value{};
  if (holder == WindowHolder::stream)
    L2CTL_CHECK(cudaStreamGetAttribute(reinterpret_cast<cudaStream_t>(handle), cudaStreamAttributeAccessPolicyWindow,
                                       &value),
                holder_name(holder, handle));
  else
    L2CTL_CHECK(cudaGraphKernelNodeGetAttribute(reinterpret_cast<cudaGraphNode_t>(handle),
                                                cudaKernelNodeAttributeAccessPolicyWindow, &value),
                holder_name(holder, handle));
  return from_cuda(value);
}

void set_window(WindowHolder holder, std::uintptr_t handle, const Window& window) {
  const cudaLaunchAttributeValue value = to_cuda(window);
  if (holder == WindowHolder::stream)
    L2CTL_CHECK(cudaStreamSetAttribute(reinterpret_cast<cudaStream_t>(handle), cudaStreamAttributeAccessPolicyWindow,
                                       &value),
                holder_name(holder, handle) + ", " + describe(window));
  else
    L2CTL_CHECK(cudaGraphKernelNodeSetAttribute(reinterpret_cast<cudaGraphNode_t>(handle),
                                                cudaKernelNodeAttributeAccessPolicyWindow, &value),
                holder_name(holder, handle) + ", " + describe(window));
}

std::string describe(const Window& w) {
  return "base " + hex(w.base) + ", num_bytes " + std::to_string(w.num_bytes) + ", hitRatio " +
         std::to_string(w.hit_ratio) + ", hitProp " + std::to_string(w.hit_prop) + ", missProp " +
         std::to_string(w.miss_prop);
}

}  // namespace l2ctl
