"""The bystander tax of a set-aside: how much slower a plain copy (no window anywhere) runs while the
limit is in place, measured as a paired comparison against no set-aside. Cached per backend, device and
granted limit for the life of the process, so every tuning can report it without paying for it twice."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from .._memory import StreamLike
from .. import _backend
from .._device import properties, stream_device
from .._interop import resolve_stream
from .._limit import set_aside_granularity
from .._plan import check_nbytes, round_up

__all__ = ["Tax", "NO_TAX", "measure_tax", "forget_taxes", "copy_pace"]

_cache: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Tax]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def copy_pace(slowdown: float) -> str:
    """How a plain copy runs under a set-aside, in words: "at full speed" when its slowdown rounds to 1.00 or
    less (a copy does not run faster for a set-aside: that is noise), else "2.37x slower"."""
    return "at full speed" if round(slowdown, 2) <= 1.0 else f"{slowdown:.2f}x slower"


@dataclass(frozen=True)
class Tax:
    """A plain copy's time with ``set_aside`` bytes set aside over its time with none (1.0: no tax), with
    the confidence interval of that ratio."""

    set_aside: int
    copy_slowdown: float
    ci: tuple[float, float]
    copy_bytes: int
    copy_ms_without: float
    copy_ms_with: float

    @property
    def pace(self) -> str:
        """:func:`copy_pace` of this tax: "at full speed" or "2.37x slower"."""
        return copy_pace(self.copy_slowdown)

    @property
    def copy_gbps_without(self) -> float:
        return 2 * self.copy_bytes / self.copy_ms_without / 1e6 if self.copy_bytes else 0.0  # nothing measured

    @property
    def copy_gbps_with(self) -> float:
        return 2 * self.copy_bytes / self.copy_ms_with / 1e6 if self.copy_bytes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"set_aside": self.set_aside, "copy_slowdown": self.copy_slowdown, "copy_slowdown_ci": list(self.ci),
                "copy_bytes": self.copy_bytes, "copy_gbps_without": self.copy_gbps_without,
                "copy_gbps_with": self.copy_gbps_with}


#: What no set-aside costs: nothing, and nothing measured.
NO_TAX = Tax(0, 1.0, (1.0, 1.0), 0, 0.0, 0.0)


def measure_tax(stream: StreamLike, set_aside: int, *, rounds: int = 3, repeat: int = 5) -> Tax:
    """The tax of ``set_aside`` bytes (rounded up to the driver's granularity) on a copy of 8x the L2
    size. 0 bytes costs nothing and is not measured."""
    set_aside = check_nbytes(set_aside, "set_aside", allow_zero=True)
    device = stream_device(resolve_stream(stream))
    info = properties(device)
    if set_aside == 0 or not info.supports_persistence:
        return NO_TAX
    granted = min(info.persisting_l2_cache_max_size, round_up(set_aside, set_aside_granularity(device)))
    key = (device, granted)
    backend = _backend.current()
    with _lock:
        cached = _cache.get(backend, {}).get(key)
    if cached is not None:
        return cached
    nbytes = round_up(8 * info.l2_cache_size, 1 << 20)
    from ..workloads.copy import CopyWorkload  # the bystander and the rounds, loaded when a tax is first measured
    from .paired import Arm, compare

    with CopyWorkload(nbytes, device) as copy:
        base, (taxed,) = compare(copy, stream, [Arm("set-aside", granted)], rounds=rounds, repeat=repeat, warmup=1,
                                 benchmark="tax")
    slowdown, (low, high) = 1.0 / taxed.speedup, (1.0 / taxed.ci[1], 1.0 / taxed.ci[0])
    tax = Tax(granted, slowdown, (low, high), nbytes, base.median_ms, taxed.median_ms)
    with _lock:
        _cache.setdefault(backend, {})[key] = tax
    return tax


def forget_taxes() -> None:
    """Drop the cached measurements (after a change of clocks or tenants that the cache cannot see)."""
    with _lock:
        _cache.clear()
