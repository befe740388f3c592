"""The simulated device's L2 state as the planner changes it: the set-aside limit, access-policy windows on
streams and graph kernel nodes, resets of persisting lines, and the batches (``apply_window``,
``apply_state``) with their journal and, for the attack tests (``atomic_calls``), signals held as for a call
into C. One concern of FakeBackend, which inherits it (backend.py holds the machine's other parts: streams,
memory, graphs, execution, counters)."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Sequence

import numpy as np

from .._errors import CudaError
from .devices import FakeDevice
from .errors import cuda_error
from .model import DeviceModel

__all__ = ["L2State", "WindowTuple", "EMPTY_WINDOW"]

WindowTuple = tuple[int, int, float, int, int]
EMPTY_WINDOW: WindowTuple = (0, 0, 0.0, 0, 0)
_Applied = tuple[int, int, list[WindowTuple]]  # apply_state's result: limit before, limit after, previous windows
_SET_STREAM_WINDOW = "cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)"


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
    windows: dict[int, WindowTuple]
    node_windows: dict[int, WindowTuple]
    atomic_calls: bool
    _streams: dict[int, Any]
    _graphs: dict[int, Any]
    _node_graph: dict[int, int]
    _locked: ContextManager[None]

    if TYPE_CHECKING:  # FakeBackend's lookups, as the type checker sees them (defined there)
        def _device(self, index: int, call: str = "cudaSetDevice(device)") -> FakeDevice:
            raise NotImplementedError

        def _stream(self, handle: int, call: str) -> Any:
            raise NotImplementedError

        def _node(self, handle: int, call: str) -> Any:
            raise NotImplementedError

    def get_persisting_limit(self, device: int) -> int:
        with self._locked:
            d = self._device(device)
            self.calls.append("cudaDeviceGetLimit")
            if d.major < 8:
                raise cuda_error("cudaDeviceGetLimit(&value, cudaLimitPersistingL2CacheSize)",
                                 "cudaErrorUnsupportedLimit", f"device {device}")
            return d.limit

    def set_persisting_limit(self, device: int, nbytes: int) -> int:
        with self._locked:
            d = self._device(device)
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
            d.limit = min(d.persisting_l2_cache_max_size, -(-int(nbytes) // d.granularity) * d.granularity)
            self.models[device].limit_changed(d.limit)
            return d.limit

    def reset_persisting_lines(self, device: int) -> None:
        with self._locked:
            d = self._device(device)
            self.calls.append("cudaCtxResetPersistingL2Cache")
            d.resets += 1
            self.models[device].reset_persisting()

    def get_stream_window(self, stream: int) -> WindowTuple:
        with self._locked:
            self._stream(stream, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)")
            self.calls.append("cudaStreamGetAttribute")
            return self.windows.get(stream, EMPTY_WINDOW)

    def _window_ratio(self, call: str, device: FakeDevice, w: WindowTuple, what: str, handle: int) -> float:
        """The window's hit ratio as CUDA holds it (float32); cudaErrorInvalidValue for a window CUDA refuses."""
        _, num_bytes, hit_ratio, hit_prop, miss_prop = w
        ratio = _float32(hit_ratio)
        if (not 0.0 <= ratio <= 1.0 or num_bytes > device.access_policy_max_window_size or num_bytes < 0
                or hit_prop not in (0, 1, 2) or miss_prop not in (0, 1)):
            raise cuda_error(call, "cudaErrorInvalidValue",
                             f"{what} 0x{handle:x}, num_bytes {num_bytes}, hitRatio {hit_ratio}, hitProp {hit_prop}, "
                             f"missProp {miss_prop}")
        return ratio

    def set_stream_window(self, stream: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                          miss_prop: int) -> None:
        with self._locked:
            self._set_stream_window(stream, (base, num_bytes, hit_ratio, hit_prop, miss_prop))

    def _read_stream_window(self, stream: int) -> WindowTuple:
        if stream not in self._streams:  # a special stream (made on first use), or an unknown one (raises)
            self._stream(stream, "cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow)")
        self.calls.append("cudaStreamGetAttribute")
        return self.windows.get(stream, EMPTY_WINDOW)

    def _set_stream_window(self, stream: int, w: WindowTuple) -> None:
        st = self._streams.get(stream) or self._stream(stream, _SET_STREAM_WINDOW)
        self.calls.append("cudaStreamSetAttribute")
        if st.context:  # the runtime works in the primary context: a stream of another one is not its handle
            raise cuda_error(_SET_STREAM_WINDOW, "cudaErrorInvalidResourceHandle",
                             f"stream 0x{stream:x} belongs to context 0x{st.context:x}")
        ratio = self._window_ratio(_SET_STREAM_WINDOW, self.devices[st.device], w, "stream", stream)
        base, num_bytes, _, hit_prop, miss_prop = w
        if num_bytes == 0:
            self.windows.pop(stream, None)
        else:
            self.windows[stream] = (int(base), int(num_bytes), ratio, int(hit_prop), int(miss_prop))

    def get_node_window(self, node: int) -> WindowTuple:
        call = "cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value)"
        with self._locked:
            self.calls.append("cudaGraphKernelNodeGetAttribute")
            self._node(node, call)
            return self.node_windows.get(node, EMPTY_WINDOW)

    def set_node_window(self, node: int, base: int, num_bytes: int, hit_ratio: float, hit_prop: int,
                        miss_prop: int) -> None:
        with self._locked:
            self._set_node_window(node, (base, num_bytes, hit_ratio, hit_prop, miss_prop))

    def _set_node_window(self, node: int, w: WindowTuple) -> None:
        call = "cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value)"
        self.calls.append("cudaGraphKernelNodeSetAttribute")
        self._node(node, call)
        device = self.devices[self._graphs[self._node_graph[node]].device]
        ratio = self._window_ratio(call, device, w, "kernel node", node)
        base, num_bytes, _, hit_prop, miss_prop = w
        self.node_windows[node] = (int(base), int(num_bytes), ratio, int(hit_prop), int(miss_prop))

    def apply_window(self, device: int, kind: int, handles: Sequence[int], base: int, num_bytes: int,
                     hit_ratio: float, hit_prop: int, miss_prop: int, read_previous: bool, limit: int,
                     at_least: bool, reset_lines: bool,
                     journal: Optional[list[Any]] = None) -> tuple[int, int, list[WindowTuple]]:
        """One window on every handle (kind 0: streams, 1: kernel nodes), with apply_state's limit and reset;
        the result is appended to ``journal`` before the call returns (atomically, as the C++ call does:
        see ``atomic_calls``)."""
        if not self.atomic_calls:  # the commonest path, without the journal's wrapper (a scope crosses here twice)
            result = self._apply_window(device, kind, handles, base, num_bytes, hit_ratio, hit_prop, miss_prop,
                                        read_previous, limit, at_least, reset_lines)
            if journal is not None:
                journal.append(result)
            return result
        return self._journaled(journal, lambda: self._apply_window(
            device, kind, handles, base, num_bytes, hit_ratio, hit_prop, miss_prop, read_previous, limit, at_least,
            reset_lines))

    def _apply_window(self, device: int, kind: int, handles: Sequence[int], base: int, num_bytes: int,
                      hit_ratio: float, hit_prop: int, miss_prop: int, read_previous: bool, limit: int,
                      at_least: bool, reset_lines: bool) -> _Applied:
        w: WindowTuple = (base, num_bytes, hit_ratio, hit_prop, miss_prop)
        if kind == 0 and limit < 0 and not reset_lines and len(handles) == 1:
            # The commonest call (a lean scope's entry or exit). A failure leaves the window as it was, as in C++.
            with self._locked:
                previous = [self._read_stream_window(handles[0])] if read_previous else []
                self._set_stream_window(handles[0], w)
                return -1, -1, previous
        changes = [(h, w) for h in handles]
        return self._apply_state(device, limit, at_least, changes if kind == 0 else [], changes if kind != 0 else [],
                                 reset_lines, read_previous)

    def apply_state(self, device: int, limit: int, at_least: bool, stream_windows: Sequence[tuple[int, WindowTuple]],
                    node_windows: Sequence[tuple[int, WindowTuple]], reset_lines: bool, read_previous: bool,
                    journal: Optional[list[Any]] = None) -> _Applied:
        """The limit when ``limit`` >= 0 (``at_least``: only raised), the windows (streams, then kernel
        nodes), each read first when ``read_previous``, then a reset of persisting lines. Returns (limit
        before, limit after, previous windows), appended to ``journal`` first. A failing call puts back the
        limit and the windows whose previous value was read, then raises (src/l2ctl/state.hpp)."""
        return self._journaled(journal, lambda: self._apply_state(device, limit, at_least, stream_windows,
                                                                  node_windows, reset_lines, read_previous))

    def _journaled(self, journal: Optional[list[Any]], apply: Callable[[], _Applied]) -> _Applied:
        with self._signals_held() if self.atomic_calls else contextlib.nullcontext():
            result = apply()
            if journal is not None:
                journal.append(result)
            return result

    @contextlib.contextmanager
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
        # The mask holds back signals for this thread only: one sent to the process can still be caught by another
        # thread, and CPython then runs its handler here, at the next bytecode. So the handlers themselves are
        # held too: for the call they only note the signal, which is delivered to the real handler when it returns.
        caught: list[int] = []
        handlers: dict[int, Any] = {}
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            for valid in signal.valid_signals():
                handler = signal.getsignal(valid)
                if callable(handler):
                    handlers[int(valid)] = handler
                    signal.signal(valid, lambda number, frame: caught.append(number))
            yield
        finally:
            # The mask first, while every handler still only notes its signal (nothing can raise here): a
            # handler restored first could run, raise, and leave this thread with every signal blocked, and a
            # timer's signal pending until a default action kills the process.
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            error: Optional[BaseException] = None
            for number, handler in handlers.items():
                while True:  # a handler restored before this one may run here and raise: restore them all
                    try:
                        signal.signal(number, handler)
                        break
                    except BaseException as exc:  # noqa: B036 - re-raised below, after every handler is back
                        error = error or exc
            if error is not None:
                try:
                    raise error
                finally:
                    # The frame must not keep the exception whose traceback holds it: that cycle would keep the
                    # interrupted code's objects (a started scope) alive until the cycle collector runs.
                    error = None
            for number in caught:
                handlers[number](number, None)

    def _apply_state(self, device: int, limit: int, at_least: bool, stream_windows: Sequence[tuple[int, WindowTuple]],
                     node_windows: Sequence[tuple[int, WindowTuple]], reset_lines: bool,
                     read_previous: bool) -> _Applied:
        with self._locked:
            self._device(device)
            previous: list[WindowTuple] = []
            before = after = -1
            changed: list[tuple[bool, int]] = []  # (is a stream, handle) in the order applied
            try:
                if limit >= 0:
                    before = after = self.get_persisting_limit(device)
                    if (before < limit) if at_least else (before != limit):
                        after = self.set_persisting_limit(device, limit)
                for handle, w in stream_windows:  # the common case, without the public calls' lock and checks
                    if read_previous:
                        previous.append(self._read_stream_window(handle))
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
