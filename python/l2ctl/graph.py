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

from . import _backend
from ._device import resolve_device
from ._interop import resolve_stream
from ._window import AccessPolicyWindow, stream_device, validate_window

__all__ = ["CaptureMode", "KernelNode", "Graph", "capture", "as_graph", "inspect"]


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


class Graph:
    """A cudaGraph_t: captured by l2ctl (owned, destroyed with the object) or borrowed from another
    library (never destroyed by l2ctl). Launching goes through an instantiation l2ctl keeps in sync
    with node windows changed through it."""

    #: How node changes reach the instantiated graph before the next launch: "reinstantiate" (a new
    #: cudaGraphExec_t) or "update" (cudaGraphExecUpdate). See README: on an H100 with driver 580 the update
    #: reports success but the replays did not speed up, so l2ctl re-instantiates by default.
    refresh = "reinstantiate"

    def __init__(self, handle: int, *, owned: bool = False, device: object = None, owner: Any = None) -> None:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise TypeError(f"a graph handle is a positive int cudaGraph_t, got {handle!r}")
        self._setup(resolve_device(device), owner)
        self._impl = _backend.current().Graph(handle, owned)

    def _setup(self, device: int, owner: Any) -> None:
        self.device = device
        self._owner = owner  # keeps a foreign graph's Python object alive
        self._impl: Any = None
        self._exec: Any = None
        self._dirty = False
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
        return bool(self._impl.owned)

    @property
    def node_count(self) -> int:
        return int(_backend.current().graph_node_count(self.handle))

    def kernel_nodes(self, predicate: Optional[Predicate] = None) -> list[KernelNode]:
        """The kernel nodes (optionally those for which ``predicate(node)`` is true), with their windows."""
        backend = _backend.current()
        nodes = []
        for node, function, grid, block in backend.graph_kernel_nodes(self.handle):
            window = AccessPolicyWindow.from_tuple(backend.get_node_window(node))
            k = KernelNode(int(node), str(function), tuple(grid), tuple(block), window)
            if predicate is None or predicate(k):
                nodes.append(k)
        return nodes

    def set_window(self, window: AccessPolicyWindow, predicate: Optional[Predicate] = None) -> int:
        """Set ``window`` on every kernel node (or those matching ``predicate``); returns how many.
        Does not touch the set-aside: use ``l2ctl.persist(graph, buf)`` for a scope that manages both."""
        window = validate_window(window)
        nodes = self.kernel_nodes(predicate)
        backend = _backend.current()
        for k in nodes:
            backend.set_node_window(k.node, *window.as_tuple())
        self._dirty = self._dirty or bool(nodes)
        return len(nodes)

    def clear_window(self, predicate: Optional[Predicate] = None) -> int:
        return self.set_window(AccessPolicyWindow(), predicate)

    def select(self, predicate: Predicate) -> "GraphNodes":
        """The kernel nodes matching ``predicate``, as a target for ``l2ctl.persist``."""
        return GraphNodes(self, predicate)

    def instantiate(self) -> Any:
        """The instantiated graph, brought up to date with node changes made through l2ctl."""
        if self._exec is None:
            self._exec = _backend.current().GraphExec(self.handle)
            self._dirty = False
        elif self._dirty:
            if self.refresh not in ("update", "reinstantiate"):
                raise ValueError(f"refresh must be 'update' or 'reinstantiate', got {self.refresh!r}")
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
        """Call after changing the graph's nodes outside l2ctl, so the next launch updates the instance."""
        self._dirty = True

    def destroy(self) -> None:
        if self._exec is not None:
            self._exec.destroy()
            self._exec = None
        self._impl.destroy()

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _l2ctl_target(self) -> "_GraphTarget":
        return _GraphTarget(self, None)

    def __repr__(self) -> str:
        return f"<l2ctl.graph.Graph 0x{self.handle:x} {'owned' if self.owned else 'borrowed'} device={self.device}>"


class GraphNodes:
    """A subset of a graph's kernel nodes (see Graph.select)."""

    def __init__(self, graph: Graph, predicate: Predicate) -> None:
        self.graph, self.predicate = graph, predicate

    def _l2ctl_target(self) -> "_GraphTarget":
        return _GraphTarget(self.graph, self.predicate)


class _GraphTarget:
    """persist() target that puts the window on kernel nodes and restores each node's own window."""

    def __init__(self, graph: Graph, predicate: Optional[Predicate]) -> None:
        self.graph, self.predicate = graph, predicate
        self.handle = graph.handle

    def device(self) -> int:
        return self.graph.device

    def read(self) -> list[tuple[int, AccessPolicyWindow]]:
        return [(k.node, k.window) for k in self.graph.kernel_nodes(self.predicate)]

    def apply(self, window: AccessPolicyWindow) -> None:
        if self.graph.set_window(window, self.predicate) == 0:
            raise ValueError("the graph has no kernel node to put the window on")

    def restore(self, previous: list[tuple[int, AccessPolicyWindow]]) -> None:
        backend = _backend.current()
        for node, window in previous:
            backend.set_node_window(node, *window.as_tuple())
        self.graph.mark_changed()

    def clear(self) -> None:
        self.graph.clear_window(self.predicate)


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
    if callable(get_ptr):
        return Graph(int(obj), owned=False, device=device, owner=obj)  # cuda.bindings handles convert with int()
    raise TypeError(
        f"cannot use a {type(obj).__name__} as a CUDA graph; pass an l2ctl Graph, an int cudaGraph_t, a "
        "torch.cuda.CUDAGraph (keep_graph=True) or a cuda-python graph handle"
    )


def inspect(graph: object) -> list[KernelNode]:
    """Every kernel node of ``graph`` and the window it carries."""
    return as_graph(graph).kernel_nodes()
