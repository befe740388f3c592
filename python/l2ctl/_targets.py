"""What a scope's window goes on: a stream, an l2ctl graph (or a selection of its kernel nodes), a
torch.cuda.CUDAGraph, or the graphs PyTorch captures (graph.torch_captures()), resolved to registry slots;
and ``scoped_window``, a fixed window on any of them for a block."""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _registry, _torch_graphs
from ._device import properties, stream_device
from ._interop import StreamRef, resolve_stream
from ._stream_window import check_window_fits
from ._window import AccessPolicyWindow, validate_window
from .graph import as_graph

__all__ = ["resolve_target", "target_stream", "is_graph_target", "ScopedWindow", "after_changes"]


def is_graph_target(obj: object) -> bool:
    """Graphs and the like, resolved when a scope enters: l2ctl graphs and node selections, torch graphs,
    torch_captures()."""
    return hasattr(type(obj), "_l2ctl_target") or _torch_graphs.is_torch_graph(obj)


def target_stream(obj: object) -> StreamRef:
    """``obj`` as a stream, or an error that says what to pass instead (a CuPy graph, a compiled function)."""
    try:
        return resolve_stream(obj)
    except TypeError:
        if type(obj).__module__.startswith("cupy") and hasattr(obj, "graphExec"):
            raise ValueError(_torch_graphs.CUPY_GRAPH_HINT) from None
        if callable(obj):
            raise TypeError(_torch_graphs.CALLABLE_HINT) from None
        raise


def resolve_target(obj: object) -> _registry.Target:
    """A stream (any accepted form), an l2ctl graph or a selection of its nodes, a torch.cuda.CUDAGraph
    (keep_graph=True), or torch_captures(), as registry slots."""
    hook = getattr(type(obj), "_l2ctl_target", None)  # l2ctl.graph.Graph, GraphNodes, TorchCaptures
    if hook is not None:
        target: _registry.Target = hook(obj)
        return target
    if _torch_graphs.is_torch_graph(obj):
        return as_graph(obj)._l2ctl_target()
    ref = target_stream(obj)
    return _registry.Target(stream_device(ref), (_registry.stream_slot(ref.handle),), ref.owner)


def after_changes(target: _registry.Target, window: AccessPolicyWindow) -> Optional[Callable[[], None]]:
    """What to call after the target's slots changed (at entry and at end): the target's own ``changed`` and
    what its ``admit`` returns; ``admit`` runs here, so a refused scope has changed nothing."""
    if target.admit is None:
        return target.changed
    remember = target.admit(window)
    changed = target.changed
    if changed is None:
        return remember

    def both() -> None:
        changed()
        remember()

    return both


class ScopedWindow:
    """A fixed ``window`` on a stream (or a graph's kernel nodes, or torch_captures()) for the block, through
    the registry: ``with l2ctl.scoped_window(s, l2ctl.AccessPolicyWindow()):`` runs the block with no window
    on ``s``, whatever scopes are live around it. The limit is left alone."""

    def __init__(self, target: object, window: AccessPolicyWindow) -> None:
        self._window = validate_window(window)
        self._object = target
        self._scope: Optional[_registry.Scope] = None
        self._changed: Optional[Callable[[], None]] = None

    def __enter__(self) -> "ScopedWindow":
        if self._scope is not None:
            raise RuntimeError("this scope is already active; create a new one")
        target = resolve_target(self._object)
        check_window_fits(self._window, target.device)
        changed = after_changes(target, self._window)
        scope = _registry.Scope(target.device, target.slots, self._window, owner=target.owner)
        _registry.enter(scope, properties(target.device).persisting_l2_cache_max_size)
        self._scope, self._changed = scope, changed
        if changed is not None:
            try:
                changed()
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        scope, changed, self._scope = self._scope, self._changed, None
        if scope is None:
            return
        _registry.exit(scope)
        if changed is not None:
            changed()
