"""``persist``: keep a buffer in L2 for the kernels a block of code launches on a stream (or that a CUDA
graph replays), through the registry that lets any number of such scopes share a device's set-aside."""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from . import _registry
from ._device import check_pointer, require_persistence
from ._errors import L2BudgetWarning, WindowClippedWarning
from ._interop import resolve_buffer, resolve_stream
from ._limit import granularity_step
from ._plan import check_nbytes, clip_window, normalize_hit_ratio
from ._stream_window import resolve_target
from ._window import AccessPolicyWindow, AccessProperty, check_property

__all__ = ["persist", "Persist", "Policy", "Budget", "budget"]

LimitRequest = Union[int, str, None]


@dataclass(frozen=True)
class Policy:
    """A persistence policy: the set-aside (bytes, ``"auto"`` or None to leave it) and the hit ratio
    (None: as much as the set-aside holds). ``enabled=False`` means "no persistence": ``persist``
    then changes nothing. The tuner returns one of these."""

    set_aside: LimitRequest = "auto"
    hit_ratio: Optional[float] = None
    enabled: bool = True


@dataclass(frozen=True)
class Budget:
    """What the live l2ctl scopes on a device ask of its set-aside (bytes): the limit in force, the
    demand (hit ratio x bytes) of the windows in force, and those windows as (slot handle, bytes, hit
    ratio), one per scope that is the latest on at least one of its streams or graph nodes."""

    device: int
    set_aside: int
    demand: float
    scopes: tuple[tuple[int, int, float], ...]

    @property
    def oversubscribed(self) -> bool:
        return self.demand > self.set_aside * (1 + 1e-9)


def budget(device: object = None) -> Budget:
    """The windows in force on ``device``, their total demand and the current set-aside."""
    props = require_persistence(device)
    snap = _registry.snapshot(props.index, props.persisting_l2_cache_max_size)
    return Budget(props.index, snap.limit, snap.demand,
                  tuple((scope.slots[0][1] if scope.slots else 0, w.num_bytes, w.hit_ratio) for scope, w in snap.in_force))


def _check_limit_request(value: object) -> LimitRequest:
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, str):
        raise ValueError(f"set_aside must be 'auto', None or a byte count, got {value!r}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"set_aside must be 'auto', None or an int byte count, not {type(value).__name__}")
    return check_nbytes(value, "set_aside", allow_zero=True)


def _policy_fields(policy: object) -> tuple[Optional[float], LimitRequest, bool]:
    inner = getattr(policy, "policy", policy)  # a TunedPolicy carries its Policy
    if not all(hasattr(inner, a) for a in ("set_aside", "hit_ratio")):
        raise TypeError(f"policy must be an l2ctl.Policy (or a tuned policy), not {type(policy).__name__}")
    enabled = getattr(inner, "enabled", True)
    if not isinstance(enabled, bool):
        raise TypeError("policy.enabled must be a bool")
    hit_ratio = getattr(inner, "hit_ratio")
    return (None if hit_ratio is None else normalize_hit_ratio(hit_ratio)), _check_limit_request(
        getattr(inner, "set_aside")), enabled


class Persist:
    """Keep ``buf`` (or ``num_bytes`` of it from ``offset``) in L2 for kernels launched on ``stream``
    inside the ``with`` block.

    >>> with l2ctl.persist(stream, lut, hit_ratio=0.75) as p:
    ...     run_my_kernels(stream)

    - ``hit_ratio``: fraction of the window's lines given ``hit_prop``. None: as much as the set-aside
      holds next to the other windows in force, min(1, room / window bytes). Values in (1, 1 + 1e-6]
      count as 1.0; NaN, negatives and larger values raise ValueError.
    - ``set_aside="auto"`` raises the device's persisting limit just enough for the windows in force
      (rounded up to the driver's granularity, capped at persistingL2CacheMaxSize), never below what it
      was. An int asks for exactly that many bytes (the driver rounds it; ``p.set_aside`` is what it
      granted); None leaves the limit alone.

      The set-aside is a tax on everything else: L2 reserved for persisting lines is lost to every
      other kernel on the GPU (an H100 at the max set-aside streams plain copies up to 2.5x slower).
      That is why "auto" grows it no further than the windows need; measure with l2ctl.tune().
    - A window larger than accessPolicyMaxWindowSize is clipped to it, with a WindowClippedWarning.
    - ``share=True``: hit ratios of all shared scopes in force on the device are scaled so their total
      demand fits what the other windows leave of the set-aside (two windows as large as the set-aside
      get half each).
    - ``policy``: a Policy (or what l2ctl.tune returned) instead of ``hit_ratio`` and ``set_aside``;
      passing both is an error.

    The stream, the graph nodes and the limit always hold what the live scopes ask for, recomputed after
    every entry and exit: nested scopes, scopes ended in any order, scopes in other threads and scopes
    whose block raised all end in the right state; when the last scope on a device ends, the limit and
    windows are what they were before l2ctl changed them, and the persisting lines are reset
    (``reset_on_exit``). An exception in entry (a warning turned into an error included) leaves nothing
    changed.

    The window applies to kernels *launched* inside the block; it is a stream attribute, so work already
    queued keeps the window it was launched with. Streams: l2ctl.Stream, torch/CuPy streams, anything
    with ``__cuda_stream__``, an int handle, or None (the legacy default stream of the current device,
    shared by every library that uses it). Graphs: an l2ctl graph or ``graph.select(predicate)``.

    Inside the block the object describes what was applied: ``window`` (as requested, hit ratio
    resolved), ``set_aside`` (the limit in force, bytes), ``device``,
    ``stream`` (the handle), ``clipped``.
    """

    def __init__(
        self,
        stream: object,
        buf: object,
        hit_ratio: Optional[float] = None,
        *,
        num_bytes: Optional[int] = None,
        offset: int = 0,
        hit_prop: AccessProperty = AccessProperty.PERSISTING,
        miss_prop: AccessProperty = AccessProperty.STREAMING,
        set_aside: LimitRequest = "auto",
        reset_on_exit: bool = True,
        share: bool = False,
        policy: Optional[Any] = None,
    ) -> None:
        # Every argument is checked here, before any device query or CUDA call.
        requested = None if hit_ratio is None else normalize_hit_ratio(hit_ratio)
        limit = _check_limit_request(set_aside)
        self._enabled = True
        if policy is not None:
            if hit_ratio is not None or set_aside != "auto":
                raise ValueError("pass either policy= or hit_ratio/set_aside, not both")
            requested, limit, self._enabled = _policy_fields(policy)
        if getattr(type(stream), "_l2ctl_target", None) is None:
            resolve_stream(stream)  # type errors now, not at entry
        self._target_object = stream
        self._buffer = resolve_buffer(buf)
        self._requested_hit_ratio = requested
        self._offset = check_nbytes(offset, "offset", allow_zero=True)
        self._num_bytes = None if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
        clip_window(self._offset, self._num_bytes, self._buffer.nbytes, 0)  # the byte range; no device yet
        self._hit_prop = check_property(hit_prop, "hit_prop")
        self._miss_prop = check_property(miss_prop, "miss_prop", miss=True)
        self._limit_request: LimitRequest = limit
        if not isinstance(reset_on_exit, bool) or not isinstance(share, bool):
            raise TypeError("reset_on_exit and share must be bools")
        self._reset_on_exit = reset_on_exit
        self._share = share
        self._scope: Optional[_registry.Scope] = None
        self._target: Optional[_registry.Target] = None
        self.window: Optional[AccessPolicyWindow] = None
        self.device: Optional[int] = None
        self.clipped = False

    @property
    def active(self) -> bool:
        return self._scope is not None

    @property
    def stream(self) -> int:
        """The handle of the stream (or graph) the window is on, once entered."""
        if self._target is None or not self._target.slots:
            raise RuntimeError("the scope has not been entered")
        return self._target.slots[0][1]

    @property
    def set_aside(self) -> Optional[int]:
        """The limit in force on the device while the scope is live (None before entry)."""
        if self.device is None:
            return None
        props = require_persistence(self.device)
        return _registry.observed_limit(self.device, props.persisting_l2_cache_max_size)

    def __enter__(self) -> "Persist":
        if self._scope is not None:
            raise RuntimeError("this persist scope is already active; create a new one with l2ctl.persist(...)")
        if not self._enabled:
            return self
        target = resolve_target(self._target_object)  # a graph predicate runs here, outside the lock
        device = target.device
        if self._buffer.device is not None and self._buffer.device != device:
            raise ValueError(
                f"the buffer is on device {self._buffer.device} but the stream is on device {device}; "
                "use a stream of the buffer's device"
            )
        props = require_persistence(device)
        nbytes, clipped = clip_window(self._offset, self._num_bytes, self._buffer.nbytes,
                                      props.access_policy_max_window_size)
        base = self._buffer.ptr + self._offset
        check_pointer(base, nbytes, device, "the buffer")
        ratio = 1.0 if self._requested_hit_ratio is None else self._requested_hit_ratio
        window = AccessPolicyWindow(base, nbytes, ratio, self._hit_prop, self._miss_prop)
        scope = _registry.Scope(device, target.slots, window, self._limit_request, self._share, self._reset_on_exit,
                                fit_hit_ratio=self._requested_hit_ratio is None,
                                owner=(target.owner, self._buffer.owner))
        maximum = props.persisting_l2_cache_max_size
        limit, demand = _registry.enter(scope, maximum, lambda: granularity_step(device))
        self._scope, self._target, self.device, self.clipped = scope, target, device, clipped
        self.window = scope.window
        try:
            if target.changed is not None:
                target.changed()
            # Warnings go out after the registry's lock is released: a filter may raise (then the scope
            # ends here) or run user code.
            if clipped:
                full = self._buffer.nbytes - self._offset if self._num_bytes is None else self._num_bytes
                warnings.warn(
                    f"window of {full} bytes clipped to accessPolicyMaxWindowSize ({props.access_policy_max_window_size}"
                    f" bytes) of device {device}; only the first {nbytes} bytes persist",
                    WindowClippedWarning, stacklevel=2)
            if window.hit_prop == AccessProperty.PERSISTING:
                in_force = limit if limit is not None else _registry.observed_limit(device, maximum)
                if demand > in_force * (1 + 1e-9):
                    warnings.warn(
                        f"device {device}: live persisting windows ask for {demand:.0f} bytes (hit_ratio x num_bytes) "
                        f"but the set-aside is {in_force} bytes; lines will evict each other (thrash). Use "
                        "share=True, a smaller hit_ratio, or a larger set_aside",
                        L2BudgetWarning, stacklevel=2)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        scope, target, self._scope = self._scope, self._target, None
        if scope is None or target is None:
            return
        try:
            _registry.exit(scope, lambda: granularity_step(scope.device))
            if target.changed is not None:
                target.changed()
        except BaseException as error:
            if exc is None:
                raise
            if hasattr(exc, "add_note"):
                exc.add_note(f"l2ctl: restoring device state after the error also failed: {error!r}")

    def __repr__(self) -> str:
        if self._scope is None:
            return "<l2ctl.persist inactive>"
        return f"<l2ctl.persist device={self.device} window={self.window}>"


#: ``persist(stream, buf, hit_ratio=None, ...)``: the scope itself (see Persist).
persist = Persist
