"""A simulated CUPTI range profiler: auto ranges (one per kernel launch), kernel or user replay.

Semantics follow src/l2ctl/counters.hpp and l2ctl._counters:

- ``cupti_load(path)`` "opens" bare library names and existing files named ``libcupti*`` (unless the backend
  was made with ``cupti=False``); anything else fails with code -1.
- ``RangeProfiler(device, metrics, max_ranges, user_replay)`` needs the library loaded and at least one metric,
  all known to the model (others fail like CUPTI's host configuration); one pass per four metrics, and one
  enabled profiler per device.
- ``start()`` begins a pass. As the real profiler does, it evicts persisting L2 lines and leaves some of its
  own data dirty in L2, which the first kernels write back. Every kernel launched on the device until
  ``end_pass()`` is a range, up to ``max_ranges``.
- Kernel replay: each launch is replayed ``passes`` times (serialized and slower on the stream's clock,
  persisting lines lost and about 15 MB written back per range by the save and restore of memory), in one
  pass that ``end_pass()`` or ``stop()`` ends.
- User replay: the caller repeats its work once per pass; ``end_pass()`` returns True after the last one;
  metric i is read from pass i mod ``passes`` (launches matched by position: every pass must launch the same
  kernels); ``stop()`` before every pass has run raises RuntimeError.

``FakeLaunchRecorder`` is eager discovery's launch recorder: ``start()`` subscribes (CUPTI's error 39 while
another recorder holds the process's one subscription); every kernel launch call on any device until ``stop()``
is kept (name, stream, device, pointer arguments as argument words), up to ``max_launches`` (``dropped``
counts the rest), captured launches included; graph replays make no launch calls and are not seen.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, ContextManager, Protocol

from .errors import cupti_error
from .model import METRIC_NAMES, DeviceModel

__all__ = ["FakeRangeProfiler", "FakeLaunchRecorder", "RecordingMachine", "ProfiledMachine", "KNOWN_METRICS",
           "chip_name", "library_loads", "METRICS_PER_PASS",
           "REPLAY_DIRTY_BYTES"]

KNOWN_METRICS = frozenset(METRIC_NAMES)
METRICS_PER_PASS = 4
REPLAY_DIRTY_BYTES = 15e6  # written back per range by kernel replay's save and restore (H100, CUPTI 13.0)


def chip_name(major: int, minor: int) -> str:
    return {(9, 0): "GH100", (8, 0): "GA100", (8, 6): "GA102", (8, 9): "AD102", (7, 5): "TU104",
            (10, 0): "GB100"}.get((major, minor), f"SM{major}{minor}")


def library_loads(path: str) -> bool:
    """Whether the simulated loader can open ``path``."""
    base = os.path.basename(path) if path else "libcupti.so"
    return base.startswith("libcupti") and (os.sep not in path or os.path.exists(path))


class ProfiledMachine(Protocol):
    """What a range profiler needs of the simulated machine (FakeBackend's profiler hook): no more, so that
    the profiler depends on this and not on the machine's insides."""

    models: list[DeviceModel]

    def cupti_loaded(self) -> bool: ...
    def checked_device(self, device: int) -> Any: ...
    def device_synchronize(self, device: int) -> None: ...
    def attach_profiler(self, profiler: "FakeRangeProfiler") -> None: ...
    @property
    def lock(self) -> ContextManager[None]: ...


class FakeRangeProfiler:
    """Implements ``l2ctl._core.RangeProfiler`` on the simulator (made by ``FakeBackend.RangeProfiler``)."""

    def __init__(self, backend: ProfiledMachine, device: int, metrics: list[str], max_ranges: int,
                 user_replay: bool = False) -> None:
        if not backend.cupti_loaded():
            raise cupti_error("RangeProfiler", "load", "libcupti is not loaded (call cupti_load first)")
        names = [str(m) for m in metrics]
        if not names:
            raise ValueError("at least one metric is needed")
        info = backend.checked_device(device)
        for m in names:
            if m not in KNOWN_METRICS:
                raise cupti_error("cuptiProfilerHostConfigAddMetrics", "CUPTI_ERROR_INVALID_PARAMETER",
                                  f"unknown metric {m!r}")
        if int(max_ranges) < 1:
            raise cupti_error("cuptiRangeProfilerGetCounterDataSize", "CUPTI_ERROR_INVALID_PARAMETER",
                              "maxNumOfRanges must be positive")
        self._backend = backend
        self.device = device
        self.metrics = names
        self.max_ranges = int(max_ranges)
        self.user_replay = bool(user_replay)
        self._passes = max(1, -(-len(names) // METRICS_PER_PASS))
        self._chip = chip_name(info.major, info.minor)
        self.running = False
        self._pass_index = 0
        self._all_passes = False
        self._seen = 0  # launches in the current (or last) pass
        self._ranges: list[list[tuple[str, dict[str, float]]]] = []  # per pass: (kernel name, metric values)
        self.released = False  # once released (or collected), the machine's hook gives way to the next profiler
        backend.attach_profiler(self)

    # ---- what the backend calls -------------------------------------------------------------------
    @property
    def kernel_replay(self) -> bool:
        return not self.user_replay

    def record(self, name: str, values: dict[str, float]) -> None:
        """A kernel launch while a pass runs."""
        self._seen += 1
        current = self._ranges[-1]
        if len(current) < self.max_ranges:
            current.append((name, values))

    # ---- the RangeProfiler interface ----------------------------------------------------------------
    @property
    def passes(self) -> int:
        return self._passes

    @property
    def chip(self) -> str:
        return self._chip

    def start(self) -> None:
        with self._backend.lock:
            if self.running:
                raise RuntimeError("the profiler is already running")
            if self.user_replay and self._all_passes:
                raise cupti_error("cuptiRangeProfilerStart", "CUPTI_ERROR_INVALID_OPERATION",
                                  "every pass has already been submitted")
            self._seen = 0
            self._ranges.append([])
            self.running = True
            self._backend.models[self.device].profiler_started(self.max_ranges)

    def end_pass(self) -> bool:
        with self._backend.lock:
            if not self.running:
                raise RuntimeError("the profiler is not running")
            self._backend.device_synchronize(self.device)
            self.running = False
            self._pass_index += 1
            self._all_passes = (not self.user_replay) or self._pass_index >= self._passes
            return self._all_passes

    def launches(self) -> int:
        return self._seen

    def stop(self) -> list[tuple[str, list[float]]]:
        with self._backend.lock:
            if self.running:
                self.end_pass()
            if self.user_replay and not self._all_passes:
                raise RuntimeError("user replay: not every pass has been run yet")
            if not self._ranges:
                return []
            last = self._ranges[-1]
            passes = self._ranges[-self._passes:] if self.user_replay else [last]

            def value(i: int, j: int) -> float:  # metric j of range i, from pass j mod passes where it has range i
                source = passes[j % len(passes)]
                return float((source[i] if i < len(source) else last[i])[1][self.metrics[j]])

            return [(name, [value(i, j) for j in range(len(self.metrics))]) for i, (name, _) in enumerate(last)]

    def release(self) -> None:
        if not self.released:  # the backend's weak reference to it then gives way to the next profiler's
            self.released, self.running = True, False

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown, or an __init__ that failed
            self.release()

    def __repr__(self) -> str:
        return (f"<FakeRangeProfiler device {self.device}, {len(self.metrics)} metrics, {self._passes} passes, "
                f"{'user' if self.user_replay else 'kernel'} replay>")


class RecordingMachine(Protocol):
    """What a launch recorder needs of the simulated machine (FakeBackend's recorder hook)."""

    def cupti_loaded(self) -> bool: ...
    def subscribe(self, recorder: "FakeLaunchRecorder", on: bool) -> None: ...


class FakeLaunchRecorder:
    """Implements ``l2ctl._core.LaunchRecorder`` on the simulator (made by ``FakeBackend.LaunchRecorder``)."""

    def __init__(self, backend: RecordingMachine, max_launches: int) -> None:
        if not backend.cupti_loaded():
            raise cupti_error("LaunchRecorder", "load", "libcupti is not loaded (call cupti_load first)")
        self._backend = backend
        self.max_launches = int(max_launches)
        self._launches: list[tuple[str, int, int, list[tuple[int, int, int]]]] = []
        self._dropped = 0
        self.recording = False

    def record(self, name: str, stream: int, device: int, args: tuple[int, ...]) -> None:
        """A kernel launch call while recording (the machine calls it, under its lock)."""
        if len(self._launches) >= self.max_launches:
            self._dropped += 1
            return
        self._launches.append((name, stream, device, [(i, 0, int(p)) for i, p in enumerate(args) if p]))

    def start(self) -> None:
        if self.recording:
            raise RuntimeError("the recorder is already recording")
        self._launches, self._dropped = [], 0
        self._backend.subscribe(self, True)
        self.recording = True

    def stop(self) -> list[tuple[str, int, int, list[tuple[int, int, int]]]]:
        if self.recording:
            self._backend.subscribe(self, False)
            self.recording = False
        launches, self._launches = self._launches, []
        return launches

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def unreadable(self) -> int:
        return 0

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a recorder dropped while recording unsubscribes, as the C++ one does
            self.stop()
