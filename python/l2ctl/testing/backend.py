"""FakeBackend: the whole backend contract (``l2ctl/_core.pyi``) on simulated devices.

It keeps what CUDA keeps: per device the set-aside limit (rounded up to multiples of max / 10, as
measured), persisting-line resets and the windows of streams and kernel nodes, with the batches that change
them (l2state.py, one concern of the class); streams; events; lazy device memory
(memory.py); captured graphs with their kernel nodes' windows, and executables with the windows of
their instantiation; a CUPTI range profiler (profiler.py). Kernels run functionally (kernels.py) and
advance their stream's clock by the timing model's duration (model.py).

Errors are CUDA's (``l2ctl.CudaError``), or ``ValueError`` where the C++ core throws
``std::invalid_argument``. Every call that changes state records the CUDA call it stands for in
``calls`` (inside ``apply_batch`` too), so tests can assert that none was made.

Clocks (ms), one per stream: a launch starts when the stream's previous work ends or when the host
last waited for the device (synchronizations, host copies, counting kernels), whichever is later;
events read the clock. Kernels of different streams that overlap share the memory bandwidth (``_share``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Optional, cast

import numpy as np

from .. import _backend, _core
from .._errors import CudaError, NotSupportedError
from .._window import AccessPolicyWindow
from .devices import FakeDevice
from .errors import cuda_error, cupti_error
from .kernels import KernelLaunch, Kernels
from .l2state import EMPTY_WINDOW, L2State
from .memory import Allocation, Memory, MemoryFault, Misaligned, OutOfMemory
from .model import DeviceModel, Estimate
from .profiler import REPLAY_DIRTY_BYTES, FakeLaunchRecorder, FakeRangeProfiler, library_loads

__all__ = ["FakeBackend", "FakeStream", "FakeEvent", "FakeDeviceMemory", "FakeGraph", "FakeGraphExec",
           "LaunchRecord"]

SPECIAL_STREAMS = (0, 1, 2)  # legacy default stream, cudaStreamLegacy, cudaStreamPerThread

# Handles and address spaces unique in the process, so a stream, buffer or graph of one simulated
# machine is never mistaken for one of another (it fails as an unknown handle instead).
_handle = itertools.count(0x5F00_0000_1000, 0x100).__next__
_spaces = itertools.count(0)


@dataclass
class LaunchRecord:
    """One executed kernel (``FakeBackend.kernel_log``)."""

    name: str
    device: int
    stream: int
    start_ms: float
    duration_ms: float
    window: Optional[AccessPolicyWindow]
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
    device: int = 0  # a kernel node's: where its window is checked


@dataclass
class _Capture:
    mode: int  # cudaStreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
    nodes: list[_Node] = field(default_factory=list)
    invalidated: str = ""
    thread: int = field(default_factory=threading.get_ident)

    def forbids_unsafe_calls(self) -> bool:
        """Whether a potentially unsafe call (cudaDeviceSynchronize, ...) from this thread breaks it."""
        return self.mode == 0 or (self.mode == 1 and self.thread == threading.get_ident())


@dataclass
class _Graph:
    device: int
    nodes: list[_Node]


# ---- the objects the factories return --------------------------------------------------------------


class _Owner:
    """What the objects owning a simulated handle (or pointer) share: ``_handle`` is 0 once released,
    using it after that is a ValueError, and a destructor leaves the release (``_free``) to the
    backend's next call, since it may run inside a locked one."""

    _backend: "FakeBackend"
    _handle = 0
    _gone = ""  # the ValueError's message once released
    _destroy_call = ""  # the CUDA call a release stands for, recorded in FakeBackend.calls
    _free: Optional[Callable[[int], None]] = None  # what a release does to the backend's state

    def _live(self) -> int:
        if self._handle == 0:
            raise ValueError(self._gone)
        return self._handle

    def _release(self) -> None:
        handle = self._handle
        if handle != 0:
            with self._backend._locked:
                self._backend.calls.append(self._destroy_call)
                if self._free is not None:
                    self._free(handle)
                self._handle = 0  # once released (a release cut short is made again, whole, by the next or __del__)

    def __del__(self) -> None:
        if self._handle and self._free is not None:
            handle, free = self._handle, self._free
            self._backend._pending.append(lambda: free(handle))


class FakeStream(_Owner):
    """``l2ctl._core.Stream`` on the simulator."""

    _gone = "the stream is closed"
    _destroy_call = "cudaStreamDestroy"

    def __init__(self, backend: "FakeBackend", device: int, non_blocking: bool = True, priority: int = 0) -> None:
        with backend._locked:
            backend._device(device, "cudaSetDevice(device)")
            backend.calls.append("cudaStreamCreateWithPriority")
            self._backend = backend
            self._free = backend._destroy_stream
            self._handle = _handle()
            self._device = device
            self.non_blocking = bool(non_blocking)
            self.priority = int(priority)
            backend._streams[self._handle] = _Stream(self._handle, device, backend._host_now[device])

    handle = property(_Owner._live)

    @property
    def device(self) -> int:
        return self._device

    @property
    def closed(self) -> bool:
        return self._handle == 0

    def synchronize(self) -> None:
        self._backend.stream_synchronize(self.handle)

    def query(self) -> bool:
        with self._backend._locked:
            handle = self.handle
            if handle in self._backend._captures:
                raise self._backend._capture_violation(handle, "cudaStreamQuery(stream)")
            return True

    close = _Owner._release

    def __repr__(self) -> str:
        return f"<FakeStream 0x{self._handle:x} device {self._device}>" if self._handle else "<FakeStream closed>"


class FakeEvent:
    """``l2ctl._core.Event`` on the simulator: a point on a stream's clock."""

    def __init__(self, backend: "FakeBackend", device: int = -1) -> None:
        with backend._locked:
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
        with b._locked:
            st = b._stream(stream, "cudaEventRecord(event_, stream)")
            if st.device != self.owner:
                raise cuda_error("cudaEventRecord(event_, reinterpret_cast<cudaStream_t>(stream))",
                                 "cudaErrorInvalidResourceHandle", f"stream 0x{stream:x}")
            b.calls.append("cudaEventRecord")
            if stream in b._captures:
                b._captures[stream].nodes.append(_Node(_handle(), "event", action=self._set))
                return
            self._set(st)

    def wait_on(self, stream: int) -> None:
        b = self._backend
        with b._locked:
            st = b._stream(stream, "cudaStreamWaitEvent(stream, event_, 0)")
            b.calls.append("cudaStreamWaitEvent")
            if self.time is not None:
                st.clock = max(st.clock, self.time)

    def synchronize(self) -> None:
        with self._backend._locked:
            if self.time is not None and self.device is not None:
                self._backend._host_waits(self.device, self.time)

    def query(self) -> bool:
        """Completed, as the host sees it: the simulator's stream work is done once queued (FakeStream.query)."""
        with self._backend._locked:
            return True

    def elapsed_since(self, start: Any) -> float:
        if not isinstance(start, FakeEvent):
            raise TypeError(f"elapsed_since(): start must be an Event, not {type(start).__name__}")
        self.synchronize()
        if self.time is None or start.time is None:
            raise cuda_error("cudaEventElapsedTime(&ms, start.event_, event_)", "cudaErrorInvalidResourceHandle",
                             "an event that was never recorded")
        return float(np.float32(self.time - start.time))


class FakeDeviceMemory(_Owner):
    """``l2ctl._core.DeviceMemory`` on the simulator: a lazy allocation (memory.py); ``_handle`` is its pointer."""

    _gone = "the device buffer has been freed"
    _destroy_call = "cudaFree"

    def __init__(self, backend: "FakeBackend", device: int, nbytes: int) -> None:
        if isinstance(nbytes, bool) or int(nbytes) < 0:
            raise TypeError("DeviceMemory(): nbytes must be a non-negative int")
        nbytes = int(nbytes)
        with backend._locked:
            backend._device(device, "cudaSetDevice(device)")
            backend.calls.append("cudaMalloc")
            self._backend = backend
            self._free = backend.memory.free
            self._nbytes = nbytes
            self._device = device
            if nbytes:
                self._handle = backend.memory.reserve(nbytes)  # owned before it is allocated: freed whatever happens
                try:
                    backend.memory.allocate(device, nbytes, self._handle)
                except OutOfMemory as exc:
                    self._handle = 0
                    raise cuda_error("cudaMalloc(&ptr_, bytes)", "cudaErrorMemoryAllocation",
                                     f"device {device}, {nbytes} bytes ({exc})") from None

    ptr = property(_Owner._live)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def device(self) -> int:
        return self._device

    @property
    def freed(self) -> bool:
        return self._handle == 0

    free = _Owner._release

    def __repr__(self) -> str:
        return f"<FakeDeviceMemory 0x{self._handle:x} {self._nbytes} B device {self._device}>"


class FakeGraph(_Owner):
    """``l2ctl._core.Graph``: a graph handle, owned (destroyed with it) or borrowed."""

    _gone = "the graph has been destroyed"
    _destroy_call = "cudaGraphDestroy"

    def __init__(self, backend: "FakeBackend", handle: int, owned: bool) -> None:
        self._backend = backend
        self._owned = bool(owned)
        if self._owned:
            self._free = backend._destroy_graph
        self._handle = int(handle)

    handle = property(_Owner._live)

    @property
    def owned(self) -> bool:
        return self._owned

    def destroy(self) -> None:
        if self._owned:
            self._release()
        self._handle = 0


class FakeGraphExec(_Owner):
    """``l2ctl._core.GraphExec``: an instantiated graph, with the node windows of its instantiation (an
    update changes the nodes, never their windows, as on an H100); launches replay its nodes (kernels run
    and advance the clock with those windows)."""

    _gone = "the graph executable has been destroyed"
    _destroy_call = "cudaGraphExecDestroy"

    def __init__(self, backend: "FakeBackend", graph: int) -> None:
        with backend._locked:
            backend.calls.append("cudaGraphInstantiate")
            g = backend._graph(graph, "cudaGraphInstantiate(&exec, as_graph(graph), 0)")
            self._backend = backend
            self._handle = _handle()
            self.graph = graph
            self.device = g.device
            self.snapshot = backend._snapshot(g)

    handle = property(_Owner._live)

    def launch(self, stream: int) -> None:
        b = self._backend
        with b._locked:
            _ = self.handle
            st = b._stream(stream, "cudaGraphLaunch(exec, stream)")
            b.calls.append("cudaGraphLaunch")
            graph, snapshot = self.graph, list(self.snapshot)

            def replay(target: _Stream) -> None:
                b.launched.append((graph, tuple(w for node, w in snapshot if node.kind == "kernel")))
                for node, window in snapshot:
                    if node.kind == "kernel" and node.launch is not None:
                        b._execute(node.launch, target, window)
                    elif node.action is not None:
                        node.action(target)

            if stream in b._captures:  # a child-graph node of the graph being captured
                b._captures[stream].nodes.append(_Node(_handle(), "graph", action=replay))
                return
            replay(st)

    def update(self, graph: int) -> bool:
        b = self._backend
        with b._locked:
            _ = self.handle
            b.calls.append("cudaGraphExecUpdate")
            new = b._snapshot(b._graph(graph, "cudaGraphExecUpdate(exec, graph, &info)"))

            def name(node: _Node) -> str:
                return node.kind if node.launch is None else node.launch.name

            if [name(n) for n, _ in self.snapshot] != [name(n) for n, _ in new]:
                return False  # cudaErrorGraphExecUpdateFailure: the topology changed
            # The update succeeds but carries no node attributes: the executable keeps the windows it was
            # instantiated with (measured on an H100, driver 580: benchmarks/results/h100/graph.json).
            self.snapshot = [(node, window) for (node, _), (_, window) in zip(new, self.snapshot)]
            self.graph = graph
            return True

    destroy = _Owner._release


# ---- the backend -----------------------------------------------------------------------------------

_machines: "weakref.WeakSet[FakeBackend]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: a lock another thread held stays held there, for good. Every
    machine gets a new one; its state is whole, since every call makes its change in one step that no thread
    switch splits (l2state.py)."""
    for machine in list(_machines):
        machine._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class FakeBackend(L2State):
    """A simulated CUDA machine implementing the backend contract (``_core.pyi``); see the package docstring.

    ``FakeBackend(*devices, seed=0, cupti=True)``: the devices (one H100 by default), the seed of the
    timing noise, and whether libcupti "loads".
    """

    __version__: str = _core.__version__

    def __init__(self, *devices: FakeDevice, seed: int = 0, cupti: bool = True) -> None:
        self._init(list(devices) if devices else [FakeDevice.h100()], seed, cupti)

    def _init(self, devices: list[FakeDevice], seed: int, cupti: bool) -> None:
        self.devices = devices
        self.seed = seed
        self.cupti_available = cupti
        self.current = 0
        self.calls: list[str] = []
        self.windows: dict[int, AccessPolicyWindow] = {}
        self.node_windows: dict[int, AccessPolicyWindow] = {}
        self.launched: list[tuple[int, tuple[AccessPolicyWindow, ...]]] = []
        self.kernel_log: deque[LaunchRecord] = deque(maxlen=100_000)
        self._lock = threading.RLock()
        self._pending: list[Callable[[], None]] = []
        _machines.add(self)
        self.memory = Memory(0x7F00_0000_0000 + (next(_spaces) << 44), [d.total_global_memory for d in devices])
        self.models = [DeviceModel(d, seed, i) for i, d in enumerate(devices)]
        self._kernels = [Kernels(self.memory, d) for d in devices]
        self._host_now = [0.0] * len(devices)
        self._streams: dict[int, _Stream] = {}
        self._defaults: dict[tuple[int, int], _Stream] = {}
        self._graphs: dict[int, _Graph] = {}
        self._nodes: dict[int, _Node] = {}
        self._captures: dict[int, _Capture] = {}
        self._cupti_loaded = False
        self._profilers: dict[int, "weakref.ReferenceType[FakeRangeProfiler]"] = {}
        # the one CUPTI callback subscriber of the process (weakly: a recorder collected while recording lets go)
        self._subscriber: Optional["weakref.ReferenceType[FakeLaunchRecorder]"] = None
        # CUDA contexts: each device's primary one (where l2ctl works), and any made with create_context
        self.primary_contexts = [_handle() for _ in devices]
        self._contexts: dict[int, int] = {}  # context -> device, for contexts other than the primary ones
        self._pointer_contexts: dict[int, int] = {}  # allocation base -> context, for foreign allocations
        self._no_device_reason = ""  # why there is no device, where not CUDA's (see without_devices)
        #: l2ctl.device_count() raises NoDeviceError instead of answering 0: the machine stands for a setting to
        #: correct (an L2CTL_SIMULATE naming no simulated GPU), not for a machine without GPUs.
        self.refuses_device_count = False
        self._announcement: Optional[str] = None  # said on stderr at the first device query (see announce)

    @classmethod
    def without_devices(cls, *, seed: int = 0, reason: str = "", refuse_count: bool = False) -> "FakeBackend":
        """A machine with an NVIDIA driver and no GPU: device_count() is 0 and every device call fails
        with cudaErrorNoDevice, as the real backend does there. ``reason``: what device_count_error() says
        instead of CUDA's words (an L2CTL_SIMULATE that names no simulated GPU). ``refuse_count``: l2ctl.device_count()
        raises NoDeviceError with that reason too, instead of answering 0 (a bad setting must not pass for no GPU)."""
        backend = cls.__new__(cls)
        backend._init([], seed, True)
        backend._no_device_reason = reason
        backend.refuses_device_count = refuse_count
        return backend

    def announce(self, line: str) -> None:
        """Say ``line`` on stderr once, when this machine is first asked about its devices (device_count or
        device_properties): a process that installs another machine before any device call (the command
        line's --simulate after L2CTL_SIMULATE) never says it."""
        self._announcement = line

    def _say_announcement(self) -> None:
        with self._lock:
            line, self._announcement = self._announcement, None
        if line:
            sys.stderr.write(line + "\n")

    # ---- installing ---------------------------------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def installed(cls, *devices: FakeDevice, seed: int = 0, cupti: bool = True) -> Iterator["FakeBackend"]:
        """Create a simulated machine and make l2ctl use it inside the block."""
        with cls(*devices, seed=seed, cupti=cupti).install() as fake:
            yield fake

    @contextlib.contextmanager
    def install(self) -> Iterator["FakeBackend"]:
        """Make l2ctl use this machine inside the block."""
        with _backend.use(self):
            yield self

    @property
    def provenance(self) -> str:
        """What this machine is, as every output that reports a device says it (l2ctl._backend.simulated)."""
        kinds = dict.fromkeys(f"{d.name}: {d.provenance}" for d in self.devices)
        return "simulated by l2ctl.testing, not a GPU (" + "; ".join(kinds) + ")"

    # ---- helpers for tests ----------------------------------------------------------------------------
    def device(self, index: int) -> FakeDevice:
        return self.devices[index]

    def checked_device(self, device: int) -> FakeDevice:
        """Device ``device`` as a CUDA call would check it (cudaErrorInvalidDevice, cudaErrorNoDevice)."""
        return self._device(device)

    @property
    def lock(self) -> ContextManager[Any]:
        """The machine's lock, as every simulated call takes it (a context manager)."""
        return self._locked

    @property
    def _locked(self) -> ContextManager[Any]:
        """The lock every call takes, once the releases that destructors left to the next call are done. It is a C
        lock taken by a with statement: no interrupt falls between its acquire and the block, nor in its release
        (a Python __enter__ could be interrupted as the acquire returns, and leave it held)."""
        if self._pending:
            with self._lock:
                self._free_pending()
        return self._lock

    def _free_pending(self) -> None:
        """The releases destructors deferred, each dropped once done (an interrupt may make one run again: they are
        idempotent)."""
        while self._pending:
            with contextlib.suppress(Exception):  # a destructor's cleanup of something already gone
                self._pending[-1]()
            self._pending.pop()

    def state(self) -> tuple[Any, ...]:
        """Everything l2ctl may change (limits, stream windows, node windows), for before/after equality."""
        with self._locked:
            return (tuple(d.limit for d in self.devices), tuple(sorted(self.windows.items())),
                    tuple(sorted(self.node_windows.items())))

    def clock(self, stream: int) -> float:
        """The simulated time (ms) at which the work queued on ``stream`` completes."""
        with self._locked:
            return self._stream(stream, "clock").clock

    def create_context(self, device: int) -> int:
        """A CUDA context of ``device`` other than its primary one (as cuCtxCreate or cuda.core make)."""
        with self._locked:
            self._device(device)
            context = _handle()
            self._contexts[context] = device
            return context

    def foreign_stream(self, context: int) -> int:
        """A stream made in ``context`` (create_context): its handle."""
        with self._locked:
            device = self._contexts[context]
            handle = _handle()
            self._streams[handle] = _Stream(handle, device, self._host_now[device], context=context)
            return handle

    def foreign_memory(self, context: int, nbytes: int) -> int:
        """``nbytes`` allocated in ``context`` (create_context): its device pointer."""
        with self._locked:
            alloc = self.memory.allocate(self._contexts[context], int(nbytes))
            self._pointer_contexts[alloc.base] = context
            return alloc.base

    def launch_fake_kernel(self, stream: int) -> None:
        """A stand-in kernel that does nothing (3 us); inside a capture it becomes a kernel node."""
        with self._locked:
            st = self._stream(stream, "launch of fake_kernel")
            self._launch(st.device, stream, self._kernels[st.device].fake_kernel())

    def launch_modeled_kernel(self, stream: int, name: str = "modeled_kernel", *, streamed_bytes: float = 0,
                              hot: Optional[tuple[int, int]] = None, hot_reads: float = 0,
                              compute_ms: float = 0.0, read_fraction: float = 0.5,
                              args: tuple[int, ...] = ()) -> None:
        """A kernel that only takes time: it streams ``streamed_bytes`` (a ``read_fraction`` of them
        reads, the rest writes), re-reads the hot buffer ``hot = (ptr, nbytes)`` for ``hot_reads``
        bytes in total, and needs at least ``compute_ms``. ``args``: the pointers it is given (the hot
        buffer's by default), what ``kernel_node_words`` shows of its node. Like every kernel, a kernel
        node inside a capture; ``kernel_log[-1]`` has the model's account of it."""
        with self._locked:
            st = self._stream(stream, f"launch of {name}")
            launch = self._kernels[st.device].modeled(name, float(streamed_bytes), hot, float(hot_reads),
                                                      float(compute_ms), float(read_fraction), tuple(args))
            self._launch(st.device, stream, launch)

    # ---- internals --------------------------------------------------------------------------------------
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
        """Kernels of other streams running at the same time share DRAM and L2 bandwidth with this one (processor
        sharing weighted by how memory-bound each is: two fully memory-bound kernels run at half speed while
        both run); the other kernel is stretched too, unless an event or the host has already seen it end."""
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

    def _graph(self, graph: int, call: str) -> _Graph:
        g = self._graphs.get(graph)
        if g is None:
            raise cuda_error(call, "cudaErrorInvalidValue", f"graph 0x{graph:x}")
        return g

    def _destroy_graph(self, handle: int) -> None:
        g = self._graphs.get(handle)
        if g is not None:  # the graph goes last, so that a release cut short is made whole when it runs again
            for node in g.nodes:
                self._nodes.pop(node.handle, None)
                self.node_windows.pop(node.handle, None)
            del self._graphs[handle]

    def _snapshot(self, g: _Graph) -> list[tuple[_Node, AccessPolicyWindow]]:
        return [(n, self.node_windows.get(n.handle, EMPTY_WINDOW)) for n in g.nodes]

    def _profiler(self, device: int) -> Optional[FakeRangeProfiler]:
        """The device's enabled profiler, unless released."""
        ref = self._profilers.get(device)
        p = ref() if ref is not None else None
        return p if p is not None and not p.released else None

    # the profiler hook (testing/profiler.py's ProfiledMachine) -------------------------------------------
    def attach_profiler(self, profiler: FakeRangeProfiler) -> None:
        """Make ``profiler`` see every kernel launched on its device (``record``) until it is released; one
        profiler per device, as CUPTI allows."""
        with self._locked:
            if self._profiler(profiler.device) is not None:
                raise cupti_error("cuptiRangeProfilerEnable", "CUPTI_ERROR_INVALID_OPERATION",
                                  f"a range profiler is already enabled on device {profiler.device}")
            self._profilers[profiler.device] = weakref.ref(profiler)

    # the launch recorder's hook (testing/profiler.py's RecordingMachine) -------------------------------------
    @property
    def subscriber(self) -> Optional[FakeLaunchRecorder]:
        """The launch recorder holding CUPTI's callbacks now, if any."""
        return None if self._subscriber is None else self._subscriber()

    def subscribe(self, recorder: FakeLaunchRecorder, on: bool) -> None:
        """Make ``recorder`` the process's CUPTI subscriber (``on``) or release it; one at a time, as CUPTI allows."""
        with self._locked:
            if not on:
                if self.subscriber is recorder:
                    self._subscriber = None
                return
            if self.subscriber is not None:
                raise cupti_error("cuptiSubscribe", "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
                                  "another subscriber holds CUPTI's callbacks")
            self._subscriber = weakref.ref(recorder)

    # execution ---------------------------------------------------------------------------------------
    def _launch(self, device: int, stream: int, launch: KernelLaunch) -> Any:
        """Run (or capture) a kernel on ``stream`` of ``device``; returns what the launcher returns."""
        self._device(device)
        st = self._stream(stream, f"launch of {launch.name}")
        if st.device != device:
            raise cuda_error(f"launch of {launch.name}", "cudaErrorInvalidResourceHandle",
                             f"stream 0x{stream:x} is on device {st.device}, the launch on device {device}")
        recorder = self.subscriber
        if recorder is not None:  # CUPTI sees the launch call, captured or not
            recorder.record(launch.name, stream, device, launch.args)
        capture = self._captures.get(stream)
        if capture is not None:
            if launch.synchronous:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            node = _Node(_handle(), "kernel", launch=launch, device=device)
            self.node_windows[node.handle] = self.windows.get(st.handle) or EMPTY_WINDOW
            capture.nodes.append(node)
            return launch.result
        value = self._execute(launch, st, self.windows.get(st.handle))
        if launch.synchronous:
            self._host_waits(device, st.clock)
        return value if launch.synchronous else launch.result

    def _execute(self, launch: KernelLaunch, st: _Stream, window: Optional[AccessPolicyWindow]) -> Any:
        """Run a kernel and advance ``st``'s clock by the model's duration of it under ``window``."""
        try:
            value = launch.run()
        except MemoryFault as exc:
            name = "cudaErrorMisalignedAddress" if isinstance(exc, Misaligned) else "cudaErrorIllegalAddress"
            raise cuda_error(f"launch of {launch.name}", name, str(exc)) from None
        traffic, device, model = launch.traffic, st.device, self.models[st.device]
        start = max(st.clock, self._host_now[device])
        profiler = self._profiler(device)
        if profiler is not None and not profiler.running:
            profiler = None
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
        st.last = LaunchRecord(traffic.name, device, st.handle, start, duration, usable, est)
        self.kernel_log.append(st.last)
        return value

    def _advance(self, st: _Stream, ms: float) -> None:
        st.clock = max(st.clock, self._host_now[st.device]) + ms

    def _on_memory(self, call: str, access: Callable[[], None]) -> None:
        """``access`` to device memory; one outside every allocation fails as CUDA's ``call`` does."""
        try:
            access()
        except MemoryFault as exc:
            raise cuda_error(call, "cudaErrorInvalidValue", str(exc)) from None

    # =====================================================================================================
    # The Backend contract
    # =====================================================================================================

    # devices and the set-aside ---------------------------------------------------------------------------
    def device_count(self) -> int:
        if self._announcement is not None:
            self._say_announcement()
        return len(self.devices)

    def device_count_error(self) -> str:
        return "" if self.devices else self._no_device_reason or "cudaErrorNoDevice: no CUDA-capable device is detected"

    def current_device(self) -> int:
        with self._locked:
            self._require_devices("cudaGetDevice(&device)")
            return self.current

    def device_properties(self, device: int) -> dict[str, Any]:
        if self._announcement is not None:
            self._say_announcement()
        with self._locked:
            d = self._device(device, "cudaGetDeviceProperties(&prop, device)")
            self.calls.append("cudaGetDeviceProperties")
            names = ("name", "major", "minor", "multiprocessor_count", "l2_cache_size", "persisting_l2_cache_max_size",
                     "access_policy_max_window_size", "total_global_memory", "memory_bus_width")
            return {"index": device, **{n: getattr(d, n) for n in names},
                    "pci_bus_id": f"0000:{0x18 + 0x10 * device:02x}:00.0", "uuid": d.uuid(device)}

    def driver_version(self) -> int:
        return 13000

    def runtime_version(self) -> int:
        # The runtime this build of l2ctl links (statically): a simulated GPU runs the same one, so a CUDA 12 build
        # says 12.x here as versions(), records and the CLI's header do (the driver above stays 13.0's).
        return int(_core.runtime_version())

    def device_synchronize(self, device: int) -> None:
        with self._locked:
            self._device(device, "cudaDeviceSynchronize()")
            for handle, capture in list(self._captures.items()):
                st = self._stream(handle, "cudaDeviceSynchronize()")
                if st.device == device and capture.forbids_unsafe_calls():
                    raise self._capture_violation(handle, "cudaDeviceSynchronize()")
            self._host_waits(device, max([s.clock for s in self._device_streams(device)] + [0.0]))

    # streams, windows, events, batched state ------------------------------------------------------------
    def Stream(self, device: int, non_blocking: bool = True, priority: int = 0) -> FakeStream:
        return FakeStream(self, device, non_blocking, priority)

    def stream_context(self, stream: int) -> tuple[int, int]:
        with self._locked:
            st = self._stream(stream, "cuStreamGetCtx(stream, &context)")
            primary = self.primary_contexts[st.device]
            return (st.context or primary, primary)

    def pointer_context(self, ptr: int) -> tuple[int, int]:
        with self._locked:
            alloc = self.memory.find(int(ptr))
            if alloc is None:
                return (0, 0)
            primary = self.primary_contexts[alloc.device]
            return (self._pointer_contexts.get(alloc.base, primary), primary)

    def stream_device(self, stream: int) -> int:
        with self._locked:
            self.calls.append("cudaStreamGetDevice")
            return self._stream(stream, "cudaStreamGetDevice(stream, &device)").device

    def stream_synchronize(self, stream: int) -> None:
        with self._locked:
            st = self._stream(stream, "cudaStreamSynchronize(stream)")
            if stream in self._captures:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            self._host_waits(st.device, st.clock)

    def Event(self, device: int = -1) -> FakeEvent:
        return FakeEvent(self, device)

    # memory -----------------------------------------------------------------------------------------------
    def DeviceMemory(self, device: int, nbytes: int) -> FakeDeviceMemory:
        return FakeDeviceMemory(self, device, nbytes)

    def pointer_info(self, ptr: int) -> tuple[int, int, int, int]:
        with self._locked:
            self._require_devices("cudaPointerGetAttributes(&attributes, ptr)")
            self.calls.append("cudaPointerGetAttributes")
            alloc: Optional[Allocation] = self.memory.find(int(ptr))
            if alloc is None:
                return (0, -2, 0, 0)  # cudaMemoryTypeUnregistered: host memory CUDA does not know
            return (2, alloc.device, alloc.base, alloc.size)

    def _host_copy(self, call: str, stream: int, nbytes: int, copy: Callable[[], None]) -> None:
        """A cudaMemcpyAsync to or from the host: the host waits for it, so no capture may hold it."""
        with self._locked:
            st = self._stream(stream, call)
            self.calls.append("cudaMemcpyAsync")
            if stream in self._captures:
                raise self._capture_violation(stream, "cudaStreamSynchronize(stream)")
            self._on_memory(call, copy)
            self._advance(st, self.models[st.device].transfer_ms(nbytes, host=True))
            self._host_waits(st.device, st.clock)

    def copy_host_to_device(self, dst: int, src: np.ndarray[Any, Any], stream: int) -> None:
        host = np.ascontiguousarray(src)
        self._host_copy("cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream)", stream, host.nbytes,
                        lambda: self.memory.write_array(int(dst), host))

    def copy_device_to_host(self, dst: np.ndarray[Any, Any], src: int, stream: int) -> None:
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("copy_device_to_host needs a writable, C-contiguous array")

        def copy() -> None:
            dst.reshape(-1).view(np.uint8)[:] = self.memory.read(int(src), dst.nbytes)

        self._host_copy("cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream)", stream, dst.nbytes, copy)

    def _device_op(self, call: str, stream: int, kind: str, ptrs: tuple[int, ...], access: Callable[[], None],
                   nbytes: int, write_only: bool = False) -> None:
        """A device-to-device cudaMemcpyAsync (kind "memcpy") or a cudaMemsetAsync ("memset"): done now, or
        a node of the stream's capture, its pointers checked now."""
        def run(st: _Stream) -> None:
            self._on_memory(call, access)
            self._advance(st, self.models[st.device].transfer_ms(int(nbytes), write_only=write_only))

        with self._locked:
            st = self._stream(stream, call)
            self.calls.append("cudaMemcpyAsync" if kind == "memcpy" else "cudaMemsetAsync")
            capture = self._captures.get(stream)
            if capture is None:
                run(st)
                return
            for ptr in ptrs:
                if self.memory.find(int(ptr)) is None:
                    raise cuda_error(call, "cudaErrorInvalidValue", f"0x{int(ptr):x} is not device memory")
            capture.nodes.append(_Node(_handle(), kind, action=run))

    def memset_device(self, dst: int, value: int, nbytes: int, stream: int) -> None:
        self._device_op("cudaMemsetAsync(dst, value, bytes, stream)", stream, "memset", (dst,),
                        lambda: self.memory.fill(int(dst), byte=int(value), nbytes=int(nbytes)), nbytes, True)

    # graphs ---------------------------------------------------------------------------------------------
    def Graph(self, handle: int, owned: bool) -> FakeGraph:
        return FakeGraph(self, handle, owned)

    def GraphExec(self, graph: int) -> FakeGraphExec:
        return FakeGraphExec(self, graph)

    def begin_capture(self, stream: int, mode: int) -> None:
        call = "cudaStreamBeginCapture(stream, mode)"
        with self._locked:
            self._stream(stream, call)
            self.calls.append("cudaStreamBeginCapture")
            if stream in (0, 1):
                raise cuda_error(call, "cudaErrorStreamCaptureUnsupported", "the legacy default stream")
            if stream in self._captures:
                raise cuda_error(call, "cudaErrorIllegalState", f"stream 0x{stream:x} is already capturing")
            if mode not in (0, 1, 2):
                raise cuda_error(call, "cudaErrorInvalidValue", f"mode {mode}")
            self._captures[stream] = _Capture(mode)

    def end_capture(self, stream: int) -> int:
        call = "cudaStreamEndCapture(stream, &graph)"
        with self._locked:
            st = self._stream(stream, call)
            self.calls.append("cudaStreamEndCapture")
            capture = self._captures.get(stream)
            if capture is None:
                raise cuda_error(call, "cudaErrorIllegalState", f"stream 0x{stream:x} is not capturing")
            captured = {node.handle: node for node in capture.nodes}
            if capture.invalidated:
                node_windows = {h: w for h, w in self.node_windows.items() if h not in captured}
                del self._captures[stream]  # with the windows, in one step (l2state.py)
                self.node_windows = node_windows
                raise cuda_error(call, "cudaErrorStreamCaptureInvalidated",
                                 f"stream 0x{stream:x}: {capture.invalidated} during the capture")
            handle = _handle()
            graph = _Graph(st.device, list(capture.nodes))
            nodes = {**self._nodes, **captured}
            self._graphs[handle] = graph  # the change in one step, the insert that may allocate first (l2state.py)
            del self._captures[stream]
            self._nodes = nodes
            return handle

    def is_capturing(self, stream: int) -> bool:
        with self._locked:
            self._stream(stream, "cudaStreamIsCapturing(stream, &status)")
            self.calls.append("cudaStreamIsCapturing")
            return stream in self._captures

    def graph_node_count(self, graph: int) -> int:
        with self._locked:
            return len(self._graph(graph, "cudaGraphGetNodes(graph, nullptr, &count)").nodes)

    def graph_kernel_nodes(self, graph: int) -> list[tuple[int, str, tuple[int, int, int], tuple[int, int, int]]]:
        with self._locked:
            g = self._graph(graph, "cudaGraphGetNodes(graph, nullptr, &count)")
            return [(n.handle, n.launch.name, (n.launch.blocks, 1, 1), (n.launch.threads, 1, 1)) for n in g.nodes
                    if n.kind == "kernel" and n.launch is not None]

    def kernel_node_words(self, node: int) -> list[tuple[int, int, int]]:
        """(parameter, offset, value) of the node's pointer arguments, as the driver reads them."""
        with self._locked:
            n = self._node(node, "cuGraphKernelNodeGetParams(node, &params)")
            return [(i, 0, ptr) for i, ptr in enumerate(n.launch.args if n.launch is not None else ()) if ptr]

    def address_range(self, address: int) -> tuple[int, int]:
        """(base, size) of the allocation holding ``address`` (cuMemGetAddressRange); (0, 0) outside any."""
        with self._locked:
            alloc: Optional[Allocation] = self.memory.find(int(address))
            return (0, 0) if alloc is None else (alloc.base, alloc.size)

    def _node(self, node: int, call: str) -> _Node:
        n = self._nodes.get(node)
        if n is None or n.kind != "kernel":
            raise cuda_error(call, "cudaErrorInvalidValue", f"kernel node 0x{node:x}")
        return n

    # hardware counters -------------------------------------------------------------------------------------
    def cupti_load(self, path: str) -> None:
        with self._locked:
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

    def LaunchRecorder(self, max_launches: int) -> FakeLaunchRecorder:
        return FakeLaunchRecorder(self, max_launches)

    # kernels -------------------------------------------------------------------------------------------------
    def load_kernels(self, device: int, nvrtc: list[str], cache_dir: str) -> dict[str, Any]:
        """What l2ctl.kernels.compile_info() reports: the simulator runs the kernels itself and compiles nothing
        (no NVRTC is looked for)."""
        with self._locked:
            d = self._device(device, "cuLibraryLoadData(&library, image, ...)")
            return {"arch": d.major * 10 + d.minor, "image": "simulated", "source": "simulated", "seconds": 0.0,
                    "cache_file": "", "cache_note": "the simulator runs the kernels itself", "nvrtc": "",
                    "nvrtc_version": ""}

    def kernel_image(self, arch: int, ptx: bool, nvrtc: list[str], cache_dir: str) -> tuple[bytes, dict[str, Any]]:
        raise NotSupportedError("the simulator compiles no kernels (it runs them itself): l2ctl._core.kernel_image "
                                "compiles them with NVRTC, on any machine")

    def _run_kernel(self, device: int, stream: int, make: Callable[[Kernels], KernelLaunch]) -> Any:
        """Launch the kernel ``make`` builds from ``device``'s kernels; what its launcher returns."""
        with self._locked:
            self._device(device)
            return self._launch(device, stream, make(self._kernels[device]))

    def reset_data(self, device: int, stream: int, out: int, out_len: int, lut: int, lut_len: int, variant: int,
                   blocks_per_sm: int = 0) -> tuple[int, int, bool, bool]:
        return cast(tuple[int, int, bool, bool], self._run_kernel(
            device, stream, lambda k: k.reset_data(out, out_len, lut, lut_len, int(variant), int(blocks_per_sm))))

    def reset_data_verify(self, device: int, stream: int, out: int, out_len: int, lut: int, lut_len: int) -> int:
        return int(self._run_kernel(device, stream, lambda k: k.reset_data_verify(out, out_len, lut, lut_len)))

    def write_index(self, device: int, stream: int, buf: int, len: int) -> None:
        self._run_kernel(device, stream, lambda k: k.write_index(buf, len))

    def count_index_mismatches(self, device: int, stream: int, buf: int, len: int) -> int:
        return int(self._run_kernel(device, stream, lambda k: k.count_index_mismatches(buf, len)))

    def copy_words(self, device: int, stream: int, dst: int, src: int, len: int) -> None:
        self._run_kernel(device, stream, lambda k: k.copy_words(dst, src, len))

    def count_mismatches(self, device: int, stream: int, a: int, b: int, len: int) -> int:
        return int(self._run_kernel(device, stream, lambda k: k.count_mismatches(a, b, len)))

    def read_sum(self, device: int, stream: int, buf: int, len: int, partials: int) -> int:
        return int(self._run_kernel(device, stream, lambda k: k.read_sum(buf, len, partials)))

    def max_read_partials(self, device: int) -> int:
        with self._locked:
            self._device(device)
            return self._kernels[device].max_read_partials()

    def stride_read(self, device: int, stream: int, buf: int, threads: int, stride_words: int, partials: int,
                    block_threads: int = 256) -> int:
        return int(self._run_kernel(device, stream,
                                    lambda k: k.stride_read(buf, threads, stride_words, partials, block_threads)))

    def sum_u64(self, device: int, stream: int, values: int, count: int) -> int:
        return int(self._run_kernel(device, stream, lambda k: k.sum_u64(values, count)))

    def sparse_vector(self, device: int, stream: int, values: int, indices: int, dense: int, dense_len: int,
                      result: int, len: int, streaming: bool) -> None:
        self._run_kernel(device, stream,
                         lambda k: k.sparse_vector(values, indices, dense, dense_len, result, len, bool(streaming)))

    def stream_analysis(self, device: int, stream: int, data: int, categories: int, weights: int, weights_len: int,
                        results: int, len: int, streaming: bool) -> None:
        self._run_kernel(device, stream, lambda k: k.stream_analysis(data, categories, weights, weights_len, results,
                                                                     len, bool(streaming)))
