"""The simulator's stand-ins that only the tests use: modeled workloads split into ``prepare()`` and ``step()`` (what
a graph captures, what a compiler compiles), one whose re-read buffer is a compiler's temporary, an eager step that
allocates its hot buffer inside, a graphed and a compiled step (torch's CUDA graphs and torch.compile on the
simulator's graph trees), and a set-aside surface measured on a GPU, replayed. The gallery's own stand-ins are
l2ctl.workloads.modeled's."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

from l2ctl import _backend
from l2ctl._device import resolve_device
from l2ctl._interop import resolve_stream
from l2ctl._memory import DeviceBuffer, Stream
from l2ctl._torch_graphs import SKIP_LOGGERS
from l2ctl.testing.torch_graphs import FakeGraphTrees, FakeRecording, FakeTorchGraph
from l2ctl.workloads import Closing
from l2ctl.workloads._base import GiB, fraction_of_l2
from l2ctl.workloads.graphed import Compiled, Graphed
from l2ctl.workloads.modeled import ModeledKernel, ModeledWorkload


class SteppedWorkload(ModeledWorkload):
    """A modeled workload split as Graphed and Compiled run one: ``prepare()`` and ``step()`` on the stream
    ``on_stream`` sets (the simulator has no "current stream" of its own). ``hidden``: buffers a user never sees (a
    compiler's temporaries), not offered as candidates."""

    def __init__(self, *args: Any, hidden: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden = hidden
        self._current = 0  # the stream step() runs on

    def prepare(self) -> None:
        """Nothing runs before a step."""

    def step(self) -> None:
        """One run on the stream set by ``on_stream`` (what a graph captures or a compiler compiles)."""
        self.enqueue(self._current)

    @contextlib.contextmanager
    def on_stream(self, stream: object) -> Iterator[None]:
        previous, self._current = self._current, resolve_stream(stream).handle
        try:
            yield
        finally:
            self._current = previous

    def candidates(self) -> dict[str, DeviceBuffer]:
        return {n: b for n, b in self.buffers.items() if n not in self.hidden}


def scatter_add_into_temporary(device: object = None) -> SteppedWorkload:
    """What Inductor makes of ``acc.zero_(); acc.index_add_(...)`` compiled together: it zeroes a temporary
    of its own, scatters into it and copies it into ``acc``. The user sees ``acc``, ``index``, ``values``;
    the re-read buffer is the temporary (``hidden``), which only the graph's kernel arguments show."""
    acc = fraction_of_l2(0.64, device)
    return SteppedWorkload("scatter-add-temp", {"acc": acc, "tmp": acc, "index": GiB, "values": GiB // 2},
                           [ModeledKernel("triton_poi_fused_zero_0", acc, given=("tmp",), read_fraction=0.0),
                            ModeledKernel("triton_poi_fused_index_add_1", 1.5 * GiB, "tmp", 32 * (1.5 * GiB / 12),
                                          read_fraction=0.98, given=("tmp", "index", "values")),
                            ModeledKernel("triton_poi_fused_copy_2", 2 * acc, given=("tmp", "acc"))],
                           hot="acc", device=device, hidden=("tmp",))


class ModeledEagerStep(SteppedWorkload):
    """An eager step that allocates its hot buffer inside, as a GNN layer's ``out = torch.zeros(N, D,
    device=...).index_add_(0, dst, x[src])``: each run takes its temporary (``out``, and the gathered rows) from
    a cache of freed blocks, as torch's caching allocator does, and gives it back when it returns, so the next
    run gets the same block, at the same address. ``keeps_last``: the step keeps its output until the next run
    (``self.prev = out``), so each run's temporary comes from another block than the last run's: it moves."""

    def __init__(self, device: object = None, *, keeps_last: bool = False) -> None:
        out = fraction_of_l2(0.6, device)
        super().__init__("eager-gnn-layer", {"out": out, "gathered": GiB // 2, "x": GiB // 4, "src": GiB // 8,
                                             "dst": GiB // 8},
                         [ModeledKernel("zeros_kernel", out, given=("out",), read_fraction=0.0),
                          ModeledKernel("index_select_kernel", GiB // 2 + GiB // 8 + GiB // 4,
                                        given=("x", "src", "gathered")),
                          ModeledKernel("index_add_kernel", GiB // 2 + GiB // 8, "out", 32 * ((GiB // 2) / 12),
                                        read_fraction=0.98, given=("out", "dst", "gathered"))],
                         hot="out", device=device, hidden=("out", "gathered"))
        self.keeps_last = keeps_last
        self._cache = {name: [self.buffers[name]] for name in self.hidden}  # torch's cache: freed blocks by size
        self._held: list[DeviceBuffer] = []

    def enqueue(self, stream: object) -> None:
        taken = {}
        for name in self.hidden:  # allocated inside the step: a cached block of the size, else a new one
            free = self._cache[name]
            taken[name] = free.pop(0) if free else DeviceBuffer(self.buffers[name].nbytes, self.device)
            self.buffers[name] = taken[name]
        super().enqueue(stream)
        kept = [taken["out"]] if self.keeps_last else []
        for block in self._held:  # what the last run kept goes back now
            self._cache["out"].append(block)
        self._held = kept
        for name, block in taken.items():  # the step returns: its temporaries go back to the cache
            if block not in kept:
                self._cache[name].append(block)

    def close(self) -> None:
        blocks = {id(b): b for b in [*self.buffers.values(), *self._held,
                                     *(b for free in self._cache.values() for b in free)]}
        for b in blocks.values():
            b.free()


class ModeledGraphed(Graphed):
    """``l2ctl.workloads.Graphed`` over a modeled workload: captured in a FakeTorchGraph(keep_graph=True) and
    replayed through it (its executable made before any scope); ``target()`` is the graph."""

    def _on_stream(self, stream: object) -> contextlib.AbstractContextManager[Any]:
        return self.base.on_stream(stream)  # type: ignore[attr-defined, no-any-return]

    def _capture(self) -> FakeTorchGraph:
        graph = FakeTorchGraph(keep_graph=True)
        with Stream(self.device) as side, self._on_stream(side):
            graph.capture_begin(side)
            self.base.prepare()
            self.base.step()
            graph.capture_end()
            graph.replay(side)
        return graph

    def enqueue(self, stream: object) -> None:
        self.graph.replay(stream)
        self.base._launched = len(self.base.kernels)  # type: ignore[attr-defined]  # the graph ran its kernels


class FakeCompiledStep:
    """What torch.compile(mode="reduce-overhead") makes of a step, on the simulator: the first call runs it
    on the recording stream (the warm-up), the second records it there (graph trees) and replays it on the
    caller's stream, later calls replay. With ``graphs=False`` it is what torch.compile makes of a step it
    does not graph (an in-place update of an input not marked static): every call runs the kernels eagerly
    on the current stream."""

    def __init__(self, trees: FakeGraphTrees, base: SteppedWorkload, graphs: bool = True) -> None:
        self.trees, self.base, self.graphs = trees, base, graphs
        self.calls = 0
        self.recording: Optional[FakeRecording] = None

    def __call__(self) -> None:
        self.calls += 1
        caller = self.base._current
        if not self.graphs:
            if self.calls == 1:  # torch says why when it compiles the step, through its cudagraphs log
                logging.getLogger(SKIP_LOGGERS[0]).warning(
                    "skipping cudagraphs due to mutated inputs (1 instances). Found from : \n  File \"step.py\", "
                    "line 3, in step\n    acc.index_add_(0, index, values)\n")
            self.base.step()
            return
        if self.calls == 1:
            with self.base.on_stream(self.trees.capture_streams(self.base.device)[0]):
                self.base.step()
            return
        graph = self.recording.graph if self.recording is not None else None
        if graph is None:  # not recorded yet, or the trees were reset since (torch records anew)
            self.recording = self.trees.record(lambda handle: self.base.enqueue(handle), self.base.device)
            graph = self.recording.graph
        assert graph is not None  # just recorded
        graph.replay(caller)
        self.base._launched = len(self.base.kernels)


class ModeledCompiled(Compiled):
    """``l2ctl.workloads.Compiled`` over a modeled workload and the simulator's graph trees (FakeGraphTrees,
    installed with ``l2ctl._torch_graphs.use_trees``): the same one-compiled-function-per-window logic.
    ``graphs=False``: torch.compile without its graphs (every call eager, on the current stream)."""

    def __init__(self, base: SteppedWorkload, trees: FakeGraphTrees, *, graphs: bool = True) -> None:
        self.trees, self.graphs = trees, graphs
        self.skips = 0  # calls run without graphs (torch counts the skips)
        super().__init__(base)

    def _static_inputs(self) -> None:
        pass

    @contextlib.contextmanager
    def _on_stream(self, stream: object) -> Iterator[None]:
        # torch.cuda.stream(stream) as the trees see it, and the modeled workload's own current stream
        with self.trees.stream(stream, self.device), self.base.on_stream(stream):  # type: ignore[attr-defined]
            yield

    def _fresh(self) -> Callable[[], Any]:
        return FakeCompiledStep(self.trees, self.base, self.graphs)  # type: ignore[arg-type]

    def _call(self, fn: Callable[[], Any]) -> None:
        fn()
        self.skips += not self.graphs

    def _graph_skips(self) -> int:
        return self.skips


class SetAsideSurface(Closing):
    """A step whose time is a given function of the set-aside, not the model's: a timing surface measured on a
    GPU, replayed. ``times_ms`` maps a set-aside in granules of the simulated device to the step's milliseconds
    under a window that covers ``buf`` with the hit ratio that fits (granule counts it does not name are
    interpolated linearly; beyond its ends, the nearest end); with no window on ``buf`` the step takes
    ``baseline_ms``. A window that serves less of ``buf`` than the set-aside could (a lower hit ratio) gets the
    same share of the gain. One launch per step, with the device's noise."""

    def __init__(self, times_ms: dict[int, float], baseline_ms: float, lut_granules: float,
                 device: object = None) -> None:
        if not hasattr(_backend.current(), "launch_modeled_kernel"):
            raise RuntimeError("a set-aside surface runs on the simulator only (l2ctl.testing.FakeBackend)")
        if not times_ms or min(times_ms) < 1:
            raise ValueError("times_ms: give the time at one granule or more")
        self.device = resolve_device(device)
        backend: Any = _backend.current()
        self.granularity = int(backend.device(self.device).granularity)
        self.times_ms, self.baseline_ms = dict(sorted(times_ms.items())), float(baseline_ms)
        self.buf = DeviceBuffer(max(256, int(lut_granules * self.granularity) // 256 * 256), device)
        self.calls = 0

    @classmethod
    def h200_lut_8mib(cls, device: object = None) -> "SetAsideSurface":
        """reset-data with an 8 MiB LUT (hit ratio 1.0, 1 GiB output) as an H200 ran it (issue 42): the median ms
        under set-asides of 1, 2, 3, 4, 5, 7, 9 and 10 granules of 3.75 MiB, on a LUT of the same size in granules
        (8 / 3.75). The first set-aside that holds the LUT (3 granules, the driver's default limit) is not the
        fastest: the next one is, by 16%, and the time rises again beyond it. The baseline (no window, 0.60 ms)
        is assumed: it was not part of that grid."""
        return cls({1: 0.558, 2: 0.502, 3: 0.418, 4: 0.361, 5: 0.479, 7: 0.494, 9: 0.804, 10: 0.884}, 0.60, 8 / 3.75,
                   device)

    def time_at(self, granules: float) -> float:
        """The step's milliseconds under a set-aside of ``granules`` with a window covering ``buf``."""
        keys = list(self.times_ms)
        if granules <= keys[0]:
            return self.times_ms[keys[0]]
        for low, high in zip(keys, keys[1:]):
            if granules <= high:
                share = (granules - low) / (high - low)
                return self.times_ms[low] + share * (self.times_ms[high] - self.times_ms[low])
        return self.times_ms[keys[-1]]

    def best_granules(self) -> int:
        """The set-aside, in granules, where the step runs fastest."""
        return min(self.times_ms, key=lambda k: self.times_ms[k])

    def enqueue(self, stream: object) -> None:
        handle = resolve_stream(stream).handle
        backend: Any = _backend.current()
        base, num_bytes, hit_ratio = backend.get_stream_window(handle)[:3]
        limit = backend.device(self.device).limit
        ms = self.baseline_ms
        if base == self.buf.ptr and num_bytes and hit_ratio and limit:
            served = min(1.0, hit_ratio * num_bytes / min(limit, self.buf.nbytes))
            ms += served * (self.time_at(limit / self.granularity) - self.baseline_ms)
        backend.launch_modeled_kernel(handle, "surface", compute_ms=ms, args=(self.buf.ptr,))
        self.calls += 1

    def describe(self) -> dict[str, Any]:
        return {"workload": "set-aside surface", "modeled": True, "lut_bytes": self.buf.nbytes}

    def close(self) -> None:
        self.buf.free()
