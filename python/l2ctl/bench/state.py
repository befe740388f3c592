"""Device-state hygiene between measurements: a declared starting state (limit, no window, no persisting
lines, a flushed L2), and streams the harness owns when the caller gives none.

Every change goes through l2ctl's public controls (and so through its registry and lock): the harness
has no private way to the device.
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

from .. import _backend, kernels
from .._device import properties, stream_device
from .._errors import L2BudgetWarning
from .._interop import resolve_stream
from .._limit import get_set_aside, reset_persisting_lines
from .._limit import set_aside as set_limit
from .._memory import BufferLike, DeviceBuffer, Stream, StreamLike, synchronize_stream
from .._persist import persist
from .._plan import check_set_aside
from .._targets import ScopedWindow, Target
from .._window import AccessPolicyWindow

__all__ = ["flush_l2", "clean_state", "owned_stream", "in_window"]

T = TypeVar("T")

# Scratch buffers for flushing L2, per backend (the extension or a simulator) and device.
_scratch: "weakref.WeakKeyDictionary[Any, dict[int, tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]]]" = (
    weakref.WeakKeyDictionary())


@contextmanager
def owned_stream(stream: StreamLike, device: object = None) -> Iterator[StreamLike]:
    """``stream`` itself, or (when it is None) a new l2ctl.Stream on ``device``, closed afterwards."""
    if stream is not None:
        yield stream
        return
    with Stream(device) as own:
        yield own


def flush_l2(stream: StreamLike = None, *, persisting: bool = True) -> None:
    """Evict L2 (queued on ``stream``): write a scratch region twice the L2 size, then read a different
    one of the same size, so L2 ends holding clean lines and no write-back of earlier data lands in the
    next measurement (reading lines just written would leave them dirty). With ``persisting``, first
    demote persisting lines too (normal accesses do not evict them)."""
    device = stream_device(resolve_stream(stream))
    info = properties(device)
    per_device = _scratch.setdefault(_backend.current(), {})
    if device not in per_device:
        per_device[device] = (DeviceBuffer(2 * info.l2_cache_size, device),
                              DeviceBuffer(2 * info.l2_cache_size, device),
                              DeviceBuffer(8 * kernels.max_read_partials(device), device))
    written, read, partials = per_device[device]
    if persisting and info.supports_persistence:
        reset_persisting_lines(device)
    written.fill_bytes(0x5A, stream)
    kernels.read_sum(read, partials, stream)


@contextmanager
def clean_state(stream: StreamLike = None, *, set_aside: Optional[int] = 0, flush: bool = True) -> Iterator[int]:
    """A declared starting state for measuring work on ``stream``: no window on the stream, the limit
    set to ``set_aside`` bytes (None: unchanged), persisting lines reset, L2 flushed. Yields the limit in
    force. Both are scopes of l2ctl's registry, ended when the block ends (lines reset again), whatever
    other scopes are live and in whatever order they end.
    """
    if set_aside is not None:
        check_set_aside(set_aside)  # refused before anything changes
    ref = resolve_stream(stream)
    device = stream_device(ref)
    persistence = properties(device).supports_persistence
    with ExitStack() as scopes:
        scopes.enter_context(ScopedWindow(stream, AccessPolicyWindow()))
        granted = get_set_aside(device) if persistence else 0
        if persistence:
            if set_aside is not None:
                granted = int(scopes.enter_context(set_limit(set_aside, device)))
            reset_persisting_lines(device)
            scopes.callback(reset_persisting_lines, device)
        if flush:
            flush_l2(stream)
        synchronize_stream(ref.handle)
        scopes.callback(synchronize_stream, ref.handle)
        yield granted


def in_window(stream: Target, buf: BufferLike, hit_ratio: Optional[float],
              measure: Callable[[], T]) -> tuple[T, Optional[float]]:
    """``measure()`` with no window (``hit_ratio`` None) or inside ``persist(stream, buf, hit_ratio,
    set_aside=None)`` with budget warnings silenced (some points oversubscribe on purpose); returns its
    result and the hit ratio applied."""
    if hit_ratio is None:
        return measure(), None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", L2BudgetWarning)
        with persist(stream, buf, hit_ratio, set_aside=None) as p:
            result = measure()
            assert p.window is not None
            return result, p.window.hit_ratio
