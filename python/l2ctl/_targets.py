"""What a scope's window goes on: a stream, an l2ctl graph (or a selection of its kernel nodes), a
torch.cuda.CUDAGraph, or the graphs PyTorch captures (graph.torch_captures()), resolved to registry slots;
and ``scoped_window``, a fixed window on any of them for a block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Union, cast

from . import _registry, _torch_graphs
from ._device import check_stream_context, stream_device
from ._interop import StreamRef, SupportsL2ctlTarget, SupportsReplay, resolve_stream
from ._memory import StreamLike
from ._stream_window import check_window_fits
from ._window import AccessPolicyWindow, validate_window
from .graph import as_graph

__all__ = ["as_target", "resolve_target", "ScopedWindow", "after_changes"]


#: Where persist (and tune) put a window: a stream (StreamLike), or a graph: l2ctl's own, ``graph.select(...)``,
#: ``graph.torch_captures()``, a torch.cuda.CUDAGraph.
Target = Union[StreamLike, SupportsL2ctlTarget, SupportsReplay]


def as_target(obj: object) -> tuple[Optional[StreamRef], Target]:
    """What ``obj`` is as a target, checked now: (its stream, obj) for a stream in any accepted form; (None,
    the target) for an l2ctl graph or node selection, torch_captures(), or a torch.cuda.CUDAGraph (as its
    view: refused here when it kept no template). Errors say what to pass instead (a CuPy graph, a function)."""
    if hasattr(type(obj), "_l2ctl_target"):  # l2ctl.graph.Graph, GraphNodes, TorchCaptures
        return None, cast(SupportsL2ctlTarget, obj)
    if _torch_graphs.is_torch_graph(obj):
        return None, as_graph(obj)
    try:
        return resolve_stream(obj), cast(StreamLike, obj)  # whatever resolve_stream takes is a StreamLike
    except TypeError:
        error = _torch_graphs.foreign_target_error(obj)
        if error is not None:
            raise error from None
        raise


def resolve_target(obj: object) -> _registry.Target:
    """A stream (any accepted form), an l2ctl graph or a selection of its nodes, a torch.cuda.CUDAGraph
    (keep_graph=True), or torch_captures(), as registry slots (a graph's predicate runs here)."""
    ref, target = as_target(obj)
    if ref is None:
        resolved: _registry.Target = getattr(type(target), "_l2ctl_target")(target)
        return resolved
    device = stream_device(ref)
    check_stream_context(ref, device)
    return _registry.Target(device, (_registry.stream_slot(ref.handle),), ref.owner)


def after_changes(target: _registry.Target, window: AccessPolicyWindow) -> Optional[Callable[[_registry.Scope], None]]:
    """What to call with the scope after the target's slots changed (at entry and at end): the target's own
    ``changed`` and what its ``admit`` returns; ``admit`` runs here, so a refused scope has changed nothing."""
    changed = target.changed
    if target.admit is None:
        return None if changed is None else lambda scope: changed()
    remember = target.admit(window)
    if changed is None:
        return remember

    def both(scope: _registry.Scope) -> None:
        changed()
        remember(scope)

    return both


class ScopedWindow:
    """A fixed ``window`` on a stream (or a graph's kernel nodes, or torch_captures()) for the block, through
    the registry: ``with l2ctl.scoped_window(s, l2ctl.AccessPolicyWindow()):`` runs the block with no window
    on ``s``, whatever scopes are live around it. The limit is left alone."""

    __slots__ = ("_window", "_object", "_scope", "_changed", "_executables", "__weakref__")

    def __init__(self, target: object, window: AccessPolicyWindow) -> None:
        self._window = validate_window(window)
        self._object = target
        self._scope: Optional[_registry.Scope] = None
        self._changed: Optional[Callable[[_registry.Scope], None]] = None
        self._executables: Any = None

    def _prepare_entry(self) -> _registry.Scope:
        """The scope the compiled entry enters, changing nothing on the device; what to call after the slots
        changed (``_changed``) and the executables to mark stale at the end (``_executables``) are kept for it."""
        if self._scope is not None:
            raise RuntimeError("this scope is already active; create a new one")
        target = resolve_target(self._object)
        check_window_fits(self._window, target.device)
        self._changed = after_changes(target, self._window)
        self._executables = target.executables
        return _registry.Scope(target.device, target.slots, self._window, owner=target.owner)

    #: ``__enter__``, compiled (src/scope_entries.cpp): _prepare_entry, then the entry and the target's callback;
    #: an error after the entry ends the scope there.
    if TYPE_CHECKING:
        def __enter__(self) -> "ScopedWindow": ...
    else:
        __enter__ = _registry.holder_enter

    __exit__ = _registry.scope_exit  # compiled, as persist's (see Persist.__exit__)

