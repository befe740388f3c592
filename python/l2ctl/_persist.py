"""``persist``: keep a buffer in L2 for the kernels a block of code launches on a stream (or that a CUDA
graph replays), through the registry that lets any number of such scopes share a device's set-aside."""
# mypy: disable-error-code="empty-body"
# (the class Persist below declares a compiled type: its methods have no Python body)

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Concatenate, Optional, ParamSpec, TypedDict

from . import _registry
from ._registry import _native
from ._device import properties, require_persistence
from ._errors import (L2BudgetWarning, NotSupportedError, PersistenceUnavailableWarning, SetAsideClampedWarning, SetAsideTaxWarning,
                      WindowClippedWarning)
from ._interop import BufferRef, StreamRef, remembered, resolve_buffer, stream_remembered
from ._memory import BufferLike, Stream
from ._plan import (DEFAULT_LIMIT_FRACTION, SetAsideRequest, check_nbytes, check_set_aside, clip_window,
                    normalize_hit_ratio, oversubscribed)
from ._targets import Target, as_target
from ._window import AccessPolicyWindow, AccessProperty, check_property

__all__ = ["persist", "Persist", "Policy", "Budget", "budget"]

#: What a scope asks of the set-aside (_plan.SetAsideRequest, checked by _plan.check_set_aside): "auto" is enough for
#: the windows in force, kept within the driver's default limit; None is the limit as it is.
LimitRequest = SetAsideRequest
_PERSISTING, _STREAMING = AccessProperty.PERSISTING, AccessProperty.STREAMING


@dataclass(frozen=True)
class Policy:
    """A persistence policy: the set-aside (bytes, ``"max"``, a fraction of the max in (0, 1), ``"auto"`` or None to
    leave it; as l2ctl.set_aside and persist take it), the hit
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
        return oversubscribed(self.demand, self.set_aside)


def budget(device: object = None) -> Budget:
    """The windows in force on ``device``, their total demand and the current set-aside."""
    props = require_persistence(device)
    limit, in_force, demand = _registry.snapshot(props.index, props.persisting_l2_cache_max_size)
    return Budget(props.index, limit, demand,
                  tuple((scope.slots[0][1] if scope.slots else 0, w.num_bytes, w.hit_ratio) for scope, w in in_force))


def _check_policy_fields(hit_ratio: object, set_aside: object, enabled: object, offset: object,
                         num_bytes: object) -> tuple[Optional[float], LimitRequest, bool, int, Optional[int]]:
    if not isinstance(enabled, bool):
        raise TypeError("policy.enabled must be a bool")
    return ((None if hit_ratio is None else normalize_hit_ratio(hit_ratio)), check_set_aside(set_aside, scope=True), enabled,
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


def _disabled_reason(policy: object) -> str:
    """Why a scope made from a "no persistence" policy changes nothing: the tuner's reason where it gave one."""
    reason = getattr(policy, "reason", None)
    return f"the policy is \"no persistence\" ({reason})" if isinstance(reason, str) else "the policy is disabled"


class Request(TypedDict):
    """persist's arguments as ``_prepare`` checked and normalised them: a field per argument, of its name, but
    ``policy`` (folded into the others), and what resolving them found. The compiled scope reads it by field name
    (src/persist_type.hpp); the Host's registration checks the names (l2ctl._host)."""

    stream: Optional[StreamRef]  # None: a graph-like target, resolved at entry
    buf: BufferRef
    hit_ratio: Optional[float]  # None: fitted to the set-aside
    num_bytes: Optional[int]  # None: to the buffer's end
    offset: int
    hit_prop: AccessProperty
    miss_prop: AccessProperty
    set_aside: LimitRequest
    reset_on_exit: bool
    share: bool
    strict: bool
    clamp: bool
    target: object  # the target as given
    reason: Optional[str]  # why the scope changes nothing (a "no persistence" policy), or None
    remember_stream: bool  # the stream object may be remembered (a torch or CuPy stream)
    buffer_stamp: Optional[tuple[Optional[Callable[[Any], Any]], Any]]  # how to tell its memory moved; None: forget it


def _prepare(stream: Target, buf: BufferLike, hit_ratio: Optional[float] = None, *, num_bytes: Optional[int] = None,
             offset: int = 0, hit_prop: AccessProperty = _PERSISTING, miss_prop: AccessProperty = _STREAMING,
             set_aside: LimitRequest = "auto", reset_on_exit: bool = True, share: bool = False,
             policy: Optional[Any] = None, strict: bool = True, clamp: bool = False) -> Request:
    """``persist``'s arguments checked and normalised, before any device query or CUDA call: every form the
    compiled scope does not take as it is (the one place their rules are written). Its parameters are the one
    declaration of persist's arguments (Persist's signature is theirs; src/persist_type.hpp names the same, and the
    Host's registration checks them): the compiled scope hands it the arguments as it was given them."""
    requested = None if hit_ratio is None else normalize_hit_ratio(hit_ratio)
    limit = check_set_aside(set_aside, scope=True)
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
    # A stream is resolved now (its errors now, not at entry); a graph's nodes at entry.
    own_stream = getattr(type(stream), "_l2ctl_stream_ref", None)
    target: object = stream
    if own_stream is not None:
        ref: Optional[StreamRef] = own_stream(stream)  # raises for a closed stream
    else:  # a graph is checked now and resolved at entry (its nodes, a predicate)
        ref, target = as_target(stream)
    own_buffer = getattr(type(buf), "_l2ctl_buffer_ref", None)
    buffer: BufferRef = own_buffer(buf) if own_buffer is not None else resolve_buffer(buf)
    offset = check_nbytes(offset, "offset", allow_zero=True)
    checked_bytes = None if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
    clip_window(offset, checked_bytes, buffer.nbytes, 0)  # the byte range; no device yet
    hit = hit_prop if hit_prop is _PERSISTING else check_property(hit_prop, "hit_prop")
    miss = miss_prop if miss_prop is _STREAMING else check_property(miss_prop, "miss_prop", miss=True)
    if (reset_on_exit is not True and reset_on_exit is not False or share is not True and share is not False
            or strict is not True and strict is not False or clamp is not True and clamp is not False):
        raise TypeError("reset_on_exit, share, strict and clamp must be bools")
    return {"stream": ref, "buf": buffer, "hit_ratio": requested, "num_bytes": checked_bytes, "offset": offset,
            "hit_prop": hit, "miss_prop": miss, "set_aside": limit, "reset_on_exit": reset_on_exit, "share": share,
            "strict": strict, "clamp": clamp, "target": target, "reason": None if enabled else _disabled_reason(policy),
            "remember_stream": ref is not None and own_stream is None and stream_remembered(target, ref),
            "buffer_stamp": None if own_buffer is not None else remembered(buf, buffer)}


_P = ParamSpec("_P")


def _arguments_of(declared: Callable[_P, Any]) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, _P], None]]:
    """Types ``__init__`` with the parameters of ``declared`` (for type checkers: the one declaration stays one)."""
    return lambda init: init


def _announce(scope: "Persist", clip: Optional[tuple[int, int, int]], limit: int, demand: float, capped: bool,
              clamped: Optional[tuple[int, int]], asked: float) -> None:
    """The entered scope's warnings: a clipped window (``clip``: bytes asked, bytes kept, the device's largest
    window), a set-aside clamped to the max (``clamped``: bytes asked, bytes granted), an "auto" limit kept at the
    tax-free one, windows asking more than the set-aside. ``demand``: the windows in force as entered; ``asked``: the
    same with this scope's window as asked, before ``hit_ratio=None`` cut it to the room. The compiled entry
    calls this after the registry's lock is released (a filter may raise: the scope then ends, or run user code),
    with no Python frame of l2ctl's between: stacklevel 2 names the user's line."""
    device = scope.device
    if clip is not None:
        full, nbytes, max_window = clip
        warnings.warn(
            f"window of {full} bytes clipped to accessPolicyMaxWindowSize ({max_window}"
            f" bytes) of device {device}; only the first {nbytes} bytes persist",
            WindowClippedWarning, stacklevel=2)
    if clamped is not None:
        asked, granted = clamped
        warnings.warn(
            f"device {device}: set_aside of {asked} bytes exceeds persistingL2CacheMaxSize; clamped to {granted} "
            "bytes (clamp=True)", SetAsideClampedWarning, stacklevel=2)
    if capped:
        warnings.warn(
            f"device {device}: set_aside='auto' kept the persisting limit at {limit} bytes, the driver's default "
            f"({DEFAULT_LIMIT_FRACTION:.0%} of the max): the windows in force ask for {asked:.0f} bytes, but a "
            "larger set-aside slows every other kernel on the GPU (l2ctl.bench.measure_tax measures it here). "
            f"{_fitted(scope) if scope._requested_hit_ratio is None else ''}"
            "Pass set_aside=<bytes> or 'max' to pay that knowingly; l2ctl.tune measures both sides",
            SetAsideTaxWarning, stacklevel=2)
    elif scope.window.hit_prop == AccessProperty.PERSISTING and oversubscribed(demand, limit):
        warnings.warn(
            f"device {device}: live persisting windows ask for {demand:.0f} bytes (hit_ratio x num_bytes) "
            f"but the set-aside is {limit} bytes; lines will evict each other (thrash). Use "
            "share=True, a smaller hit_ratio, or a larger set_aside",
            L2BudgetWarning, stacklevel=2)


def _fitted(scope: "Persist") -> str:
    """What ``hit_ratio=None`` made of a window larger than the set-aside (the planner's fit_window)."""
    window = scope.window
    if window.hit_ratio == 1.0:
        return f"The window was cut to its first {window.num_bytes} bytes, which it holds, at hit ratio 1.0. "
    return f"The hit ratio was fitted to it ({window.hit_ratio:.3g}). "


#: (device, reason) pairs a best-effort scope has warned of: once each per process.
_warned_unavailable: set[tuple[int, str]] = set()


def _unavailable(scope: "Persist") -> None:
    """A best-effort scope (strict=False) found that its device cannot persist: it changes nothing, and says so
    once per device and reason. Called by the compiled entry with no Python frame of l2ctl's between: stacklevel
    2 names the user's line."""
    key = (scope.device, str(scope.reason))
    if key in _warned_unavailable:
        return
    warnings.warn(f"l2ctl.persist(strict=False) changes nothing here: {scope.reason}",
                  PersistenceUnavailableWarning, stacklevel=2)
    _warned_unavailable.add(key)  # said only once it returned: a filter that raised it (-W error) said nothing


def _set_aside(scope: "Persist") -> int:
    """The limit in force on the device (bytes), once entered; 0 where the device cannot persist (or none was
    found)."""
    device = scope.device
    try:
        props = properties(device) if device >= 0 else None
    except NotSupportedError:  # a best-effort scope that found no device
        return 0
    if props is None or not props.supports_persistence:
        return 0
    return _registry.observed_limit(device, props.persisting_l2_cache_max_size)


def _repr(scope: "Persist") -> str:
    if not scope.active:
        return "<l2ctl.persist inactive>" if scope.reason is None else f"<l2ctl.persist off: {scope.reason}>"
    return f"<l2ctl.persist device={scope.device} window={scope.window}>"


class Persist:
    """Keep ``buf`` (or ``num_bytes`` of it from ``offset``) in L2 for kernels launched on ``stream``
    inside the ``with`` block (or between ``start()`` and ``stop()``).

    >>> with l2ctl.persist(stream, lut, hit_ratio=0.75) as p:
    ...     run_my_kernels(stream)

    - ``hit_ratio``: fraction of the window's lines given ``hit_prop``. None: as much as the set-aside
      holds next to the other windows in force (the room): a window that fits is kept whole at 1.0, a
      larger one is cut to its first room bytes (in 256-byte units) at 1.0 (``window`` says so), not
      spread over the whole window at room / window (docs/results.md measures both). An explicit
      ``hit_ratio`` or ``num_bytes`` is applied as given. Values in (1, 1 + 1e-6] count as 1.0; NaN,
      negatives and larger values raise ValueError.
    - ``set_aside="auto"`` raises the device's persisting limit just enough for the windows in force
      (rounded up to the driver's granularity), never below what it was, and never past the driver's
      default limit (30% of persistingL2CacheMaxSize: 9.375 MiB on an H100, 11.25 MiB on an H200).
      When the windows ask for more, it stops there and says so (SetAsideTaxWarning): the set-aside is a
      tax on everything else, L2 reserved for persisting lines is lost to every other kernel on the GPU
      (plain copies ran 2.4x slower at the max on an H100: docs/results.md), and below the default limit
      the measured tax is nil. An int asks for exactly that many bytes (the driver rounds it;
      ``p.set_aside`` is what it granted), ``"max"`` for persistingL2CacheMaxSize, a float strictly between 0
      and 1 for that fraction of it (``1.0`` is refused: write ``"max"`` or an int); None leaves the limit
      alone. Under MPS, where a client cannot set the limit, ``"auto"`` takes the limit MPS gives, as None
      does; an explicit request raises NotSupportedError. l2ctl.tune() measures what a larger set-aside buys
      and costs.
    - A window larger than accessPolicyMaxWindowSize is clipped to it, with a WindowClippedWarning.
    - ``share=True``: hit ratios of all shared scopes in force on the device are scaled so their total
      demand fits what the other windows leave of the set-aside (two windows as large as the set-aside
      get half each).
    - ``policy``: a Policy (or what l2ctl.tune returned) instead of ``hit_ratio`` and ``set_aside`` (and,
      when the policy has a byte range, ``offset``/``num_bytes``); passing both is an error.
    - ``clamp=True``: an int ``set_aside`` above persistingL2CacheMaxSize is granted the max, with a
      SetAsideClampedWarning naming the bytes asked and granted (without it: ValueError).
    - ``strict=False`` (best effort): where the device cannot persist (no device, compute capability below
      8.0, a MIG instance, a limit refused under MPS), the scope changes nothing, warns once per device
      (PersistenceUnavailableWarning) and ``reason`` says why. Arguments are still checked: a bad hit ratio
      raises either way.

    A scope for an app's lifetime (set at model load, kept until unload or for a server's life):
    ``p = l2ctl.persist(stream, buf, ...).start()`` ... ``p.stop()`` (``close()`` too). It is the same scope as
    the ``with`` block, with the same promises; it also ends when the object is garbage-collected and at
    interpreter exit.

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
    resolved; empty before entry and for a scope that changes nothing), ``set_aside`` (the limit in force,
    bytes; 0 where the device cannot persist), ``device`` (-1 where no device was found), ``stream`` (the
    handle), ``clipped``, ``active`` (whether it is live in l2ctl's registry) and ``reason`` (None, or why
    it changes nothing: a "no persistence" policy, or with ``strict=False`` the device). One object is one
    scope: entering it again while it is live (from another thread too) is refused.
    """

    window: AccessPolicyWindow
    clipped: bool
    _requested_hit_ratio: Optional[float]

    @_arguments_of(_prepare)  # its parameters: _prepare's, the one declaration of them
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    @property
    def active(self) -> bool: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def set_aside(self) -> int: ...
    @property
    def reason(self) -> Optional[str]: ...
    def start(self) -> "Persist": ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Persist": ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...


if not TYPE_CHECKING:
    # The scope is a compiled type (src/persist_scope.cpp): its construction, entry and end run in C++, so no
    # bytecode runs between a device change and its record, and a lean scope costs about its driver calls. The
    # class above declares it (for type checkers and help()); its signature is _prepare's (a compiled type carries
    # none of its own).
    _declared = Persist
    Persist = _native.Persist
    Persist.__doc__ = inspect.cleandoc(_declared.__doc__)
    Persist.set_aside = property(_set_aside, doc=_set_aside.__doc__)
    Persist.__signature__ = inspect.signature(_prepare).replace(return_annotation=inspect.Signature.empty)
    Persist.__repr__ = _repr


#: ``persist(stream, buf, hit_ratio=None, ...)``: the scope itself (see Persist).
persist = Persist
