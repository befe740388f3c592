"""PyTorch's CUDA graphs as l2ctl sees them: which of them a window can reach, and how. CUDA copies node
windows into an executable only when it instantiates it, and no call changes an executable's nodes
(l2ctl.graph), so:

- ``torch.cuda.CUDAGraph(keep_graph=True)`` (torch >= 2.9) keeps its template (``raw_cuda_graph()``):
  l2ctl sets the windows on its kernel nodes and has torch remake its executable (torch's own
  ``instantiate()``), so ``replay()`` runs with them.
- ``keep_graph=False`` (the default), ``torch.cuda.make_graphed_callables`` and torch.compile's CUDA graph
  trees (``mode="reduce-overhead"``) destroy the template once instantiated. A window reaches them only
  through the stream they are captured on (CUDA copies it into every kernel node captured there):
  ``capture_streams`` names those streams.

torch is not imported at import time, its graph trees only when a ``graph.torch_captures()`` scope is
used. Their names (``get_manager``, ``.stream``, ``get_roots``, ``.children``, ``.graph``) are the same
from torch 2.6 to 2.15.
"""

from __future__ import annotations

import itertools
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional, Protocol

WindowTuple = tuple[int, int, float, int, int]

__all__ = ["KEEP_GRAPH_HINT", "CUPY_GRAPH_HINT", "CALLABLE_HINT", "foreign_target_error", "is_torch_graph",
           "template_of", "has_executable",
           "allocator_blocks", "GraphTrees", "TorchGraphTrees", "trees", "use_trees", "without", "recordings", "remember_recordings"]

KEEP_GRAPH_HINT = (
    "this torch.cuda.CUDAGraph keeps only its executable graph (keep_graph=False, the default), and CUDA cannot "
    "change the kernel nodes of an executable: a window set now would never reach its replays while the set-aside "
    "grows. Capture it as torch.cuda.CUDAGraph(keep_graph=True) (torch >= 2.9), or enter "
    "l2ctl.persist(<its capture stream>, buf) around the capture and the replays (CUDA copies the stream's window "
    "into the captured nodes)"
)
CUPY_GRAPH_HINT = (
    "a CuPy graph is instantiated when its capture ends and cannot be instantiated again, and CUDA cannot change "
    "the kernel nodes of an executable: a window set now would never reach its launches. Enter "
    "l2ctl.persist(<the capture stream>, buf) around stream.begin_capture() ... end_capture() and the launches "
    "(CUDA copies the stream's window into the captured nodes)"
)
CALLABLE_HINT = (
    "a function is not a target. For code compiled with torch.compile(mode='reduce-overhead') or graphed by "
    "torch.cuda.make_graphed_callables, use l2ctl.persist(l2ctl.graph.torch_captures(), buf) from before its "
    "first call (its CUDA graphs then carry the window); for eager code, persist the stream it runs on"
)


def foreign_target_error(obj: object) -> Optional[Exception]:
    """The error that says what to pass instead of ``obj`` when it is a graph no window can reach (a CuPy
    graph) or a function (compiled or graphed code); None for anything else."""
    if type(obj).__module__.startswith("cupy") and hasattr(obj, "graphExec"):
        return ValueError(CUPY_GRAPH_HINT)
    if callable(obj) and not is_torch_graph(obj):
        return TypeError(CALLABLE_HINT)
    return None


def is_torch_graph(obj: object) -> bool:
    """A torch.cuda.CUDAGraph (recognised by its methods, without importing torch)."""
    return all(callable(getattr(obj, name, None)) for name in ("raw_cuda_graph", "replay", "capture_begin"))


def template_of(obj: Any) -> int:
    """The template (cudaGraph_t) of a torch graph captured with keep_graph=True; ValueError otherwise."""
    if not callable(getattr(obj, "instantiate", None)) or not callable(getattr(obj, "raw_cuda_graph_exec", None)):
        raise ValueError("this PyTorch is too old for l2ctl to keep a graph's replays in step with its windows "
                         "(torch.cuda.CUDAGraph needs instantiate() and raw_cuda_graph_exec(): torch >= 2.9)")
    try:
        return int(obj.raw_cuda_graph())
    except RuntimeError as exc:
        if "keep_graph" in str(exc):
            raise ValueError(KEEP_GRAPH_HINT) from None
        raise ValueError(f"the torch graph has no template yet ({exc}); capture it first") from None


def has_executable(obj: Any) -> bool:
    """Whether torch holds an executable graph for ``obj`` (made at its first replay or instantiate())."""
    try:
        obj.raw_cuda_graph_exec()
    except RuntimeError:
        return False
    return True


# ---- the CUDA graph trees of torch.compile(mode="reduce-overhead") ------------------------------------


class GraphTrees(Protocol):
    """How l2ctl reaches the streams and graphs PyTorch runs a step on (tests substitute a stand-in)."""

    def capture_streams(self, device: int) -> list[object]:
        """The streams PyTorch captures on for ``device``: the graph trees' recording stream and
        torch.cuda.graph's default capture stream (made now if they do not exist yet)."""
        ...

    def current_stream(self, device: int) -> object:
        """The stream eager kernels of ``device`` launch on now, on this thread: torch's current stream. What
        torch.compile runs without graphs (a step it did not graph, graph breaks, its warm-up) runs there."""
        ...

    def watch_current(self, device: int, made_current: Callable[[object], None]) -> Callable[[], None]:
        """Call ``made_current(stream)`` whenever a stream of ``device`` is made torch's current stream (by
        ``torch.cuda.set_stream`` or ``with torch.cuda.stream(s)``), before any kernel launches on it; returns
        the call that stops watching."""
        ...

    def recorded(self, device: int) -> list[object]:
        """The graphs the graph trees hold on ``device`` (one object per recording)."""
        ...


class TorchGraphTrees:
    """torch.compile's CUDA graph trees (one tree manager per device) and torch.cuda.graph's default stream."""

    def capture_streams(self, device: int) -> list[object]:
        import torch
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(device, False)
        if manager is None:
            # Made now, as the first compiled call would make it: the warm-up and every recording of
            # torch.compile's graphs run on its stream. Making it captures an empty graph on purpose; torch
            # records the warning that raises, which a process that turns warnings into errors would see raised.
            with torch.cuda.device(device), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The CUDA Graph is empty", UserWarning)
                manager = cudagraph_trees.get_manager(device)
        streams: list[object] = [manager.stream]
        # make_graphed_callables and torch.cuda.graph(g) capture on this one; torch makes it on the current
        # device at its first capture, and so does l2ctl when that device is this one.
        default = torch.cuda.graph.default_capture_stream
        if default is None and torch.cuda.current_device() == device:
            default = torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
        if default is not None and default.device.index == device:
            streams.append(default)
        return streams

    def current_stream(self, device: int) -> object:
        import torch

        return torch.cuda.current_stream(device)

    def watch_current(self, device: int, made_current: Callable[[object], None]) -> Callable[[], None]:
        import torch

        return _stream_watch.watch(torch.cuda, device, made_current)

    def recorded(self, device: int) -> list[object]:
        module = sys.modules.get("torch._inductor.cudagraph_trees")  # never imported: nothing was recorded
        manager = None if module is None else module.get_manager(device, False)
        if manager is None:
            return []
        found, pending = [], list(manager.get_roots())
        while pending:
            node = pending.pop()
            if getattr(node, "graph", None) is not None:
                found.append(node)
            for children in node.children.values():
                pending.extend(children)
        return found


class _StreamWatch:
    """Who is told when torch makes a stream current. ``torch.cuda.set_stream`` is the function through which
    ``torch.cuda.stream(s)`` and user code make a stream current; l2ctl wraps it while a watcher is
    registered (a live ``torch_captures()`` scope) and puts back what it wrapped when the last one goes, so
    a process with no such scope runs torch's function untouched. Watchers are per device, not per thread: a
    stream any thread makes current gets the window. Not seen: ``with s:`` on a ``torch.Stream`` and
    ``torch.accelerator.set_stream``, which go to torch's C++ directly (docs/reference.md)."""

    def __init__(self) -> None:
        self._watchers: dict[int, tuple[int, Callable[[object], None]]] = {}  # token -> (device, callback)
        self._tokens = itertools.count(1)
        self._original: Optional[Callable[..., Any]] = None  # what l2ctl wrapped, read at each install
        self._module: Any = None

    def watch(self, module: Any, device: int, made_current: Callable[[object], None]) -> Callable[[], None]:
        with _lock:
            token = next(self._tokens)
            self._watchers[token] = (device, made_current)
            if self._module is None:  # not installed: wrap what is there now (torch's, or another wrapper)
                self._module, self._original = module, module.set_stream
                module.set_stream = self._set_stream
        return lambda: self._unwatch(token)

    def _unwatch(self, token: int) -> None:
        with _lock:
            self._watchers.pop(token, None)
            if not self._watchers and self._module is not None:
                if self._module.set_stream == self._set_stream:  # nobody wrapped it after l2ctl
                    self._module.set_stream = self._original
                self._module = None  # a later watch wraps whatever is there then

    def _set_stream(self, stream: Any) -> None:
        # First the watchers (the window goes on the stream), then torch's set_stream: no kernel can launch on
        # the stream between the two. Called without l2ctl's lock: a watcher enters the registry.
        if stream is not None:
            device = getattr(getattr(stream, "device", None), "index", None)
            with _lock:
                callbacks = [cb for d, cb in self._watchers.values() if d == device]
            for made_current in callbacks:
                made_current(stream)
        original = self._original
        assert original is not None  # set before this wrapper was installed
        original(stream)


_stream_watch = _StreamWatch()


trees: GraphTrees = TorchGraphTrees()


def use_trees(source: GraphTrees) -> GraphTrees:
    """Replace how l2ctl reaches PyTorch's graph trees (tests); returns the previous source."""
    global trees
    previous, trees = trees, source
    return previous


def allocator_blocks(device: int) -> list[tuple[int, int, bool]]:
    """(address, size, in a graph's private pool) of the blocks of PyTorch's caching allocator on ``device``:
    every allocated block, and every block of a graph's private pool whatever its state (a temporary a
    captured graph freed at capture end is still where its replays write); empty where torch is not
    imported or has not touched CUDA (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    blocks = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != device:
            continue
        private = tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0)
        address = int(segment["address"])
        for block in segment.get("blocks", []):
            if private or block.get("state") == "active_allocated":
                blocks.append((int(block.get("address", address)), int(block["size"]), private))
            address += int(block["size"])
    return blocks


# What l2ctl saw recorded inside its torch_captures scopes: recording -> the window its nodes carry
# (None: none). Weak keys: a recording torch drops is forgotten.
_lock = threading.Lock()
_recorded: "weakref.WeakKeyDictionary[Any, Optional[WindowTuple]]" = weakref.WeakKeyDictionary()
_UNKNOWN = object()


def _window_of(node: object) -> object:
    try:
        return _recorded.get(node, _UNKNOWN)
    except TypeError:  # not weakly referable: never remembered
        return _UNKNOWN


def without(recordings: list[object], window: WindowTuple) -> tuple[int, int]:
    """Of ``recordings``, how many l2ctl did not see recorded (their window is unknown) and how many carry
    another window than ``window``."""
    unknown = other = 0
    with _lock:
        for node in recordings:
            seen = _window_of(node)
            if seen is _UNKNOWN:
                unknown += 1
            elif seen != window:
                other += 1
    return unknown, other


def recordings(device: int) -> set[int]:
    """Identities of the graphs recorded on ``device`` now (what a scope's end compares with)."""
    return {id(node) for node in trees.recorded(device)}


def remember_recordings(device: int, before: set[int], window: Optional[WindowTuple]) -> None:
    """The graphs on ``device`` that are not in ``before`` were recorded under ``window``."""
    with _lock:
        for node in trees.recorded(device):
            if id(node) not in before and _window_of(node) is _UNKNOWN:
                try:
                    _recorded[node] = window
                except TypeError:
                    pass  # cannot be remembered: it stays unknown, and later scopes are refused
