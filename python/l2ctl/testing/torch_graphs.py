"""Stand-ins for PyTorch's CUDA graphs on the simulator, so that what l2ctl does with them runs without
torch or a GPU: ``FakeTorchGraph`` behaves as ``torch.cuda.CUDAGraph`` (its template kept or destroyed
as ``keep_graph`` says, an executable made at capture end or at the first replay, ``instantiate()``
making a new one from the template; ``keep_graph`` read by ``__init__``, as torch's C++ binding reads it,
so l2ctl's ``keep_templates`` patches it as it patches torch's), and ``FakeGraphTrees`` as torch.compile's
CUDA graph trees (one recording stream per device, recordings made with torch's default flags)::

    with FakeBackend.installed() as fake, l2ctl.Stream() as s:
        g = FakeTorchGraph(keep_graph=True)
        g.capture_begin(s); fake.launch_fake_kernel(s.handle); g.capture_end()
        g.replay(s)                                   # torch's executable, made now
        with l2ctl.persist(g, buf, 1.0):
            g.replay(s)                               # carries the window: l2ctl had torch re-instantiate it
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator, Optional

from .. import _backend, _torch_graphs
from .._device import stream_device
from .._interop import resolve_stream

__all__ = ["FakeTorchGraph", "FakeGraphTrees", "FakeRecording"]


class FakeTorchGraph:
    """``torch.cuda.CUDAGraph`` on the simulator (the methods l2ctl uses, with torch's errors)."""

    def __init__(self, keep_graph: bool = False) -> None:  # torch's C++ binding: where keep_graph is read
        self._backend = _backend.current()
        self.keep_graph = keep_graph
        self._stream: Optional[int] = None
        self.device = 0
        self._graph = 0  # the template (0: none, or destroyed)
        self._exec: Any = None
        self.instantiations = 0

    def capture_begin(self, stream: object) -> None:
        if self._exec is not None or self._graph:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph.")
        ref = resolve_stream(stream)
        self._stream, self.device = ref.handle, stream_device(ref)
        self._backend.begin_capture(self._stream, 1)

    def capture_end(self) -> None:
        assert self._stream is not None, "capture_end() called before capture_begin()"
        self._graph = int(self._backend.end_capture(self._stream))
        if not self.keep_graph:  # torch instantiates at once and destroys the template
            self.instantiate()
            self._backend.Graph(self._graph, True).destroy()
            self._graph = 0

    def instantiate(self) -> None:
        if self._exec is not None:
            if not self.keep_graph:
                raise RuntimeError("instantiate() is intended to be called by the user only when keep_graph=true")
            self._exec.destroy()
        self._exec = self._backend.GraphExec(self._graph)
        self.instantiations += 1

    def replay(self, stream: object = None) -> None:
        """torch replays on its current stream; here the stream is an argument (None: the default stream)."""
        if self._exec is None:
            if not self._graph:
                raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
            self.instantiate()
        self._exec.launch(resolve_stream(stream).handle)

    def reset(self) -> None:
        """Template and executable destroyed (torch's reset(), also run when the graph is freed)."""
        if self._exec is not None:
            self._exec.destroy()
            self._exec = None
        if self._graph:
            self._backend.Graph(self._graph, True).destroy()
            self._graph = 0

    def __del__(self) -> None:  # torch's destructor runs reset(): a graph nobody holds loses its template
        self.reset()

    def raw_cuda_graph(self) -> int:
        if not self.keep_graph:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance unless CUDAGraph was initialized "
                               "with keep_graph=true")
        if not self._graph:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance until capture_end() has been called")
        return self._graph

    def raw_cuda_graph_exec(self) -> int:
        if self._exec is None:
            raise RuntimeError("You cannot access the raw cudaGraphExec_t instance until instantiate() has been called")
        return int(self._exec.handle)


class FakeRecording:
    """One recording of the graph trees: its graph (an executable only, as torch keeps it). The stand-in records
    roots only: torch.compile's child recordings add nothing l2ctl treats apart."""

    def __init__(self, graph: FakeTorchGraph) -> None:
        self.graph: Optional[FakeTorchGraph] = graph


class FakeGraphTrees:
    """torch.compile's CUDA graph trees for ``l2ctl._torch_graphs.use_trees``: per device a recording stream
    and torch.cuda.graph's default capture stream (l2ctl Streams), the recordings made on the recording
    stream with ``record``, and torch's current stream per device (``set_stream``, ``stream(s)``; the legacy
    default stream until one is set), whose watchers are told before a stream becomes current, as
    ``torch.cuda.set_stream`` tells l2ctl's."""

    def __init__(self, *, keeps_templates: bool = True) -> None:
        self.keeps_templates = keeps_templates  # False: a torch before 2.9, whose graphs cannot keep a template
        self.streams: dict[int, Any] = {}
        self.default_streams: dict[int, Any] = {}
        self.roots: dict[int, list[FakeRecording]] = {}
        self.current: dict[int, object] = {}
        self._watchers: dict[int, tuple[int, Callable[[object], None]]] = {}
        self._tokens = itertools.count(1)

    def in_use(self) -> bool:
        return True  # the stand-in is torch, in use

    def capture_streams(self, device: int) -> list[object]:
        from .._memory import Stream

        if device not in self.streams:
            self.streams[device] = Stream(device)
            self.default_streams[device] = Stream(device)
        return [self.streams[device], self.default_streams[device]]

    def current_stream(self, device: int) -> object:
        return self.current.get(device, 0)  # 0: the legacy default stream, torch's current one at start

    def watch_current(self, device: int, made_current: Callable[[object], None]) -> Callable[[], None]:
        token = next(self._tokens)
        self._watchers[token] = (device, made_current)
        return lambda: self._watchers.pop(token, None) and None

    @property
    def watching(self) -> int:
        """How many watchers are registered (a scope that ended must leave none)."""
        return len(self._watchers)

    def set_stream(self, stream: object, device: int = 0) -> None:
        """torch.cuda.set_stream: the watchers first, then the stream is current on ``device``."""
        for watched, made_current in list(self._watchers.values()):
            if watched == device:
                made_current(stream)
        self.current[device] = stream

    @contextlib.contextmanager
    def stream(self, stream: object, device: int = 0) -> Iterator[None]:
        """``with torch.cuda.stream(s):``."""
        previous = self.current_stream(device)
        self.set_stream(stream, device)
        try:
            yield
        finally:
            self.set_stream(previous, device)

    def recorded(self, device: int) -> list[Any]:
        return list(self.roots.get(device, []))  # FakeRecordings

    def keep_templates(self, captured: Callable[[object, int], None]) -> Optional[Callable[[], None]]:
        """FakeTorchGraph patched as l2ctl patches torch.cuda.CUDAGraph (the same code)."""
        if not self.keeps_templates:
            return None
        return _torch_graphs.keep_templates(FakeTorchGraph, lambda graph: int(graph.device), captured)

    def record(self, launch: Callable[[int], None], device: int = 0) -> FakeRecording:
        """Record ``launch(stream handle)`` as torch.compile would: on the recording stream, in a graph made with
        torch's defaults (its template destroyed once instantiated, unless l2ctl keeps templates)."""
        stream = self.capture_streams(device)[0]
        graph = FakeTorchGraph()
        graph.capture_begin(stream)
        launch(resolve_stream(stream).handle)
        graph.capture_end()
        node = FakeRecording(graph)
        self.roots.setdefault(device, []).append(node)
        return node

    def reset(self) -> None:
        """torch.compiler.reset() (the graph trees' shutdown): every recording drops its graph and the trees
        forget them; a graph nobody else holds is freed then, its template destroyed."""
        for device in self.roots:
            for node in self.recorded(device):
                node.graph = None
        self.roots.clear()

    def close(self) -> None:
        for stream in [*self.streams.values(), *self.default_streams.values()]:
            stream.close()
