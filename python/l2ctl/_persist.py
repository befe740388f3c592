"""``persist``: keep a buffer in L2 for the kernels a block of code launches on a stream (or that a CUDA
graph replays), through the registry that lets any number of such scopes share a device's set-aside."""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Union

import numpy as np

from . import _registry
from ._device import check_owned_pointer, check_stream_context, properties, require_persistence, stream_device
from ._errors import L2BudgetWarning, SetAsideTaxWarning, WindowClippedWarning
from ._interop import BufferRef, StreamRef, resolve_buffer
from ._memory import BufferLike, DeviceBuffer, Stream
from ._plan import DEFAULT_LIMIT_FRACTION, check_nbytes, clip_window, normalize_hit_ratio
from ._targets import Target, after_changes, as_target, end_after, resolve_target
from ._window import AccessPolicyWindow, AccessProperty, check_property

__all__ = ["persist", "Persist", "Policy", "Budget", "budget"]

#: What a scope asks of the set-aside: bytes, "auto" (enough for the windows in force, kept within the driver's
#: default limit), "max", or None (the limit as it is). A Literal, so that a type checker refuses "lots".
LimitRequest = Union[int, Literal["auto", "max"], None]
_PERSISTING, _STREAMING = AccessProperty.PERSISTING, AccessProperty.STREAMING
#: Hit ratios up to here are below 1.0 in float32 too, so they need no further normalisation.
_SURELY_FLOAT32 = 0.9999999
_new_tuple = tuple.__new__
_NO_WINDOW = AccessPolicyWindow()


@dataclass(frozen=True)
class Policy:
    """A persistence policy: the set-aside (bytes, ``"auto"``, ``"max"`` or None to leave it), the hit
    ratio (None: as much as the set-aside holds) and, optionally, the byte range of the buffer the window
    covers (``offset``, ``num_bytes``; None: to the buffer's end). ``enabled=False`` means "no
    persistence": ``persist`` then changes nothing. The tuner returns one of these."""

    set_aside: LimitRequest = "auto"
    hit_ratio: Optional[float] = None
    enabled: bool = True
    offset: int = 0
    num_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        # Checked (and the hit ratio normalised) once, here: persist() then takes a Policy's fields as they
        # are, so a scope made from a tuned policy costs what the same arguments cost.
        fields = _check_policy_fields(self.hit_ratio, self.set_aside, self.enabled, self.offset, self.num_bytes)
        for name, value in zip(("hit_ratio", "set_aside", "enabled", "offset", "num_bytes"), fields):
            object.__setattr__(self, name, value)


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
    if value is None:
        return None
    if isinstance(value, str) and value in ("auto", "max"):
        return "auto" if value == "auto" else "max"
    if isinstance(value, str):
        raise ValueError(f"set_aside must be 'auto', 'max', None or a byte count, got {value!r}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"set_aside must be 'auto', 'max', None or an int byte count, not {type(value).__name__}")
    return check_nbytes(value, "set_aside", allow_zero=True)


def _check_policy_fields(hit_ratio: object, set_aside: object, enabled: object, offset: object,
                         num_bytes: object) -> tuple[Optional[float], LimitRequest, bool, int, Optional[int]]:
    if not isinstance(enabled, bool):
        raise TypeError("policy.enabled must be a bool")
    return ((None if hit_ratio is None else normalize_hit_ratio(hit_ratio)), _check_limit_request(set_aside), enabled,
            check_nbytes(offset, "policy.offset", allow_zero=True),
            None if num_bytes is None else check_nbytes(num_bytes, "policy.num_bytes"))


def _policy_fields(policy: object) -> tuple[Optional[float], LimitRequest, bool, int, Optional[int]]:
    inner = getattr(policy, "policy", policy)  # a TunedPolicy carries its Policy
    if type(inner) is Policy:  # checked when it was made
        return inner.hit_ratio, inner.set_aside, inner.enabled, inner.offset, inner.num_bytes
    if not all(hasattr(inner, a) for a in ("set_aside", "hit_ratio")):
        raise TypeError(f"policy must be an l2ctl.Policy (or a tuned policy), not {type(policy).__name__}")
    return _check_policy_fields(getattr(inner, "hit_ratio"), getattr(inner, "set_aside"),
                                getattr(inner, "enabled", True), getattr(inner, "offset", 0),
                                getattr(inner, "num_bytes", None))


class Persist:
    """Keep ``buf`` (or ``num_bytes`` of it from ``offset``) in L2 for kernels launched on ``stream``
    inside the ``with`` block.

    >>> with l2ctl.persist(stream, lut, hit_ratio=0.75) as p:
    ...     run_my_kernels(stream)

    - ``hit_ratio``: fraction of the window's lines given ``hit_prop``. None: as much as the set-aside
      holds next to the other windows in force, min(1, room / window bytes). Values in (1, 1 + 1e-6]
      count as 1.0; NaN, negatives and larger values raise ValueError.
    - ``set_aside="auto"`` raises the device's persisting limit just enough for the windows in force
      (rounded up to the driver's granularity), never below what it was, and never past the driver's
      default limit (30% of persistingL2CacheMaxSize: 9.375 MiB on an H100, 11.25 MiB on an H200).
      When the windows ask for more, it stops there and says so (SetAsideTaxWarning): the set-aside is a
      tax on everything else, L2 reserved for persisting lines is lost to every other kernel on the GPU
      (plain copies ran 2.4x slower at the max on an H100: docs/results.md), and below the default limit
      the measured tax is nil. An int asks for exactly that many bytes (the driver rounds it;
      ``p.set_aside`` is what it granted), ``"max"`` for persistingL2CacheMaxSize; None leaves the
      limit alone. l2ctl.tune() measures what a larger set-aside buys and costs.
    - A window larger than accessPolicyMaxWindowSize is clipped to it, with a WindowClippedWarning.
    - ``share=True``: hit ratios of all shared scopes in force on the device are scaled so their total
      demand fits what the other windows leave of the set-aside (two windows as large as the set-aside
      get half each).
    - ``policy``: a Policy (or what l2ctl.tune returned) instead of ``hit_ratio`` and ``set_aside`` (and,
      when the policy has a byte range, ``offset``/``num_bytes``); passing both is an error.

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
    resolved; empty before entry and for a "no persistence" policy), ``set_aside`` (the limit in force,
    bytes), ``device``, ``stream`` (the handle), ``clipped``. One object is one scope: entering it again
    while it is live (from another thread too) is refused.
    """

    __slots__ = ("_ref", "_target_object", "_buffer", "_offset", "_num_bytes", "_hit_prop", "_miss_prop",
                 "_requested_hit_ratio", "_limit_request", "_reset_on_exit", "_share", "_enabled", "_scope", "_slots",
                 "_changed", "_executables", "_device", "window", "clipped", "__weakref__")

    window: AccessPolicyWindow
    clipped: bool

    def __init__(
        self,
        stream: Target,
        buf: BufferLike,
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
        if getattr(self, "_scope", None) is not None:
            raise RuntimeError("this persist scope is live: end it before initialising it again")
        # Every argument is checked here, before any device query or CUDA call; the common forms of each
        # take a short path first (a persist scope wraps every step of a user's loop).
        if type(hit_ratio) is float and 0.0 <= hit_ratio <= _SURELY_FLOAT32:
            requested: Optional[float] = hit_ratio
        else:
            requested = None if hit_ratio is None else normalize_hit_ratio(hit_ratio)
        limit = set_aside if set_aside is None or set_aside == "auto" else _check_limit_request(set_aside)
        enabled = True
        if policy is not None:
            if hit_ratio is not None or set_aside != "auto":
                raise ValueError("pass either policy= or hit_ratio/set_aside, not both")
            requested, limit, enabled, policy_offset, policy_bytes = _policy_fields(policy)
            if policy_offset or policy_bytes is not None:
                if offset != 0 or num_bytes is not None:
                    raise ValueError("the policy sets the window's byte range; pass offset/num_bytes or a policy "
                                     "with a range, not both")
                offset, num_bytes = policy_offset, policy_bytes
        # A stream is resolved now (its errors now, not at entry); a graph's nodes at entry. l2ctl's own
        # streams and buffers hand over their references directly.
        if type(stream) is Stream and stream._ref is not None:  # the commonest object, first
            ref: Optional[StreamRef] = stream._ref
        elif (own_stream := getattr(type(stream), "_l2ctl_stream_ref", None)) is not None:
            ref = own_stream(stream)  # raises for a closed stream
        else:  # a graph is checked now and resolved at entry (its nodes, a predicate)
            ref, stream = as_target(stream)
        if type(buf) is DeviceBuffer and buf._ref is not None:
            buffer: BufferRef = buf._ref
        else:
            own_buffer = getattr(type(buf), "_l2ctl_buffer_ref", None)
            buffer = own_buffer(buf) if own_buffer is not None else resolve_buffer(buf)
        if type(offset) is int and offset == 0 and num_bytes is None:
            self._offset, self._num_bytes = 0, None
        else:
            self._offset = check_nbytes(offset, "offset", allow_zero=True)
            self._num_bytes = None if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
            clip_window(self._offset, self._num_bytes, buffer.nbytes, 0)  # the byte range; no device yet
        self._hit_prop = hit_prop if hit_prop is _PERSISTING else check_property(hit_prop, "hit_prop")
        self._miss_prop = miss_prop if miss_prop is _STREAMING else check_property(miss_prop, "miss_prop", miss=True)
        if reset_on_exit is not True and reset_on_exit is not False or share is not True and share is not False:
            raise TypeError("reset_on_exit and share must be bools")
        self._ref, self._target_object, self._buffer, self._enabled = ref, stream, buffer, enabled
        self._requested_hit_ratio, self._limit_request = requested, limit
        self._reset_on_exit, self._share = reset_on_exit, share
        self._scope: Optional[_registry.Scope] = None
        self._slots: tuple[_registry.Slot, ...] = ()
        self._changed: Optional[Callable[[_registry.Scope], None]] = None
        self._executables: Any = None  # an l2ctl Graph the compiled end marks stale (Target.executables)
        self._device = -1
        self.window = _NO_WINDOW
        self.clipped = False

    @property
    def active(self) -> bool:
        return self._scope is not None

    @property
    def device(self) -> int:
        """The device of the stream (or graph) the window is on, once entered."""
        if self._device < 0:
            raise RuntimeError("the scope has not been entered")
        return self._device

    @property
    def stream(self) -> int:
        """The handle of the stream (or graph node) the window is on, once entered."""
        if not self._slots:
            raise RuntimeError("the scope has not been entered")
        return self._slots[0][1]

    @property
    def set_aside(self) -> int:
        """The limit in force on the device (bytes), once entered."""
        device = self.device
        return _registry.observed_limit(device, properties(device).persisting_l2_cache_max_size)

    def __enter__(self) -> "Persist":
        if self._scope is not None:
            raise RuntimeError("this persist scope is already active; create a new one with l2ctl.persist(...)")
        if not self._enabled:
            return self
        ref = self._ref
        target: Optional[_registry.Target] = None
        if ref is not None:  # a stream: the common case, without a Target
            device = ref.device
            if device is None:
                device = stream_device(ref)
            if ref.source != "l2ctl.Stream":
                check_stream_context(ref, device)
            elif ref.owner._ref is None:  # checked again here: it may have been closed since the scope was made
                raise ValueError("the stream is closed")
            slots: tuple[_registry.Slot, ...] = (_registry.stream_slot(ref.handle),)
            owner = ref.owner
        else:
            target = resolve_target(self._target_object)  # a graph predicate runs here
            device, slots, owner = target.device, target.slots, target.owner
        buffer = self._buffer
        if buffer.allocation and buffer.owner._ref is None:  # an l2ctl buffer freed since the scope was made
            raise ValueError("the device buffer has been freed")
        if buffer.device is not None and buffer.device != device:
            raise ValueError(
                f"the buffer is on device {buffer.device} but the {'stream' if target is None else 'target'} is on "
                f"device {device}; " + ("use a stream of the buffer's device" if target is None else
                                        "for a graph of another device, pass l2ctl.graph.as_graph(g, device=N)")
            )
        props = properties(device)
        if not props.supports_persistence:
            require_persistence(device)  # raises, saying why
        offset = self._offset
        if not offset and self._num_bytes is None and buffer.nbytes <= props.access_policy_max_window_size:
            nbytes, clipped = buffer.nbytes, False
        else:
            nbytes, clipped = clip_window(offset, self._num_bytes, buffer.nbytes, props.access_policy_max_window_size)
        if not buffer.allocation:  # l2ctl's own buffers are one allocation of a known device
            check_owned_pointer(buffer.ptr + offset, nbytes, device, buffer.owner, "the buffer")
        requested = self._requested_hit_ratio
        # A named tuple made without its Python-level __new__: every scope makes one.
        window: AccessPolicyWindow = _new_tuple(AccessPolicyWindow, (buffer.ptr + offset, nbytes,
                                                                    1.0 if requested is None else requested,
                                                                    self._hit_prop, self._miss_prop))
        request = self._limit_request
        if request is not None and request != "auto":
            if request == "max":
                request = props.persisting_l2_cache_max_size
            elif request > props.persisting_l2_cache_max_size:
                raise ValueError(f"set_aside of {request} bytes exceeds persistingL2CacheMaxSize "
                                 f"({props.persisting_l2_cache_max_size} bytes) of device {device}; ask for at most "
                                 "that, or 'max'")
        changed = None
        if target is not None:  # a graph-like target may refuse a window that would not reach what it launches
            changed = after_changes(target, window)
        scope = _registry.Scope(device, slots, window, request, self._share, self._reset_on_exit, requested is None,
                                False, False, (owner, buffer.owner))
        try:
            limit, demand, capped = _registry.enter(scope, props.persisting_l2_cache_max_size, self)
            self._slots, self._changed, self._device, self.clipped = slots, changed, device, clipped
            self._executables = None if target is None else target.executables
            self.window = scope.window  # type: ignore[assignment]  # the hit ratio resolved
            if changed is not None:
                changed(scope)
            if clipped or capped or window.hit_prop is _PERSISTING and demand > limit:
                full = buffer.nbytes - offset if self._num_bytes is None else self._num_bytes
                self._announce((full, nbytes, props.access_policy_max_window_size) if clipped else None, limit,
                               demand, capped)
        except BaseException as error:
            scope.ending = True  # first: if what follows is cut short too, the next l2ctl call ends the scope
            if scope.backend is not None:
                end_after(lambda: self._end(scope), error)
            raise
        return self

    def _announce(self, clip: Optional[tuple[int, int, int]], limit: int, demand: float, capped: bool) -> None:
        """The entered scope's warnings: a clipped window (``clip``: bytes asked, bytes kept, the device's
        largest window), an "auto" limit kept at the tax-free one, windows asking more than the set-aside.
        They go out after the registry's lock is released: a filter may raise (then the scope ends) or run
        user code. They name the user's line (three frames up: this, __enter__, the user's)."""
        device = self._device
        if clip is not None:
            full, nbytes, max_window = clip
            warnings.warn(
                f"window of {full} bytes clipped to accessPolicyMaxWindowSize ({max_window}"
                f" bytes) of device {device}; only the first {nbytes} bytes persist",
                WindowClippedWarning, stacklevel=3)
        if capped:
            warnings.warn(
                f"device {device}: set_aside='auto' kept the persisting limit at {limit} bytes, the driver's default "
                f"({DEFAULT_LIMIT_FRACTION:.0%} of the max): the windows in force ask for {demand:.0f} bytes, but a "
                "larger set-aside slows every other kernel on the GPU (l2ctl.bench.measure_tax measures it here). "
                f"{'The hit ratio was fitted to it. ' if self._requested_hit_ratio is None else ''}"
                "Pass set_aside=<bytes> or 'max' to pay that knowingly; l2ctl.tune measures both sides",
                SetAsideTaxWarning, stacklevel=3)
        elif self.window.hit_prop == AccessProperty.PERSISTING and demand > limit * (1 + 1e-9):
            warnings.warn(
                f"device {device}: live persisting windows ask for {demand:.0f} bytes (hit_ratio x num_bytes) "
                f"but the set-aside is {limit} bytes; lines will evict each other (thrash). Use "
                "share=True, a smaller hit_ratio, or a larger set_aside",
                L2BudgetWarning, stacklevel=3)

    def _end(self, scope: _registry.Scope) -> None:
        """End ``scope`` (marked ``ending`` already) and tell a graph its nodes changed."""
        _registry.exit(scope)
        if self._changed is not None:
            self._changed(scope)

    #: ``__exit__(exc_type, exc, tb)``, compiled (src/planner_bindings.cpp): the scope ends (marked ending first),
    #: then ``_changed`` runs; no Python code of l2ctl's runs before the end, so an interrupt cannot land there.
    #: When the block raised, a failure of the end is a note on the block's own exception.
    __exit__ = _registry.scope_exit

    def __repr__(self) -> str:
        if self._scope is None:
            return "<l2ctl.persist inactive>"
        return f"<l2ctl.persist device={self._device} window={self.window}>"


#: ``persist(stream, buf, hit_ratio=None, ...)``: the scope itself (see Persist).
persist = Persist
