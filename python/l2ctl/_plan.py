"""Arguments of set-asides and windows checked and normalised (pure, no CUDA, property-tested), and the names of
the planner's arithmetic ("auto", the tax-free limit, sharing), which lives once, in C++ (src/l2ctl/planner.cpp)."""

from __future__ import annotations

import numbers
from typing import Literal, Sequence, TypeGuard, Union

import numpy as np

from . import _core

_native = _core._planner  # the planner's rules (src/l2ctl/planner.cpp), typed by _core.pyi

#: A set-aside request as check_set_aside returns it: bytes, "max", a fraction of the max in (0, 1), and for a persist
#: scope "auto" or None. A Literal, so that a type checker refuses "lots".
SetAsideRequest = Union[int, float, Literal["auto", "max"], None]

__all__ = ["HIT_RATIO_TOLERANCE", "normalize_hit_ratio", "hit_ratio_grid", "round_up", "parse_set_aside_request",
           "check_set_aside", "SetAsideRequest", "SET_ASIDE_FORMS", "oversubscribed", "tax_free_limit",
           "DEFAULT_LIMIT_FRACTION", "clip_window", "shared_hit_ratios", "check_nbytes", "check_count", "is_integer",
           "default_hit_ratio"]

#: Hit ratios in (1, 1 + HIT_RATIO_TOLERANCE] are taken as 1.0: they are rounding noise (0.1 added ten
#: times in float32 gives 1.0000001, which CUDA rejects with cudaErrorInvalidValue). Anything larger
#: is an error (the planner's constant).
HIT_RATIO_TOLERANCE: float = _native.plan_hit_ratio_tolerance
#: The most points a hit-ratio grid may have (a bound, so a typo cannot hang the process).
MAX_GRID_POINTS = 100_000
#: The planner's reasons to refuse a hit ratio (its Hit_ratio_fault), worded with the argument's name.
_HIT_RATIO_REFUSALS = {
    1: "{name} must be finite, got {x!r}",
    2: "{name} must be in [0, 1], got {x!r}",
    3: "{name} must be in [0, 1], got {x!r}; values up to 1 + {tolerance:g} are accepted as 1.0 (float "
       "accumulation noise), larger ones are refused",
}


def _as_float(value: numbers.Real, refusal: str) -> float:
    """``float(value)``; a value beyond a float's range (10**400, a huge Fraction) is a ValueError saying
    ``refusal``, as any other value out of range, not the OverflowError float() raises."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{refusal}, got {value!r:.40}{'...' if len(repr(value)) > 40 else ''}, beyond a float's "
                         "range") from None


def normalize_hit_ratio(value: object, name: str = "hit_ratio") -> float:
    """Validate a hit ratio and return it as a float that CUDA accepts (float32 never above 1.0).

    Raises TypeError for non-real values (bool included) and ValueError for NaN, infinities, negative
    values and values above ``1 + HIT_RATIO_TOLERANCE``. Which values and as what: the planner's rule
    (``check_hit_ratio`` in src/l2ctl/planner.cpp), the one the compiled scope applies too.
    """
    if type(value) is float:
        x = value
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1], not {type(value).__name__}")
    else:
        x = _as_float(value, f"{name} must be in [0, 1]")
    ratio, fault = _native.plan_check_hit_ratio(x)
    if fault:
        raise ValueError(_HIT_RATIO_REFUSALS[fault].format(name=name, x=x, tolerance=HIT_RATIO_TOLERANCE))
    # the caller's object where it is unchanged (a window stays canonical); a zero is the planner's (-0.0 is 0.0)
    return x if ratio == x and x != 0.0 else ratio


def hit_ratio_grid(points: int, start: float = 0.0, stop: float = 1.0) -> list[float]:
    """An exact grid of hit ratios (i / (points - 1) scaled), never accumulated, ends included."""
    points = check_count(points, "points", minimum=2, maximum=MAX_GRID_POINTS)
    a = normalize_hit_ratio(start, "start")
    b = normalize_hit_ratio(stop, "stop")
    if b < a:
        raise ValueError(f"stop ({b}) must not be below start ({a})")
    n = points - 1
    return [normalize_hit_ratio(a + (b - a) * i / n) for i in range(n)] + [b]


#: The largest byte count l2ctl accepts anywhere: what a 64-bit size_t holds on the C++ side.
MAX_BYTES = (1 << 63) - 1


def is_integer(value: object) -> TypeGuard[numbers.Integral]:
    """An integer, not a bool (NumPy's included): what every byte count, count, handle and index is."""
    # A plain int first: the ABC check costs a few hundred nanoseconds, on every scope's stream and buffer.
    return type(value) is int or isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_nbytes(value: object, name: str, *, allow_zero: bool = False) -> int:
    """A byte count: an integer (not bool), positive (or zero when allowed), below 2**63."""
    if type(value) is int and (0 < value <= MAX_BYTES or (allow_zero and value == 0)):
        return value  # the common case, without the ABC checks (a scope's path)
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer number of bytes, not {type(value).__name__}")
    n = int(value)
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {n}")
    if n > MAX_BYTES:
        raise ValueError(f"{name} of {n} bytes is beyond any device (at most 2**63 - 1)")
    return n


def check_count(value: object, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A count (repetitions, points, threads): an integer, not bool, within [minimum, maximum]."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    n = int(value)
    if n < minimum or (maximum is not None and n > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {n}")
    return n


def default_hit_ratio(granted: int, window_bytes: int) -> float:
    """The share of a window that ``granted`` bytes of set-aside hold, min(1, granted / window), as the planner
    computes it (the tuner's points at each set-aside)."""
    return float(_native.plan_default_hit_ratio(int(granted), int(window_bytes)))


def round_up(nbytes: int, granularity: int) -> int:
    """Smallest multiple of ``granularity`` that is >= nbytes."""
    return int(_native.plan_round_up(int(nbytes), int(granularity)))


#: What a set-aside is, everywhere (l2ctl.set_aside, persist, Policy, tune's policies, the CLI's --set-aside): said
#: once, for the messages that refuse the other forms.
SET_ASIDE_FORMS = ("an int of bytes (1 is one byte), 'max' (persistingL2CacheMaxSize), or a float strictly between 0 "
                   "and 1 (that fraction of the max: 0.5 is half of it)")


def check_set_aside(value: object, *, scope: bool = False) -> SetAsideRequest:
    """The one check of a set-aside's form, without a device: the request normalised, or the error that says what to
    write. An int (not bool) is bytes; ``"max"`` the device's max; a float strictly between 0 and 1 that fraction of
    the max. A float that could be read as bytes or as all of the max (``1.0``), or is neither (``0.0``, ``2.0``,
    NaN), is refused. ``scope``: a persist scope's request, which also takes ``"auto"`` (what the windows need,
    within the driver's default limit) and None (the limit as it is); ``l2ctl.set_aside`` and the CLI do not."""
    if value is None or (isinstance(value, str) and value == "auto"):
        if scope:
            return None if value is None else "auto"
        raise (TypeError if value is None else ValueError)(f"set_aside={value!r} is a persist scope's request (it sizes the limit to the windows, or "
                         f"leaves it); here the set-aside is {SET_ASIDE_FORMS}")
    if isinstance(value, str):
        if value == "max":
            return "max"
        also = ", 'auto' or None" if scope else ""
        raise ValueError(f"set_aside={value!r} is not a set-aside: write {SET_ASIDE_FORMS}{also}")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"set_aside must be {SET_ASIDE_FORMS}, not bool")
    if isinstance(value, numbers.Integral):
        return check_nbytes(value, "set_aside", allow_zero=True)
    if isinstance(value, numbers.Real):
        f = _as_float(value, "a float set_aside must be a fraction strictly between 0 and 1 (of the max)")
        refused = _native.plan_set_aside_fraction_refusal(f)  # the planner's rule and its words
        if refused:
            raise ValueError(f"set_aside={f!r}{refused}")
        return f
    raise TypeError(f"set_aside must be {SET_ASIDE_FORMS}, not {type(value).__name__}")


def parse_set_aside_request(value: object, maximum: int) -> int:
    """Bytes asked for by ``set_aside(value)`` on a device whose max is ``maximum``: an int (bytes, at most the
    max), ``"max"``, or a float fraction of the max strictly between 0 and 1 (check_set_aside says which forms)."""
    request = check_set_aside(value)
    if isinstance(request, str):
        return int(_native.plan_requested_set_aside("max", 0, 0.0, int(maximum), False))
    if isinstance(request, float):
        return int(_native.plan_requested_set_aside("fraction", 0, request, int(maximum), False))
    assert isinstance(request, int)
    return int(_native.plan_requested_set_aside("bytes", request, 0.0, int(maximum), False))


#: The limit a fresh process gets from the driver, as a fraction of persistingL2CacheMaxSize: 9,830,400 of
#: 32,768,000 B on the H100 and 11,796,480 of 39,321,600 B on the H200 (driver 580). Up to it, the measured
#: set-aside tax on other kernels is nil (README, "the set-aside tax"); "auto" stops there (the planner's constant).
DEFAULT_LIMIT_FRACTION: float = _native.plan_default_limit_fraction


def tax_free_limit(maximum: int, granularity: int) -> int:
    """Where ``set_aside="auto"`` stops growing the limit: the driver's default limit, DEFAULT_LIMIT_FRACTION
    of the max rounded up to the granularity. More costs every other kernel; ask for it explicitly."""
    return int(_native.plan_tax_free_limit(int(maximum), int(granularity)))


def oversubscribed(demand: float, limit: int) -> bool:
    """Whether windows asking ``demand`` bytes (hit ratio x bytes) ask more than a set-aside of ``limit`` bytes,
    so that their lines evict each other (beyond the rounding of the sum)."""
    return bool(_native.plan_oversubscribed(float(demand), int(limit)))


def clip_window(offset: int, num_bytes: int | None, buffer_nbytes: int, max_window: int) -> tuple[int, bool]:
    """Bytes of the window, and whether it was clipped to ``max_window`` (0: never): the planner's rule
    (``clip_window``, which persist's entry applies too).

    ``num_bytes=None`` means from ``offset`` to the end of the buffer. A window that runs past the end
    of the buffer is an error (not clipped): it would cover memory l2ctl knows nothing about.
    """
    offset = check_nbytes(offset, "offset", allow_zero=True)
    n = -1 if num_bytes is None else check_nbytes(num_bytes, "num_bytes")
    kept, clipped, fault = _native.plan_clip_window(offset, n, int(buffer_nbytes), int(max_window))
    if fault == 1:
        raise ValueError(f"offset {offset} is not inside the buffer ({buffer_nbytes} bytes)")
    if fault == 2:
        raise ValueError(f"the window [{offset}, {offset + n}) runs past the end of the buffer ({buffer_nbytes} bytes)")
    return int(kept), bool(clipped)


def shared_hit_ratios(requests: Sequence[tuple[float, int]], set_aside: int) -> list[float]:
    """Scale requested (hit_ratio, window bytes) pairs so that their demand fits the set-aside.

    Demand is sum(hit_ratio x bytes). When it fits, the ratios are returned unchanged; otherwise every
    ratio is multiplied by set_aside / demand (two 16 KiB windows at 1.0 on a 16 KiB set-aside get 0.5
    each, the source documents' example).
    """
    checked = [(normalize_hit_ratio(hr), int(nb)) for hr, nb in requests]
    return list(_native.plan_shared_hit_ratios(checked, int(set_aside)))
