"""Streams, events and device buffers that l2ctl owns, so NumPy alone is enough."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np

from . import _backend, _registry
from ._device import properties, resolve_device, stream_device
from ._dlpack import DL_CUDA, DLPACK_VERSION, export_capsule
from ._interop import (BufferRef, StreamRef, SupportsCudaArrayInterface, SupportsCudaStream, SupportsDLPack,
                       resolve_stream)
from ._plan import check_count, check_nbytes

__all__ = ["Stream", "Event", "DeviceBuffer", "synchronize_stream", "StreamLike", "BufferLike"]

_exports_lock = threading.Lock()


class Stream:
    """A CUDA stream owned by l2ctl (non-blocking by default), destroyed by close() or garbage collection.

    ``with s:`` makes ``s`` l2ctl's current stream on this thread for the block: every l2ctl ``stream=``
    argument left out (or None) means it, as ``with torch.cuda.stream(s):`` and CuPy's ``with s:`` do for
    their own calls. It does not change torch's or CuPy's current stream, and it does not close ``s``.

    Implements ``__cuda_stream__`` so torch (``torch.cuda.ExternalStream(s.handle)``), CuPy
    (``cupy.cuda.ExternalStream(s.handle)``) and cuda.core can use it.
    """

    _ref: Optional[StreamRef]  # what l2ctl's own calls need of it; None once closed (read by the compiled layer)

    def __init__(self, device: object = None, *, non_blocking: bool = True, priority: int = 0) -> None:
        index = resolve_device(device)
        self._impl = _backend.current().Stream(index, bool(non_blocking), int(priority))
        # What l2ctl's own calls need, made once: a stream's handle and device never change while it is open.
        self._ref = StreamRef(self._impl.handle, index, "l2ctl.Stream", self)

    @property
    def handle(self) -> int:
        """The ``cudaStream_t`` as an int. Raises ValueError once the stream is closed."""
        return int(self._impl.handle)

    @property
    def device(self) -> int:
        return int(self._impl.device)

    @property
    def closed(self) -> bool:
        return bool(self._impl.closed)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def _l2ctl_stream_ref(self) -> StreamRef:
        if self._ref is None:
            raise ValueError("the stream is closed")
        return self._ref

    def synchronize(self) -> None:
        """Wait until all work queued on the stream is done."""
        self._impl.synchronize()

    def query(self) -> bool:
        """True when all queued work is done (does not wait)."""
        return bool(self._impl.query())

    def record(self, event: Optional["Event"] = None) -> "Event":
        """Record ``event`` (a new one when None) at this point of the stream, and return it."""
        event = Event(self.device) if event is None else event
        event.record(self)
        return event

    def wait(self, other: Union["Event", StreamLike]) -> None:
        """Make work queued on this stream from now on wait for ``other``: an Event (as recorded), or any
        stream l2ctl accepts (all that is queued on it now), as torch's wait_event/wait_stream do. A stream of
        another device is waited for through an event of its own device (CUDA records an event only on a
        stream of the event's device)."""
        if isinstance(other, Event):
            other.wait(self)
            return
        ref = resolve_stream(other)
        device = ref.device if ref.device is not None else stream_device(ref)
        Event(device).recording(other).wait(self)

    def close(self) -> None:
        """Destroy the stream (idempotent). Work already queued still completes. Live l2ctl scopes on it
        stop writing to it (its handle may be reused by the next stream CUDA creates)."""
        if not self._impl.closed:
            _registry.forget_slots(_registry.STREAM, [self._impl.handle])
        self._ref = None
        _registry.own_released()  # after _ref: a scope made before this looks again at entry
        self._impl.close()

    #: ``__enter__``, compiled: a closed stream is refused, an open one joins this thread's current streams.
    if TYPE_CHECKING:
        def __enter__(self) -> "Stream": ...
    else:
        __enter__ = _registry.stream_enter

    #: ``__exit__``, compiled: the innermost entry of this stream leaves this thread's stack of current streams
    #: (blocks nest) by list operations alone, so no interrupt can leave it current.
    __exit__ = _registry.stream_exit

    def __repr__(self) -> str:
        if self.closed:
            return "<l2ctl.Stream closed>"
        return f"<l2ctl.Stream handle=0x{self.handle:x} device={self.device}>"


class Event:
    """A CUDA event on ``device`` (None: the current device): a point in a stream's work that other streams
    can wait for and the host can time, as torch.cuda.Event and cupy.cuda.Event are."""

    def __init__(self, device: object = None) -> None:
        self.device = resolve_device(device)
        self._impl = _backend.current().Event(self.device)
        self._recorded = False

    def record(self, stream: StreamLike = None) -> None:
        """Record the event on ``stream`` (any stream l2ctl accepts; None: l2ctl's current stream)."""
        self._impl.record(resolve_stream(stream).handle)
        self._recorded = True

    def recording(self, stream: StreamLike = None) -> "Event":
        """``record(stream)``, returning the event."""
        self.record(stream)
        return self

    def wait(self, stream: StreamLike = None) -> None:
        """Make work queued on ``stream`` from now on wait until the event has completed."""
        self._impl.wait_on(resolve_stream(stream).handle)

    def synchronize(self) -> None:
        """Wait on the host until the event has completed."""
        self._impl.synchronize()

    def query(self) -> bool:
        """True when the event has completed (or was never recorded); does not wait, as torch's."""
        return bool(self._impl.query())

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded; waits for ``end``), as torch's is."""
        if not (self._recorded and end._recorded):
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return float(end._impl.elapsed_since(self._impl))

    def __repr__(self) -> str:
        return f"<l2ctl.Event device={self.device}{' recorded' if self._recorded else ''}>"


def synchronize_stream(stream: StreamLike = None) -> None:
    """Wait until the work queued on ``stream`` (any accepted stream; None: the legacy default) is done."""
    _backend.current().stream_synchronize(resolve_stream(stream).handle)


class DeviceBuffer:
    """Device memory from cudaMalloc, with a dtype and shape for NumPy round trips.

    ``nbytes`` is the allocation size in bytes; ``ptr`` the device address. Freed by free(), the
    ``with`` exit, or garbage collection. Exposes ``__cuda_array_interface__`` (version 3).
    """

    _ref: Optional[BufferRef]  # what l2ctl's own calls need of it; None once freed (read by the compiled layer)

    def __init__(
        self,
        nbytes: int,
        device: object = None,
        *,
        dtype: Any = np.uint8,
        shape: Optional[Sequence[int]] = None,
    ) -> None:
        nbytes = check_nbytes(nbytes, "nbytes")
        dt = np.dtype(dtype)
        if shape is None:
            if nbytes % dt.itemsize:
                raise ValueError(f"nbytes {nbytes} is not a multiple of the {dt} item size {dt.itemsize}")
            shape = (nbytes // dt.itemsize,)
        shape = tuple(check_count(n, "shape entry") for n in shape)
        if math.prod(shape) * dt.itemsize != nbytes:
            raise ValueError(f"shape {shape} of {dt} does not hold exactly {nbytes} bytes")
        index = resolve_device(device)
        total = properties(index).total_memory
        if nbytes > total:
            raise ValueError(f"{nbytes} bytes exceed the {total} bytes of device {index}'s memory")
        self.dtype = dt
        self.shape = shape
        self._exports = 0  # DLPack views still held by a consumer: the memory outlives free() until they go
        self._free_pending = False
        self._impl = _backend.current().DeviceMemory(index, nbytes)
        self._ref = BufferRef(self._impl.ptr, nbytes, index, "l2ctl.DeviceBuffer", self, True)

    @classmethod
    def from_numpy(cls, array: np.ndarray, device: object = None, stream: StreamLike = None) -> "DeviceBuffer":
        """A new device buffer holding a copy of ``array`` (made contiguous first)."""
        host = np.ascontiguousarray(array)
        if host.nbytes == 0:
            raise ValueError("cannot copy an empty array to the device")
        buffer = cls(host.nbytes, device, dtype=host.dtype, shape=host.shape)
        buffer.copy_from(host, stream)
        return buffer

    @classmethod
    def empty_like(cls, array: np.ndarray, device: object = None) -> "DeviceBuffer":
        return cls(array.nbytes, device, dtype=array.dtype, shape=array.shape)

    @property
    def ptr(self) -> int:
        """Device address. Raises ValueError once freed."""
        return int(self._impl.ptr)

    @property
    def nbytes(self) -> int:
        return int(self._impl.nbytes)

    @property
    def device(self) -> int:
        return int(self._impl.device)

    @property
    def freed(self) -> bool:
        return bool(self._impl.freed)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def _l2ctl_buffer_ref(self) -> BufferRef:
        if self._ref is None:
            raise ValueError("the device buffer has been freed")
        return self._ref

    def copy_from(self, array: np.ndarray, stream: StreamLike = None) -> None:
        """Copy host data in (same byte size); waits until the copy is done."""
        host = np.ascontiguousarray(array)
        if host.nbytes != self.nbytes:
            raise ValueError(f"array has {host.nbytes} bytes, the buffer {self.nbytes}")
        _backend.current().copy_host_to_device(self.ptr, host.reshape(-1).view(np.uint8), resolve_stream(stream).handle)

    def to_numpy(self, stream: StreamLike = None) -> np.ndarray:
        """A host copy with the buffer's dtype and shape; waits until the copy is done."""
        out = np.empty(self.shape, dtype=self.dtype)
        _backend.current().copy_device_to_host(out.reshape(-1).view(np.uint8), self.ptr, resolve_stream(stream).handle)
        return out

    def fill_bytes(self, value: int, stream: StreamLike = None) -> None:
        """cudaMemsetAsync of every byte (asynchronous on ``stream``)."""
        _backend.current().memset_device(self.ptr, int(value) & 0xFF, self.nbytes, resolve_stream(stream).handle)

    def free(self) -> None:
        """Release the memory now (idempotent); l2ctl refuses the buffer from then on. The caller must make
        sure no queued work still uses it. While DLPack views of it are alive (``torch.from_dlpack(buf)``)
        the memory itself is released when the last of them goes."""
        self._ref = None
        _registry.own_released()  # after _ref: a scope made before this looks again at entry
        with _exports_lock:
            if self._exports:
                self._free_pending = True
                return
        self._impl.free()

    def __dlpack__(self, *, stream: object = None, max_version: Optional[tuple[int, int]] = None,
                   dl_device: Optional[tuple[int, int]] = None, copy: Optional[bool] = None) -> object:
        """DLPack export (the array API's signature): a view of this memory with the buffer's dtype and
        shape, a versioned capsule when ``max_version`` allows. l2ctl tracks no pending work on its
        buffers, so ``stream`` is accepted and ignored: order your writes before the consumer's reads."""
        if self._ref is None:
            raise BufferError("the device buffer has been freed")
        if copy:
            raise BufferError("l2ctl.DeviceBuffer exports its memory, never a copy")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the buffer is on {self.__dlpack_device__()}, not {tuple(dl_device)}")
        if stream is not None and not isinstance(stream, int):
            raise TypeError(f"stream must be an int or None, not {type(stream).__name__}")
        versioned = max_version is not None and int(max_version[0]) >= DLPACK_VERSION[0]
        with _exports_lock:
            self._exports += 1
        try:
            return export_capsule(self.ptr, self.nbytes, self.device, self.dtype, tuple(self.shape), self,
                                  self._release_export, versioned=versioned)
        except BaseException:  # refused (a dtype DLPack cannot describe): no view was handed out
            self._release_export()
            raise

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, self.device)

    def _release_export(self) -> None:
        with _exports_lock:
            self._exports -= 1
            last = self._exports == 0 and self._free_pending
        if last:
            self._impl.free()

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "stream": None,
        }

    def __repr__(self) -> str:
        if self.freed:
            return f"<l2ctl.DeviceBuffer freed, {self.nbytes} bytes>"
        return f"<l2ctl.DeviceBuffer 0x{self.ptr:x} {self.nbytes} bytes {self.dtype}{list(self.shape)} device={self.device}>"


#: A stream l2ctl takes: its own, torch's, CuPy's, anything with ``__cuda_stream__``, a ``cudaStream_t`` int,
#: or None (l2ctl's current stream, else the legacy default stream).
StreamLike = Union[Stream, SupportsCudaStream, int, None]
#: Device memory l2ctl takes: its own buffers, torch tensors, CuPy arrays, anything with
#: ``__cuda_array_interface__`` or DLPack, or a (pointer, bytes) pair.
BufferLike = Union[DeviceBuffer, SupportsCudaArrayInterface, SupportsDLPack, tuple[int, int]]
