"""PyTorch's CUDA graphs as l2ctl sees them: which of them a window can reach, and how (docs/DESIGN.md, "Graphs",
has the table). CUDA copies node windows into an executable only when it instantiates it, so a window reaches a
torch graph through its template: one made with ``keep_graph=True`` (torch >= 2.9), or any made while a
``graph.torch_captures()`` scope lives (``keep_templates``: torch's ``__init__`` is given ``keep_graph=True``, and
the executable is still made at capture end; ``kept`` lists them). A graph made outside such a scope is reached only
through the stream it is captured on (``capture_streams``).

torch is not imported at import time, its graph trees only when a ``graph.torch_captures()`` scope is
used. Their names (``get_manager``, ``.stream``, ``get_roots``, ``.children``, ``.graph``) are the same
from torch 2.6 to 2.15; ``CUDAGraph``'s ``__init__`` (torch's C++ binding) takes ``keep_graph`` from 2.9.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional, Protocol

from . import _backend

WindowTuple = tuple[int, int, float, int, int]

__all__ = ["TOO_OLD_HINT", "KEEP_GRAPH_HINT", "CUPY_GRAPH_HINT", "CALLABLE_HINT", "foreign_target_error",
           "is_torch_graph", "template_of", "has_executable", "keep_templates", "kept", "is_kept", "describe",
           "allocator_blocks", "weak_get", "GraphTrees", "TorchGraphTrees", "trees", "use_trees", "without",
           "recordings", "remember_recordings", "SKIP_LOGGERS", "watch_skips", "trace_allocations", "allocations_in"]

TOO_OLD_HINT = ("this PyTorch cannot keep a CUDA graph's template (torch.cuda.CUDAGraph(keep_graph=True) needs "
                "torch >= 2.9), so l2ctl can neither keep nor change the graphs it records: upgrade torch, or persist "
                "on l2ctl.graph.torch_captures() from before the compiled function's first call (its window then "
                "goes into the graphs as they are captured)")
KEEP_GRAPH_HINT = (
    "this torch.cuda.CUDAGraph keeps only its executable graph (keep_graph=False, the default, made outside any "
    "l2ctl.graph.torch_captures() scope), and CUDA cannot change the kernel nodes of an executable: a window set "
    "now would never reach its replays while the set-aside grows. Make and capture it inside "
    "`with l2ctl.graph.torch_captures():` (torch then keeps its template, whatever flags it was made with), or as "
    "torch.cuda.CUDAGraph(keep_graph=True) (torch >= 2.9)"
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
    return _answers(obj.raw_cuda_graph_exec)


def _answers(read: Callable[[], object]) -> bool:
    """Whether torch's ``read()`` finds what it reads (a graph's executable or template: RuntimeError once gone)."""
    try:
        read()
    except RuntimeError:
        return False
    return True


# ---- the CUDA graph trees of torch.compile(mode="reduce-overhead") ------------------------------------


class GraphTrees(Protocol):
    """How l2ctl reaches the streams and graphs PyTorch runs a step on (tests substitute a stand-in)."""

    def in_use(self) -> bool:
        """Whether PyTorch runs CUDA work in this process (imported, its CUDA initialized): where a step may be
        torch's, compiled or graphed."""

    def capture_streams(self, device: int) -> list[object]:
        """The streams PyTorch captures on for ``device``: the graph trees' recording stream and
        torch.cuda.graph's default capture stream (made now if they do not exist yet)."""

    def current_stream(self, device: int) -> object:
        """The stream eager kernels of ``device`` launch on now, on this thread: torch's current stream. What
        torch.compile runs without graphs (a step it did not graph, graph breaks, its warm-up) runs there."""

    def watch_current(self, device: int, made_current: Callable[[object], None]) -> Callable[[], None]:
        """Call ``made_current(stream)`` whenever a stream of ``device`` is made torch's current stream (by
        ``torch.cuda.set_stream`` or ``with torch.cuda.stream(s)``), before any kernel launches on it; returns
        the call that stops watching."""

    def recorded(self, device: int) -> list[object]:
        """The graphs the graph trees hold on ``device`` (one object per recording)."""

    def keep_templates(self, captured: Callable[[object, int], None]) -> Optional[Callable[[], None]]:
        """From now on every graph PyTorch makes keeps its template (``keep_templates``), and
        ``captured(graph, device)`` is called as each one's capture ends; returns the call that stops, or None
        where this PyTorch cannot keep a template (before 2.9)."""


#: ``_tree_manager``'s answer in a thread where torch keeps no graph trees.
_NO_TREES = object()


def _tree_manager(device: int, create: bool = False) -> Any:
    """torch.compile's graph-tree manager of ``device`` (made with ``create``), None where there is none yet, or
    _NO_TREES in a thread without torch's graph trees: torch keeps them in thread-local state that only the
    main thread and autograd's threads carry (its ``get_obj`` asserts elsewhere), so a compiled step that records
    graphs runs in those threads, and a step called from another thread records none there."""
    from torch._inductor import cudagraph_trees

    try:
        return cudagraph_trees.get_manager(device, create)
    except AssertionError:
        return _NO_TREES


class TorchGraphTrees:
    """torch.compile's CUDA graph trees (one tree manager per device) and torch.cuda.graph's default stream."""

    def in_use(self) -> bool:
        torch = sys.modules.get("torch")  # never imported here
        return torch is not None and bool(torch.cuda.is_available()) and bool(torch.cuda.is_initialized())

    def capture_streams(self, device: int) -> list[object]:
        import torch

        manager = _tree_manager(device)
        if manager is None:
            # Made now, as the first compiled call would make it: the warm-up and every recording of
            # torch.compile's graphs run on its stream. Making it captures an empty graph on purpose; torch
            # records the warning that raises, which a process that turns warnings into errors would see raised.
            with torch.cuda.device(device), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The CUDA Graph is empty", UserWarning)
                manager = _tree_manager(device, create=True)
        streams: list[object] = [] if manager is None or manager is _NO_TREES else [manager.stream]
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
        if sys.modules.get("torch._inductor.cudagraph_trees") is None:  # never imported: nothing was recorded
            return []
        manager = _tree_manager(device)
        if manager is None or manager is _NO_TREES:
            return []
        found, pending = [], list(manager.get_roots())
        while pending:
            node = pending.pop()
            if getattr(node, "graph", None) is not None:
                found.append(node)
            for children in node.children.values():
                pending.extend(children)
        return found

    def keep_templates(self, captured: Callable[[object, int], None]) -> Optional[Callable[[], None]]:
        import torch

        if not callable(getattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec", None)):  # before 2.9: no keep_graph
            return None
        return keep_templates(torch.cuda.CUDAGraph, lambda graph: int(torch.cuda.current_device()), captured)


class _StreamWatch:
    """Who is told when torch makes a stream current: l2ctl wraps ``torch.cuda.set_stream`` (through which
    ``torch.cuda.stream(s)`` and user code make a stream current) while a watcher is registered (a live
    ``torch_captures()`` scope), and puts back what it wrapped when the last one goes. Watchers are per device,
    not per thread. What bypasses that function is not seen (TorchCaptures names it)."""

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


# ---- templates kept for what is captured inside a torch_captures() scope ---------------------------------

_ABSENT = object()


class _TemplateKeeper:
    """While anyone asks, the graphs of a graph class keep their template: its ``__init__`` is given
    ``keep_graph=True``, and its ``capture_end`` makes the executable at once for a graph that asked for
    ``keep_graph=False``, as torch does for those, and remembers every graph captured (``kept``). The class's own
    attributes are put back when the last one stops (docs/DESIGN.md, "Graphs")."""

    def __init__(self) -> None:
        self._listeners: dict[int, tuple[type, Callable[[object, int], None]]] = {}
        self._tokens = itertools.count(1)
        #: class -> (its own attributes l2ctl replaced, what l2ctl put there)
        self._saved: dict[type, tuple[dict[str, object], dict[str, object]]] = {}
        self._defaulted: "weakref.WeakSet[Any]" = weakref.WeakSet()  # graphs that asked for keep_graph=False

    def keep(self, cls: type, device_of: Callable[[Any], int],
             captured: Callable[[object, int], None]) -> Callable[[], None]:
        """Have every graph of ``cls`` (torch.cuda.CUDAGraph, or the simulator's stand-in) made from now on keep
        its template, ``captured(graph, device)`` called as each capture ends (``device_of(graph)`` says where);
        returns the call that stops (the class is put back when the last caller stops)."""
        with _lock:
            token = next(self._tokens)
            self._listeners[token] = (cls, captured)
            if cls not in self._saved:
                saved = {name: cls.__dict__.get(name, _ABSENT) for name in ("__init__", "capture_end")}
                self._saved[cls] = (saved, self._patch(cls, device_of))
        return lambda: self._release(token)

    def _patch(self, cls: Any, device_of: Callable[[Any], int]) -> dict[str, object]:
        init, capture_end, keeper = cls.__init__, cls.capture_end, self  # what is there now (maybe inherited)

        def __init__(graph: Any, keep_graph: bool = False, *args: Any, **kwargs: Any) -> None:
            init(graph, True, *args, **kwargs)
            if not keep_graph:
                keeper._defaulted.add(graph)

        def capture_end_kept(graph: Any) -> None:
            capture_end(graph)
            if graph in keeper._defaulted and not has_executable(graph):
                graph.instantiate()  # torch instantiates a default graph here; a kept one would wait for replay()
            keeper._captured(cls, graph, device_of(graph))

        cls.__init__, cls.capture_end = __init__, capture_end_kept
        return {"__init__": __init__, "capture_end": capture_end_kept}

    def _captured(self, cls: type, graph: Any, device: int) -> None:
        with _lock:
            try:
                _kept[graph] = (device, _backend._active)
            except TypeError:  # not weakly referable: never listed
                return
            listeners = [fn for c, fn in self._listeners.values() if c is cls]
        for captured in listeners:
            captured(graph, device)

    def _release(self, token: int) -> None:
        with _lock:
            entry = self._listeners.pop(token, None)
            if entry is None or any(c is entry[0] for c, _ in self._listeners.values()):
                return
            cls: Any = entry[0]
            saved, ours = self._saved.pop(cls)
            for name, value in saved.items():
                if cls.__dict__.get(name) is not ours[name]:
                    continue  # someone wrapped it after l2ctl: theirs stays (and calls l2ctl's, which still works)
                if value is _ABSENT:
                    delattr(cls, name)
                else:
                    setattr(cls, name, value)


_keeper = _TemplateKeeper()
#: Every graph captured while its class kept templates -> its device and the backend it was captured under (weak
#: keys: a graph torch drops is gone).
_kept: "weakref.WeakKeyDictionary[Any, tuple[int, object]]" = weakref.WeakKeyDictionary()
#: ``keep_templates(cls, device_of, captured)``: the graphs of ``cls`` keep their template (_TemplateKeeper.keep).
keep_templates = _keeper.keep


def is_kept(graph: Any) -> bool:
    """Whether ``graph`` was captured inside a torch_captures() scope and still holds its template."""
    with _lock:
        known = weak_get(_kept, graph, (None, None))[1] is _backend._active
    return known and _answers(graph.raw_cuda_graph)


def kept(device: int) -> list[Any]:
    """The torch graphs on ``device`` captured inside torch_captures() scopes that still hold their template,
    in the order they were captured."""
    with _lock:
        graphs = [g for g, where in _kept.items() if where == (device, _backend._active)]
    return [g for g in graphs if _answers(g.raw_cuda_graph)]  # none after reset()


trees: GraphTrees = TorchGraphTrees()

#: Where torch.compile says that it runs compiled code without CUDA graphs ("skipping cudagraphs due to mutated
#: inputs", "... cpu device", ...): the log_cudagraph_skip_and_bump_counter artifact loggers of
#: torch._inductor.cudagraph_utils ("cudagraphs" from torch 2.6, "perf_hints" before). Read by name, so torch is
#: never imported for it.
SKIP_LOGGERS = ("torch._inductor.cudagraph_utils.__cudagraphs", "torch._inductor.cudagraph_utils.__perf_hints")
_SKIP_PREFIX = "skipping cudagraphs"


class _SkipHandler(logging.Handler):
    """Passes torch's reason for a skip, its first sentence (the stack trace after "Found from" left out), on."""

    def __init__(self, said: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._said = said

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record torch formats badly is not l2ctl's to raise
            return
        if message.startswith(_SKIP_PREFIX):
            self._said(message.split(". Found from")[0].strip())


def watch_skips(said: Callable[[str], None]) -> Callable[[], None]:
    """Call ``said(reason)`` whenever torch.compile reports that it runs a step without CUDA graphs (torch logs it
    once, when it compiles the step, whatever its log settings: the message is a warning); returns the call that
    stops."""
    handler = _SkipHandler(said)
    loggers = [logging.getLogger(name) for name in SKIP_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)

    def stop() -> None:
        for logger in loggers:
            logger.removeHandler(handler)

    return stop



def use_trees(source: GraphTrees) -> GraphTrees:
    """Replace how l2ctl reaches PyTorch's graph trees (tests); returns the previous source."""
    global trees
    previous, trees = trees, source
    return previous


def describe(graph: object, index: int, count: int) -> str:
    """How a report names a kept graph: its place among ``count`` and what made it (a recording of the graph
    trees, or a torch.cuda.CUDAGraph: torch.cuda.graph, make_graphed_callables)."""
    with _lock:
        device = weak_get(_kept, graph, (None, None))[0]
    tree = device is not None and any(getattr(node, "graph", None) is graph for node in trees.recorded(device))
    made = "a recording of torch.compile's CUDA graph trees" if tree else "a torch.cuda.CUDAGraph"
    return f"graph {index + 1} of {count} ({made})"


def trace_allocations(device: int) -> Optional[Callable[[], list[tuple[int, int]]]]:
    """Start recording the allocations torch's caching allocator makes on ``device`` (its memory history, without
    stack frames); returns the call that stops recording and gives them as (address, bytes), largest first. A
    temporary a step allocates and frees inside is then known by its own extent, not by the cached block it was
    carved from (which, after the step, may have merged with free memory around it: hundreds of MiB). None where
    torch is not in use or cannot record. A memory history the app itself records is switched off at the stop."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    memory = torch.cuda.memory
    record, snapshot = getattr(memory, "_record_memory_history", None), getattr(memory, "_snapshot", None)
    if record is None or snapshot is None:
        return None
    try:
        record(enabled="all", context=None, stacks="python", max_entries=1 << 16, clear_history=True)
    except (TypeError, RuntimeError):  # an older signature, or no CUDA allocator to record
        return None

    def stop() -> list[tuple[int, int]]:
        try:
            traces = snapshot().get("device_traces", [])
        finally:
            record(enabled=None)
        return allocations_in(traces[device] if device < len(traces) else [])

    return stop


def allocations_in(trace: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The (address, bytes) of the "alloc" actions of a device's memory trace, once each, largest first."""
    found = {(int(e["addr"]), int(e["size"])) for e in trace if e.get("action") == "alloc" and e.get("size")}
    return sorted(found, key=lambda item: (-item[1], item[0]))


def allocator_blocks(device: int, *, freed: bool = False) -> list[tuple[int, int, bool, bool]]:
    """(address, size, in a graph's private pool, allocated) of the blocks of PyTorch's caching allocator on
    ``device``: every allocated block, every block of a graph's private pool whatever its state (a temporary
    a captured graph freed at capture end is still where its replays write) and, with ``freed``, every cached
    block nobody holds (read after an eager step: its temporaries, freed when it returned); empty where torch
    is not imported or has not touched CUDA (never imports it)."""
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
            allocated = block.get("state") == "active_allocated"
            if private or allocated or freed:
                blocks.append((int(block.get("address", address)), int(block["size"]), private, allocated))
            address += int(block["size"])
    return blocks


# What l2ctl saw recorded inside its torch_captures scopes: recording -> the window its nodes carry
# (None: none). Weak keys: a recording torch drops is forgotten.
_lock = threading.Lock()
_recorded: "weakref.WeakKeyDictionary[Any, Optional[WindowTuple]]" = weakref.WeakKeyDictionary()
_UNKNOWN = object()


def weak_get(table: "weakref.WeakKeyDictionary[Any, Any]", key: object, default: Any) -> Any:
    """``table.get(key, default)``; ``default`` for a key that is not weakly referable (never stored)."""
    try:
        return table.get(key, default)
    except TypeError:
        return default


def without(recordings: list[object], window: WindowTuple) -> tuple[int, int]:
    """Of ``recordings``, how many l2ctl did not see recorded (their window is unknown) and how many carry
    another window than ``window``; a recording whose graph kept its template counts as neither (a scope puts
    its window on the graph's nodes)."""
    unknown = other = 0
    reachable = {id(node) for node in recordings if is_kept(getattr(node, "graph", None))}  # windows on their nodes
    with _lock:
        for node in recordings:
            if id(node) in reachable:
                continue
            seen = weak_get(_recorded, node, _UNKNOWN)
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
            if id(node) not in before and weak_get(_recorded, node, _UNKNOWN) is _UNKNOWN:
                try:
                    _recorded[node] = window
                except TypeError:
                    pass  # cannot be remembered: it stays unknown, and later scopes are refused
