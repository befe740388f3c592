// Which CUDA context a stream or a pointer belongs to. l2ctl, like the CUDA runtime, works in each device's
// primary context: a stream or an allocation of another context (made through the driver API, or a
// cuda.core context) is refused before any change, naming both contexts.
#pragma once

#include <cstdint>

namespace l2ctl {

struct Contexts {
  std::uintptr_t context = 0;  // the one the stream or pointer belongs to (0: the driver cannot tell)
  std::uintptr_t primary = 0;  // the primary context of its device
};

// A stream's context; the special handles (0, 1, 2) are the current device's primary context.
Contexts stream_context(std::uintptr_t stream);
// A device pointer's context; {0, 0} for memory the driver knows no context of (host memory).
Contexts pointer_context(std::uintptr_t ptr);

}  // namespace l2ctl
