"""Access-policy windows as values: the properties, the window, and its validation (no device needed).
Putting windows on streams and graph nodes: _stream_window and graph."""

from __future__ import annotations

import enum
from typing import NamedTuple, Optional

from ._interop import resolve_buffer
from ._plan import check_nbytes, clip_window, is_integer, normalize_hit_ratio

__all__ = ["AccessProperty", "AccessPolicyWindow", "validate_window", "check_property"]


class AccessProperty(enum.IntEnum):
    """cudaAccessProperty: what an access in (hit) or out of (miss) the hit ratio does to its L2 line."""

    NORMAL = 0
    STREAMING = 1
    PERSISTING = 2


class AccessPolicyWindow(NamedTuple):
    """cudaAccessPolicyWindow. ``base_ptr`` is a device address, ``num_bytes`` the window size in bytes;
    a fraction ``hit_ratio`` of the lines in it get ``hit_prop``, the rest ``miss_prop``. An immutable
    value (a named tuple: cheap to make, as every persist scope makes one)."""

    base_ptr: int = 0
    num_bytes: int = 0
    hit_ratio: float = 0.0
    hit_prop: AccessProperty = AccessProperty.NORMAL
    miss_prop: AccessProperty = AccessProperty.NORMAL

    @property
    def empty(self) -> bool:
        """True for the cleared window (0 bytes): no address gets a special property."""
        return self.num_bytes == 0

    @property
    def demand(self) -> float:
        """hit_ratio x num_bytes: the persisting L2 this window asks for when hit_prop is PERSISTING."""
        return self.hit_ratio * self.num_bytes if self.hit_prop == AccessProperty.PERSISTING else 0.0

    def as_tuple(self) -> tuple[int, int, float, int, int]:
        """The five fields as a plain tuple's type (the window is one: the properties are ints already)."""
        return self

    @classmethod
    def for_buffer(
        cls,
        buf: object,
        hit_ratio: float = 1.0,
        *,
        offset: int = 0,
        num_bytes: Optional[int] = None,
        hit_prop: AccessProperty = AccessProperty.PERSISTING,
        miss_prop: AccessProperty = AccessProperty.STREAMING,
    ) -> "AccessPolicyWindow":
        """A window over ``buf`` (any accepted buffer) from ``offset`` for ``num_bytes`` (default: to its end)."""
        ref = resolve_buffer(buf)
        offset = check_nbytes(offset, "offset", allow_zero=True)
        n, _ = clip_window(offset, num_bytes, ref.nbytes, 0)  # the byte range's checks (no maximum: never clipped)
        return validate_window(cls(ref.ptr + offset, n, hit_ratio, hit_prop, miss_prop))


def check_property(value: object, name: str, *, miss: bool = False) -> AccessProperty:
    """An AccessProperty from itself or its int value; ``miss``: PERSISTING is refused (CUDA refuses it)."""
    if type(value) is AccessProperty and not (miss and value is AccessProperty.PERSISTING):
        return value
    if not is_integer(value):
        raise TypeError(f"{name} must be an AccessProperty (or its int value), not {type(value).__name__}")
    try:
        prop = AccessProperty(int(value))
    except ValueError:
        raise ValueError(f"{name} must be one of {[p.name for p in AccessProperty]}, got {value!r}") from None
    if miss and prop == AccessProperty.PERSISTING:
        raise ValueError(f"{name} must be NORMAL or STREAMING (CUDA refuses PERSISTING for misses)")
    return prop


def validate_window(window: AccessPolicyWindow) -> AccessPolicyWindow:
    """Type and range checks that need no device (hit ratio, properties, byte count)."""
    if not isinstance(window, AccessPolicyWindow):
        raise TypeError(f"expected an AccessPolicyWindow, got {type(window).__name__}")
    base = check_nbytes(window.base_ptr, "base_ptr", allow_zero=True)
    nbytes = check_nbytes(window.num_bytes, "num_bytes", allow_zero=True)
    hit_prop = check_property(window.hit_prop, "hit_prop")
    miss_prop = check_property(window.miss_prop, "miss_prop", miss=True)
    if nbytes and not base:
        raise ValueError("a non-empty window needs a base_ptr")
    hit_ratio = normalize_hit_ratio(window.hit_ratio)
    if (base is window.base_ptr and nbytes is window.num_bytes and hit_ratio is window.hit_ratio
            and hit_prop is window.hit_prop and miss_prop is window.miss_prop):
        return window  # already canonical: no copy
    return window._replace(
        base_ptr=base,
        num_bytes=nbytes,
        hit_ratio=hit_ratio,
        hit_prop=hit_prop,
        miss_prop=miss_prop,
    )
