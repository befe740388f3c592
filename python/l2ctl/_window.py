"""Access-policy windows on streams: the raw get/set/clear, validated before CUDA is called."""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from . import _backend
from ._device import require_persistence
from ._interop import StreamRef, resolve_buffer, resolve_stream
from ._plan import check_nbytes, normalize_hit_ratio

__all__ = [
    "AccessProperty",
    "AccessPolicyWindow",
    "get_window",
    "set_window",
    "clear_window",
    "stream_device",
    "check_device_pointer",
]


class AccessProperty(enum.IntEnum):
    """cudaAccessProperty: what an access in (hit) or out of (miss) the hit ratio does to its L2 line."""

    NORMAL = 0
    STREAMING = 1
    PERSISTING = 2


@dataclass(frozen=True)
class AccessPolicyWindow:
    """cudaAccessPolicyWindow. ``base_ptr`` is a device address, ``num_bytes`` the window size in bytes;
    a fraction ``hit_ratio`` of the lines in it get ``hit_prop``, the rest ``miss_prop``."""

    base_ptr: int = 0
    num_bytes: int = 0
    hit_ratio: float = 0.0
    hit_prop: AccessProperty = AccessProperty.NORMAL
    miss_prop: AccessProperty = AccessProperty.NORMAL

    @property
    def empty(self) -> bool:
        """True for the cleared window (0 bytes): no address gets a special property."""
        return self.num_bytes == 0

    @property
    def demand(self) -> float:
        """hit_ratio x num_bytes: the persisting L2 this window asks for when hit_prop is PERSISTING."""
        return self.hit_ratio * self.num_bytes if self.hit_prop == AccessProperty.PERSISTING else 0.0

    def as_tuple(self) -> tuple[int, int, float, int, int]:
        return (self.base_ptr, self.num_bytes, self.hit_ratio, int(self.hit_prop), int(self.miss_prop))

    @classmethod
    def from_tuple(cls, raw: tuple[int, int, float, int, int]) -> "AccessPolicyWindow":
        base, nbytes, hit_ratio, hit_prop, miss_prop = raw
        return cls(int(base), int(nbytes), float(hit_ratio), AccessProperty(int(hit_prop)), AccessProperty(int(miss_prop)))

    @classmethod
    def for_buffer(
        cls,
        buf: object,
        hit_ratio: float = 1.0,
        *,
        offset: int = 0,
        num_bytes: Optional[int] = None,
        hit_prop: AccessProperty = AccessProperty.PERSISTING,
        miss_prop: AccessProperty = AccessProperty.STREAMING,
    ) -> "AccessPolicyWindow":
        """A window over ``buf`` (any accepted buffer) from ``offset`` for ``num_bytes`` (default: to its end)."""
        ref = resolve_buffer(buf)
        offset = check_nbytes(offset, "offset", allow_zero=True)
        if offset >= ref.nbytes:
            raise ValueError(f"offset {offset} is not inside the buffer ({ref.nbytes} bytes)")
        n = ref.nbytes - offset if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
        if offset + n > ref.nbytes:
            raise ValueError(f"the window [{offset}, {offset + n}) runs past the end of the buffer ({ref.nbytes} bytes)")
        return validate_window(cls(ref.ptr + offset, n, hit_ratio, hit_prop, miss_prop))


def _property(value: object, name: str) -> AccessProperty:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an AccessProperty (or its int value), not {type(value).__name__}")
    try:
        return AccessProperty(int(value))
    except ValueError:
        raise ValueError(f"{name} must be one of {[p.name for p in AccessProperty]}, got {value!r}") from None


def validate_window(window: AccessPolicyWindow) -> AccessPolicyWindow:
    """Type and range checks that need no device (hit ratio, properties, byte count)."""
    if not isinstance(window, AccessPolicyWindow):
        raise TypeError(f"expected an AccessPolicyWindow, got {type(window).__name__}")
    base = check_nbytes(window.base_ptr, "base_ptr", allow_zero=True)
    nbytes = check_nbytes(window.num_bytes, "num_bytes", allow_zero=True)
    hit_prop = _property(window.hit_prop, "hit_prop")
    miss_prop = _property(window.miss_prop, "miss_prop")
    if miss_prop == AccessProperty.PERSISTING:
        raise ValueError("miss_prop must be NORMAL or STREAMING (CUDA refuses PERSISTING for misses)")
    if nbytes and not base:
        raise ValueError("a non-empty window needs a base_ptr")
    return replace(
        window,
        base_ptr=base,
        num_bytes=nbytes,
        hit_ratio=normalize_hit_ratio(window.hit_ratio),
        hit_prop=hit_prop,
        miss_prop=miss_prop,
    )


def stream_device(ref: StreamRef) -> int:
    """The device a resolved stream belongs to (the current device for the default streams)."""
    if ref.device is not None:
        return int(ref.device)
    return int(_backend.current().stream_device(ref.handle))


# cudaMemoryType values.
_HOST_UNREGISTERED, _HOST, _DEVICE, _MANAGED = 0, 1, 2, 3


def check_device_pointer(ptr: int, nbytes: int, device: int, what: str = "the buffer") -> None:
    """Refuse host memory and memory of another device (asks CUDA what the pointer is)."""
    memory_type, owner, _, _ = _backend.current().pointer_info(ptr)
    if memory_type in (_HOST_UNREGISTERED, _HOST):
        raise ValueError(
            f"{what} at 0x{ptr:x} is host memory; l2ctl needs device memory (cudaMalloc, torch/CuPy CUDA arrays, "
            "l2ctl.DeviceBuffer)"
        )
    if memory_type == _DEVICE and owner != device:
        raise ValueError(
            f"{what} at 0x{ptr:x} ({nbytes} bytes) is on device {owner} but the stream is on device {device}; "
            "use a stream of the buffer's device"
        )


def get_window(stream: object) -> AccessPolicyWindow:
    """The access-policy window currently set on ``stream``."""
    ref = resolve_stream(stream)
    return AccessPolicyWindow.from_tuple(_backend.current().get_stream_window(ref.handle))


def set_window(stream: object, window: AccessPolicyWindow) -> None:
    """Set ``window`` on ``stream`` (kernels launched on it afterwards use it). Validated first:
    hit ratio, properties, the device's support and max window size, and that the base is device memory."""
    ref = resolve_stream(stream)
    window = validate_window(window)
    device = stream_device(ref)
    if not window.empty:
        info = require_persistence(device)
        if window.num_bytes > info.access_policy_max_window_size:
            raise ValueError(
                f"window of {window.num_bytes} bytes exceeds accessPolicyMaxWindowSize "
                f"({info.access_policy_max_window_size} bytes) of device {device}; use a smaller num_bytes "
                "(l2ctl.persist clips it for you)"
            )
        check_device_pointer(window.base_ptr, window.num_bytes, device, "the window base")
    _backend.current().set_stream_window(ref.handle, *window.as_tuple())


def clear_window(stream: object) -> None:
    """Remove the window from ``stream`` (an empty window: no addresses, hit ratio 0, NORMAL)."""
    ref = resolve_stream(stream)
    _backend.current().set_stream_window(ref.handle, *AccessPolicyWindow().as_tuple())
