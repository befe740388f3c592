"""Access-policy windows on CUDA graph kernel nodes.

Replays use the windows stored in a graph's kernel nodes (CUDA copies a stream's window into each node at
capture), and CUDA copies node attributes into an executable only when it instantiates it
(cudaGraphExecUpdate reports success but carries no window: benchmarks/results/h100/graph.json). So l2ctl
sets the windows on the template and remakes every executable made from it: its own before the next
launch, a torch.cuda.CUDAGraph's at once. PyTorch's graphs made with its defaults (keep_graph=False,
make_graphed_callables, torch.compile's graph trees) keep their template when made inside a
``torch_captures()`` scope; elsewhere, and for CuPy's, the template is gone and a window reaches them only
at capture: docs/DESIGN.md ("Graphs").

    with l2ctl.Stream() as s:
        with l2ctl.graph.capture(s) as g:
            run_my_kernels(s)
        with l2ctl.persist(g, lut, hit_ratio=1.0):     # every kernel node gets the window
            for _ in range(100):
                g.launch(s)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Optional, Union

import weakref

from . import _backend, _core, _registry, _torch_graphs
from ._device import properties, resolve_device, stream_device
from ._interop import resolve_stream
from ._kernel_buffers import GraphBuffer, map_pointers
from ._memory import StreamLike
from ._plan import check_count
from ._stream_window import check_window_fits
from ._window import AccessPolicyWindow, validate_window

__all__ = ["CaptureMode", "KernelNode", "Graph", "GraphNodes", "GraphBuffer", "TorchCaptures", "capture", "as_graph",
           "inspect", "buffers", "torch_captures"]


class CaptureMode(enum.IntEnum):
    GLOBAL = 0
    THREAD_LOCAL = 1
    RELAXED = 2


@dataclass(frozen=True)
class KernelNode:
    """A kernel node of a graph: its handle, kernel name, launch shape and current window; from
    ``inspect``, also the memory its arguments point into (``buffers``)."""

    node: int
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    window: AccessPolicyWindow
    buffers: tuple[GraphBuffer, ...] = ()


Predicate = Callable[[KernelNode], bool]
_NodeTuple = tuple[int, str, tuple[int, int, int], tuple[int, int, int]]


class Graph:
    """A cudaGraph_t (the template) and the executable graphs made from it: l2ctl's own (``launch``) and,
    for a torch.cuda.CUDAGraph seen through ``as_graph``, torch's (``replay()``). Captured by l2ctl (owned,
    destroyed with the object) or borrowed from another library (never destroyed by l2ctl). Whenever a
    window on its kernel nodes changes through l2ctl, every executable it knows is made anew from the
    template (l2ctl's own lazily, at its next launch; torch's at once)."""

    _impl: Optional[_core.Graph]
    _dirty: bool  # its executable is stale (marked by a scope's compiled end, too)

    def __init__(self, handle: int, *, owned: bool = False, device: object = None, owner: Any = None) -> None:
        graph = check_count(handle, "a graph handle (cudaGraph_t)", minimum=1, maximum=(1 << 64) - 1)
        self._setup(resolve_device(device), owner)
        self._impl = _backend.current().Graph(graph, owned)

    def _setup(self, device: int, owner: Any) -> None:
        self.device = device
        self._owner = owner  # keeps a foreign graph's Python object alive
        self._impl = None
        self._exec: Optional[_core.GraphExec] = None
        self._dirty = False
        self._nodes: Optional[list[_NodeTuple]] = None  # the kernel nodes; a captured graph's never change
        #: The registry slots of every kernel node, with the node list, backend and slot epoch they were made for: a
        #: scope on the whole graph (the common target) skips listing and converting its nodes again.
        self._all_slots: Optional[tuple[list[_NodeTuple], Any, int, tuple[_registry.Slot, ...]]] = None
        self._torch: Optional[Callable[[], Any]] = None  # (a weak ref to) the torch.cuda.CUDAGraph whose exec follows
        self.reinstantiations = 0

    @property
    def handle(self) -> int:
        if self._impl is None:
            raise RuntimeError("the capture has not ended yet; use the graph after the with block")
        return int(self._impl.handle)

    @property
    def owned(self) -> bool:
        return self._impl is not None and bool(self._impl.owned)

    @property
    def node_count(self) -> int:
        return int(_backend.current().graph_node_count(self.handle))

    def _kernel_node_tuples(self) -> list[_NodeTuple]:
        if self._nodes is None:
            self._nodes = [(int(n), str(f), (int(g[0]), int(g[1]), int(g[2])), (int(b[0]), int(b[1]), int(b[2])))
                           for n, f, g, b in _backend.current().graph_kernel_nodes(self.handle)]
        return self._nodes

    def kernel_nodes(self, predicate: Optional[Predicate] = None) -> list[KernelNode]:
        """The kernel nodes (optionally those for which ``predicate(node)`` is true), with their windows."""
        backend = _backend.current()
        nodes = (KernelNode(*t, backend.get_node_window(t[0]))
                 for t in self._kernel_node_tuples())
        return [k for k in nodes if predicate is None or predicate(k)]

    def _selected(self, predicate: Optional[Predicate]) -> list[int]:
        if predicate is None:  # no predicate: no need to read every node's window
            return [node for node, _, _, _ in self._kernel_node_tuples()]
        return [k.node for k in self.kernel_nodes(predicate)]

    def set_window(self, window: AccessPolicyWindow, predicate: Optional[Predicate] = None) -> int:
        """Set ``window`` on every kernel node (or those matching ``predicate``); returns how many.
        Does not touch the set-aside: use ``l2ctl.persist(graph, buf)`` for a scope that manages both.
        On nodes a live l2ctl scope covers, ``window`` is what they return to when the scopes end."""
        window = validate_window(window)
        check_window_fits(window, self.device)
        nodes = self._selected(predicate)  # the predicate runs here, outside the registry's lock
        _registry.set_base_window(_registry.node_slots(nodes), self.device,
                                  properties(self.device).persisting_l2_cache_max_size, window)
        if nodes:
            self._node_windows_changed()
        return len(nodes)

    def clear_window(self, predicate: Optional[Predicate] = None) -> int:
        return self.set_window(AccessPolicyWindow(), predicate)

    def select(self, predicate: Predicate) -> "GraphNodes":
        """The kernel nodes matching ``predicate``, as a target for ``l2ctl.persist``."""
        if not callable(predicate):
            raise TypeError("predicate must be callable as predicate(KernelNode) -> bool")
        return GraphNodes(self, predicate)

    def instantiate(self) -> _core.GraphExec:
        """l2ctl's executable graph, made anew from the template when node windows changed through l2ctl."""
        if self._exec is None or self._dirty:
            old = self._exec
            if old is not None:
                old.destroy()
            self._exec = _backend.current().GraphExec(self.handle)
            self.reinstantiations += old is not None
            self._dirty = False
        return self._exec

    def launch(self, stream: StreamLike = None) -> None:
        """Replay the graph on ``stream`` (asynchronous)."""
        ref = resolve_stream(stream)
        self.instantiate().launch(ref.handle)

    def mark_changed(self) -> None:
        """Call after changing the graph outside l2ctl, so the next launch re-instantiates (and the kernel
        nodes are listed again)."""
        self._dirty = True
        self._nodes = None

    def _node_windows_changed(self) -> None:
        """Node windows changed: l2ctl's executable is made anew before its next launch; torch's now, since
        torch replays it without asking (one that does not exist yet is made from the template anyway).
        Torch destroys its old executable then: no other thread may replay it meanwhile."""
        self._dirty = True
        torch_graph = self._torch() if self._torch is not None else None
        if torch_graph is not None and _torch_graphs.has_executable(torch_graph):
            torch_graph.instantiate()
            self.reinstantiations += 1

    def destroy(self) -> None:
        """Destroy the instance and, when l2ctl owns it, the graph. Live scopes on its nodes stop writing."""
        if self._impl is None:
            return
        if self._nodes is not None:
            _registry.forget_slots(_registry.NODE, [n for n, _, _, _ in self._nodes])
        if self._exec is not None:
            self._exec.destroy()
            self._exec = None
        self._impl.destroy()
        self._nodes = self._all_slots = None  # what was read of it is gone: a later use asks the handle, and is refused

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _l2ctl_target(self, predicate: Optional[Predicate] = None) -> _registry.Target:
        if predicate is None:
            nodes, backend, known = self._kernel_node_tuples(), _backend._active, self._all_slots
            epoch = _registry.slot_epoch()  # a handle forgotten since (another view of the graph destroyed)
            if known is None or known[0] is not nodes or known[1] is not backend or known[2] != epoch:
                slots = _registry.node_slots([node for node, _, _, _ in nodes])
                known = self._all_slots = (nodes, backend, epoch, slots)
            slots = known[3]
        else:
            slots = _registry.node_slots(self._selected(predicate))
        if not slots:
            raise ValueError("the graph has no kernel node to put the window on")
        owner = (self, self._torch() if self._torch is not None else None)  # a scope keeps both alive
        return _registry.Target(self.device, slots, owner, self._node_windows_changed, executables=self)

    def __repr__(self) -> str:
        if self._impl is None:
            return "<l2ctl.graph.Graph (capturing)>"
        return f"<l2ctl.graph.Graph 0x{self.handle:x} {'owned' if self.owned else 'borrowed'} device={self.device}>"


class GraphNodes:
    """A subset of a graph's kernel nodes (see Graph.select)."""

    def __init__(self, graph: Graph, predicate: Predicate) -> None:
        self.graph, self.predicate = graph, predicate

    def _l2ctl_target(self) -> _registry.Target:
        return self.graph._l2ctl_target(self.predicate)


class Capture:
    """``with l2ctl.graph.capture(stream) as g:``: the work queued on ``stream`` inside the block, captured into
    an l2ctl Graph (owned). The graph object is given at once and usable after the block. A window set on the
    stream before the capture is copied by CUDA into every captured kernel node. If the block raises, the
    capture is ended and the partial graph destroyed.

    The stream is checked when the object is made; the capture begins and ends in compiled code
    (src/scope_entries.cpp), so no interrupt can leave the stream capturing: one that lands as it begins ends it."""

    __slots__ = ("_stream", "_owner", "_mode", "_backend", "_graph", "_capturing")

    def __init__(self, stream: StreamLike, mode: CaptureMode = CaptureMode.THREAD_LOCAL) -> None:
        ref = resolve_stream(stream)
        if ref.is_default:
            raise ValueError("the legacy default stream cannot be captured; capture on an l2ctl.Stream or a "
                             "torch/CuPy stream")
        self._mode = int(CaptureMode(mode))
        self._stream, self._owner = ref.handle, ref.owner  # the stream's object lives as long as the capture
        self._backend = _backend.current()
        graph = Graph.__new__(Graph)  # given now, its graph when the capture ends
        graph._setup(stream_device(ref), None)
        self._graph = graph
        self._capturing: Optional[bool] = False  # True while capturing, None once ended (one capture per object)

    if TYPE_CHECKING:
        def __enter__(self) -> Graph: ...
        def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...
    else:
        __enter__ = _registry.capture_enter
        __exit__ = _registry.capture_exit


#: ``capture(stream, mode=CaptureMode.THREAD_LOCAL)``: the capture itself (see Capture).
capture = Capture


# One view per torch graph, so that its kernel nodes are listed once however often it is persisted. The
# view refers to its torch graph weakly (a scope on it keeps it alive): the cache keeps no graph alive.
_torch_views: "weakref.WeakKeyDictionary[Any, Graph]" = weakref.WeakKeyDictionary()


def as_graph(obj: object, device: object = None) -> Graph:
    """A Graph view of: an l2ctl Graph, an int cudaGraph_t, a torch.cuda.CUDAGraph captured with
    ``keep_graph=True`` or inside a ``torch_captures()`` scope (its windows reach torch's own ``replay()``:
    l2ctl has torch re-instantiate it after every change), or a cuda-python ``cudaGraph_t``/``CUgraph``.
    Foreign graphs are borrowed, never destroyed by l2ctl. ``device``: the graph's device (None: the current
    one). Refused (saying what to do instead): graphs whose executable no window can reach any more (a torch
    graph with ``keep_graph=False``, a CuPy graph) and functions."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return Graph(obj, owned=False, device=device)
    if _torch_graphs.is_torch_graph(obj):
        return _torch_view(obj, device)
    get_ptr = getattr(obj, "getPtr", None)
    if callable(get_ptr):  # cuda.bindings handles: getPtr() is the address of the handle, int() the handle
        return Graph(int(obj), owned=False, device=device, owner=obj)  # type: ignore[call-overload]
    error = _torch_graphs.foreign_target_error(obj)
    if error is not None:
        raise error
    raise TypeError(
        f"cannot use a {type(obj).__name__} as a CUDA graph; pass an l2ctl Graph, an int cudaGraph_t, a "
        "torch.cuda.CUDAGraph (keep_graph=True) or a cuda-python graph handle"
    )


def _torch_view(obj: Any, device: object) -> Graph:
    handle = _torch_graphs.template_of(obj)  # ValueError for keep_graph=False, saying what to do
    view: Optional[Graph] = _torch_graphs.weak_get(_torch_views, obj, None)  # not weakly referable: one per call
    try:
        if view is not None and view.handle == handle and (device is None or view.device == resolve_device(device)):
            return view
    except (ValueError, RuntimeError):  # the view was destroyed
        pass
    view = Graph(handle, owned=False, device=device)
    try:
        view._torch = weakref.ref(obj)
        _torch_views[obj] = view
    except TypeError:
        view._owner = obj
        view._torch = lambda: obj
    return view


#: ``replays(window)``: the recordings a scope's block will replay (see TorchCaptures), or ``"new"``: only
#: what the block itself records.
Replays = Union[Callable[[tuple[int, int, float, int, int]], Iterable[object]], Literal["new"]]


class TorchCaptures:
    """Wherever PyTorch runs a step while the scope lives, as a target for ``l2ctl.persist`` and ``l2ctl.tune``.

    **Templates kept.** While a scope on it lives, or a ``with torch_captures() as captures:`` block (which
    changes nothing else), every ``torch.cuda.CUDAGraph`` torch makes keeps its template, whatever flags it was
    made with: the recordings of torch.compile's CUDA graph trees (``mode="reduce-overhead"``),
    ``make_graphed_callables``' graphs and ``torch.cuda.graph(torch.cuda.CUDAGraph())``. They replay as
    before (a graph made with the default flags still gets its executable at capture end), and l2ctl
    remembers them: a scope's window then goes on their kernel nodes, with torch's executables made anew,
    as for a ``keep_graph=True`` graph, and ``tune(step, captures, "discover")`` reads what their kernels are
    given. The cost: each graph's template stays in host memory as long as the graph, and every scope's entry
    and end re-instantiates each kept graph that has an executable (``scripts/bench_torch_captures.py``
    measures both).

    **Streams.** The window also goes on the streams PyTorch captures on (torch.compile's graph-tree
    recording stream and torch.cuda.graph's default capture stream), so CUDA copies it into every kernel
    node captured there while the scope lives; and on the streams eager kernels launch on: torch's current
    stream at entry and every stream made current inside the block (``torch.cuda.stream(s)``,
    ``torch.cuda.set_stream``), where torch.compile runs what it does not graph (an in-place update of an
    input not marked static, graph breaks, dynamic shapes, its warm-up runs). For example::

        step = torch.compile(step_fn, mode="reduce-overhead")
        with l2ctl.graph.torch_captures() as captures:             # before the first call
            tuned = l2ctl.tune(run_step, captures, "discover", stream=s)
            with tuned.persist(captures):
                for _ in range(100):
                    step()

    A scope with a window is refused, before any change, when the graph trees on its device hold a recording
    whose template is gone and that does not carry that window (recorded outside any such scope, so l2ctl
    cannot tell, or under another window): a larger set-aside only slows its replays (2x on an H100).
    ``replays`` narrows that check to what the block replays: ``"new"`` when it replays only what it records
    itself, or a function of the window that returns the recordings it replays. l2ctl sees the graph trees
    only, not what make_graphed_callables or torch.cuda.graph captured outside every scope: capture those
    inside one. The current stream at entry is the entering thread's (torch's is per thread); a stream any
    thread makes current through ``torch.cuda.set_stream`` or ``torch.cuda.stream(s)`` while the scope
    lives gets the window too. ``with s:`` on a ``torch.Stream`` and ``torch.accelerator.set_stream``
    bypass that function: l2ctl does not see those."""

    def __init__(self, device: object = None, *, replays: Optional[Replays] = None) -> None:
        if replays is not None and replays != "new" and not callable(replays):
            raise TypeError(f"replays must be 'new' or a function of the window, got {replays!r}")
        self._device = device
        self._replays = replays
        self._graphs: "weakref.WeakKeyDictionary[Any, None]" = weakref.WeakKeyDictionary()
        self._blocks: list[Callable[[], None]] = []  # how to stop keeping, one per open with block
        self._skips: dict[str, None] = {}  # torch's reasons for running compiled code without graphs, in order

    def __enter__(self) -> "TorchCaptures":
        stop = self._keep()
        if stop is None:
            raise ValueError(_torch_graphs.TOO_OLD_HINT)
        self._blocks.append(stop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._blocks.pop()()

    def _keep(self, also: Optional[Callable[[object], None]] = None) -> Optional[Callable[[], None]]:
        """Templates kept from now on; the graphs captured on this device are this object's too (and ``also``'s)."""
        device = resolve_device(self._device)

        def captured(graph: object, on: int) -> None:
            if on == device:
                self._graphs[graph] = None
                if also is not None:
                    also(graph)

        stop = _torch_graphs.trees.keep_templates(captured)
        if stop is None:
            return None
        unwatch = _torch_graphs.watch_skips(self._skipped)

        def stop_both() -> None:
            unwatch()
            stop()

        return stop_both

    def _skipped(self, reason: str) -> None:
        if len(self._skips) < 16:
            self._skips[reason] = None

    def skips(self) -> list[str]:
        """torch's reasons, in its words, for running compiled code without CUDA graphs, given while this object's
        blocks and scopes lived ("skipping cudagraphs due to mutated inputs (1 instances)"): what torch then runs
        eagerly, on the streams the scope's window goes on."""
        return list(self._skips)

    def graphs(self) -> list[Any]:
        """The torch graphs captured in this object's blocks and scopes that still hold their template, in the
        order they were captured: what ``tune(step, captures, "discover")`` reads."""
        return [g for g in list(self._graphs) if _torch_graphs.is_kept(g)]

    def _l2ctl_target(self) -> _registry.Target:
        device = resolve_device(self._device)
        streams = [*_torch_graphs.trees.capture_streams(device), _torch_graphs.trees.current_stream(device)]
        slots = tuple(dict.fromkeys(_registry.stream_slot(resolve_stream(s).handle) for s in streams))
        kept = _torch_graphs.kept(device)
        views = [_torch_view(g, device) for g in kept]
        if views:
            slots += _registry.node_slots([node for v in views for node, _, _, _ in v._kernel_node_tuples()])

        def changed() -> None:  # torch's executables made anew from the templates
            for view in views:
                view._node_windows_changed()

        # The scope holds the torch graphs, not only their views: one torch drops meanwhile (its graph trees reset,
        # a cycle collected) keeps its template and nodes, which the scope's end writes to, until the scope ends.
        return _registry.Target(device, slots, (tuple(streams), tuple(views), tuple(kept)), changed if views else None,
                                lambda window: self._admit(device, window))

    def _admit(self, device: int, window: AccessPolicyWindow) -> Callable[[_registry.Scope], None]:
        value = window.as_tuple()
        if not window.empty:
            self._refuse_unreached(device, value)
        return _CaptureScope(self, device, None if window.empty else value)

    def _refuse_unreached(self, device: int, value: Any) -> None:
        """Raise when the block may replay a recording whose template is gone and that does not carry the window
        ``value`` (``()``: any window, as a search varies it)."""
        if self._replays != "new":
            found = list(_torch_graphs.trees.recorded(device) if self._replays is None else self._replays(value))
            unknown, other = _torch_graphs.without(found, value)
            if unknown or other:
                raise ValueError(
                    f"device {device}: PyTorch's CUDA graph trees hold {unknown} graph(s) recorded outside any "
                    f"l2ctl.graph.torch_captures() scope and {other} recorded under another window, their templates "
                    "gone. CUDA copies a window into such a graph only while it is captured, so their replays "
                    "would not carry this one, and without it a larger set-aside only slows them. Make the "
                    "compiled function's first call inside `with l2ctl.graph.torch_captures():` (torch then keeps "
                    "the templates of what it records, and every scope reaches them), pass "
                    "torch_captures(replays='new') if the block replays only what it records itself, or call "
                    "torch.compiler.reset() and start again")

    def __repr__(self) -> str:
        return f"<l2ctl.graph.torch_captures device={self._device}>"


class _CaptureScope:
    """Called with a torch_captures scope after its entry (its window now on the capture streams and the
    current stream: what is recorded now was recorded before; from now on, every stream made current gets
    the window too) and after its end (what is new was recorded under the window; the watch stops)."""

    def __init__(self, captures: TorchCaptures, device: int,
                 window: Optional[tuple[int, int, float, int, int]]) -> None:
        self.captures, self.device, self.window = captures, device, window
        self.before: set[int] = set()
        self.entered = False  # the first call is the entry's, every later one an end's
        self.unwatch: Optional[Callable[[], None]] = None
        self.unkeep: Optional[Callable[[], None]] = None
        self.recorded: "weakref.WeakKeyDictionary[Any, None]" = weakref.WeakKeyDictionary()  # kept, inside the scope

    def __call__(self, scope: _registry.Scope) -> None:
        if not self.entered:
            self.entered = True  # first: an entry cut short is ended as an end, never entered twice
            self.before = _torch_graphs.recordings(self.device)
            self.unkeep = self.captures._keep(lambda graph: self.recorded.__setitem__(graph, None))
            self.unwatch = _torch_graphs.trees.watch_current(self.device,
                                                             lambda stream: self._made_current(scope, stream))
        else:
            self._stop()
            _torch_graphs.remember_recordings(self.device, self.before, self.window)
            if self.window is not None:  # captured under the window (CUDA copied it from the stream): put back
                for kept in list(self.recorded):
                    if _torch_graphs.is_kept(kept):
                        _torch_view(kept, self.device).clear_window()

    def _stop(self) -> None:
        stops, self.unwatch, self.unkeep = (self.unwatch, self.unkeep), None, None
        for stop in stops:
            if stop is not None:
                stop()

    def _made_current(self, scope: _registry.Scope, stream: object) -> None:
        """A stream of the device is made current inside the block: the scope's window goes there first."""
        if not _registry.add_slots(scope, (_registry.stream_slot(resolve_stream(stream).handle),), stream):
            self._stop()  # the scope ended (its holder died, or its end was cut short)


#: ``torch_captures(device=None, *, replays=None)``: the target itself (see TorchCaptures).
torch_captures = TorchCaptures


def inspect(graph: object, names: Optional[Mapping[str, object]] = None) -> list[KernelNode]:
    """Every kernel node of ``graph``, the window it carries and the memory its arguments point into (named
    from ``names``, name -> tensor, where they match; l2ctl._kernel_buffers says how the rest is named)."""
    g = as_graph(graph)
    nodes = g.kernel_nodes()
    _, per_node = map_pointers(g.device, [(k.node, k.function) for k in nodes], names)
    return [dataclasses.replace(k, buffers=tuple(per_node.get(k.node, ()))) for k in nodes]


def buffers(graph: object, names: Optional[Mapping[str, object]] = None) -> list[GraphBuffer]:
    """The memory ``graph``'s kernels are given, largest first: each range with what it is (yours, a
    temporary of a captured graph, torch's cache, an allocation), its name and the kernels given it. What
    ``tune(step, graph, "discover")`` tries."""
    g = as_graph(graph)
    found, _ = map_pointers(g.device, [(k.node, k.function) for k in g.kernel_nodes()], names)
    return found
