"""The simulated device's L2 state as the planner changes it: the set-aside limit, access-policy windows on
streams and graph kernel nodes, resets of persisting lines, and the planner's batch (``apply_batch``) with its
journal. The simulator's implementation of the planner's calls (``planner::Calls``, src/l2ctl/planner.hpp: the
contract's single calls and ``apply_batch``, which src/backend_calls.cpp forwards to). One concern of FakeBackend,
which inherits it (backend.py holds the machine's other parts: streams, memory, graphs, execution, counters).

Every call is atomic, as a driver call is (docs/DESIGN.md, "The backend contract"): it checks its arguments and
computes the whole change first, touching nothing, then makes it in one step (``_commit``), journal entry first."""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, Optional, Sequence

import numpy as np

from .._errors import CudaError
from .._window import AccessPolicyWindow, AccessProperty
from .devices import FakeDevice
from .errors import cuda_error
from .model import DeviceModel

__all__ = ["L2State", "EMPTY_WINDOW"]

EMPTY_WINDOW = AccessPolicyWindow()
Change = tuple[int, int, AccessPolicyWindow]  # (kind: 0 a stream, 1 a kernel node; its handle; its window)
_Applied = tuple[int, int, list[AccessPolicyWindow]]  # a batch's result: limit before, limit after, previous windows
_Windows = dict[int, AccessPolicyWindow]
_PROPERTIES = tuple(AccessProperty)  # by value
_SET_STREAM_WINDOW = "cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)"
_SET_NODE_WINDOW = "cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value)"
_SET_CALLS = ("cudaStreamSetAttribute", "cudaGraphKernelNodeSetAttribute")  # by kind: streams, kernel nodes


@functools.lru_cache(maxsize=4096)
def _float32(x: float) -> float:
    """x rounded to float32, as CUDA stores a hit ratio; a scope's few ratios recur, so they are remembered."""
    return float(np.float32(x))


class L2State:
    """The limit, the windows and the batches of FakeBackend's devices (see the module's docstring)."""

    # The machine's parts this concern reads and writes (FakeBackend makes them in its __init__).
    devices: list[FakeDevice]
    models: list[DeviceModel]
    calls: list[str]
    windows: _Windows
    node_windows: _Windows
    _streams: dict[int, Any]

    # FakeBackend's lookups and lock (defined there).
    _device: Callable[..., FakeDevice]
    _stream: Callable[[int, str], Any]
    _node: Callable[[int, str], Any]

    @property
    def _locked(self) -> ContextManager[Any]:
        raise NotImplementedError

    def get_persisting_limit(self, device: int) -> int:
        with self._locked:
            return self._read_limit(device, self._device(device))

    def _read_limit(self, device: int, d: FakeDevice) -> int:
        self.calls.append("cudaDeviceGetLimit")
        if d.major < 8:
            raise cuda_error("cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize)",
                             "cudaErrorUnsupportedLimit", f"device {device}")
        return d.limit

    def set_persisting_limit(self, device: int, nbytes: int) -> int:
        with self._locked:
            granted = self._granted_limit(device, self._device(device), nbytes)
            self._commit(None, None, device, granted)
            return granted

    def _granted_limit(self, device: int, d: FakeDevice, nbytes: int) -> int:
        """The limit the driver keeps for a request of ``nbytes`` (rounded up to its granularity); CUDA's error
        for a request it refuses."""
        self.calls.append("cudaDeviceSetLimit")
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
        return min(d.persisting_l2_cache_max_size, -(-int(nbytes) // d.granularity) * d.granularity)

    def reset_persisting_lines(self, device: int) -> None:
        with self._locked:
            self._device(device)
            self.calls.append("cudaCtxResetPersistingL2Cache")
            self._commit(None, None, device, None, True)

    def get_stream_window(self, stream: int) -> AccessPolicyWindow:
        with self._locked:
            return self._read_window(0, stream, self.windows)

    def get_node_window(self, node: int) -> AccessPolicyWindow:
        with self._locked:
            return self._read_window(1, node, self.node_windows)

    def _read_window(self, kind: int, handle: int, windows: _Windows) -> AccessPolicyWindow:
        """The window of a stream (kind 0; a special one is made on first use) or a kernel node (1) in
        ``windows``; CUDA's error for a handle it does not know."""
        if kind == 0:
            if handle not in self._streams:
                self._stream(handle, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)")
            self.calls.append("cudaStreamGetAttribute")
        else:
            self.calls.append("cudaGraphKernelNodeGetAttribute")
            if handle not in windows:
                self._node(handle, "cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, "
                                   "&value)")
        return windows.get(handle, EMPTY_WINDOW)

    def _window_batch(self, kind: int, handle: int, w: tuple[int, int, float, int, int], read_previous: bool,
                      journal: Optional[list[Any]]) -> _Applied:
        """One window on one stream (kind 0) or kernel node (1), read first when ``read_previous``: the commonest
        call (a lean scope's entry and exit). A failure leaves the window as it was, as in C++."""
        with self._locked:
            tables = [self.windows, self.node_windows]
            previous = [self._read_window(kind, handle, tables[kind])] if read_previous else []
            tables[kind] = self._put_window(kind, dict(tables[kind]), handle, w)
            result = (-1, -1, previous)
            self._commit(journal, result, 0, None, False, *tables)
            return result

    def _put_window(self, kind: int, windows: _Windows, handle: int, w: tuple[int, int, float, int, int]) -> _Windows:
        """``windows`` (a copy, changed in place) with the window of a stream (kind 0) or kernel node (1) set as
        CUDA sets it; CUDA's error for a window or handle it refuses."""
        if kind == 0:
            st = self._streams.get(handle) or self._stream(handle, _SET_STREAM_WINDOW)
            self.calls.append(_SET_CALLS[0])
            if st.context:  # the runtime works in the primary context: a stream of another one is not its handle
                raise cuda_error(_SET_STREAM_WINDOW, "cudaErrorInvalidResourceHandle",
                                 f"stream 0x{handle:x} belongs to context 0x{st.context:x}")
            call, what, device = _SET_STREAM_WINDOW, "stream", st.device
        else:
            self.calls.append(_SET_CALLS[1])
            call, what, device = _SET_NODE_WINDOW, "kernel node", self._node(handle, _SET_NODE_WINDOW).device
        base, num_bytes, hit_ratio, hit_prop, miss_prop = w
        ratio = _float32(hit_ratio)
        if (not 0.0 <= ratio <= 1.0 or num_bytes > self.devices[device].access_policy_max_window_size
                or num_bytes < 0 or hit_prop not in (0, 1, 2) or miss_prop not in (0, 1)):
            raise cuda_error(call, "cudaErrorInvalidValue",
                             f"{what} 0x{handle:x}, num_bytes {num_bytes}, hitRatio {hit_ratio}, hitProp {hit_prop}, "
                             f"missProp {miss_prop}")
        if num_bytes == 0 and kind == 0:  # a stream's empty window is no window; a node keeps its attribute
            windows.pop(handle, None)
        else:
            windows[handle] = AccessPolicyWindow(int(base), int(num_bytes), ratio, _PROPERTIES[hit_prop],
                                                 _PROPERTIES[miss_prop])
        return windows

    def apply_batch(self, device: int, limit: int, at_least: bool, reset_lines: bool, read_previous: bool,
                    changes: Sequence[Change], journal: Optional[list[Any]] = None) -> _Applied:
        """The planner's batch (``planner::Calls::apply_batch``): the limit when ``limit`` >= 0 (``at_least``: only
        raised), the windows in order (``changes``: (kind, handle, window), streams first), each read first when
        ``read_previous``, then a reset of persisting lines. Returns (limit before, limit after, previous windows),
        appended to ``journal`` as the device changes (see the module's docstring). A failing call puts back the
        limit and the windows whose previous value was read, then raises (src/l2ctl/state.hpp): here it makes only
        the change that leaves."""
        if len(changes) == 1 and changes[0][0] == 0 and limit < 0 and not reset_lines:
            return self._window_batch(0, changes[0][1], changes[0][2], read_previous, journal)
        with self._locked:
            d = self._device(device)
            tables = [self.windows, self.node_windows]
            copied = [False, False]
            previous: list[AccessPolicyWindow] = []
            before = after = -1
            set_calls: list[str] = []  # the set calls made, each put back by a call of the same name on a failure
            try:
                if limit >= 0:
                    before = after = self._read_limit(device, d)
                    if (before < limit) if at_least else (before != limit):
                        after = self._granted_limit(device, d, limit)
                for kind, handle, w in changes:  # the common case, without the public calls' lock and checks
                    if not copied[kind]:
                        tables[kind], copied[kind] = dict(tables[kind]), True
                    if read_previous:
                        previous.append(self._read_window(kind, handle, tables[kind]))
                    self._put_window(kind, tables[kind], handle, w)
                    set_calls.append(_SET_CALLS[kind])
                if reset_lines:
                    self.calls.append("cudaCtxResetPersistingL2Cache")
            except CudaError:
                if read_previous:  # every window set is put back
                    self.calls += set_calls
                    tables = [self.windows, self.node_windows]
                if after != before:
                    self.calls.append("cudaDeviceSetLimit")
                self._commit(None, None, device, None, False, *tables)
                raise
            result = (before, after, previous)
            self._commit(journal, result, device, after if after != before else None, reset_lines, *tables)
            return result

    def _commit(self, journal: Optional[list[Any]], result: Any, device: int, limit: Optional[int] = None,
                reset_lines: bool = False, windows: Optional[_Windows] = None,
                node_windows: Optional[_Windows] = None) -> None:
        """A call's change, computed whole, made in one step (see the module's docstring): the result appended to
        ``journal`` (the one allocation, while nothing has changed), then stores of what was computed, with no
        call, loop or allocation among them. ``device``: the device of the limit and the reset."""
        d: Optional[FakeDevice] = None
        if limit is not None or reset_lines:
            d, model = self.devices[device], self.models[device]
            persisted = {} if reset_lines else model.persisted_within(limit or 0)
            new_limit, resets = d.limit if limit is None else limit, d.resets + reset_lines
        if journal is not None:
            journal += (result,)  # in place, without a call: no interrupt lands between it and the stores
        if d is not None:
            model.persisted = persisted
            d.limit = new_limit
            d.resets = resets
        if windows is not None:
            self.windows = windows
        if node_windows is not None:
            self.node_windows = node_windows
