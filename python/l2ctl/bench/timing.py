"""Timing GPU work with CUDA events: per-repetition times, medians, spread, and a Timer for a block."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .._memory import StreamLike
from .. import _backend
from .._device import stream_device
from .._interop import resolve_stream
from .._plan import check_count

__all__ = ["Timing", "time_gpu", "Timer", "MAX_REPEAT", "check_repeats"]

#: The most repetitions (or warm-ups) one measurement accepts: far above any useful count, and a bound
#: that keeps a typo (2**63) from hanging the process.
MAX_REPEAT = 100_000


def check_repeats(warmup: object, repeat: object) -> tuple[int, int]:
    """(warmup, repeat) validated: warmup in [0, MAX_REPEAT], repeat in [1, MAX_REPEAT]. Every measurement
    calls this before it changes anything on the device."""
    return (check_count(warmup, "warmup", minimum=0, maximum=MAX_REPEAT),
            check_count(repeat, "repeat", minimum=1, maximum=MAX_REPEAT))


@dataclass(frozen=True)
class Timing:
    """Per-repetition times (ms) of one measured region."""

    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.times_ms))

    @property
    def min_ms(self) -> float:
        return float(min(self.times_ms))

    @property
    def max_ms(self) -> float:
        return float(max(self.times_ms))

    @property
    def spread(self) -> float:
        """Inter-quartile range over the median: the noise of this measurement."""
        median = self.median_ms
        if not median:
            return 0.0
        if len(self.times_ms) < 4:
            return (self.max_ms - self.min_ms) / median
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4)
        return (q3 - q1) / median


def time_gpu(
    enqueue: Callable[[Any], Any],
    stream: StreamLike = None,
    *,
    warmup: int = 3,
    repeat: int = 15,
    flush: Optional[Callable[[], Any]] = None,
) -> Timing:
    """Time ``enqueue(stream)`` with a pair of CUDA events per repetition, after ``warmup`` untimed runs.

    ``flush`` (e.g. ``lambda: flush_l2(stream)``) runs before every repetition, outside the timed region:
    cold-L2 timing. Repetitions are queued back to back and read after, so host overhead stays out.
    """
    warmup, repeat = check_repeats(warmup, repeat)
    if not callable(enqueue):
        raise TypeError(f"enqueue must be callable as enqueue(stream), not {type(enqueue).__name__}")
    ref = resolve_stream(stream)
    backend = _backend.current()
    device = stream_device(ref)  # an event can be recorded only on streams of its own device
    for _ in range(warmup):
        if flush is not None:
            flush()
        enqueue(stream)
    events = [(backend.Event(device), backend.Event(device)) for _ in range(repeat)]
    for start, stop in events:
        if flush is not None:
            flush()
        start.record(ref.handle)
        enqueue(stream)
        stop.record(ref.handle)
    return Timing(tuple(float(stop.elapsed_since(start)) for start, stop in events))


class Timer:
    """Times the GPU work queued on ``stream`` inside the block, with CUDA events.

    >>> with l2ctl.Timer(stream) as t:
    ...     run(stream)
    >>> t.elapsed_ms   # waits for the stop event
    """

    def __init__(self, stream: StreamLike = None) -> None:
        self._stream = resolve_stream(stream)
        backend = _backend.current()
        device = stream_device(self._stream)
        self._start, self._stop = backend.Event(device), backend.Event(device)
        self._stopped = False

    def __enter__(self) -> "Timer":
        self._start.record(self._stream.handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.record(self._stream.handle)
        self._stopped = True

    @property
    def elapsed_ms(self) -> float:
        if not self._stopped:
            raise RuntimeError("the timer is still running; read elapsed_ms after the with block")
        return float(self._stop.elapsed_since(self._start))
