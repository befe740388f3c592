"""FakeBackend: the whole ``l2ctl._backend.Backend`` contract on simulated devices.

State CUDA keeps is kept here: the set-aside limit per device (rounded up to multiples of max / 10,
as measured), persisting-line resets, streams and their access-policy windows, events on simulated
per-stream clocks, lazy device memory (memory.py), captured graphs with their kernel nodes' windows,
graph executables with the node windows they were instantiated (or updated) with, and a CUPTI range
profiler (profiler.py). Every kernel of the contract runs functionally (kernels.py) and advances its
stream's clock by the timing model's duration (model.py).

Errors are CUDA's (``l2ctl.CudaError`` with the CUDA error name and code), or ``ValueError`` where
the C++ core throws ``std::invalid_argument``. Every call that changes state records the CUDA call it
stands for in ``calls`` (also inside ``apply_state``), so tests can assert that none was made.

Clocks: each stream has its own clock (ms). A launch starts when the stream's previous work ends, or
when the host last waited for the device (synchronizations, copies to or from the host, counting
kernels), whichever is later, and ends after the model's duration; events read the clock.
``Event.wait_on`` makes a stream wait for an event. Kernels of different streams that overlap in time
share the memory bandwidth (processor sharing, weighted by how memory-bound each is: two streaming
kernels started together both take about twice as long); an earlier kernel is stretched too unless an
event or the host has already seen it end.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from .. import _backend, _core
from .._errors import CudaError
from .devices import FakeDevice
from .errors import cuda_error, cupti_error
from .kernels import KernelLaunch, Kernels
from .memory import Allocation, Memory, MemoryFault, Misaligned, OutOfMemory
from .model import DeviceModel, Estimate, Traffic
from .profiler import REPLAY_DIRTY_BYTES, FakeRangeProfiler, library_loads

__all__ = ["FakeBackend", "FakeStream", "FakeEvent", "FakeDeviceMemory", "FakeGraph", "FakeGraphExec",
           "LaunchRecord", "WindowTuple"]

WindowTuple = tuple[int, int, float, int, int]
EMPTY_WINDOW: WindowTuple = (0, 0, 0.0, 0, 0)
_SET_STREAM_WINDOW = "cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)"
SPECIAL_STREAMS = (0, 1, 2)  # legacy default stream, cudaStreamLegacy, cudaStreamPerThread

# Handles and address spaces unique in the process, so a stream, buffer or graph of one simulated
# machine is never mistaken for one of another (it fails as an unknown handle instead).
_handles = itertools.count(0x5F00_0000_1000, 0x100)
_spaces = itertools.count(0)


def _handle() -> int:
    return next(_handles)


@dataclass
class LaunchRecord:
    """One executed kernel (``FakeBackend.kernel_log``)."""

    name: str
    device: int
    stream: int
    start_ms: float
    duration_ms: float
    window: Optional[WindowTuple]
    estimate: Estimate


@dataclass
class _Stream:
    handle: int
    device: int
    clock: float = 0.0
    last: Optional[LaunchRecord] = None  # its last kernel, while it may still be stretched
    context: int = 0  # its CUDA context (0: the device's primary one)


@dataclass
class _Node:
    handle: int
    kind: str  # "kernel", or another node kind ("memset", "memcpy", "event", "graph")
    launch: Optional[KernelLaunch] = None
    action: Optional[Callable[[_Stream], None]] = None


@dataclass
class _Capture:
    stream: int
    mode: int  # cudaStreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
    nodes: list[_Node] = field(default_factory=list)
    invalidated: str = ""
    thread: int = field(default_factory=threading.get_ident)

    def forbids_unsafe_calls(self) -> bool:
        """Whether a potentially unsafe call (cudaDeviceSynchronize, ...) from this thread breaks it."""
        return self.mode == 0 or (self.mode == 1 and self.thread == threading.get_ident())


@dataclass
class _Graph:
    handle: int
    device: int
    nodes: list[_Node]


_float32_cache: dict[float, float] = {}


def _float32(x: float) -> float:
    """x rounded to float32, as CUDA stores a hit ratio; a scope's few ratios recur, so they are remembered."""
    known = _float32_cache.get(x)
    if known is None:
        if len(_float32_cache) > 4096:
            _float32_cache.clear()
        known = _float32_cache[x] = float(np.float32(x))
    return known


def _window(base: int, num_bytes: int, hit_ratio: float, hit_prop: int, miss_prop: int) -> WindowTuple:
    return (int(base), int(num_bytes), _float32(hit_ratio), int(hit_prop), int(miss_prop))


# ---- the objects the factories return --------------------------------------------------------------


class FakeStream:
    """``l2ctl._core.Stream`` on the simulator."""

    def __init__(self, backend: "FakeBackend", device: int, non_blocking: bool = True, priority: int = 0) -> None:
        with backend._locked():
            backend._device(device, "cudaSetDevice(device)")
            backend._record("cudaStreamCreateWithPriority")
            self._backend = backend
            self._handle = _handle()
            self._device = device
            self.non_blocking = bool(non_blocking)
            self.priority = int(priority)
            backend._streams[self._handle] = _Stream(self._handle, device, backend._host_now[device])

    @property
    def handle(self) -> int:
        if self._handle == 0:
            raise ValueError("the stream is closed")
        return self._handle

    @property
    def device(self) -> int:
        return self._device

    @property
    def closed(self) -> bool:
        return self._handle == 0

    def synchronize(self) -> None:
        self._backend.stream_synchronize(self.handle)

    def query(self) -> bool:
        with self._backend._locked():
            handle = self.handle
            if handle in self._backend._captures:
                raise self._backend._capture_violation(handle, "cudaStreamQuery(stream)")
            return True

    def close(self) -> None:
        if self._handle != 0:
            handle, self._handle = self._handle, 0
            with self._backend._locked():
                self._backend._record("cudaStreamDestroy")
                self._backend._destroy_stream(handle)

    def __del__(self) -> None:
        if getattr(self, "_handle", 0):
            handle, backend = self._handle, self._backend
            backend._defer(lambda: backend._destroy_stream(handle))

    def __repr__(self) -> str:
        return f"<FakeStream 0x{self._handle:x} device {self._device}>" if self._handle else "<FakeStream closed>"


class _Locked:
    """The backend's lock as a context manager that also runs work deferred by destructors (a plain class:
    every simulated call takes it, and a generator-based context manager costs several times more)."""

    __slots__ = ("_backend",)

    def __init__(self, backend: "FakeBackend") -> None:
        self._backend = backend

    def __enter__(self) -> None:
        backend = self._backend
        backend._lock.acquire()
        while backend._pending:
            action = backend._pending.pop()
            try:
                action()
            except Exception:  # pragma: no cover - a destructor's cleanup of something already gone
                pass

    def __exit__(self, *exc: object) -> None:
        self._backend._lock.release()


class FakeEvent:
    """``l2ctl._core.Event`` on the simulator: a point on a stream's clock."""

    def __init__(self, backend: "FakeBackend", device: int = -1) -> None:
        with backend._locked():
            backend._require_devices("cudaEventCreate(&event_)")
            self._backend = backend
            self.time: Optional[float] = None
            # the device it was made on: CUDA refuses to record it on another device's stream
            if device >= 0:
                backend._device(device, "cudaEventCreate(&event_)")
            self.owner = device if device >= 0 else backend.current
            self.device: Optional[int] = None

    def _set(self, st: _Stream) -> None:
        self.time = max(st.clock, self._backend._host_now[st.device])
        self.device = st.device
        st.last = None  # the event has seen the stream's time: its kernels are final

    def record(self, stream: int) -> None:
        b = self._backend
        with b._locked():
            st = b._stream(stream, "cudaEventRecord(event_, stream)")
            if st.device != self.owner:
                raise cuda_error("cudaEventRecord(event_, reinterpret_cast<cudaStream_t>(stream))",
                                 "cudaErrorInvalidResourceHandle", f"stream 0x{stream:x}")
            b._record("cudaEventRecord")
            if stream in b._captures:
                b._captures[stream].nodes.append(_Node(_handle(), "event", action=self._set))
                return
            self._set(st)

    def wait_on(self, stream: int) -> None:
        b = self._backend
        with b._locked():
            st = b._stream(stream, "cudaStreamWaitEvent(stream, event_, 0)")
            b._record("cudaStreamWaitEvent")
            if self.time is not None:
                st.clock = max(st.clock, self.time)

    def synchronize(self) -> None:
        with self._backend._locked():
            if self.time is not None and self.device is not None:
                self._backend._host_waits(self.device, self.time)

    def elapsed_since(self, start: Any) -> float:
        if not isinstance(start, FakeEvent):
            raise TypeError(f"elapsed_since(): start must be an Event, not {type(start).__name__}")
        self.synchronize()
        if self.time is None or start.time is None:
            raise cuda_error("cudaEventElapsedTime(&ms, start.event_, event_)", "cudaErrorInvalidResourceHandle",
                             "an event that was never recorded")
        return float(np.float32(self.time - start.time))


class FakeDeviceMemory:
    """``l2ctl._core.DeviceMemory`` on the simulator: a lazy allocation (memory.py)."""

    def __init__(self, backend: "FakeBackend", device: int, nbytes: int) -> None:
        if isinstance(nbytes, bool) or int(nbytes) < 0:
            raise TypeError("DeviceMemory(): nbytes must be a non-negative int")
        nbytes = int(nbytes)
        with backend._locked():
            backend._device(device, "cudaSetDevice(device)")
            backend._record("cudaMalloc")
            self._backend = backend
            self._nbytes = nbytes
            self._device = device
            self._ptr = 0
            if nbytes:
                try:
                    self._ptr = backend.memory.allocate(device, nbytes).base
                except OutOfMemory as exc:
                    raise cuda_error("cudaMalloc(&ptr_, bytes)", "cudaErrorMemoryAllocation",
                                     f"device {device}, {nbytes} bytes ({exc})") from None

    @property
    def ptr(self) -> int:
        if self._ptr == 0:
            raise ValueError("the device buffer has been freed")
        return self._ptr

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def device(self) -> int:
        return self._device

    @property
    def freed(self) -> bool:
        return self._ptr == 0

    def free(self) -> None:
        if self._ptr != 0:
            ptr, self._ptr = self._ptr, 0
            with self._backend._locked():
                self._backend._record("cudaFree")
                self._backend.memory.free(ptr)

    def __del__(self) -> None:
        if getattr(self, "_ptr", 0):
            ptr, backend = self._ptr, self._backend
            backend._defer(lambda: backend.memory.free(ptr))

    def __repr__(self) -> str:
        return f"<FakeDeviceMemory 0x{self._ptr:x} {self._nbytes} B device {self._device}>"


class FakeGraph:
    """``l2ctl._core.Graph``: a graph handle, owned (destroyed with it) or borrowed."""

    def __init__(self, backend: "FakeBackend", handle: int, owned: bool) -> None:
        self._backend = backend
        self._handle = int(handle)
        self._owned = bool(owned)

    @property
    def handle(self) -> int:
        if self._handle == 0:
            raise ValueError("the graph has been destroyed")
        return self._handle

    @property
    def owned(self) -> bool:
        return self._owned

    def destroy(self) -> None:
        if self._handle == 0:
            return
        handle, self._handle = self._handle, 0
        if self._owned:
            with self._backend._locked():
                self._backend._record("cudaGraphDestroy")
                self._backend._destroy_graph(handle)

    def __del__(self) -> None:
        if getattr(self, "_handle", 0) and getattr(self, "_owned", False):
            handle, backend = self._handle, self._backend
            backend._defer(lambda: backend._destroy_graph(handle))


class FakeGraphExec:
    """``l2ctl._core.GraphExec``: an instantiated graph, with the node windows of its instantiation (an
    update changes the nodes, never their windows, as on an H100); launches replay its nodes (kernels run
    and advance the clock with those windows)."""

    def __init__(self, backend: "FakeBackend", graph: int) -> None:
        with backend._locked():
            backend._record("cudaGraphInstantiate")
            g = backend._graph(graph, "cudaGraphInstantiate(&exec, as_graph(graph), 0)")
            self._backend = backend
            self._handle = _handle()
            self.graph = graph
            self.device = g.device
            self.snapshot = backend._snapshot(g)

    @property
    def handle(self) -> int:
        if self._handle == 0:
            raise ValueError("the graph executable has been destroyed")
        return self._handle

    def launch(self, stream: int) -> None:
        b = self._backend
        with b._locked():
            _ = self.handle
            st = b._stream(stream, "cudaGraphLaunch(exec, stream)")
            b._record("cudaGraphLaunch")
            graph, snapshot = self.graph, list(self.snapshot)

            def replay(target: _Stream) -> None:
                b.launched.append((graph, tuple(w for node, w in snapshot if node.kind == "kernel")))
                b._replay(snapshot, target)

            if stream in b._captures:  # a child-graph node of the graph being captured
                b._captures[stream].nodes.append(_Node(_handle(), "graph", action=replay))
                return
            replay(st)

    def update(self, graph: int) -> bool:
        b = self._backend
        with b._locked():
            _ = self.handle
            b._record("cudaGraphExecUpdate")
            g = b._graph(graph, "cudaGraphExecUpdate(exec, graph, &info)")
            new = b._snapshot(g)

            def name(node: _Node) -> str:
                return node.kind if node.launch is None else node.launch.name

            if [name(n) for n, _ in self.snapshot] != [name(n) for n, _ in new]:
                return False  # cudaErrorGraphExecUpdateFailure: the topology changed
            # The update succeeds but carries no node attributes: the executable keeps the windows it was
            # instantiated with (measured on an H100, driver 580: benchmarks/results/h100/graph.json).
            self.snapshot = [(node, window) for (node, _), (_, window) in zip(new, self.snapshot)]
            self.graph = graph
            return True

    def destroy(self) -> None:
        if self._handle != 0:
            self._handle = 0
            with self._backend._locked():
                self._backend._record("cudaGraphExecDestroy")


# ---- the backend -----------------------------------------------------------------------------------


class FakeBackend:
    """A simulated CUDA machine implementing ``l2ctl._backend.Backend``; see the package docstring.

    ``FakeBackend(*devices, seed=0, cupti=True)``: the devices (one H100 by default), the seed of the
    timing noise, and whether libcupti "loads". ``FakeBackend.without_devices()``: a machine with a
    driver and no GPU.
    """

    __version__: str = _core.__version__
    #: Whether a batch (apply_window, apply_state) holds signals back while it changes the device, as a call
    #: into C does (a signal's handler runs only when it returns): what tests of interrupts need.
    atomic_calls = False

    def __init__(self, *devices: FakeDevice, seed: int = 0, cupti: bool = True) -> None:
        self._init(list(devices) if devices else [FakeDevice.h100()], seed, cupti)

    def _init(self, devices: list[FakeDevice], seed: int, cupti: bool) -> None:
        self.devices = devices
        self.seed = seed
        self.cupti_available = cupti
        self.current = 0
        self.calls: list[str] = []
        self.windows: dict[int, WindowTuple] = {}
        self.node_windows: dict[int, WindowTuple] = {}
        self.launched: list[tuple[int, tuple[WindowTuple, ...]]] = []
        self.kernel_log: deque[LaunchRecord] = deque(maxlen=100_000)
        self._lock = threading.RLock()
        self._pending: list[Callable[[], None]] = []
        self._locker = _Locked(self)
        space = next(_spaces)
        self.memory = Memory(0x7F00_0000_0000 + (space << 44), [d.total_global_memory for d in devices])
        self.models = [DeviceModel(d, seed, i) for i, d in enumerate(devices)]
        self._kernels = [Kernels(self.memory, d) for d in devices]
        self._host_now = [0.0] * len(devices)
        self._streams: dict[int, _Stream] = {}
        self._defaults: dict[tuple[int, int], _Stream] = {}
        self._graphs: dict[int, _Graph] = {}
        self._nodes: dict[int, _Node] = {}
        self._node_graph: dict[int, int] = {}
        self._captures: dict[int, _Capture] = {}
        self._cupti_loaded = False
        self._profilers: dict[int, "weakref.ReferenceType[FakeRangeProfiler]"] = {}
        # CUDA contexts: each device's primary one (where l2ctl works), and any made with create_context
        self.primary_contexts = [_handle() for _ in devices]
        self._contexts: dict[int, int] = {}  # context -> device, for contexts other than the primary ones
        self._pointer_contexts: dict[int, int] = {}  # allocation base -> context, for foreign allocations

    @classmethod
    def without_devices(cls, *, seed: int = 0) -> "FakeBackend":
        """A machine with an NVIDIA driver and no GPU: device_count() is 0 and every device call fails
        with cudaErrorNoDevice, as the real backend does there."""
        backend = cls.__new__(cls)
        backend._init([], seed, True)
        return backend

    # ---- installing ---------------------------------------------------------------------------------
    @classmethod
    @contextmanager
    def installed(cls, *devices: FakeDevice, seed: int = 0, cupti: bool = True) -> Iterator["FakeBackend"]:
        """Create a simulated machine and make l2ctl use it inside the block."""
        with cls(*devices, seed=seed, cupti=cupti).install() as fake:
            yield fake

    @contextmanager
    def install(self) -> Iterator["FakeBackend"]:
        """Make l2ctl use this machine inside the block."""
        with _backend.use(self):
            yield self

    # ---- helpers for tests ----------------------------------------------------------------------------
    def device(self, index: int) -> FakeDevice:
        return self.devices[index]

    def model(self, index: int = 0) -> DeviceModel:
        """The timing model (and L2 state) of device ``index``."""
        return self.models[index]

    def state(self) -> tuple[Any, ...]:
        """Everything l2ctl may change (limits, stream windows, node windows), for before/after equality."""
        with self._locked():
            return (tuple(d.limit for d in self.devices), tuple(sorted(self.windows.items())),
                    tuple(sorted(self.node_windows.items())))

    def clock(self, stream: int) -> float:
        """The simulated time (ms) at which the work queued on ``stream`` completes."""
        with self._locked():
            return self._stream(stream, "clock").clock

    def create_context(self, device: int) -> int:
        """A CUDA context of ``device`` other than its primary one (as cuCtxCreate or cuda.core make)."""
        with self._locked():
            self._device(device)
            context = _handle()
            self._contexts[context] = device
            return context

    def foreign_stream(self, context: int) -> int:
        """A stream made in ``context`` (create_context): its handle."""
        with self._locked():
            device = self._contexts[context]
            handle = _handle()
            self._streams[handle] = _Stream(handle, device, self._host_now[device], context=context)
            return handle

    def foreign_memory(self, context: int, nbytes: int) -> int:
        """``nbytes`` allocated in ``context`` (create_context): its device pointer."""
        with self._locked():
            alloc = self.memory.allocate(self._contexts[context], int(nbytes))
            self._pointer_contexts[alloc.base] = context
            return alloc.base

    def launch_fake_kernel(self, stream: int) -> None:
        """A stand-in kernel that does nothing (3 us); inside a capture it becomes a kernel node."""
        with self._locked():
            st = self._stream(stream, "launch of fake_kernel")
            self._launch(st.device, stream, self._kernels[st.device].fake_kernel())

    def launch_modeled_kernel(self, stream: int, name: str = "modeled_kernel", *, streamed_bytes: float = 0,
                              hot: Optional[tuple[int, int]] = None, hot_reads: float = 0,
                              compute_ms: float = 0.0, read_fraction: float = 0.5) -> None:
        """A kernel that only takes time: it streams ``streamed_bytes`` (a ``read_fraction`` of them
        reads, the rest writes), re-reads the hot buffer ``hot = (ptr, nbytes)`` for ``hot_reads``
        bytes in total, and needs at least ``compute_ms``. Like every kernel, a kernel node inside a
        capture; ``kernel_log[-1]`` has the model's account of it."""
        with self._locked():
            st = self._stream(stream, f"launch of {name}")
            launch = self._kernels[st.device].modeled(name, float(streamed_bytes), hot, float(hot_reads),
                                                      float(compute_ms), float(read_fraction))
            self._launch(st.device, stream, launch)

    # ---- internals --------------------------------------------------------------------------------------
    def _locked(self) -> "_Locked":
        return self._locker

    def _defer(self, action: Callable[[], None]) -> None:
        """Work from a destructor, run at the next call (destructors may run inside a locked call)."""
        self._pending.append(action)

    def _record(self, call: str) -> None:
        self.calls.append(call)

    def _require_devices(self, call: str) -> None:
        if not self.devices:
            raise cuda_error(call, "cudaErrorNoDevice")

    def _device(self, index: int, call: str = "cudaSetDevice(device)") -> FakeDevice:
        if type(index) is int and 0 <= index < len(self.devices):  # the common case first
            return self.devices[index]
        self._require_devices(call)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.devices):
            raise cuda_error(call, "cudaErrorInvalidDevice", f"device {index}")
        return self.devices[int(index)]

    def _stream(self, handle: int, call: str) -> _Stream:
        if handle in SPECIAL_STREAMS:
            self._require_devices(call)
            key = (self.current, handle)
            if key not in self._defaults:
                self._defaults[key] = _Stream(handle, self.current, self._host_now[self.current])
            return self._defaults[key]
        st = self._streams.get(handle)
        if st is None:
            self._require_devices(call)
            raise cuda_error(call, "cudaErrorInvalidResourceHandle", f"stream 0x{handle:x}")
        return st

    def _destroy_stream(self, handle: int) -> None:
        self._streams.pop(handle, None)
        self.windows.pop(handle, None)
        self._captures.pop(handle, None)
        for model in self.models:
            model.recent.pop(handle, None)

    def _host_waits(self, device: int, time: float) -> None:
        self._host_now[device] = max(self._host_now[device], time)
        for st in self._device_streams(device):
            if st.clock <= time:
                st.last = None  # the host has seen it complete

    def _device_streams(self, device: int) -> list[_Stream]:
        return [s for s in self._streams.values() if s.device == device] + [
            s for (dev, _), s in self._defaults.items() if dev == device]

    def _share(self, st: _Stream, start: float, duration: float, utilization: float) -> float:
        """Kernels of other streams that run at the same time share DRAM and L2 bandwidth with this one
        (processor sharing: two fully memory-bound kernels progress at half speed while both run). The
        other kernel is stretched too, unless an event or the host has already seen it end."""
        for other in self._device_streams(st.device):
            rec = other.last
            if other is st or rec is None or utilization <= 0:
                continue
            e_o = rec.start_ms + rec.duration_ms
            end = start + duration
            if e_o <= start or rec.start_ms >= end:
                continue
            rate = 1.0 / (1.0 + utilization * rec.estimate.utilization)
            t0 = max(start, rec.start_ms)
            r_o, r_b = e_o - t0, end - t0  # remaining solo work at t0
            if other.clock == e_o:  # nothing queued after it: both stretch
                first = t0 + min(r_o, r_b) / rate
                new_o, new_b = (first, first + r_b - r_o) if r_o <= r_b else (first + r_o - r_b, first)
                rec.duration_ms = new_o - rec.start_ms
                other.clock = new_o
            else:  # it is fixed: this kernel runs slower while it lasts
                overlap = e_o - t0
                new_b = t0 + r_b / rate if r_b <= overlap * rate else e_o + r_b - overlap * rate
            duration = new_b - start
        return duration

    def _capture_violation(self, stream: int, call: str) -> CudaError:
        """A synchronizing call on a capturing stream: it fails and invalidates the capture."""
        self._captures[stream].invalidated = call
        return cuda_error(call, "cudaErrorStreamCaptureUnsupported", f"stream 0x{stream:x} is capturing")

    def _window_of(self, st: _Stream) -> Optional[WindowTuple]:
        return self.windows.get(st.handle)

    def _graph(self, graph: int, call: str) -> _Graph:
        g = self._graphs.get(graph)
        if g is None:
            raise cuda_error(call, "cudaErrorInvalidValue", f"graph 0x{graph:x}")
        return g

    def _destroy_graph(self, handle: int) -> None:
        g = self._graphs.pop(handle, None)
        if g is not None:
            for node in g.nodes:
                self._nodes.pop(node.handle, None)
                self._node_graph.pop(node.handle, None)
                self.node_windows.pop(node.handle, None)

    def _snapshot(self, g: _Graph) -> list[tuple[_Node, WindowTuple]]:
        return [(n, self.node_windows.get(n.handle, EMPTY_WINDOW)) for n in g.nodes]

    def _running_profiler(self, device: int) -> Optional[FakeRangeProfiler]:
        ref = self._profilers.get(device)
        p = ref() if ref is not None else None
        return p if p is not None and p.running and not p._released else None

    def _enable_profiler(self, profiler: FakeRangeProfiler) -> None:
        with self._locked():
            ref = self._profilers.get(profiler.device)
            other = ref() if ref is not None else None
            if other is not None and not other._released:
                raise cupti_error("cuptiRangeProfilerEnable", "CUPTI_ERROR_INVALID_OPERATION",
                                  f"a range profiler is already enabled on device {profiler.device}")
            self._profilers[profiler.device] = weakref.ref(profiler)

    def _disable_profiler(self, profiler: FakeRangeProfiler) -> None:
        pass  # the profiler is marked released; its weak reference is replaced by the next one

    def _profiler_started(self, profiler: FakeRangeProfiler) -> None:
        self.models[profiler.device].profiler_started(profiler.max_ranges)

    # execution ---------------------------------------------------------------------------------------
    def _launch(self, device: int, stream: int, launch: KernelLaunch) -> Any:
        """Run (or capture) a kernel on ``stream`` of ``device``; returns what the launcher returns."""
        self._device(device)
        st = self._stream(stream, f"launch of {launch.name}")
        if st.device != device:
            raise cuda_error(f"launch of {launch.name}", "cudaErrorInvalidResourceHandle",
                             f"stream 0x{stream:x} is on device {st.device}, the launch on device {device}")
        capture = self._captures.get(stream)
        if capture is not None:
            if launch.synchronous:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            node = _Node(_handle(), "kernel", launch=launch)
            self.node_windows[node.handle] = self._window_of(st) or EMPTY_WINDOW
            capture.nodes.append(node)
            return launch.result
        value = self._execute(launch, st, self._window_of(st))
        if launch.synchronous:
            self._host_waits(device, st.clock)
            return value
        return launch.result

    def _execute(self, launch: KernelLaunch, st: _Stream, window: Optional[WindowTuple]) -> Any:
        try:
            value = launch.run()
        except MemoryFault as exc:
            name = "cudaErrorMisalignedAddress" if isinstance(exc, Misaligned) else "cudaErrorIllegalAddress"
            raise cuda_error(f"launch of {launch.name}", name, str(exc)) from None
        self._account(st, launch.traffic, window)
        return value

    def _account(self, st: _Stream, traffic: Traffic, window: Optional[WindowTuple]) -> None:
        device = st.device
        model = self.models[device]
        start = max(st.clock, self._host_now[device])
        profiler = self._running_profiler(device)
        if profiler is not None and profiler.kernel_replay:
            model.reset_persisting()  # CUPTI saves and restores memory around every replay
            model.dirty += REPLAY_DIRTY_BYTES
        usable = window if window is not None and window[1] > 0 and self.devices[device].supports_persistence else None
        est = model.evaluate(traffic, usable, stream=st.handle, start_ms=start)
        duration = est.duration_ms
        if profiler is not None:
            profiler.record(traffic.name, est.metrics())
            if profiler.kernel_replay:
                duration = duration * profiler.passes + 0.02
        duration = self._share(st, start, duration, est.utilization)
        st.clock = start + duration
        record = LaunchRecord(traffic.name, device, st.handle, start, duration, usable, est)
        st.last = record
        self.kernel_log.append(record)

    def _replay(self, snapshot: list[tuple[_Node, WindowTuple]], st: _Stream) -> None:
        for node, window in snapshot:
            if node.kind == "kernel" and node.launch is not None:
                self._execute(node.launch, st, window)
            elif node.action is not None:
                node.action(st)

    def _advance(self, st: _Stream, ms: float) -> None:
        st.clock = max(st.clock, self._host_now[st.device]) + ms

    def _memory_fault(self, call: str, exc: Exception) -> CudaError:
        return cuda_error(call, "cudaErrorInvalidValue", str(exc))

    # =====================================================================================================
    # The Backend contract
    # =====================================================================================================

    # devices and the set-aside ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self.devices)

    def device_count_error(self) -> str:
        return "" if self.devices else "cudaErrorNoDevice: no CUDA-capable device is detected"

    def current_device(self) -> int:
        with self._locked():
            self._require_devices("cudaGetDevice(&device)")
            return self.current

    def device_properties(self, device: int) -> dict[str, Any]:
        with self._locked():
            d = self._device(device, "cudaGetDeviceProperties(&prop, device)")
            self._record("cudaGetDeviceProperties")
            return {
                "index": device,
                "name": d.name,
                "major": d.major,
                "minor": d.minor,
                "multiprocessor_count": d.multiprocessor_count,
                "l2_cache_size": d.l2_cache_size,
                "persisting_l2_cache_max_size": d.persisting_l2_cache_max_size,
                "access_policy_max_window_size": d.access_policy_max_window_size,
                "total_global_memory": d.total_global_memory,
                "memory_bus_width": d.memory_bus_width,
                "pci_bus_id": f"0000:{0x18 + 0x10 * device:02x}:00.0",
                "uuid": d.uuid(device),
            }

    def get_persisting_limit(self, device: int) -> int:
        with self._locked():
            d = self._device(device)
            self._record("cudaDeviceGetLimit")
            if d.major < 8:
                raise cuda_error("cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize)",
                                 "cudaErrorUnsupportedLimit", f"device {device}")
            return d.limit

    def set_persisting_limit(self, device: int, nbytes: int) -> int:
        with self._locked():
            d = self._device(device)
            self._record("cudaDeviceSetLimit")
            call = "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes)"
            details = f"device {device}, requested {nbytes} bytes"
            if isinstance(nbytes, bool) or int(nbytes) < 0:
                raise TypeError("set_persisting_limit(): nbytes must be a non-negative int")
            if d.major < 8:
                raise cuda_error(call, "cudaErrorUnsupportedLimit", details)
            if d.mps:
                raise cuda_error(call, "cudaErrorNotSupported", details)
            if nbytes > d.persisting_l2_cache_max_size:
                raise cuda_error(call, "cudaErrorInvalidValue", details)
            d.limit = min(d.persisting_l2_cache_max_size, -(-int(nbytes) // d.granularity) * d.granularity)
            self.models[device].limit_changed(d.limit)
            return d.limit

    def reset_persisting_lines(self, device: int) -> None:
        with self._locked():
            d = self._device(device)
            self._record("cudaCtxResetPersistingL2Cache")
            d.resets += 1
            self.models[device].reset_persisting()

    def driver_version(self) -> int:
        return 13000

    def runtime_version(self) -> int:
        return 13000

    def device_synchronize(self, device: int) -> None:
        with self._locked():
            self._device(device, "cudaDeviceSynchronize()")
            for handle, capture in list(self._captures.items()):
                st = self._stream(handle, "cudaDeviceSynchronize()")
                if st.device == device and capture.forbids_unsafe_calls():
                    raise self._capture_violation(handle, "cudaDeviceSynchronize()")
            latest = max([s.clock for s in self._streams.values() if s.device == device]
                         + [s.clock for (dev, _), s in self._defaults.items() if dev == device] + [0.0])
            self._host_waits(device, latest)

    # streams, windows, events, batched state ------------------------------------------------------------
    def Stream(self, device: int, non_blocking: bool = True, priority: int = 0) -> FakeStream:
        return FakeStream(self, device, non_blocking, priority)

    def stream_context(self, stream: int) -> tuple[int, int]:
        with self._locked():
            st = self._stream(stream, "cuStreamGetCtx(stream, &context)")
            primary = self.primary_contexts[st.device]
            return (st.context or primary, primary)

    def pointer_context(self, ptr: int) -> tuple[int, int]:
        with self._locked():
            alloc = self.memory.find(int(ptr))
            if alloc is None:
                return (0, 0)
            primary = self.primary_contexts[alloc.device]
            return (self._pointer_contexts.get(alloc.base, primary), primary)

    def stream_device(self, stream: int) -> int:
        with self._locked():
            self._record("cudaStreamGetDevice")
            return self._stream(stream, "cudaStreamGetDevice(stream, &device)").device

    def stream_synchronize(self, stream: int) -> None:
        with self._locked():
            st = self._stream(stream, "cudaStreamSynchronize(stream)")
            if stream in self._captures:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            self._host_waits(st.device, st.clock)

    def get_stream_window(self, stream: int) -> WindowTuple:
        with self._locked():
            self._stream(stream, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)")
            self._record("cudaStreamGetAttribute")
            return self.windows.get(stream, EMPTY_WINDOW)

    def _check_window(self, call: str, device: FakeDevice, num_bytes: int, hit_ratio: float, hit_prop: int,
                      miss_prop: int, what: str, handle: int) -> WindowTuple:
        ratio = float(np.float32(hit_ratio))
        if (not 0.0 <= ratio <= 1.0 or num_bytes > device.access_policy_max_window_size or num_bytes < 0
                or hit_prop not in (0, 1, 2) or miss_prop not in (0, 1)):
            raise cuda_error(call, "cudaErrorInvalidValue",
                             f"{what} 0x{handle:x}, num_bytes {num_bytes}, hitRatio {hit_ratio}, hitProp {hit_prop}, "
                             f"missProp {miss_prop}")
        return (0, int(num_bytes), ratio, int(hit_prop), int(miss_prop))

    def set_stream_window(self, stream: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                          miss_prop: int) -> None:
        with self._locker:
            self._set_stream_window(stream, (base, num_bytes, hit_ratio, hit_prop, miss_prop))

    def _set_stream_window(self, stream: int, w: WindowTuple) -> None:
        st = self._streams.get(stream) or self._stream(stream, _SET_STREAM_WINDOW)
        self.calls.append("cudaStreamSetAttribute")
        if st.context:  # the runtime works in the primary context: a stream of another one is not its handle
            raise cuda_error(_SET_STREAM_WINDOW, "cudaErrorInvalidResourceHandle",
                             f"stream 0x{stream:x} belongs to context 0x{st.context:x}")
        base, num_bytes, hit_ratio, hit_prop, miss_prop = w
        ratio = _float32(hit_ratio)  # what CUDA holds
        if (not 0.0 <= ratio <= 1.0 or not 0 <= num_bytes <= self.devices[st.device].access_policy_max_window_size
                or hit_prop not in (0, 1, 2) or miss_prop not in (0, 1)):
            self._check_window(_SET_STREAM_WINDOW, self.devices[st.device], num_bytes, hit_ratio, hit_prop, miss_prop,
                               "stream", stream)  # raises, with CUDA's error
        if num_bytes == 0:
            self.windows.pop(stream, None)
        else:
            self.windows[stream] = (int(base), int(num_bytes), ratio, int(hit_prop), int(miss_prop))

    def Event(self, device: int = -1) -> FakeEvent:
        return FakeEvent(self, device)

    def apply_window(self, device: int, kind: int, handles: Sequence[int], base: int, num_bytes: int,
                     hit_ratio: float, hit_prop: int, miss_prop: int, read_previous: bool, limit: int,
                     at_least: bool, reset_lines: bool,
                     journal: Optional[list[Any]] = None) -> tuple[int, int, list[WindowTuple]]:
        """One window on every handle (kind 0: streams, 1: kernel nodes), with apply_state's limit and reset;
        the result is appended to ``journal`` before the call returns (atomically, as the C++ call does:
        see ``atomic_calls``)."""
        if self.atomic_calls:
            with self._signals_held():
                result = self._apply_window(device, kind, handles, base, num_bytes, hit_ratio, hit_prop, miss_prop,
                                            read_previous, limit, at_least, reset_lines)
                if journal is not None:
                    journal.append(result)
                return result
        result = self._apply_window(device, kind, handles, base, num_bytes, hit_ratio, hit_prop, miss_prop,
                                    read_previous, limit, at_least, reset_lines)
        if journal is not None:
            journal.append(result)
        return result

    def _apply_window(self, device: int, kind: int, handles: Sequence[int], base: int, num_bytes: int,
                      hit_ratio: float, hit_prop: int, miss_prop: int, read_previous: bool, limit: int,
                      at_least: bool, reset_lines: bool) -> tuple[int, int, list[WindowTuple]]:
        w: WindowTuple = (base, num_bytes, hit_ratio, hit_prop, miss_prop)
        if kind == 0 and limit < 0 and not reset_lines and len(handles) == 1:
            # The commonest call (a lean scope's entry or exit). A failure leaves the window as it was, as in C++.
            with self._locker:
                handle = handles[0]
                previous: list[WindowTuple] = []
                if read_previous:
                    if handle not in self._streams:
                        self._stream(handle, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow)")
                    self.calls.append("cudaStreamGetAttribute")
                    previous.append(self.windows.get(handle, EMPTY_WINDOW))
                self._set_stream_window(handle, w)
                return -1, -1, previous
        changes = [(h, w) for h in handles]
        return self._apply_state(device, limit, at_least, changes if kind == 0 else [], changes if kind != 0 else [],
                                 reset_lines, read_previous)

    def apply_state(self, device: int, limit: int, at_least: bool, stream_windows: Sequence[tuple[int, WindowTuple]],
                    node_windows: Sequence[tuple[int, WindowTuple]], reset_lines: bool, read_previous: bool,
                    journal: Optional[list[Any]] = None) -> tuple[int, int, list[WindowTuple]]:
        """The limit when ``limit`` >= 0 (``at_least``: only raised), the windows (streams, then kernel
        nodes), each read first when ``read_previous``, then a reset of persisting lines. Returns (limit
        before, limit after, previous windows), appended to ``journal`` first. A failing call puts back the
        limit and the windows whose previous value was read, then raises (src/l2ctl/state.hpp)."""
        with self._signals_held() if self.atomic_calls else contextlib.nullcontext():
            result = self._apply_state(device, limit, at_least, stream_windows, node_windows, reset_lines,
                                       read_previous)
            if journal is not None:
                journal.append(result)
            return result

    @contextmanager
    def _signals_held(self) -> Iterator[None]:
        """Signals held back for the call, as for a call into C: its change and its journal entry happen
        whole, and a signal's handler runs when the call returns. Only the main thread receives signals."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # Reading the mask runs the handlers of signals already caught, before anything changes; blocking
        # them may run one more (CPython checks after each mask change), so the mask is put back whatever
        # happens from there.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _apply_state(self, device: int, limit: int, at_least: bool, stream_windows: Sequence[tuple[int, WindowTuple]],
                     node_windows: Sequence[tuple[int, WindowTuple]], reset_lines: bool,
                     read_previous: bool) -> tuple[int, int, list[WindowTuple]]:
        with self._locker:
            if type(device) is not int or not 0 <= device < len(self.devices):
                self._device(device)  # raises, with CUDA's error
            previous: list[WindowTuple] = []
            before = after = -1
            changed: list[tuple[bool, int]] = []  # (is a stream, handle) in the order applied
            if limit < 0 and not node_windows and not reset_lines and len(stream_windows) == 1:
                handle, w = stream_windows[0]
                return self._apply_window(device, 0, [handle], *w, read_previous, -1, False, False)
            try:
                if limit >= 0:
                    before = after = self.get_persisting_limit(device)
                    if (before < limit) if at_least else (before != limit):
                        after = self.set_persisting_limit(device, limit)
                for handle, w in stream_windows:  # the common case, without the public calls' lock and checks
                    if read_previous:
                        self._stream(handle, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow)")
                        self.calls.append("cudaStreamGetAttribute")
                        previous.append(self.windows.get(handle, EMPTY_WINDOW))
                    self._set_stream_window(handle, w)
                    changed.append((True, handle))
                for handle, w in node_windows:
                    if read_previous:
                        self.calls.append("cudaGraphKernelNodeGetAttribute")
                        if handle not in self.node_windows:
                            self._node(handle, "cudaGraphKernelNodeGetAttribute(node, ...)")
                        previous.append(self.node_windows.get(handle, EMPTY_WINDOW))
                    self._set_node_window(handle, w)
                    changed.append((False, handle))
                if reset_lines:
                    self.reset_persisting_lines(device)
            except CudaError:
                for (is_stream, handle), old in zip(changed, previous if read_previous else []):
                    (self.set_stream_window if is_stream else self.set_node_window)(handle, *old)
                if after != before:
                    self.set_persisting_limit(device, before)
                raise
            return before, after, previous

    # memory -----------------------------------------------------------------------------------------------
    def DeviceMemory(self, device: int, nbytes: int) -> FakeDeviceMemory:
        return FakeDeviceMemory(self, device, nbytes)

    def pointer_info(self, ptr: int) -> tuple[int, int, int, int]:
        with self._locked():
            self._require_devices("cudaPointerGetAttributes(&attributes, ptr)")
            self._record("cudaPointerGetAttributes")
            alloc: Optional[Allocation] = self.memory.find(int(ptr))
            if alloc is None:
                return (0, -2, 0, 0)  # cudaMemoryTypeUnregistered: host memory CUDA does not know
            return (2, alloc.device, alloc.base, alloc.size)

    def copy_host_to_device(self, dst: int, src: np.ndarray[Any, Any], stream: int) -> None:
        call = "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream)"
        host = np.ascontiguousarray(src)
        with self._locked():
            st = self._stream(stream, call)
            self._record("cudaMemcpyAsync")
            if stream in self._captures:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            try:
                self.memory.write_array(int(dst), host)
            except MemoryFault as exc:
                raise self._memory_fault(call, exc) from None
            self._advance(st, self.models[st.device].transfer_ms(host.nbytes, host=True))
            self._host_waits(st.device, st.clock)

    def copy_device_to_host(self, dst: np.ndarray[Any, Any], src: int, stream: int) -> None:
        call = "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream)"
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("copy_device_to_host needs a writable, C-contiguous array")
        with self._locked():
            st = self._stream(stream, call)
            self._record("cudaMemcpyAsync")
            if stream in self._captures:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            try:
                data = self.memory.read(int(src), dst.nbytes)
            except MemoryFault as exc:
                raise self._memory_fault(call, exc) from None
            dst.reshape(-1).view(np.uint8)[:] = data
            self._advance(st, self.models[st.device].transfer_ms(dst.nbytes, host=True))
            self._host_waits(st.device, st.clock)

    def _device_copy(self, st: _Stream, dst: int, src: int, nbytes: int, call: str) -> None:
        try:
            self.memory.copy(dst, src, nbytes)
        except MemoryFault as exc:
            raise self._memory_fault(call, exc) from None
        self._advance(st, self.models[st.device].transfer_ms(nbytes))

    def copy_device_to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        call = "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)"
        with self._locked():
            st = self._stream(stream, call)
            self._record("cudaMemcpyAsync")
            if stream in self._captures:
                for ptr in (src, dst):
                    if self.memory.find(int(ptr)) is None:
                        raise self._memory_fault(call, MemoryFault(f"0x{int(ptr):x} is not device memory"))
                self._captures[stream].nodes.append(_Node(_handle(), "memcpy", action=lambda s: self._device_copy(
                    s, int(dst), int(src), int(nbytes), call)))
                return
            self._device_copy(st, int(dst), int(src), int(nbytes), call)

    def _memset(self, st: _Stream, dst: int, value: int, nbytes: int, call: str) -> None:
        try:
            self.memory.fill(dst, nbytes, value)
        except MemoryFault as exc:
            raise self._memory_fault(call, exc) from None
        self._advance(st, self.models[st.device].transfer_ms(nbytes, write_only=True))

    def memset_device(self, dst: int, value: int, nbytes: int, stream: int) -> None:
        call = "cudaMemsetAsync(dst, value, bytes, stream)"
        with self._locked():
            st = self._stream(stream, call)
            self._record("cudaMemsetAsync")
            if stream in self._captures:
                if self.memory.find(int(dst)) is None:
                    raise self._memory_fault(call, MemoryFault(f"0x{int(dst):x} is not device memory"))
                self._captures[stream].nodes.append(_Node(_handle(), "memset", action=lambda s: self._memset(
                    s, int(dst), int(value), int(nbytes), call)))
                return
            self._memset(st, int(dst), int(value), int(nbytes), call)

    # graphs ---------------------------------------------------------------------------------------------
    def Graph(self, handle: int, owned: bool) -> FakeGraph:
        return FakeGraph(self, handle, owned)

    def GraphExec(self, graph: int) -> FakeGraphExec:
        return FakeGraphExec(self, graph)

    def begin_capture(self, stream: int, mode: int) -> None:
        call = "cudaStreamBeginCapture(stream, mode)"
        with self._locked():
            self._stream(stream, call)
            self._record("cudaStreamBeginCapture")
            if stream in (0, 1):
                raise cuda_error(call, "cudaErrorStreamCaptureUnsupported", "the legacy default stream")
            if stream in self._captures:
                raise cuda_error(call, "cudaErrorIllegalState", f"stream 0x{stream:x} is already capturing")
            if mode not in (0, 1, 2):
                raise cuda_error(call, "cudaErrorInvalidValue", f"mode {mode}")
            self._captures[stream] = _Capture(stream, mode)

    def end_capture(self, stream: int) -> int:
        call = "cudaStreamEndCapture(stream, &graph)"
        with self._locked():
            st = self._stream(stream, call)
            self._record("cudaStreamEndCapture")
            capture = self._captures.pop(stream, None)
            if capture is None:
                raise cuda_error(call, "cudaErrorIllegalState", f"stream 0x{stream:x} is not capturing")
            if capture.invalidated:
                for node in capture.nodes:
                    self.node_windows.pop(node.handle, None)
                raise cuda_error(call, "cudaErrorStreamCaptureInvalidated",
                                 f"stream 0x{stream:x}: {capture.invalidated} during the capture")
            handle = _handle()
            self._graphs[handle] = _Graph(handle, st.device, list(capture.nodes))
            for node in capture.nodes:
                self._nodes[node.handle] = node
                self._node_graph[node.handle] = handle
            return handle

    def is_capturing(self, stream: int) -> bool:
        with self._locked():
            self._stream(stream, "cudaStreamIsCapturing(stream, &status)")
            self._record("cudaStreamIsCapturing")
            return stream in self._captures

    def graph_node_count(self, graph: int) -> int:
        with self._locked():
            return len(self._graph(graph, "cudaGraphGetNodes(graph, nullptr, &count)").nodes)

    def graph_kernel_nodes(self, graph: int) -> list[tuple[int, str, tuple[int, int, int], tuple[int, int, int]]]:
        with self._locked():
            g = self._graph(graph, "cudaGraphGetNodes(graph, nullptr, &count)")
            return [(n.handle, n.launch.name, n.launch.grid, n.launch.block) for n in g.nodes
                    if n.kind == "kernel" and n.launch is not None]

    def _node(self, node: int, call: str) -> _Node:
        n = self._nodes.get(node)
        if n is None or n.kind != "kernel":
            raise cuda_error(call, "cudaErrorInvalidValue", f"kernel node 0x{node:x}")
        return n

    def get_node_window(self, node: int) -> WindowTuple:
        call = "cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value)"
        with self._locked():
            self._record("cudaGraphKernelNodeGetAttribute")
            self._node(node, call)
            return self.node_windows.get(node, EMPTY_WINDOW)

    def set_node_window(self, node: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                        miss_prop: int) -> None:
        with self._locker:
            self._set_node_window(node, (base, num_bytes, hit_ratio, hit_prop, miss_prop))

    def _set_node_window(self, node: int, w: WindowTuple) -> None:
        call = "cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value)"
        self.calls.append("cudaGraphKernelNodeSetAttribute")
        n = self._nodes.get(node)
        if n is None or n.kind != "kernel":
            self._node(node, call)  # raises, with CUDA's error
        base, num_bytes, hit_ratio, hit_prop, miss_prop = w
        ratio = _float32(hit_ratio)
        device = self.devices[self._graphs[self._node_graph[node]].device]
        if (not 0.0 <= ratio <= 1.0 or not 0 <= num_bytes <= device.access_policy_max_window_size
                or hit_prop not in (0, 1, 2) or miss_prop not in (0, 1)):
            self._check_window(call, device, num_bytes, hit_ratio, hit_prop, miss_prop, "kernel node", node)
        self.node_windows[node] = (int(base), int(num_bytes), ratio, int(hit_prop), int(miss_prop))

    # hardware counters -------------------------------------------------------------------------------------
    def cupti_load(self, path: str) -> None:
        with self._locked():
            if self._cupti_loaded:
                return
            name = path or "libcupti.so"
            if not self.cupti_available or not library_loads(path):
                raise cupti_error(f"dlopen({name})", "load", f"{name}: cannot open shared object file: "
                                  "No such file or directory (simulated)")
            self._cupti_loaded = True

    def cupti_loaded(self) -> bool:
        return self._cupti_loaded

    def RangeProfiler(self, device: int, metrics: list[str], max_ranges: int,
                      user_replay: bool = False) -> FakeRangeProfiler:
        return FakeRangeProfiler(self, device, metrics, max_ranges, user_replay)

    # kernels -------------------------------------------------------------------------------------------------
    def _kernels_of(self, device: int) -> Kernels:
        self._device(device)
        return self._kernels[device]

    def reset_data(self, device: int, stream: int, out: int, out_len: int, lut: int, lut_len: int, variant: int,
                   blocks_per_sm: int = 0) -> tuple[int, int, bool, bool]:
        with self._locked():
            launch = self._kernels_of(device).reset_data(out, out_len, lut, lut_len, int(variant), int(blocks_per_sm))
            shape: tuple[int, int, bool, bool] = self._launch(device, stream, launch)
            return shape

    def reset_data_verify(self, device: int, stream: int, out: int, out_len: int, lut: int, lut_len: int) -> int:
        with self._locked():
            return int(self._launch(device, stream, self._kernels_of(device).reset_data_verify(out, out_len, lut,
                                                                                                lut_len)))

    def write_index(self, device: int, stream: int, buf: int, len: int) -> None:
        with self._locked():
            self._launch(device, stream, self._kernels_of(device).write_index(buf, len))

    def count_index_mismatches(self, device: int, stream: int, buf: int, len: int) -> int:
        with self._locked():
            return int(self._launch(device, stream, self._kernels_of(device).count_index_mismatches(buf, len)))

    def copy_words(self, device: int, stream: int, dst: int, src: int, len: int) -> None:
        with self._locked():
            self._launch(device, stream, self._kernels_of(device).copy_words(dst, src, len))

    def count_mismatches(self, device: int, stream: int, a: int, b: int, len: int) -> int:
        with self._locked():
            return int(self._launch(device, stream, self._kernels_of(device).count_mismatches(a, b, len)))

    def read_sum(self, device: int, stream: int, buf: int, len: int, partials: int) -> int:
        with self._locked():
            return int(self._launch(device, stream, self._kernels_of(device).read_sum(buf, len, partials)))

    def max_read_partials(self, device: int) -> int:
        with self._locked():
            return self._kernels_of(device).max_read_partials()

    def stride_read(self, device: int, stream: int, buf: int, threads: int, stride_words: int, partials: int,
                    block_threads: int = 256) -> int:
        with self._locked():
            launch = self._kernels_of(device).stride_read(buf, threads, stride_words, partials, block_threads)
            return int(self._launch(device, stream, launch))

    def sum_u64(self, device: int, stream: int, values: int, count: int) -> int:
        with self._locked():
            return int(self._launch(device, stream, self._kernels_of(device).sum_u64(values, count)))

    def sparse_vector(self, device: int, stream: int, values: int, indices: int, dense: int, dense_len: int,
                      result: int, len: int, streaming: bool) -> None:
        with self._locked():
            launch = self._kernels_of(device).sparse_vector(values, indices, dense, dense_len, result, len,
                                                            bool(streaming))
            self._launch(device, stream, launch)

    def stream_analysis(self, device: int, stream: int, data: int, categories: int, weights: int, weights_len: int,
                        results: int, len: int, streaming: bool) -> None:
        with self._locked():
            launch = self._kernels_of(device).stream_analysis(data, categories, weights, weights_len, results, len,
                                                              bool(streaming))
            self._launch(device, stream, launch)
