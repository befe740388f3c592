// What a graph's kernel nodes are given: the words of their arguments that may be pointers, and the device
// allocation a pointer falls in. l2ctl.graph.buffers maps them to the memory each kernel touches, so the
// tuner can try ranges no user named (a compiled graph's temporaries).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace l2ctl {

struct ArgumentWord {
  unsigned param = 0;        // the kernel parameter it is part of
  unsigned offset = 0;       // its byte offset inside that parameter
  std::uint64_t value = 0;   // the 8 bytes there (a pointer, or not)
};

// Every 8-byte-aligned word of every parameter of a kernel node, read through the driver
// (cuGraphKernelNodeGetParams, cuFuncGetParamInfo or cuKernelGetParamInfo for the layout). Empty where the
// node cannot tell (made with `extra` instead of kernelParams); NotSupported, naming the driver needed, where the
// driver is older than CUDA 12.4.
std::vector<ArgumentWord> kernel_node_words(std::uintptr_t node);

// Appends the nonzero 8-byte words of one parameter's `size` bytes. A parameter's value starts aligned to its own
// alignment; pointers inside structs (torch's TensorInfo) sit at 8-byte offsets from it.
void append_words(std::vector<ArgumentWord>& words, unsigned param, const void* bytes, std::size_t size);

// (base, size) of the device allocation that holds `address` (cuMemGetAddressRange); (0, 0) when it is in
// none (host memory, a value that is no pointer).
std::pair<std::uintptr_t, std::size_t> address_range(std::uintptr_t address);

}  // namespace l2ctl
