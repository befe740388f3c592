"""``persist``: an access-policy window on a stream for one block of code, and the per-device registry
that lets several such scopes (nested, on other streams, in other threads) share one set-aside."""

from __future__ import annotations

import atexit
import itertools
import math
import numbers
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import _backend
from ._device import apply_limit, require_persistence, set_aside_granularity
from ._errors import L2BudgetWarning, WindowClippedWarning
from ._interop import resolve_buffer, resolve_stream
from ._plan import auto_set_aside, check_nbytes, clip_window, normalize_hit_ratio, shared_hit_ratios
from ._window import AccessPolicyWindow, AccessProperty, check_device_pointer, stream_device, validate_window

__all__ = ["persist", "Persist", "Policy", "Budget", "budget"]


@dataclass(frozen=True)
class Policy:
    """A persistence policy: the set-aside (bytes, ``"auto"`` or None to leave it) and the hit ratio
    (None: as much as the set-aside holds). ``enabled=False`` means "no persistence": ``persist``
    then changes nothing. The tuner returns one of these."""

    set_aside: Union[int, str, None] = "auto"
    hit_ratio: Optional[float] = None
    enabled: bool = True


class _StreamTarget:
    """Where a persist scope puts its window: a stream attribute."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.handle = ref.handle

    def device(self) -> int:
        return stream_device(self.ref)

    def read(self) -> Any:
        return AccessPolicyWindow.from_tuple(_backend.current().get_stream_window(self.handle))

    def apply(self, window: AccessPolicyWindow) -> None:
        _backend.current().set_stream_window(self.handle, *window.as_tuple())

    def restore(self, previous: Any) -> None:
        self.apply(previous)

    def clear(self) -> None:
        self.apply(AccessPolicyWindow())


@dataclass
class _Scope:
    id: int
    device: int
    stream: int
    target: Any
    window: AccessPolicyWindow
    requested_hit_ratio: float
    share: bool
    limit_request: Union[int, str, None]  # bytes, "auto" or None


@dataclass
class _DeviceState:
    scopes: dict[int, _Scope] = field(default_factory=dict)
    baseline: Optional[int] = None  # the limit before the first live scope changed it


@dataclass(frozen=True)
class Budget:
    """What the live l2ctl scopes on a device ask of its set-aside (bytes)."""

    device: int
    set_aside: int
    demand: float
    scopes: tuple[tuple[int, int, float], ...]  # (stream handle, window bytes, hit ratio)

    @property
    def oversubscribed(self) -> bool:
        return self.demand > self.set_aside * (1 + 1e-9)


from ._registry import lock as _lock
_devices: dict[int, _DeviceState] = {}
_ids = itertools.count(1)


def _demand(scopes: Any) -> float:
    return sum(s.window.demand for s in scopes)


def budget(device: object = None) -> Budget:
    """The live persist scopes of ``device``: their windows, total demand and the current set-aside."""
    from ._device import get_set_aside, resolve_device

    index = resolve_device(device)
    with _lock:
        scopes = list(_devices.get(index, _DeviceState()).scopes.values())
        return Budget(
            index,
            get_set_aside(index),
            _demand(scopes),
            tuple((s.stream, s.window.num_bytes, s.window.hit_ratio) for s in scopes),
        )


class Persist:
    """Keep ``buf`` (or ``num_bytes`` of it from ``offset``) in L2 for kernels launched on ``stream``
    inside the ``with`` block.

    >>> with l2ctl.persist(stream, lut, hit_ratio=0.75) as p:
    ...     run_my_kernels(stream)

    - ``hit_ratio``: fraction of the window's lines given ``hit_prop``. None: min(1, set-aside / window).
      Values in (1, 1 + 1e-6] count as 1.0; NaN, negatives and larger values raise ValueError.
    - ``set_aside="auto"`` grows the device's persisting limit just enough for hit_ratio x window bytes
      (rounded up to the driver's granularity, capped at persistingL2CacheMaxSize), never shrinks it,
      and restores it when the last l2ctl scope on the device ends. An int sets exactly that many bytes
      (the driver rounds it to its granularity; p.set_aside is what it granted); None leaves the
      limit alone.

      The set-aside is a tax on everything else: L2 reserved for persisting lines is lost to every
      other kernel on the GPU (an H100 at the max set-aside streams plain copies up to 2.5x slower).
      That is why "auto" grows it no further than the window needs; measure with l2ctl.tune().
    - A window larger than accessPolicyMaxWindowSize is clipped to it, with a WindowClippedWarning.
    - ``share=True``: hit ratios of all shared scopes on the device are scaled so their total demand
      fits the set-aside (two windows as large as the set-aside get half each).
    - On exit (also when the block raises): the stream's previous window is restored (so nesting works),
      the persisting lines are reset when no other l2ctl scope is live on the device (``reset_on_exit``),
      and the limit is restored when the last scope on the device ends.

    The window applies to kernels *launched* inside the block; it is a stream attribute, so work already
    queued keeps the window it was launched with. Streams: l2ctl.Stream, torch/CuPy streams, anything
    with ``__cuda_stream__``, an int handle, or None (the legacy default stream of the current device,
    shared by every library that uses it).

    Inside the block the object describes what was applied: ``window`` (the AccessPolicyWindow set),
    ``set_aside`` (the limit in force, bytes), ``previous_set_aside``, ``previous_window``,
    ``device``, ``stream`` (handle), ``clipped`` (the window was cut to accessPolicyMaxWindowSize).
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
        set_aside: Union[int, str, None] = "auto",
        reset_on_exit: bool = True,
        share: bool = False,
        policy: Optional[Any] = None,
    ) -> None:
        # Everything that needs no device is checked here, before any CUDA call.
        if policy is not None:
            hit_ratio, set_aside, enabled = _policy_fields(policy)
        else:
            enabled = True
        self._enabled = enabled
        self._stream = resolve_stream(stream) if not hasattr(stream, "_l2ctl_target") else None
        self._target = stream._l2ctl_target() if self._stream is None else _StreamTarget(self._stream)
        self._buffer = resolve_buffer(buf)
        self._requested_hit_ratio = None if hit_ratio is None else normalize_hit_ratio(hit_ratio)
        self._offset = check_nbytes(offset, "offset", allow_zero=True)
        self._num_bytes = None if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
        # Only the byte range is checked here; clipping to the device's max window happens on entry.
        clip_window(self._offset, self._num_bytes, self._buffer.nbytes, 0)
        probe = validate_window(AccessPolicyWindow(1, 1, 0.0, hit_prop, miss_prop))
        self._hit_prop, self._miss_prop = probe.hit_prop, probe.miss_prop
        self._limit_request = _check_limit_request(set_aside)
        if not isinstance(reset_on_exit, bool) or not isinstance(share, bool):
            raise TypeError("reset_on_exit and share must be bools")
        self._reset_on_exit = reset_on_exit
        self._share = share
        self._scope: Optional[_Scope] = None
        self.window: Optional[AccessPolicyWindow] = None
        self.previous_window: Optional[AccessPolicyWindow] = None
        self.set_aside: Optional[int] = None
        self.previous_set_aside: Optional[int] = None
        self.device: Optional[int] = None
        self.clipped = False

    @property
    def stream(self) -> int:
        return self._target.handle

    @property
    def active(self) -> bool:
        return self._scope is not None

    def __enter__(self) -> "Persist":
        if self._scope is not None:
            raise RuntimeError("this persist scope is already active; create a new one with l2ctl.persist(...)")
        if not self._enabled:
            return self
        device = self._target.device()
        if self._buffer.device is not None and self._buffer.device != device:
            raise ValueError(
                f"the buffer is on device {self._buffer.device} but the stream is on device {device}; "
                "use a stream of the buffer's device"
            )
        info = require_persistence(device)
        check_device_pointer(self._buffer.ptr, self._buffer.nbytes, device)
        nbytes, clipped = clip_window(
            self._offset, self._num_bytes, self._buffer.nbytes, info.access_policy_max_window_size
        )
        if clipped:
            warnings.warn(
                f"window of {self._buffer.nbytes - self._offset if self._num_bytes is None else self._num_bytes} "
                f"bytes clipped to accessPolicyMaxWindowSize ({info.access_policy_max_window_size} bytes) of device "
                f"{device}; only the first {nbytes} bytes persist",
                WindowClippedWarning,
                stacklevel=2,
            )
        granularity = set_aside_granularity(device) if self._limit_request == "auto" else 1
        base = self._buffer.ptr + self._offset
        backend = _backend.current()
        with _lock:
            state = _devices.setdefault(device, _DeviceState())
            current = int(backend.get_persisting_limit(device))
            others = list(state.scopes.values())
            other_demand = _demand(others)
            # 1. the limit
            if self._limit_request == "auto":
                wanted = 1.0 if self._requested_hit_ratio is None else self._requested_hit_ratio
                target = auto_set_aside(
                    other_demand + wanted * nbytes, current, granularity, info.persisting_l2_cache_max_size
                )
            elif self._limit_request is None:
                target = current
            else:
                target = int(self._limit_request)
                if target > info.persisting_l2_cache_max_size:
                    raise ValueError(
                        f"set_aside {target} exceeds persistingL2CacheMaxSize ({info.persisting_l2_cache_max_size} "
                        f"bytes) of device {device}"
                    )
            baseline_taken = state.baseline is None and not state.scopes
            granted = current
            if target != current:
                granted = apply_limit(device, target)
            try:
                # 2. the hit ratio
                if self._requested_hit_ratio is None:
                    room = max(0.0, granted - other_demand)
                    hit_ratio = normalize_hit_ratio(min(1.0, room / nbytes))
                else:
                    hit_ratio = self._requested_hit_ratio
                window = AccessPolicyWindow(base, nbytes, hit_ratio, self._hit_prop, self._miss_prop)
                previous_window = self._target.read()
                self._target.apply(window)
            except BaseException:
                if granted != current:
                    apply_limit(device, current)
                raise
            if baseline_taken:
                state.baseline = current
            scope = _Scope(
                next(_ids), device, self._target.handle, self._target, window, hit_ratio, self._share,
                self._limit_request,
            )
            state.scopes[scope.id] = scope
            self._scope = scope
            if self._share:
                _rebalance(device, state, granted)
            _atexit_guard()
            total = _demand(state.scopes.values())
            if total > granted * (1 + 1e-9) and window.hit_prop == AccessProperty.PERSISTING:
                warnings.warn(
                    f"device {device}: live persisting windows ask for {total:.0f} bytes (hit_ratio x num_bytes) but "
                    f"the set-aside is {granted} bytes; lines will evict each other (thrash). Use share=True, a "
                    "smaller hit_ratio, or a larger set_aside",
                    L2BudgetWarning,
                    stacklevel=2,
                )
            self.window = scope.window
            self.previous_window = previous_window
            self.set_aside = granted
            self.previous_set_aside = current
            self.device = device
            self.clipped = clipped
            self._previous_window = previous_window
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        scope, self._scope = self._scope, None
        if scope is None:
            return
        backend = _backend.current()
        errors: list[BaseException] = []

        def attempt(step: Any) -> None:
            try:
                step()
            except BaseException as error:  # keep restoring; report the first failure below
                errors.append(error)

        with _lock:
            state = _devices[scope.device]
            attempt(lambda: scope.target.restore(self._previous_window))
            del state.scopes[scope.id]
            if not state.scopes:
                if self._reset_on_exit:
                    attempt(lambda: backend.reset_persisting_lines(scope.device))
                baseline, state.baseline = state.baseline, None
                if baseline is not None:
                    attempt(lambda: _restore_limit(scope.device, baseline))
            else:
                attempt(lambda: _limit_for_remaining(scope.device, state))
                if any(s.share for s in state.scopes.values()):
                    attempt(lambda: _rebalance(scope.device, state, int(backend.get_persisting_limit(scope.device))))
        if errors:
            if exc is None:
                raise errors[0]
            if hasattr(exc, "add_note"):
                exc.add_note(f"l2ctl: restoring device state after the error also failed: {errors[0]!r}")

    def __repr__(self) -> str:
        if self._scope is None:
            return "<l2ctl.persist inactive>"
        return f"<l2ctl.persist device={self.device} window={self.window} set_aside={self.set_aside}>"


def _restore_limit(device: int, limit: int) -> None:
    if int(_backend.current().get_persisting_limit(device)) != limit:
        apply_limit(device, limit)


def _limit_for_remaining(device: int, state: _DeviceState) -> None:
    """After one scope of several ends: the latest explicit request wins; otherwise auto scopes keep
    at least what they need (the limit never shrinks under live auto scopes)."""
    remaining = sorted(state.scopes.values(), key=lambda s: s.id)
    explicit = [s for s in remaining if isinstance(s.limit_request, int)]
    if explicit:
        _restore_limit(device, int(explicit[-1].limit_request))


def _rebalance(device: int, state: _DeviceState, granted: int) -> None:
    """share=True scopes: scale their requested hit ratios so all live windows fit the set-aside."""
    shared = [s for s in state.scopes.values() if s.share]
    fixed = _demand(s for s in state.scopes.values() if not s.share)
    ratios = shared_hit_ratios([(s.requested_hit_ratio, s.window.num_bytes) for s in shared], max(0, granted - fixed))
    backend = _backend.current()
    for scope, ratio in zip(shared, ratios):
        if not math.isclose(ratio, scope.window.hit_ratio, rel_tol=0, abs_tol=1e-7):
            new = AccessPolicyWindow(
                scope.window.base_ptr, scope.window.num_bytes, ratio, scope.window.hit_prop, scope.window.miss_prop
            )
            scope.target.apply(new)
            scope.window = new


def _policy_fields(policy: Any) -> tuple[Optional[float], Union[int, str, None], bool]:
    inner = getattr(policy, "policy", policy)  # a TunedPolicy carries its Policy
    if not all(hasattr(inner, a) for a in ("set_aside", "hit_ratio")):
        raise TypeError(f"policy must be an l2ctl.Policy (or a tuned policy), not {type(policy).__name__}")
    return inner.hit_ratio, inner.set_aside, bool(getattr(inner, "enabled", True))


def _check_limit_request(value: object) -> Union[int, str, None]:
    if value is None or value == "auto":
        return value  # type: ignore[return-value]
    if isinstance(value, str):
        raise ValueError(f"set_aside must be 'auto', None or a byte count, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"set_aside must be 'auto', None or an int byte count, not {type(value).__name__}")
    return check_nbytes(value, "set_aside", allow_zero=True)


_atexit_registered = False


def _atexit_guard() -> None:
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_restore_all)


def _restore_all() -> None:
    """At interpreter exit: put back the limit of every device that still has open scopes."""
    with _lock:
        backend = _backend.current()
        for device, state in _devices.items():
            if not state.scopes:
                continue
            for scope in state.scopes.values():
                try:
                    scope.target.clear()
                except Exception:
                    pass  # the stream may already be gone
            state.scopes.clear()
            try:
                backend.reset_persisting_lines(device)
                if state.baseline is not None:
                    backend.set_persisting_limit(device, state.baseline)
            except Exception:
                pass
            state.baseline = None


#: ``persist(stream, buf, hit_ratio=None, ...)``: the scope itself (see Persist).
persist = Persist
