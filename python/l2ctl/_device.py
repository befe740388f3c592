"""Device queries and the persisting-L2 set-aside limit."""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from . import _backend
from ._errors import CudaError, NoDeviceError, NotSupportedError
from ._plan import parse_set_aside_request

__all__ = [
    "DeviceInfo",
    "device_count",
    "device_info",
    "get_set_aside",
    "set_aside",
    "SetAside",
    "reset_persisting_lines",
    "set_aside_granularity",
    "set_aside_rounding",
    "resolve_device",
    "require_persistence",
    "versions",
]

MPS_HINT = (
    "the persisting L2 limit cannot be set from a client under MPS (or this process is not allowed to set it); "
    "start the MPS control daemon with CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT=<percent> in its "
    "environment to choose the set-aside for all clients"
)

# CUDA errors that mean "this process may not set the limit" rather than "bad value".
_REFUSED_LIMIT = {"cudaErrorNotSupported", "cudaErrorNotPermitted", "cudaErrorUnsupportedLimit"}

from ._registry import lock as _granularity_lock
_granularity: dict[tuple[int, str], int] = {}
_rounding: dict[tuple[int, str], str] = {}


@dataclass(frozen=True)
class DeviceInfo:
    """What a device offers for L2 persistence. All sizes are in bytes."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    multiprocessor_count: int
    l2_cache_size: int
    persisting_l2_cache_max_size: int
    access_policy_max_window_size: int
    persisting_l2_cache_size: int
    """The current set-aside limit (cudaLimitPersistingL2CacheSize)."""
    set_aside_granularity: Optional[int]
    """The step the driver rounds the limit to, once probed (see set_aside_granularity())."""
    supports_persistence: bool
    unsupported_reason: Optional[str]
    total_memory: int
    pci_bus_id: str
    uuid: str


def device_count() -> int:
    """Number of visible CUDA devices; 0 without a GPU or a usable driver (never raises for that)."""
    return int(_backend.current().device_count())


def resolve_device(device: object = None) -> int:
    """A validated device index; None means the current device. Raises NoDeviceError without a GPU."""
    backend = _backend.current()
    count = int(backend.device_count())
    if count == 0:
        reason = backend.device_count_error() or "no CUDA device is visible"
        raise NoDeviceError(
            f"no CUDA device available ({reason}); l2ctl's device functions need an NVIDIA GPU and driver"
        )
    if device is None:
        return int(backend.current_device())
    index = getattr(device, "index", device)  # torch.device
    if index is None and getattr(device, "type", None) == "cuda":
        return int(backend.current_device())
    index = getattr(index, "id", index)  # cupy.cuda.Device
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
        raise TypeError(f"device must be an int index (or None for the current device), not {type(device).__name__}")
    index = int(index)
    if not 0 <= index < count:
        raise ValueError(f"device {index} does not exist; {count} device(s) are visible (0 to {count - 1})")
    return index


def _properties(device: int) -> dict:
    return _backend.current().device_properties(device)


def _support(props: dict) -> tuple[bool, Optional[str]]:
    major, minor = props["major"], props["minor"]
    if major < 8:
        return False, (
            f"compute capability {major}.{minor} is below 8.0; L2 persistence needs Ampere (sm_80) or newer"
        )
    if props["persisting_l2_cache_max_size"] == 0:
        return False, (
            "persistingL2CacheMaxSize is 0: the device offers no persisting L2 (as in a MIG instance, where "
            "persistence is disabled); use the whole GPU without MIG"
        )
    return True, None


def device_info(device: object = None) -> DeviceInfo:
    """Properties of ``device`` (None: the current device) that matter for L2 persistence."""
    index = resolve_device(device)
    props = _properties(index)
    supported, reason = _support(props)
    limit = int(_backend.current().get_persisting_limit(index)) if props["major"] >= 8 else 0
    return DeviceInfo(
        index=index,
        name=props["name"],
        compute_capability=(props["major"], props["minor"]),
        multiprocessor_count=props["multiprocessor_count"],
        l2_cache_size=props["l2_cache_size"],
        persisting_l2_cache_max_size=props["persisting_l2_cache_max_size"],
        access_policy_max_window_size=props["access_policy_max_window_size"],
        persisting_l2_cache_size=limit,
        set_aside_granularity=_granularity.get((index, props["uuid"])),
        supports_persistence=supported,
        unsupported_reason=reason,
        total_memory=props["total_global_memory"],
        pci_bus_id=props["pci_bus_id"],
        uuid=props["uuid"],
    )


def require_persistence(device: object = None) -> DeviceInfo:
    """device_info(), raising NotSupportedError (with what to do) where persistence is unavailable."""
    info = device_info(device)
    if not info.supports_persistence:
        raise NotSupportedError(f"device {info.index} ({info.name}): {info.unsupported_reason}")
    return info


def get_set_aside(device: object = None) -> int:
    """The current persisting-L2 set-aside limit of ``device``, in bytes."""
    index = resolve_device(device)
    return int(_backend.current().get_persisting_limit(index))


def apply_limit(index: int, nbytes: int) -> int:
    try:
        return int(_backend.current().set_persisting_limit(index, nbytes))
    except CudaError as exc:
        if exc.name in _REFUSED_LIMIT:
            raise NotSupportedError(f"device {index}: {exc}; {MPS_HINT}") from exc
        raise


class SetAside(int):
    """The granted set-aside in bytes (an int), also a context manager that restores the previous limit.

    ``set_aside(n)`` applies the limit at once; ``with set_aside(n):`` additionally puts the previous
    limit back when the block ends, also when it raises.
    """

    device: int
    requested: int
    previous: int

    def __new__(cls, granted: int, device: int, requested: int, previous: int) -> "SetAside":
        obj = super().__new__(cls, granted)
        obj.device, obj.requested, obj.previous = device, requested, previous
        obj._restored = False
        return obj

    @property
    def granted(self) -> int:
        return int(self)

    def __enter__(self) -> "SetAside":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the limit this call replaced back (once)."""
        if not self._restored:
            self._restored = True
            apply_limit(self.device, self.previous)

    def __repr__(self) -> str:
        return (
            f"SetAside(granted={int(self)}, requested={self.requested}, previous={self.previous}, device={self.device})"
        )

    def __reduce__(self):
        return (int, (int(self),))


def set_aside(nbytes: Union[int, float, str], device: object = None) -> SetAside:
    """Set the persisting-L2 set-aside (``cudaLimitPersistingL2CacheSize``) and return what was granted.

    ``nbytes`` is a byte count, ``"max"`` (``persistingL2CacheMaxSize``) or a float fraction of the max
    (``0.5``). The driver rounds the request to its granularity (on an H100, up to a multiple of max/10),
    so the returned value is read back from the driver, never assumed. Use it as ``with l2ctl.set_aside(n): ...`` to
    restore the previous limit afterwards.

    The set-aside is reserved for persisting lines on the whole device: while it is large, every
    other kernel streams through a smaller L2 (an H100 at the max set-aside loses up to 2.5x of its
    DRAM bandwidth for plain copies). Set it no larger than needed, and put it back.
    """
    info = require_persistence(device)
    requested = parse_set_aside_request(nbytes, info.persisting_l2_cache_max_size)
    previous = info.persisting_l2_cache_size
    granted = apply_limit(info.index, requested)
    return SetAside(granted, info.index, requested, previous)


def reset_persisting_lines(device: object = None) -> None:
    """Demote every persisting L2 line of ``device`` to normal (``cudaCtxResetPersistingL2Cache``)."""
    info = require_persistence(device)
    _backend.current().reset_persisting_lines(info.index)


def set_aside_granularity(device: object = None) -> int:
    """The step (bytes) the driver rounds set-aside requests to; probed once per device and cached.

    The driver does not grant arbitrary byte counts: on an H100 (driver 580) every request becomes a
    multiple of max/10, rounded *up* (3 MiB + 12345 B gives 3,276,800 B). The probe asks for 1 byte,
    and where that gives 0 (rounding down or to nearest) for max - 1 and, if needed, bisects; it then
    restores the previous limit, also on error. set_aside_rounding() tells the direction found.
    """
    info = require_persistence(device)
    key = (info.index, info.uuid)
    with _granularity_lock:
        if key not in _granularity:
            backend = _backend.current()
            maximum = info.persisting_l2_cache_max_size

            def ask(n: int) -> int:
                return int(backend.set_persisting_limit(info.index, n))

            previous = int(backend.get_persisting_limit(info.index))  # read under the lock, not from info
            try:
                step, direction = _probe_rounding(ask, maximum)
            finally:
                backend.set_persisting_limit(info.index, previous)
            _granularity[key] = step
            _rounding[key] = direction
        return _granularity[key]


def set_aside_rounding(device: object = None) -> str:
    """How the driver rounds set-aside requests: "up", "down", "nearest" or "exact" (probes once)."""
    info = require_persistence(device)
    set_aside_granularity(info.index)
    return _rounding[(info.index, info.uuid)]


def _probe_rounding(ask, maximum: int) -> tuple[int, str]:
    """(granularity, direction) from a few limit requests; ``ask(n)`` sets the limit and returns the grant."""
    if maximum <= 1:
        return 1, "exact"
    one = ask(1)
    if one == 1:
        return 1, "exact"
    if one > 1:
        return one, "up"
    below = ask(maximum - 1)
    if below < maximum:
        return max(1, maximum - below), "down"
    # Rounded to nearest: the smallest request granted non-zero is half a step (bisection).
    lo, hi = 1, maximum
    while lo < hi:
        mid = (lo + hi) // 2
        if ask(mid) > 0:
            hi = mid
        else:
            lo = mid + 1
    return max(1, ask(lo)), "nearest"


def versions() -> dict:
    """Driver and runtime versions as ints (e.g. 13000 for 13.0); driver 0 when no driver is loaded."""
    backend = _backend.current()
    return {"driver": int(backend.driver_version()), "runtime": int(backend.runtime_version())}
