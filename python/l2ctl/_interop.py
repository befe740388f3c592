"""Turning the streams and buffers of other libraries into (handle, device) and (ptr, nbytes, device).

Nothing here imports torch or cupy: objects are recognised by the protocols they implement
(``__cuda_stream__``, ``__cuda_array_interface__``, ``__dlpack__``) or by duck-typed attributes.
No CUDA call is made here either; the device of a raw pointer is looked up later, by the caller.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, NamedTuple, Optional, Protocol

import numpy as np

from ._dlpack import HOST_HINT, check_dlpack_device, read_capsule, request_capsule
from ._plan import MAX_BYTES, check_nbytes, is_integer

__all__ = ["StreamRef", "BufferRef", "resolve_stream", "resolve_buffer", "parse_cuda_array_interface",
           "current_streams", "remembered", "stream_remembered", "SupportsCudaStream", "SupportsCudaArrayInterface", "SupportsDLPack", "SupportsReplay",
           "SupportsL2ctlTarget"]

#: Special stream handles CUDA understands.
LEGACY_DEFAULT_STREAM = 0


# What other libraries' objects offer, as type checkers see it: the parameters of l2ctl's calls are typed with
# these, so a checker accepts a torch or CuPy stream or tensor and refuses arguments given in the wrong order.
class SupportsCudaStream(Protocol):
    """The CUDA stream protocol (torch and CuPy streams, cuda.core)."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class SupportsCudaArrayInterface(Protocol):
    """``__cuda_array_interface__`` (torch tensors, CuPy arrays, Numba device arrays)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


class SupportsDLPack(Protocol):
    """A DLPack producer (JAX arrays, cuda.core buffers, torch, CuPy)."""

    def __dlpack_device__(self) -> tuple[int, int]: ...


class SupportsReplay(Protocol):
    """A graph that replays: torch.cuda.CUDAGraph."""

    def replay(self) -> None: ...


class SupportsL2ctlTarget(Protocol):
    """l2ctl's own graph targets: Graph, graph.select(...), graph.torch_captures()."""

    def _l2ctl_target(self) -> Any: ...
CUDA_STREAM_LEGACY = 1
CUDA_STREAM_PER_THREAD = 2


class StreamRef(NamedTuple):
    """A resolved stream: the raw ``cudaStream_t`` as an int, and its device when the object said so."""

    handle: int
    device: Optional[int] = None
    source: str = "int"
    owner: Any = None

    @property
    def is_default(self) -> bool:
        """True for the legacy default stream (0 or cudaStreamLegacy) and cudaStreamPerThread."""
        return self.handle in (LEGACY_DEFAULT_STREAM, CUDA_STREAM_LEGACY, CUDA_STREAM_PER_THREAD)


class BufferRef(NamedTuple):
    """A resolved buffer: device address, size in bytes, device when known, and the object kept alive.
    ``allocation``: the range is exactly one allocation l2ctl made (an l2ctl.DeviceBuffer), so its device
    and extent need no query."""

    ptr: int
    nbytes: int
    device: Optional[int] = None
    source: str = "pointer"
    owner: Any = None
    allocation: bool = False



def _module_of(obj: object) -> str:
    return type(obj).__module__ or ""


# ---- streams -------------------------------------------------------------------------------------


class _Current(threading.local):
    def __init__(self) -> None:
        self.streams: list[Any] = []  # the l2ctl.Streams entered with `with`, innermost last


_current = _Current()


#: ``current_streams()``: this thread's stack of l2ctl streams made current by ``with stream:`` (innermost last). C
#: calls only, as the compiled ``with stream:`` calls it (l2ctl._host), so no bytecode runs and an interrupt cannot land
#: between the block's end and the stream leaving the stack.
current_streams: Callable[[], list[Any]] = functools.partial(getattr, _current, "streams")


def resolve_stream(stream: object) -> StreamRef:
    """Accepts l2ctl.Stream, an int handle, None (l2ctl's current stream: the innermost ``with stream:`` of
    this thread, else the legacy default stream), torch.cuda.Stream, cupy.cuda.Stream and anything
    implementing ``__cuda_stream__``."""
    own = getattr(type(stream), "_l2ctl_stream_ref", None)  # l2ctl's own streams know their device
    if own is not None:
        return own(stream)  # type: ignore[no-any-return]
    if stream is None:
        if _current.streams:
            return resolve_stream(_current.streams[-1])
        return StreamRef(LEGACY_DEFAULT_STREAM, None, "None (legacy default stream)")
    if isinstance(stream, (bool, np.bool_)):
        raise TypeError("a stream cannot be a bool; pass an l2ctl.Stream, a torch/CuPy stream or a cudaStream_t int")
    if is_integer(stream):
        handle = int(stream)
        if handle < 0 or handle >= 1 << 64:
            raise ValueError(f"a cudaStream_t handle must be a non-negative 64-bit integer, got {handle}")
        return StreamRef(handle, None, "int")
    protocol = getattr(type(stream), "__cuda_stream__", None)
    if protocol is not None:
        value = protocol(stream)
        if not (isinstance(value, tuple) and len(value) == 2 and all(is_integer(v) for v in value)):
            raise TypeError(f"__cuda_stream__ must return (version, handle) integers, got {value!r}")
        version, handle = (int(v) for v in value)
        if version != 0:
            raise TypeError(f"__cuda_stream__ version {version} is not supported (l2ctl reads version 0)")
        if handle < 0:
            raise ValueError(f"__cuda_stream__ returned a negative handle {handle}")
        if handle >= 1 << 64:
            raise ValueError(f"__cuda_stream__ returned {handle}, not a cudaStream_t handle (a 64-bit integer)")
        return StreamRef(handle, _stream_device_attr(stream), f"{_module_of(stream)}.__cuda_stream__", stream)
    module = _module_of(stream)
    handle_attr = getattr(stream, "cuda_stream", None)
    if module.startswith("torch") and is_integer(handle_attr):
        index = getattr(getattr(stream, "device", None), "index", None)
        return StreamRef(int(handle_attr), int(index) if is_integer(index) else None, "torch.cuda.Stream", stream)
    ptr_attr = getattr(stream, "ptr", None)
    if module.startswith("cupy") and is_integer(ptr_attr):
        device = getattr(stream, "device_id", None)
        return StreamRef(int(ptr_attr), int(device) if is_integer(device) else None, "cupy.cuda.Stream", stream)
    raise TypeError(
        f"cannot use a {type(stream).__name__} as a stream; pass an l2ctl.Stream, torch.cuda.Stream, "
        "cupy.cuda.Stream, an object with __cuda_stream__, an int cudaStream_t, or None for the default stream"
    )


def _stream_device_attr(stream: object) -> Optional[int]:
    for name in ("device_index", "device_id", "device"):  # torch, CuPy/cuda.core, others
        value = getattr(stream, name, None)
        for found in (value, getattr(value, "index", None), getattr(value, "device_id", None)):  # an int, a device
            if is_integer(found):
                return int(found)
    return None


# ---- buffers -------------------------------------------------------------------------------------


def _dense_extent(shape: tuple[int, ...], strides: Optional[tuple[int, ...]], itemsize: int) -> bool:
    """True when the elements fill exactly prod(shape) * itemsize bytes (C, Fortran or any dense order)."""
    if strides is None:
        return True
    if len(strides) != len(shape):
        raise ValueError(f"strides {strides} do not match shape {shape}")
    if any(s < 0 for s in strides):
        return False
    dims = sorted((s, n) for s, n in zip(strides, shape) if n != 1)
    expected = itemsize
    for stride, n in dims:
        if stride != expected:
            return False
        expected *= n
    return True


def _int_tuple(values: object, name: str) -> tuple[int, ...]:
    """A shape or strides: a tuple (or list) of integers; floats and strings are refused, not coerced."""
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of integers, got {values!r}")
    if not all(is_integer(v) for v in values):
        raise TypeError(f"{name} must hold integers only, got {values!r}")
    return tuple(int(v) for v in values)


def _extent_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes the elements span, in exact integer arithmetic; refused when none, or beyond what a 64-bit size
    holds."""
    nbytes = math.prod(shape) * itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"shape {shape} of {itemsize}-byte elements spans {nbytes} bytes, beyond any device")
    if nbytes == 0:
        raise ValueError("the buffer is empty (0 bytes); a window must cover at least one byte")
    return nbytes


def parse_cuda_array_interface(cai: object, source: str = "__cuda_array_interface__", owner: Any = None) -> BufferRef:
    """Parse a ``__cuda_array_interface__`` dict (versions 0 to 3) into a BufferRef.

    Refuses masked arrays, empty arrays and non-contiguous layouts (a window covers one byte range).
    """
    if not isinstance(cai, dict):
        raise TypeError(f"__cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    version = cai.get("version", 0)
    if not is_integer(version) or not 0 <= int(version) <= 3:
        raise ValueError(f"__cuda_array_interface__ version {version!r} is not supported (0 to 3)")
    try:
        shape = _int_tuple(cai["shape"], "shape")
        typestr = cai["typestr"]
        data = cai["data"]
    except KeyError as missing:
        raise ValueError(f"__cuda_array_interface__ lacks the required key {missing}") from None
    if any(n < 0 for n in shape):
        raise ValueError(f"negative extent in shape {shape}")
    if not isinstance(typestr, str):
        raise TypeError(f"typestr must be a str, got {typestr!r}")
    try:
        itemsize = np.dtype(typestr).itemsize
    except TypeError as exc:
        raise ValueError(f"unknown typestr {typestr!r}") from exc
    if itemsize <= 0:
        raise ValueError(f"typestr {typestr!r} has no fixed size")
    if not (isinstance(data, tuple) and len(data) == 2 and is_integer(data[0])):
        raise ValueError(f"data must be (pointer, read_only), got {data!r}")
    if cai.get("mask") is not None:
        raise ValueError("masked arrays are not supported; pass the data array itself")
    raw_strides = cai.get("strides")
    strides = None if raw_strides is None else _int_tuple(raw_strides, "strides")
    nbytes = _extent_bytes(shape, itemsize)
    if not _dense_extent(shape, strides, itemsize):
        raise ValueError(
            f"the array is not contiguous (shape {shape}, strides {strides}); a window covers one byte range, "
            "so pass a contiguous array (e.g. .copy() or ascontiguousarray)"
        )
    ptr = int(data[0])
    if ptr == 0:
        raise ValueError("the array's data pointer is NULL")
    if not 0 < ptr < 1 << 64:  # else it reads as "0x-10 is host memory" further on
        raise ValueError(f"the array's data pointer {ptr} is not an address: a pointer is an unsigned 64-bit integer")
    return BufferRef(ptr, nbytes, None, source, owner)


def parse_dlpack_capsule(capsule: object, source: str = "__dlpack__", owner: Any = None) -> BufferRef:
    """The buffer an unconsumed DLPack capsule (legacy or versioned) describes. Not consumed."""
    t = read_capsule(capsule)
    if any(n < 0 for n in t.shape):
        raise ValueError(f"DLPack tensor has a negative extent: shape {t.shape}")
    nbytes = _extent_bytes(t.shape, t.itemsize)
    if not _dense_extent(t.shape, t.strides, t.itemsize):
        raise ValueError(f"the DLPack tensor is not contiguous (shape {t.shape}, strides {t.strides})")
    if not t.ptr:
        raise ValueError("the DLPack tensor's data pointer is NULL")
    return BufferRef(t.ptr, nbytes, t.device_id, source, owner)


def resolve_buffer(buf: object) -> BufferRef:
    """Accepts l2ctl.DeviceBuffer, torch tensors, ``__cuda_array_interface__`` (CuPy, Numba, ...),
    ``__dlpack__`` producers, and ``(ptr, nbytes)`` tuples. Host memory is refused."""
    own = getattr(type(buf), "_l2ctl_buffer_ref", None)  # l2ctl's own buffers know their size and device
    if own is not None:
        return own(buf)  # type: ignore[no-any-return]
    if buf is None:
        raise TypeError("a buffer is required: pass a device array, tensor, l2ctl.DeviceBuffer or (ptr, nbytes)")
    if isinstance(buf, np.ndarray):
        raise ValueError(f"got a NumPy array, which is host memory; {HOST_HINT}")
    if isinstance(buf, (bytes, bytearray, memoryview)):
        raise ValueError(f"got a {type(buf).__name__}, which is host memory; {HOST_HINT}")
    if isinstance(buf, tuple):
        if len(buf) != 2 or not all(is_integer(v) for v in buf):
            raise TypeError(f"a raw buffer is a (ptr, nbytes) pair of integers, got {buf!r}")
        ptr = int(buf[0])
        if ptr <= 0:
            raise ValueError(f"pointer must be a positive device address, got {ptr}")
        if ptr >= 1 << 64:
            raise ValueError(f"pointer {ptr} is not an address: a pointer is an unsigned 64-bit integer")
        return BufferRef(ptr, check_nbytes(buf[1], "nbytes"), None, "(ptr, nbytes)")
    if is_integer(buf):
        raise TypeError("a bare integer is ambiguous; pass (ptr, nbytes) so l2ctl knows the size")
    if _module_of(buf).startswith("torch") and hasattr(buf, "data_ptr") and hasattr(buf, "is_cuda"):
        return _torch_buffer(buf)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        return parse_cuda_array_interface(cai, f"{_module_of(buf)}.__cuda_array_interface__", buf)
    if hasattr(buf, "__dlpack__") and hasattr(buf, "__dlpack_device__"):
        device_type, _ = buf.__dlpack_device__()
        check_dlpack_device(int(device_type), f"the {type(buf).__name__}")
        return parse_dlpack_capsule(request_capsule(buf), f"{_module_of(buf)}.__dlpack__", buf)
    if hasattr(buf, "__array_interface__") or hasattr(buf, "__array__"):
        raise ValueError(f"got a {type(buf).__name__}, which is host memory; {HOST_HINT}")
    raise TypeError(
        f"cannot use a {type(buf).__name__} as a device buffer; pass an l2ctl.DeviceBuffer, a torch tensor, an "
        "object with __cuda_array_interface__ or __dlpack__, or a (ptr, nbytes) tuple"
    )


def _torch_buffer(tensor: Any) -> BufferRef:
    if not tensor.is_cuda:
        raise ValueError(f"the torch tensor is on {tensor.device}, which is host memory; {HOST_HINT}")
    if not tensor.is_contiguous():
        raise ValueError("the torch tensor is not contiguous; a window covers one byte range, pass tensor.contiguous()")
    nbytes = int(tensor.numel()) * int(tensor.element_size())
    if nbytes == 0:
        raise ValueError("the tensor is empty (0 bytes); a window must cover at least one byte")
    # get_device() is an int; tensor.device builds a torch.device object (a microsecond, on every scope).
    return BufferRef(int(tensor.data_ptr()), nbytes, int(tensor.get_device()), "torch.Tensor", tensor)


def _torch_stamp(tensor: Any) -> tuple[int, int]:
    return int(tensor.data_ptr()), int(tensor.nbytes)


def remembered(buf: object, ref: BufferRef) -> Optional[tuple[Optional[Callable[[Any], Any]], Any]]:
    """Whether ``ref`` (``buf`` resolved) may be remembered for as long as ``buf`` lives, so that later scopes on
    it skip the resolution and the pointer checks: ``(stamp_of, stamp)``, where ``stamp_of(buf)`` must still equal
    ``stamp`` at each use (None: nothing to compare), or None to resolve it every time. A torch tensor's memory can
    move under the same object (``set_``, ``resize_``, ``.data =``), so its pointer and size are compared; a CuPy
    array's cannot. Other objects are resolved every time (their protocol may answer differently)."""
    if ref.owner is not buf:
        return None
    if ref.source == "torch.Tensor":
        return _torch_stamp, _torch_stamp(buf)
    if _module_of(buf).startswith("cupy"):
        return None, None
    return None


def stream_remembered(stream: object, ref: StreamRef) -> bool:
    """Whether ``ref`` (``stream`` resolved) may be remembered for as long as ``stream`` lives: a torch or CuPy
    stream object names one stream for life, whichever way it was read (torch's streams implement
    ``__cuda_stream__`` too); another object's ``__cuda_stream__`` may answer differently (a proxy of the
    current stream, a cuda.core stream closed since), so it is read at every scope."""
    return ref.owner is stream and _module_of(stream).partition(".")[0] in ("torch", "cupy")
