"""Access-policy windows on streams: the raw get/set/clear (validated before CUDA is called, applied through
the registry), and the checks a window must pass on a device."""

from __future__ import annotations

from . import _backend, _registry
from ._device import check_pointer, check_stream_context, properties, require_persistence, stream_device
from ._interop import resolve_stream
from ._plan import clip_window
from ._window import AccessPolicyWindow, validate_window

__all__ = ["get_window", "set_window", "clear_window", "check_window_fits"]


def check_window_fits(window: AccessPolicyWindow, device: int) -> None:
    """A non-empty window: the device can persist, the window is within its max size, and it covers
    device memory of that device inside one allocation."""
    if window.empty:
        return
    props = require_persistence(device)
    if clip_window(0, None, window.num_bytes, props.access_policy_max_window_size)[1]:  # the planner's size rule
        raise ValueError(
            f"window of {window.num_bytes} bytes exceeds accessPolicyMaxWindowSize "
            f"({props.access_policy_max_window_size} bytes) of device {device}; use a smaller num_bytes "
            "(l2ctl.persist clips it for you)"
        )
    check_pointer(window.base_ptr, window.num_bytes, device, "the window")


def get_window(stream: object) -> AccessPolicyWindow:
    """The access-policy window currently set on ``stream``."""
    ref = resolve_stream(stream)
    stream_device(ref)  # NoDeviceError where there is no GPU
    return _backend.current().get_stream_window(ref.handle)  # type: ignore[no-any-return]


def set_window(stream: object, window: AccessPolicyWindow) -> None:
    """Set ``window`` on ``stream`` (kernels launched on it afterwards use it). Validated first: hit ratio,
    properties, the device's support and max window size, and that the window lies in one allocation
    of the stream's device. Inside a live l2ctl scope on the same stream the scope's window stays in
    force, and ``window`` is what the stream returns to when the scopes end."""
    window = validate_window(window)
    ref = resolve_stream(stream)
    device = stream_device(ref)
    check_stream_context(ref, device)
    check_window_fits(window, device)
    _registry.set_base_window([_registry.stream_slot(ref.handle)], device,
                              properties(device).persisting_l2_cache_max_size, window)


def clear_window(stream: object) -> None:
    """Remove the window from ``stream`` (an empty window: no addresses, hit ratio 0, NORMAL)."""
    set_window(stream, AccessPolicyWindow())
