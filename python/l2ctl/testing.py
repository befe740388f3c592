"""A simulated CUDA backend for testing code that uses l2ctl on machines without a GPU.

    from l2ctl.testing import FakeBackend, FakeDevice
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        with l2ctl.persist(l2ctl.Stream(), l2ctl.DeviceBuffer(1 << 20)):
            ...
        assert fake.device(0).limit == fake.device(0).initial_limit

It keeps the state CUDA keeps (limit, windows per stream, allocations with their bytes, persisting
line resets) and reproduces the behaviour measured on an H100: the limit is rounded up to multiples
of max/10, a limit above the max, a window above accessPolicyMaxWindowSize and a float32 hit ratio
outside [0, 1] fail with cudaErrorInvalidValue. It can also play a pre-Ampere GPU, a MIG instance
(max 0) and an MPS client (setting the limit fails with cudaErrorNotSupported).
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from . import _backend
from ._errors import CudaError

__all__ = ["FakeDevice", "FakeBackend"]

_ERRORS = {
    "cudaErrorInvalidValue": 1,
    "cudaErrorInvalidDevice": 101,
    "cudaErrorUnsupportedLimit": 215,
    "cudaErrorInvalidResourceHandle": 400,
    "cudaErrorNotSupported": 801,
}

MiB = 1 << 20


def _fail(call: str, name: str, details: str = "") -> CudaError:
    return CudaError(call, _ERRORS[name], name, f"simulated {name}", details)


@dataclass
class FakeDevice:
    name: str = "Fake H100"
    major: int = 9
    minor: int = 0
    multiprocessor_count: int = 132
    l2_cache_size: int = 50 * MiB
    persisting_l2_cache_max_size: int = 32_768_000
    access_policy_max_window_size: int = 128 * MiB
    initial_limit: int = 9_830_400
    mps: bool = False
    total_global_memory: int = 80 * 1024 * MiB
    limit: int = field(init=False)
    resets: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.limit = self.initial_limit

    @property
    def granularity(self) -> int:
        return max(1, self.persisting_l2_cache_max_size // 10)

    @classmethod
    def h100(cls) -> "FakeDevice":
        return cls()

    @classmethod
    def turing(cls) -> "FakeDevice":
        return cls(name="Fake T4", major=7, minor=5, l2_cache_size=4 * MiB, persisting_l2_cache_max_size=0,
                   access_policy_max_window_size=0, initial_limit=0)

    @classmethod
    def mig(cls) -> "FakeDevice":
        return cls(name="Fake H100 MIG 1g.10gb", persisting_l2_cache_max_size=0, initial_limit=0)

    @classmethod
    def mps_client(cls) -> "FakeDevice":
        return cls(name="Fake H100 (MPS client)", mps=True)


class FakeBackend:
    """Implements the functions of ``l2ctl._core`` that the control API uses."""

    def __init__(self, *devices: FakeDevice) -> None:
        self.devices = list(devices) if devices else [FakeDevice.h100()]
        self.current = 0
        self.calls: list[str] = []
        self.windows: dict[int, tuple] = {}
        self.stream_devices: dict[int, int] = {}
        self.allocations: dict[int, tuple[int, int, bytearray]] = {}  # ptr -> (device, nbytes, data)
        self._handles = itertools.count(0x1000, 0x100)
        self._addresses = itertools.count(0x7F00_0000_0000, 1 << 32)
        self._lock = threading.Lock()
        backend = self

        class Stream:
            def __init__(self, device: int, non_blocking: bool = True, priority: int = 0) -> None:
                backend._device(device)
                backend._record("cudaStreamCreateWithPriority")
                self._handle: Optional[int] = next(backend._handles)
                self.device = device
                backend.stream_devices[self._handle] = device

            @property
            def handle(self) -> int:
                if self._handle is None:
                    raise ValueError("the stream is closed")
                return self._handle

            @property
            def closed(self) -> bool:
                return self._handle is None

            def synchronize(self) -> None:
                _ = self.handle

            def query(self) -> bool:
                _ = self.handle
                return True

            def close(self) -> None:
                if self._handle is not None:
                    backend._record("cudaStreamDestroy")
                    backend.stream_devices.pop(self._handle, None)
                    backend.windows.pop(self._handle, None)
                    self._handle = None

        class DeviceMemory:
            def __init__(self, device: int, nbytes: int) -> None:
                backend._device(device)
                backend._record("cudaMalloc")
                self._ptr: Optional[int] = next(backend._addresses)
                self.nbytes = nbytes
                self.device = device
                backend.allocations[self._ptr] = (device, nbytes, bytearray(nbytes))

            @property
            def ptr(self) -> int:
                if self._ptr is None:
                    raise ValueError("the device buffer has been freed")
                return self._ptr

            @property
            def freed(self) -> bool:
                return self._ptr is None

            def free(self) -> None:
                if self._ptr is not None:
                    backend._record("cudaFree")
                    backend.allocations.pop(self._ptr, None)
                    self._ptr = None

        class Event:
            def record(self, stream: int) -> None:
                backend._record("cudaEventRecord")

            def wait_on(self, stream: int) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def elapsed_since(self, start: object) -> float:
                return 0.0

        class Graph:
            def __init__(self, handle: int, owned: bool) -> None:
                self._handle: Optional[int] = handle
                self.owned = owned

            @property
            def handle(self) -> int:
                if self._handle is None:
                    raise ValueError("the graph has been destroyed")
                return self._handle

            def destroy(self) -> None:
                if self._handle is not None and self.owned:
                    backend.graphs.pop(self._handle, None)
                self._handle = None

        class GraphExec:
            def __init__(self, graph: int) -> None:
                backend._record("cudaGraphInstantiate")
                self.graph = graph
                self.snapshot = [backend.node_windows[n] for n in backend.graphs[graph]]

            def launch(self, stream: int) -> None:
                backend._record("cudaGraphLaunch")
                backend.launched.append((self.graph, tuple(self.snapshot)))

            def update(self, graph: int) -> bool:
                backend._record("cudaGraphExecUpdate")
                self.snapshot = [backend.node_windows[n] for n in backend.graphs[graph]]
                return True

            def destroy(self) -> None:
                pass

        self.Graph = Graph
        self.GraphExec = GraphExec
        self.graphs: dict[int, list[int]] = {}
        self.node_windows: dict[int, tuple] = {}
        self.capturing: dict[int, list[int]] = {}
        self.launched: list[tuple] = []
        self.Stream = Stream
        self.DeviceMemory = DeviceMemory
        self.Event = Event

    # ---- helpers --------------------------------------------------------------------------------
    @classmethod
    @contextmanager
    def installed(cls, *devices: FakeDevice) -> Iterator["FakeBackend"]:
        """Create a fake backend and make l2ctl use it inside the block."""
        fake = cls(*devices)
        with _backend.use(fake):
            yield fake

    def device(self, index: int) -> FakeDevice:
        return self.devices[index]

    def _device(self, index: int) -> FakeDevice:
        if not 0 <= index < len(self.devices):
            raise _fail("cudaSetDevice(device)", "cudaErrorInvalidDevice", f"device {index}")
        return self.devices[index]

    def _record(self, call: str) -> None:
        with self._lock:
            self.calls.append(call)

    def state(self) -> tuple:
        """Everything l2ctl may change, for before/after comparisons."""
        return (tuple(d.limit for d in self.devices), tuple(sorted(self.windows.items())),
                tuple(sorted(self.node_windows.items())))

    # ---- the _core interface ------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self.devices)

    def device_count_error(self) -> str:
        return "" if self.devices else "cudaErrorNoDevice: simulated, no device"

    def current_device(self) -> int:
        if not self.devices:
            raise _fail("cudaGetDevice(&device)", "cudaErrorInvalidDevice")
        return self.current

    def device_properties(self, device: int) -> dict:
        d = self._device(device)
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
            "memory_bus_width": 5120,
            "pci_bus_id": f"0000:{device:02x}:00.0",
            "uuid": f"GPU-fake-{device}",
        }

    def get_persisting_limit(self, device: int) -> int:
        d = self._device(device)
        self._record("cudaDeviceGetLimit")
        return d.limit

    def set_persisting_limit(self, device: int, nbytes: int) -> int:
        d = self._device(device)
        self._record("cudaDeviceSetLimit")
        call = "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes)"
        if d.major < 8:
            raise _fail(call, "cudaErrorUnsupportedLimit", f"device {device}")
        if d.mps:
            raise _fail(call, "cudaErrorNotSupported", f"device {device}")
        if nbytes > d.persisting_l2_cache_max_size:
            raise _fail(call, "cudaErrorInvalidValue", f"device {device}, requested {nbytes} bytes")
        d.limit = -(-nbytes // d.granularity) * d.granularity  # rounded up, as an H100 does
        return d.limit

    def reset_persisting_lines(self, device: int) -> None:
        d = self._device(device)
        self._record("cudaCtxResetPersistingL2Cache")
        d.resets += 1

    def driver_version(self) -> int:
        return 13000

    def runtime_version(self) -> int:
        return 13000

    def device_synchronize(self, device: int) -> None:
        self._device(device)

    def stream_device(self, handle: int) -> int:
        self._record("cudaStreamGetDevice")
        if handle <= 2:
            return self.current
        if handle not in self.stream_devices:
            raise _fail("cudaStreamGetDevice(stream, &device)", "cudaErrorInvalidResourceHandle", f"stream {handle:#x}")
        return self.stream_devices[handle]

    def stream_synchronize(self, handle: int) -> None:
        self.stream_device(handle)

    def get_stream_window(self, handle: int) -> tuple:
        self.stream_device(handle)
        self._record("cudaStreamGetAttribute")
        return self.windows.get(handle, (0, 0, 0.0, 0, 0))

    def set_stream_window(self, handle: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                          miss_prop: int) -> None:
        device = self._device(self.stream_device(handle))
        self._record("cudaStreamSetAttribute")
        ratio = float(np.float32(hit_ratio))
        if not 0.0 <= ratio <= 1.0 or num_bytes > device.access_policy_max_window_size or miss_prop == 2:
            raise _fail("cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)",
                        "cudaErrorInvalidValue", f"num_bytes {num_bytes}, hitRatio {hit_ratio}")
        if num_bytes == 0:
            self.windows.pop(handle, None)
        else:
            self.windows[handle] = (base, num_bytes, ratio, hit_prop, miss_prop)

    def apply_state(self, device: int, limit: int, stream_windows: list, node_windows: list,
                    reset_lines: bool) -> int:
        for handle, w in stream_windows:
            self.set_stream_window(handle, *w)
        for node, w in node_windows:
            self.set_node_window(node, *w)
        granted = -1
        if limit >= 0:
            granted = self.set_persisting_limit(device, limit)
        if reset_lines:
            self.reset_persisting_lines(device)
        return granted

    # graphs: begin_capture/launch_fake_kernel/end_capture record kernel nodes; like CUDA, each node
    # starts with the window its stream had when the kernel was captured.
    def begin_capture(self, stream: int, mode: int) -> None:
        self.stream_device(stream)
        self.capturing[stream] = []

    def launch_fake_kernel(self, stream: int) -> None:
        """Stand-in for a kernel launch; inside a capture it becomes a kernel node."""
        if stream in self.capturing:
            node = next(self._handles)
            self.node_windows[node] = self.windows.get(stream, (0, 0, 0.0, 0, 0))
            self.capturing[stream].append(node)

    def end_capture(self, stream: int) -> int:
        nodes = self.capturing.pop(stream)
        handle = next(self._handles)
        self.graphs[handle] = nodes
        return handle

    def graph_node_count(self, graph: int) -> int:
        return len(self.graphs[graph])

    def graph_kernel_nodes(self, graph: int) -> list:
        return [(n, "fake_kernel", (1, 1, 1), (32, 1, 1)) for n in self.graphs[graph]]

    def get_node_window(self, node: int) -> tuple:
        return self.node_windows[node]

    def set_node_window(self, node: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                        miss_prop: int) -> None:
        self._record("cudaGraphKernelNodeSetAttribute")
        if not 0.0 <= float(np.float32(hit_ratio)) <= 1.0:
            raise _fail("cudaGraphKernelNodeSetAttribute", "cudaErrorInvalidValue", f"hitRatio {hit_ratio}")
        self.node_windows[node] = (base, num_bytes, float(np.float32(hit_ratio)), hit_prop, miss_prop)

    def pointer_info(self, ptr: int) -> tuple[int, int]:
        self._record("cudaPointerGetAttributes")
        for start, (device, nbytes, _) in self.allocations.items():
            if start <= ptr < start + nbytes:
                return (2, device, start, nbytes)
        return (0, -2, 0, 0)

    def _span(self, ptr: int, nbytes: int) -> tuple[bytearray, int]:
        for start, (_, size, data) in self.allocations.items():
            if start <= ptr and ptr + nbytes <= start + size:
                return data, ptr - start
        raise _fail("cudaMemcpyAsync", "cudaErrorInvalidValue", f"{ptr:#x}, {nbytes} bytes")

    def copy_host_to_device(self, dst: int, src: np.ndarray, stream: int) -> None:
        raw = memoryview(src).cast("B")
        data, at = self._span(dst, raw.nbytes)
        data[at:at + raw.nbytes] = raw

    def copy_device_to_host(self, dst: np.ndarray, src: int, stream: int) -> None:
        raw = memoryview(dst).cast("B")
        data, at = self._span(src, raw.nbytes)
        raw[:] = data[at:at + raw.nbytes]

    def memset_device(self, dst: int, value: int, nbytes: int, stream: int) -> None:
        data, at = self._span(dst, nbytes)
        data[at:at + nbytes] = bytes([value & 0xFF]) * nbytes
