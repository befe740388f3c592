"""The persisting-L2 set-aside: what a device offers (DeviceInfo), the limit (get and set, as a scope),
the driver's granularity, and resetting persisting lines. Every change goes through the registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from . import _backend, _registry
from ._device import DeviceProperties, properties, require_persistence, resolve_device
from ._plan import check_set_aside, parse_set_aside_request, round_up, tax_free_limit

__all__ = ["DeviceInfo", "device_info", "get_set_aside", "set_aside", "SetAside", "reset_persisting_lines",
           "set_aside_granularity", "set_aside_rounding", "auto_set_aside_cap", "set_aside_grid"]


@dataclass(frozen=True)
class DeviceInfo(DeviceProperties):
    """What a device offers for L2 persistence (its properties, see DeviceProperties) and its set-aside
    now. All sizes are in bytes."""

    persisting_l2_cache_size: int = 0
    """The current set-aside limit (cudaLimitPersistingL2CacheSize)."""
    set_aside_granularity: Optional[int] = None
    """The step the driver rounds the limit to, once probed (see set_aside_granularity())."""


def _read_limit(index: int) -> int:
    known = _registry.known_limit(index)
    return int(_backend.current().get_persisting_limit(index)) if known is None else known


def device_info(device: object = None) -> DeviceInfo:
    """Properties of ``device`` (None: the current device) that matter for L2 persistence, and its
    current limit. The properties are cached; the limit is read unless l2ctl owns it at the moment."""
    props = properties(device)
    limit = _read_limit(props.index) if props.compute_capability[0] >= 8 else 0
    return DeviceInfo(**vars(props), persisting_l2_cache_size=limit,
                      set_aside_granularity=_registry.known_granularity(props.index))


def get_set_aside(device: object = None) -> int:
    """The current persisting-L2 set-aside limit of ``device``, in bytes."""
    return _read_limit(resolve_device(device))


def _rounding(device: object) -> tuple[int, str]:
    """(step, direction) of the driver's rounding of limit requests on ``device`` (probed once)."""
    props = require_persistence(device)
    return _registry.granularity(props.index, props.persisting_l2_cache_max_size)


class SetAside(int):
    """The granted set-aside in bytes (an int) and the scope that holds it.

    ``set_aside(n)`` applies the limit at once and keeps it until ``restore()``; ``with set_aside(n):``
    ends the scope when the block ends, also when it raises. Either way the limit then becomes what
    the scopes still live on the device ask for (persist scopes, other set_aside calls), or what it was
    before l2ctl changed it: any order of exits, in any threads, ends right.
    """

    device: int
    requested: int
    previous: int
    _scope: _registry.Scope

    def __new__(cls, granted: int, device: int, requested: int, previous: int, scope: _registry.Scope) -> "SetAside":
        obj = super().__new__(cls, granted)
        obj.device, obj.requested, obj.previous, obj._scope = device, requested, previous, scope
        return obj

    @property
    def granted(self) -> int:
        return int(self)

    #: ``__enter__``, compiled: the request, standing until now, becomes the block's, ended by ``__exit__``.
    if TYPE_CHECKING:
        def __enter__(self) -> "SetAside": ...
    else:
        __enter__ = _registry.set_aside_enter

    __exit__ = _registry.scope_exit  # compiled, as persist's (see Persist.__exit__)

    def restore(self) -> None:
        """End this request (idempotent): the limit goes back to what the live scopes and the base say."""
        _registry.exit(self._scope)

    def __del__(self) -> None:
        scope = getattr(self, "_scope", None)
        if scope is not None:
            if scope.standing:
                scope.orphaned = True  # nobody can restore it any more; a later plain call may drop it
            else:
                scope.ending = True  # a block's, its __exit__ interrupted before it began: the next call ends it

    def __repr__(self) -> str:
        return (
            f"SetAside(granted={int(self)}, requested={self.requested}, previous={self.previous}, device={self.device})"
        )

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (int, (int(self),))


def set_aside(nbytes: Union[int, float, Literal["max"]], device: object = None) -> SetAside:
    """Set the persisting-L2 set-aside (``cudaLimitPersistingL2CacheSize``) and return what was granted.

    ``nbytes`` is an int of bytes (``1`` is one byte), ``"max"`` (``persistingL2CacheMaxSize``) or a float strictly
    between 0 and 1, that fraction of the max (``0.5``); ``1.0`` is refused (write ``"max"`` or an int), as ``persist``,
    ``Policy`` and the CLI's ``--set-aside`` refuse it. The driver rounds the request to its granularity (on an H100, up to a multiple of max/10),
    so the returned value is read back from the driver, never assumed. Use it as ``with l2ctl.set_aside(n): ...``
    to end the request with the block.

    The set-aside is reserved for persisting lines on the whole device: while it is large, every
    other kernel streams through a smaller L2 (plain copies ran 2.4x slower at the max on an H100:
    docs/results.md). Set it no larger than needed, and put it back.
    """
    check_set_aside(nbytes)  # arguments first, then the device
    props = require_persistence(device)
    requested = parse_set_aside_request(nbytes, props.persisting_l2_cache_max_size)
    previous = _read_limit(props.index)
    scope = _registry.Scope(props.index, limit=requested, standing=True)
    try:
        _registry.enter(scope, props.persisting_l2_cache_max_size)
        return SetAside(_read_limit(props.index), props.index, requested, previous, scope)
    except BaseException:
        scope.ending = True  # nothing can restore it without its SetAside: end it (the next call, if cut short)
        _registry.exit(scope)
        raise


def reset_persisting_lines(device: object = None) -> None:
    """Demote every persisting L2 line of ``device`` to normal (``cudaCtxResetPersistingL2Cache``)."""
    props = require_persistence(device)
    _registry.reset_lines(props.index)


def set_aside_granularity(device: object = None) -> int:
    """The step (bytes) the driver rounds set-aside requests to; probed once per device and cached.

    The driver does not grant arbitrary byte counts: on an H100 (driver 580) every request becomes a
    multiple of max/10, rounded *up* (3 MiB + 12345 B gives 3,276,800 B). The probe asks for 1 byte,
    and where that gives 0 (rounding down or to nearest) for max - 1 and, if needed, bisects; it then
    restores the previous limit, also on error. set_aside_rounding() tells the direction found.
    """
    return _rounding(device)[0]


def auto_set_aside_cap(device: object = None) -> int:
    """Where ``persist(..., set_aside="auto")`` stops growing the limit (bytes): the driver's default limit,
    30% of persistingL2CacheMaxSize rounded up to the granularity. Below it the set-aside costs other
    kernels nothing measurable; above it, it does (docs/results.md), so more is granted only on request."""
    props = require_persistence(device)
    return tax_free_limit(props.persisting_l2_cache_max_size, _rounding(props.index)[0])


def set_aside_rounding(device: object = None) -> str:
    """How the driver rounds set-aside requests: "up", "down", "nearest" or "exact" (probes once)."""
    return _rounding(device)[1]


def set_aside_grid(device: object = None, *, include_zero: bool = True) -> list[int]:
    """Every limit the driver can grant: multiples of its granularity up to the max."""
    info = require_persistence(device)
    g = set_aside_granularity(info.index)
    steps = max(1, info.persisting_l2_cache_max_size // g)
    if steps > 64:  # drivers with a fine granularity: 32 even steps
        g, steps = round_up(info.persisting_l2_cache_max_size // 32, g), 32
    grid = [min(k * g, info.persisting_l2_cache_max_size) for k in range(0 if include_zero else 1, steps + 1)]
    return sorted(set(grid))
