"""Gallery workloads run the way modern PyTorch runs them: captured in a CUDA graph and replayed
(``Graphed``: the target is the graph, whose template l2ctl changes and torch re-instantiates), or compiled
with ``torch.compile(mode="reduce-overhead")`` (``Compiled``: the target is ``graph.torch_captures()``; its
graphs keep the window they were recorded under, so it keeps one compiled function per window, and every
tune point, and the baseline, replays graphs recorded under its own). ``target()`` says what a persist
scope or ``l2ctl.tune`` must target so that its window reaches what replays.

Both wrap an object that splits a step into ``prepare()`` (eager work before it) and ``step()`` (what is
captured or compiled), both on the current torch stream, and says its ``device``; a gallery workload, or
your own with any of ``candidates()``, ``poison(stream)``, ``verify(stream)``, ``describe()``, ``close()``.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Optional, Protocol

from .. import _torch_graphs
from .._stream_window import get_window
from .._targets import ScopedWindow
from .._window import AccessPolicyWindow
from ..graph import TorchCaptures, torch_captures
from . import Closing
from ._frameworks import on_torch_stream, require_torch

__all__ = ["Stepped", "Graphed", "Compiled"]

WindowTuple = tuple[int, int, float, int, int]


class Stepped(Protocol):
    """A step that can be captured or compiled: ``prepare()`` and ``step()`` on the current torch stream."""

    @property
    def device(self) -> int: ...

    def prepare(self) -> None: ...
    def step(self) -> None: ...


class _Wrapped(Closing):
    """What Graphed and Compiled share: everything but running the step comes from the wrapped workload
    (what it lacks: no candidates, nothing to poison, unverified)."""

    mode = ""
    framework = "torch"

    def __init__(self, base: Stepped) -> None:
        self.base = base
        self.name = f"{getattr(base, 'name', 'step')}-{self.mode}"
        self.hot = str(getattr(base, "hot", ""))
        self.device = int(base.device)
        if not callable(getattr(base, "verify", None)):
            self.verify = None  # type: ignore[assignment]  # measured as unverified (bench.compare)

    def _on_stream(self, stream: object) -> contextlib.AbstractContextManager[Any]:
        """The step's code on ``stream``: torch's current stream inside the block."""
        return on_torch_stream(stream)

    def candidates(self) -> dict[str, Any]:
        candidates = getattr(self.base, "candidates", None)
        return dict(candidates()) if callable(candidates) else {}

    def poison(self, stream: object) -> None:
        poison = getattr(self.base, "poison", None)
        if callable(poison):
            poison(stream)

    def verify(self, stream: object) -> bool:
        return bool(self.base.verify(stream))  # type: ignore[attr-defined]

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.base, "describe", None)
        return {**(describe() if callable(describe) else {}), "workload": self.name, "mode": self.mode}

    def close(self) -> None:
        close = getattr(self.base, "close", None)
        if callable(close):
            close()


class Graphed(_Wrapped):
    """``base``'s whole step captured in a torch.cuda.CUDAGraph(keep_graph=True), replayed once already (its
    executable exists before any scope, as after a user's warm-up); ``target()`` is the graph. Nothing
    runs outside the graph: an eager kernel under a stream window would load the buffer's lines as
    persisting, and the graph's kernels would then hit them without a window of their own."""

    mode = "graphed"

    def __init__(self, base: Stepped) -> None:
        super().__init__(base)
        self.graph = self._capture()

    def _capture(self) -> Any:
        torch = require_torch()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.base.prepare()
                self.base.step()  # warm-up outside the capture (library handles, lazy allocations)
                with torch.cuda.graph(graph, stream=side):
                    self.base.prepare()
                    self.base.step()
                graph.replay()
            torch.cuda.current_stream().wait_stream(side)
        return graph

    def target(self) -> Any:
        return self.graph

    def enqueue(self, stream: object) -> None:
        with self._on_stream(stream):
            self.graph.replay()


class Compiled(_Wrapped):
    """``base``'s step compiled with torch.compile(mode="reduce-overhead"), one compiled function per
    window in force on torch's capture stream (each a fresh compilation of the same step, so that CUDA
    graph trees record it anew: Inductor's cache makes that quick). ``target()`` is
    ``graph.torch_captures()``, told which recordings each window's scope replays (that window's own);
    ``l2ctl.tune`` accepts it for this workload (``records_each_window``). Every compiled function and its
    recording stay until ``close()``: a tune of a few candidates makes a few dozen.

    ``static_inputs=False`` leaves the step's tensors unmarked: a step that updates one in place is then
    not graphed at all (torch skips CUDA graphs for mutated inputs) and runs eagerly on the current stream,
    as much user code does. ``describe()`` says how many of its compilations torch ran as CUDA graphs (0:
    none, the step ran eagerly)."""

    mode = "compiled"
    records_each_window = True

    def __init__(self, base: Stepped, *, static_inputs: bool = True, name: Optional[str] = None) -> None:
        super().__init__(base)
        if name is not None:
            self.name = name
        self._captures = torch_captures(self.device, replays=self._replayed)
        self._compiled: dict[WindowTuple, Callable[[], Any]] = {}
        self._recorded: dict[WindowTuple, set[int]] = {}  # the recordings each compiled function made
        self._graphed: dict[WindowTuple, bool] = {}  # whether torch ran each compiled function as CUDA graphs
        self.compilations = 0
        self.static_inputs = bool(static_inputs)
        if self.static_inputs:
            self._static_inputs()

    # ---- what PyTorch does (the simulator's stand-in, tests/stand_ins.py, replaces these) ---------------

    def _static_inputs(self) -> None:
        """Static addresses for the step's tensors (its attributes and its candidates): graph trees then
        neither copy them into their pool before every replay (copies that pay the set-aside's tax) nor
        refuse the step's in-place update of them. Mark any other input yourself
        (torch._dynamo.mark_static_address)."""
        torch = require_torch()
        for value in [*vars(self.base).values(), *self.candidates().values()]:
            if isinstance(value, torch.Tensor) and value.is_cuda:
                torch._dynamo.mark_static_address(value)

    def _call(self, fn: Callable[[], Any]) -> None:
        require_torch().compiler.cudagraph_mark_step_begin()
        fn()

    def _graph_skips(self) -> int:
        """How many times torch.compile has skipped CUDA graphs in this process (its own counter, bumped with
        every "skipping cudagraphs due to ..." it logs)."""
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["cudagraph_skips"])

    def _fresh(self) -> Callable[[], Any]:
        step = self.base.step

        def call() -> None:
            step()

        # Dynamo caches compiled code per code object: a copy of it compiles, and records, anew.
        fresh = types.FunctionType(call.__code__.replace(), call.__globals__, "step", None, call.__closure__)
        return require_torch().compile(fresh, mode="reduce-overhead")  # type: ignore[no-any-return]

    # ---- the workload ------------------------------------------------------------------------------------

    def target(self) -> TorchCaptures:
        return self._captures

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "static_inputs": self.static_inputs, "compilations": self.compilations,
                "graphed_compilations": sum(self._graphed.values())}

    def _replayed(self, window: WindowTuple) -> list[object]:
        ids = self._recorded.get(window, set())
        return [node for node in _torch_graphs.trees.recorded(self.device) if id(node) in ids]

    def enqueue(self, stream: object) -> None:
        with self._on_stream(stream):
            recording_stream = _torch_graphs.trees.capture_streams(self.device)[0]
            key = get_window(recording_stream).as_tuple()
            fn = self._compiled.get(key)
            if fn is not None:
                self.base.prepare()
                self._call(fn)
                return
            # Warm-up, recording and a first replay, all under the window in force; with no scope live, under an
            # explicitly empty one, so that l2ctl knows what these graphs carry.
            fn = self._compiled[key] = self._fresh()
            self.compilations += 1
            before, skips = _torch_graphs.recordings(self.device), self._graph_skips()
            with ScopedWindow(self._captures, AccessPolicyWindow()) if not key[1] else contextlib.nullcontext():
                for _ in range(3):
                    self.base.prepare()
                    self._call(fn)
            self._recorded[key] = _torch_graphs.recordings(self.device) - before
            self._graphed[key] = self._graph_skips() == skips

    def close(self) -> None:
        self._compiled.clear()
        super().close()
