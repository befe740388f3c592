"""Access-policy windows on CUDA graph kernel nodes.

A stream window cannot reach a graph after capture: replays use the windows stored in their kernel
nodes (CUDA copies the stream's window into each node at capture time; measured on an H100 with CUDA
13, see README). l2ctl reads and writes those node attributes, and re-applies them to the instantiated
graph (cudaGraphExecUpdate, or a new instantiation when CUDA refuses the update) before the next launch.

    with l2ctl.Stream() as s:
        with l2ctl.graph.capture(s) as g:
            run_my_kernels(s)
        with l2ctl.persist(g, lut, hit_ratio=1.0):     # every kernel node gets the window
            for _ in range(100):
                g.launch(s)
"""

from __future__ import annotations

import enum
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from . import _backend, _registry
from ._backend import GraphExecImpl, GraphImpl
from ._device import properties, resolve_device, stream_device
from ._interop import resolve_stream
from ._plan import check_count
from ._stream_window import check_window_fits
from ._window import AccessPolicyWindow, validate_window

__all__ = ["CaptureMode", "KernelNode", "Graph", "GraphNodes", "capture", "as_graph", "inspect"]


class CaptureMode(enum.IntEnum):
    GLOBAL = 0
    THREAD_LOCAL = 1
    RELAXED = 2


@dataclass(frozen=True)
class KernelNode:
    """A kernel node of a graph: its handle, kernel name, launch shape and current window."""

    node: int
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    window: AccessPolicyWindow


Predicate = Callable[[KernelNode], bool]
_NodeTuple = tuple[int, str, tuple[int, int, int], tuple[int, int, int]]


class Graph:
    """A cudaGraph_t: captured by l2ctl (owned, destroyed with the object) or borrowed from another
    library (never destroyed by l2ctl). Launching goes through an instantiation l2ctl keeps in sync
    with node windows changed through it."""

    #: How node changes reach the instantiated graph before the next launch: "reinstantiate" (a new
    #: cudaGraphExec_t) or "update" (cudaGraphExecUpdate). See README: on an H100 with driver 580 the update
    #: reports success but the replays did not speed up, so l2ctl re-instantiates by default.
    refresh = "reinstantiate"

    device: int
    reinstantiations: int
    updates: int
    _owner: Any
    _impl: Optional[GraphImpl]
    _exec: Optional[GraphExecImpl]
    _dirty: bool
    _nodes: Optional[list[_NodeTuple]]  # the kernel nodes; a captured graph's never change

    def __init__(self, handle: int, *, owned: bool = False, device: object = None, owner: Any = None) -> None:
        graph = check_count(handle, "a graph handle (cudaGraph_t)", minimum=1, maximum=(1 << 64) - 1)
        self._setup(resolve_device(device), owner)
        self._impl = _backend.current().Graph(graph, owned)

    def _setup(self, device: int, owner: Any) -> None:
        self.device = device
        self._owner = owner  # keeps a foreign graph's Python object alive
        self._impl = None
        self._exec = None
        self._dirty = False
        self._nodes = None
        self.reinstantiations = 0
        self.updates = 0

    @classmethod
    def _deferred(cls, device: int) -> "Graph":
        """The object capture() yields before the capture has ended; _attach gives it its graph."""
        graph = cls.__new__(cls)
        graph._setup(device, None)
        return graph

    def _attach(self, handle: int) -> None:
        self._impl = _backend.current().Graph(handle, True)

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
        nodes = []
        for node, function, grid, block in self._kernel_node_tuples():
            k = KernelNode(node, function, grid, block, AccessPolicyWindow.from_tuple(backend.get_node_window(node)))
            if predicate is None or predicate(k):
                nodes.append(k)
        return nodes

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
        self._dirty = self._dirty or bool(nodes)
        return len(nodes)

    def clear_window(self, predicate: Optional[Predicate] = None) -> int:
        return self.set_window(AccessPolicyWindow(), predicate)

    def select(self, predicate: Predicate) -> "GraphNodes":
        """The kernel nodes matching ``predicate``, as a target for ``l2ctl.persist``."""
        if not callable(predicate):
            raise TypeError("predicate must be callable as predicate(KernelNode) -> bool")
        return GraphNodes(self, predicate)

    def instantiate(self) -> GraphExecImpl:
        """The instantiated graph, brought up to date with node changes made through l2ctl."""
        if self.refresh not in ("update", "reinstantiate"):
            raise ValueError(f"refresh must be 'update' or 'reinstantiate', got {self.refresh!r}")
        if self._exec is None:
            self._exec = _backend.current().GraphExec(self.handle)
            self._dirty = False
        elif self._dirty:
            if self.refresh == "update" and self._exec.update(self.handle):
                self.updates += 1
            else:
                self._exec.destroy()
                self._exec = _backend.current().GraphExec(self.handle)
                self.reinstantiations += 1
            self._dirty = False
        return self._exec

    def launch(self, stream: object = None) -> None:
        """Replay the graph on ``stream`` (asynchronous)."""
        ref = resolve_stream(stream)
        self.instantiate().launch(ref.handle)

    def mark_changed(self) -> None:
        """Call after changing the graph outside l2ctl, so the next launch updates the instance (and the
        kernel nodes are listed again)."""
        self._dirty = True
        self._nodes = None

    def _node_windows_changed(self) -> None:
        self._dirty = True

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

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _l2ctl_target(self, predicate: Optional[Predicate] = None) -> _registry.Target:
        nodes = self._selected(predicate)
        if not nodes:
            raise ValueError("the graph has no kernel node to put the window on")
        return _registry.Target(self.device, _registry.node_slots(nodes), self, self._node_windows_changed)

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


@contextmanager
def capture(stream: object, mode: CaptureMode = CaptureMode.THREAD_LOCAL) -> Iterator[Graph]:
    """Capture the work queued on ``stream`` inside the block into an l2ctl Graph (owned).

    The graph object is yielded at once and usable after the block. A window set on the stream before
    the capture is copied by CUDA into every captured kernel node. If the block raises, the capture is
    ended and the partial graph destroyed.
    """
    ref = resolve_stream(stream)
    if ref.is_default:
        raise ValueError("the legacy default stream cannot be captured; capture on an l2ctl.Stream or a torch/CuPy stream")
    mode = CaptureMode(mode)
    device = stream_device(ref)
    backend = _backend.current()
    backend.begin_capture(ref.handle, int(mode))
    graph = Graph._deferred(device)
    try:
        yield graph
    except BaseException:
        try:
            handle = backend.end_capture(ref.handle)
            if handle:
                backend.Graph(handle, True).destroy()
        except Exception:
            pass  # the capture may already be invalidated; the body's error matters
        raise
    graph._attach(int(backend.end_capture(ref.handle)))


def as_graph(obj: object, device: object = None) -> Graph:
    """A Graph view of: an l2ctl Graph, an int cudaGraph_t, a torch.cuda.CUDAGraph captured with
    ``keep_graph=True`` (through ``raw_cuda_graph()``), or a cuda-python ``cudaGraph_t``/``CUgraph``.
    Foreign graphs are borrowed, never destroyed by l2ctl."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return Graph(obj, owned=False, device=device)
    raw = getattr(obj, "raw_cuda_graph", None)
    if callable(raw):
        try:
            handle = int(raw())
        except RuntimeError as exc:
            raise ValueError("torch.cuda.CUDAGraph exposes its graph only when captured with keep_graph=True") from exc
        return Graph(handle, owned=False, device=device, owner=obj)
    get_ptr = getattr(obj, "getPtr", None)
    if callable(get_ptr):  # cuda.bindings handles: getPtr() is the address of the handle, int() the handle
        return Graph(int(obj), owned=False, device=device, owner=obj)  # type: ignore[call-overload]
    raise TypeError(
        f"cannot use a {type(obj).__name__} as a CUDA graph; pass an l2ctl Graph, an int cudaGraph_t, a "
        "torch.cuda.CUDAGraph (keep_graph=True) or a cuda-python graph handle"
    )


def inspect(graph: object) -> list[KernelNode]:
    """Every kernel node of ``graph`` and the window it carries."""
    return as_graph(graph).kernel_nodes()
