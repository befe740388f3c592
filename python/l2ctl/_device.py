"""Devices: which ones exist, their immutable properties (cached per backend and device), and which
device a stream or a pointer belongs to. Nothing here changes device state (see _registry)."""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _backend
from ._backend import Backend
from ._errors import CudaError, NoDeviceError, NotSupportedError
from ._interop import StreamRef
from ._plan import is_integer

__all__ = ["DeviceProperties", "device_count", "resolve_device", "properties", "require_persistence", "stream_device",
           "check_pointer", "versions", "minimum_driver", "check_owned_pointer", "check_stream_context"]

# CUDA errors that mean "there is no usable driver or GPU" rather than a failed call.
_NO_DEVICE = {"cudaErrorNoDevice", "cudaErrorInsufficientDriver", "cudaErrorInitializationError"}


@dataclass(frozen=True)
class DeviceProperties:
    """What never changes for a device while the process runs (bytes for sizes)."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    multiprocessor_count: int
    l2_cache_size: int
    persisting_l2_cache_max_size: int
    access_policy_max_window_size: int
    total_memory: int
    pci_bus_id: str
    uuid: str
    supports_persistence: bool
    unsupported_reason: Optional[str]


# Per backend (the extension, or a simulator), per device. Weak keys: a simulator's cache goes with it.
_cache: "weakref.WeakKeyDictionary[Any, dict[int, DeviceProperties]]" = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # The child must not trust the parent's view of CUDA: every cache goes. A new lock, never the parent's:
    # another thread of the parent may have held it at the fork, and that thread does not exist in the child
    # (waiting for it would hang the child).
    global _cache_lock
    _cache_lock = threading.Lock()
    _cache.clear()
    _last[0], _last[1] = None, {}
    _checked.clear()
    _stream_contexts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


#: The oldest Linux driver for each CUDA major version (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit
#: and Minimum Required Driver Version for CUDA Minor Version Compatibility").
_MINIMUM_DRIVER = {12: "525.60.13", 13: "580.65.06"}


def minimum_driver(runtime_version: int) -> str:
    """The oldest NVIDIA driver (Linux) that runs code built with the CUDA runtime ``runtime_version``
    (e.g. 12090): l2ctl links its runtime statically, so the runtime it was built with (``versions()["runtime"]``)
    sets this, not the toolkit installed."""
    return _MINIMUM_DRIVER.get(runtime_version // 1000, f"one for CUDA {runtime_version // 1000}.{runtime_version % 1000 // 10}")


def no_device_error(backend: Backend) -> NoDeviceError:
    reason = backend.device_count_error() or "no CUDA device is visible"
    return NoDeviceError(f"no CUDA device available ({reason}); l2ctl's device functions need an NVIDIA GPU and "
                         f"driver {minimum_driver(int(backend.runtime_version()))} or newer (L2CTL_SIMULATE=h100 "
                         "runs on a simulated GPU)")


def device_count() -> int:
    """Number of visible CUDA devices; 0 without a GPU or a usable driver (never raises for that). Where
    L2CTL_SIMULATE names no simulated GPU (a setting to correct, not a machine without GPUs), NoDeviceError saying
    what is wrong and the values it takes, as every other device call."""
    backend = _backend.current()
    count = int(backend.device_count())
    if count == 0 and getattr(backend, "refuses_device_count", False):
        raise no_device_error(backend)
    return count


def _index_of(device: object) -> Optional[int]:
    """The index a device object names (None: the current device); TypeError for what names none.
    Accepts ints, torch.device (.index), CuPy devices (.id) and cuda.core devices (.device_id)."""
    if device is None:
        return None
    if isinstance(device, (bool, np.bool_)):
        raise TypeError("device must be an int index, a device object or None, not bool")
    if isinstance(device, numbers.Integral):
        return int(device)
    if getattr(device, "type", None) == "cuda" and getattr(device, "index", 0) is None:
        return None  # torch.device("cuda"): the current device
    for attribute in ("index", "id", "device_id"):
        value: object = getattr(device, attribute, None)
        if is_integer(value):
            return int(value)
    raise TypeError(f"device must be an int index (or None for the current device), not {type(device).__name__}")


def resolve_device(device: object = None) -> int:
    """A validated device index; None means the current device. The argument is checked first
    (TypeError), then that a device exists (NoDeviceError), then the index (ValueError)."""
    index = _index_of(device)
    if index is not None and index < 0:
        raise ValueError(f"device index must be >= 0, got {index}")
    backend = _backend.current()
    count = int(backend.device_count())
    if count == 0:
        raise no_device_error(backend)
    if index is None:
        return int(backend.current_device())
    if index >= count:
        raise ValueError(f"device {index} does not exist; {count} device(s) are visible (0 to {count - 1})")
    return index


def _support(major: int, minor: int, persisting_max: int) -> tuple[bool, Optional[str]]:
    if major < 8:
        return False, f"compute capability {major}.{minor} is below 8.0; L2 persistence needs Ampere (sm_80) or newer"
    if persisting_max == 0:
        return False, ("persistingL2CacheMaxSize is 0: the device offers no persisting L2 (as in a MIG instance, where "
                       "persistence is disabled); use the whole GPU without MIG")
    return True, None


_last: list[Any] = [None, {}]  # the last backend looked up and its cache: the common case, without a weak lookup


def properties(device: object = None) -> DeviceProperties:
    """The immutable properties of ``device``, queried once per backend and device."""
    backend = _backend._active  # current(), inline: every scope's path
    if type(device) is int and backend is _last[0]:
        known: Optional[DeviceProperties] = _last[1].get(device)
        if known is not None:
            return known
    index = resolve_device(device)
    with _cache_lock:
        per_backend = _cache.setdefault(backend, {})
        _last[0], _last[1] = backend, per_backend
        known = per_backend.get(index)
    if known is not None:
        return known
    try:
        raw = backend.device_properties(index)
    except CudaError as exc:
        if exc.name in _NO_DEVICE:
            raise no_device_error(backend) from exc
        raise
    supported, reason = _support(int(raw["major"]), int(raw["minor"]), int(raw["persisting_l2_cache_max_size"]))
    props = DeviceProperties(
        index=index,
        name=str(raw["name"]),
        compute_capability=(int(raw["major"]), int(raw["minor"])),
        multiprocessor_count=int(raw["multiprocessor_count"]),
        l2_cache_size=int(raw["l2_cache_size"]),
        persisting_l2_cache_max_size=int(raw["persisting_l2_cache_max_size"]),
        access_policy_max_window_size=int(raw["access_policy_max_window_size"]),
        total_memory=int(raw["total_global_memory"]),
        pci_bus_id=str(raw["pci_bus_id"]),
        uuid=str(raw["uuid"]),
        supports_persistence=supported,
        unsupported_reason=reason,
    )
    with _cache_lock:
        _cache.setdefault(backend, {})[index] = props
    return props


def require_persistence(device: object = None) -> DeviceProperties:
    """properties(), raising NotSupportedError (with what to do) where persistence is unavailable."""
    props = properties(device)
    if not props.supports_persistence:
        raise NotSupportedError(f"device {props.index} ({props.name}): {props.unsupported_reason}")
    return props


def stream_device(ref: StreamRef) -> int:
    """The device a resolved stream belongs to (the current device for the default streams)."""
    if ref.device is not None:
        return int(ref.device)
    backend = _backend.current()
    if int(backend.device_count()) == 0:
        raise no_device_error(backend)
    return int(backend.stream_device(ref.handle))


# cudaMemoryType values.
_HOST_UNREGISTERED, _HOST, _DEVICE, _MANAGED = 0, 1, 2, 3


def _context_error(what: str, context: int, primary: int, device: int) -> ValueError:
    return ValueError(
        f"{what} belongs to CUDA context 0x{context:x}, not to the primary context of device {device} "
        f"(0x{primary:x}), where l2ctl works (as the CUDA runtime, PyTorch and CuPy do): a window or a limit set "
        "from there would not reach it. Make it in the primary context (cuda.core: use the Device without "
        "creating a context of your own; the driver API: cuDevicePrimaryCtxRetain)")


# Streams of a foreign kind already checked, per backend and handle (an l2ctl Stream is never checked: it is
# made in the primary context). Bounded; cleared after fork.
_stream_contexts: dict[tuple[int, int], bool] = {}


def check_stream_context(ref: StreamRef, device: int) -> None:
    """Refuse a stream of another CUDA context than its device's primary one, once per handle."""
    backend = _backend._active
    key = (id(backend), ref.handle)
    if ref.owner is not None and type(ref.owner).__module__.startswith("l2ctl") or key in _stream_contexts:
        return
    context, primary = backend.stream_context(ref.handle)
    if context and primary and context != primary:
        raise _context_error(f"the stream 0x{ref.handle:x}", int(context), int(primary), device)
    if len(_stream_contexts) > 1024:
        _stream_contexts.clear()
    _stream_contexts[key] = True


def check_pointer(ptr: int, nbytes: int, device: int, what: str = "the buffer", *, align: int = 1) -> None:
    """Refuse host memory, memory of another device or of another CUDA context than the device's primary
    one, a range that runs past the allocation holding ``ptr`` (as the driver reports it), and a pointer not
    aligned to ``align`` bytes."""
    if align > 1 and ptr % align:
        raise ValueError(f"{what} at 0x{ptr:x} is not aligned to {align} bytes (its element size)")
    memory_type, owner, base, size = _backend.current().pointer_info(ptr)
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
    if size and not (base <= ptr and ptr + nbytes <= base + size):
        raise ValueError(
            f"{what} [0x{ptr:x}, 0x{ptr + nbytes:x}) runs past its allocation [0x{base:x}, 0x{base + size:x}) "
            f"({size} bytes); a window or kernel there would touch memory that is not yours"
        )
    context, primary = _backend.current().pointer_context(ptr)
    if context and primary and context != primary:
        raise _context_error(f"{what} at 0x{ptr:x}", int(context), int(primary), device)


# Ranges already checked, per (backend, device, pointer, bytes), each with a weak reference to the object
# that owns the memory (a tensor, an array): while that same object lives, its memory stays allocated, so
# the answer holds. Bounded; cleared after fork.
_checked: dict[tuple[int, int, int, int], tuple[Any, "weakref.ref[Any]"]] = {}


def check_owned_pointer(ptr: int, nbytes: int, device: int, owner: Any, what: str = "the buffer") -> None:
    """check_pointer, remembered while ``owner`` (the object the range came from) is alive."""
    key = (id(_backend.current()), device, ptr, nbytes)
    known = _checked.get(key)
    if known is not None and known[0] is _backend.current() and owner is not None and known[1]() is owner:
        return
    check_pointer(ptr, nbytes, device, what)
    if owner is not None:
        try:
            reference = weakref.ref(owner)
        except TypeError:
            return  # an owner without weak references is checked every time
        if len(_checked) > 1024:
            _checked.clear()
        _checked[key] = (_backend.current(), reference)


def versions() -> dict[str, int]:
    """Driver and runtime versions as ints (e.g. 13000 for 13.0); driver 0 when no driver is loaded."""
    backend = _backend.current()
    return {"driver": int(backend.driver_version()), "runtime": int(backend.runtime_version())}
