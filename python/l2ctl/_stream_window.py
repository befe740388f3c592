"""Access-policy windows on streams as the registry's slots: the raw get/set/clear (validated before CUDA
is called), where a scope's window goes (a stream, or graph kernel nodes), and a scoped fixed window."""

from __future__ import annotations

from typing import Any, Optional

from . import _backend, _registry
from ._device import check_pointer, properties, require_persistence, stream_device
from ._interop import resolve_stream
from ._window import AccessPolicyWindow, validate_window

__all__ = ["get_window", "set_window", "clear_window", "resolve_target", "ScopedWindow", "check_window_fits"]


def resolve_target(obj: object) -> _registry.Target:
    """A stream (any accepted form), an l2ctl graph, or a selection of its nodes, as registry slots."""
    hook = getattr(type(obj), "_l2ctl_target", None)  # l2ctl.graph.Graph and GraphNodes
    if hook is not None:
        target: _registry.Target = hook(obj)
        return target
    ref = resolve_stream(obj)
    return _registry.Target(stream_device(ref), (_registry.stream_slot(ref.handle),), ref.owner)


def check_window_fits(window: AccessPolicyWindow, device: int) -> None:
    """A non-empty window: the device can persist, the window is within its max size, and it covers
    device memory of that device inside one allocation."""
    if window.empty:
        return
    props = require_persistence(device)
    if window.num_bytes > props.access_policy_max_window_size:
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
    return AccessPolicyWindow.from_tuple(_backend.current().get_stream_window(ref.handle))


def set_window(stream: object, window: AccessPolicyWindow) -> None:
    """Set ``window`` on ``stream`` (kernels launched on it afterwards use it). Validated first: hit ratio,
    properties, the device's support and max window size, and that the window lies in one allocation
    of the stream's device. Inside a live l2ctl scope on the same stream the scope's window stays in
    force, and ``window`` is what the stream returns to when the scopes end."""
    window = validate_window(window)
    ref = resolve_stream(stream)
    device = stream_device(ref)
    check_window_fits(window, device)
    _registry.set_base_window([_registry.stream_slot(ref.handle)], device,
                              properties(device).persisting_l2_cache_max_size, window)


def clear_window(stream: object) -> None:
    """Remove the window from ``stream`` (an empty window: no addresses, hit ratio 0, NORMAL)."""
    set_window(stream, AccessPolicyWindow())


class ScopedWindow:
    """A fixed ``window`` on a stream (or a graph's kernel nodes) for the block, through the registry:
    ``with l2ctl.scoped_window(s, l2ctl.AccessPolicyWindow()):`` runs the block with no window on ``s``,
    whatever scopes are live around it. The limit is left alone."""

    def __init__(self, target: object, window: AccessPolicyWindow) -> None:
        self._window = validate_window(window)
        self._object = target
        self._scope: Optional[_registry.Scope] = None
        self._target: Optional[_registry.Target] = None

    def __enter__(self) -> "ScopedWindow":
        if self._scope is not None:
            raise RuntimeError("this scope is already active; create a new one")
        target = resolve_target(self._object)
        check_window_fits(self._window, target.device)
        scope = _registry.Scope(target.device, target.slots, self._window, owner=target.owner)
        _registry.enter(scope, properties(target.device).persisting_l2_cache_max_size)
        self._scope, self._target = scope, target
        if target.changed is not None:
            target.changed()
        return self

    def __exit__(self, *exc: Any) -> None:
        scope, target, self._scope = self._scope, self._target, None
        if scope is None or target is None:
            return
        _registry.exit(scope)
        if target.changed is not None:
            target.changed()
