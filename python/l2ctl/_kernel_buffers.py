"""The memory kernels are given: every argument word of every kernel node of a graph, or of every kernel an
eager step launches (:func:`record_steps`), that points into device memory, mapped to the range that holds
it, so the tuner can offer ranges nobody named (a compiled graph's temporaries, a step's own temporaries) and
a person can see which kernels touch what.

A pointer is mapped, first match wins, to:

1. a tensor the caller named (``names``: name -> buffer): that tensor's bytes, under its name ("yours");
2. a block of PyTorch's caching allocator (its snapshot, read only where torch is already imported): the
   block, "a temporary of a captured graph" when it lies in a graph's private pool, "a temporary of the step"
   when an eager step freed it before it returned (read after the step: torch keeps the block cached, where
   the next step's allocation of the same size comes back), else "torch's cache" (a tensor nobody named);
3. the device allocation that holds it (cuMemGetAddressRange): the whole allocation ("an allocation").

Words that point nowhere (sizes, strides, flags) are dropped. Nothing here changes the device.

**Eager steps** (:func:`record_steps`): the arguments are read as the kernels launch (CUPTI's callbacks), over a
few steps after a warm-up, and a range is offered only where it is at the same place in every recorded step: a
window fixed on one step's address would miss the next step's data (docs/DESIGN.md, "Eager discovery").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

from . import _backend, _torch_graphs
from ._counters import load_cupti
from ._errors import CountersUnavailableError, CuptiError
from ._interop import resolve_buffer

T = TypeVar("T")

__all__ = ["GraphBuffer", "StepBuffers", "StepRecorder", "YOURS", "GRAPH_POOL", "STEP_TEMPORARY", "TORCH_CACHE",
           "ALLOCATION", "map_pointers", "record_steps", "MAX_LAUNCHES"]

YOURS, GRAPH_POOL, STEP_TEMPORARY, TORCH_CACHE, ALLOCATION = (
    "yours", "a temporary of a captured graph", "a temporary of the step", "torch's cache", "an allocation")
#: The most launches one recorded step keeps (a step of more is refused: its discovery would be partial).
MAX_LAUNCHES = 100_000
#: Why eager discovery may need CUPTI installed: said with every refusal.
CUPTI_HINT = ("eager discovery reads the kernels' arguments as they launch, through CUPTI's callbacks: install the "
              "CUDA toolkit (it ships CUPTI) or the CUPTI wheel of your CUDA (pip install nvidia-cuda-cupti for CUDA "
              "13, nvidia-cuda-cupti-cu12 for CUDA 12), or set L2CTL_CUPTI=/path/to/libcupti.so; or capture the step "
              "in a torch.cuda.CUDAGraph(keep_graph=True) and discover on the graph")


@dataclass(frozen=True)
class GraphBuffer:
    """A range of device memory that kernel nodes are given: where it is, what it is (``owner``: yours, a
    temporary of a captured graph, torch's cache, an allocation), its name (yours) or a label from the
    kernels that touch it, and those kernels' names."""

    ptr: int
    nbytes: int
    owner: str
    name: str
    kernels: tuple[str, ...]

    def describe(self) -> str:
        return (f"{self.name}: {self.nbytes / (1 << 20):.2f} MiB at 0x{self.ptr:x}, {self.owner}; given to "
                + ", ".join(self.kernels))


def _range_of(ptr: int, named: list[tuple[str, int, int]], blocks: list[tuple[int, int, str]]
              ) -> Optional[tuple[int, int, str, str]]:
    """(base, nbytes, owner, name) of the range holding ``ptr``, or None."""
    for name, base, nbytes in named:
        if base <= ptr < base + nbytes:
            return base, nbytes, YOURS, name
    for base, nbytes, owner in blocks:
        if base <= ptr < base + nbytes:
            return base, nbytes, owner, ""
    base, nbytes = _backend.current().address_range(ptr)
    if nbytes:
        return int(base), int(nbytes), ALLOCATION, ""
    return None


def _named(names: Optional[Mapping[str, object]]) -> list[tuple[str, int, int]]:
    refs = {str(name): resolve_buffer(obj) for name, obj in (names or {}).items()}
    return [(name, ref.ptr, ref.nbytes) for name, ref in refs.items()]


def _torch_blocks(device: int, freed: bool) -> list[tuple[int, int, str]]:
    """torch's allocator blocks with their owners; ``freed``: the cached blocks nobody holds are a step's
    temporaries (read after the step)."""
    return [(base, nbytes, GRAPH_POOL if private else TORCH_CACHE if allocated else STEP_TEMPORARY)
            for base, nbytes, private, allocated in _torch_graphs.allocator_blocks(device, freed=freed)]


def map_pointers(device: int, nodes: Iterable[tuple[int, str]], names: Optional[Mapping[str, object]] = None
                 ) -> tuple[list[GraphBuffer], dict[int, list[GraphBuffer]]]:
    """For kernel ``nodes`` ((handle, kernel name)) of ``device``: every range their arguments point into
    (ordered by size, largest first), and per node the ranges it is given."""
    backend = _backend.current()
    launches = [(node, function, backend.kernel_node_words(node)) for node, function in nodes]
    return _map_words(launches, _named(names), _torch_blocks(device, False))


def _map_words(launches: Iterable[tuple[int, str, list[tuple[int, int, int]]]], named: list[tuple[str, int, int]],
               blocks: list[tuple[int, int, str]]) -> tuple[list[GraphBuffer], dict[int, list[GraphBuffer]]]:
    """Every range the ``launches`` ((key, kernel name, argument words)) point into, largest first, and per key
    the ranges that launch is given."""
    found: dict[tuple[int, int], tuple[str, str, list[str]]] = {}
    per_node: dict[int, list[tuple[int, int]]] = {}
    for node, function, words in launches:
        seen: list[tuple[int, int]] = []
        for _param, _offset, value in words:
            where = _range_of(int(value), named, blocks)
            if where is None:
                continue
            base, nbytes, owner, name = where
            key = (base, nbytes)
            given = found.setdefault(key, (owner, name, []))[2]
            if function not in given:
                given.append(function)
            if key not in seen:
                seen.append(key)
        per_node[node] = seen
    labels = {key: name or _label(kernels) for key, (_owner, name, kernels) in found.items()}
    taken = list(labels.values())
    for key, label in labels.items():  # two ranges given to the same kernels: each its own name
        if taken.count(label) > 1:
            labels[key] = f"{label} @0x{key[0]:x}"
    buffers = {key: GraphBuffer(key[0], key[1], owner, labels[key], tuple(kernels))
               for key, (owner, _name, kernels) in found.items()}
    ordered = sorted(buffers.values(), key=lambda b: (-b.nbytes, b.ptr))
    return ordered, {node: [buffers[k] for k in keys] for node, keys in per_node.items()}


def _label(kernels: list[str]) -> str:
    """A name for memory nobody named: the kernels given it (the first two, and how many more)."""
    short = [k if len(k) <= 40 else k[:37] + "..." for k in kernels[:2]]
    return "memory of " + ", ".join(short) + (f" (+{len(kernels) - 2})" if len(kernels) > 2 else "")


@dataclass(frozen=True)
class StepBuffers:
    """What :func:`record_steps` found: the ranges an eager step's kernels are given at the same place in every
    recorded step (``stable``, largest first, as ``graph.buffers`` lists a graph's), the ranges that moved
    (``moved``: label -> why), how many steps were recorded and how many launches each made."""

    stable: list[GraphBuffer]
    moved: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    launches: tuple[int, ...] = ()


class StepRecorder:
    """The launches of an eager step, one run at a time, for a caller that runs the step itself (``record_steps``
    runs it in a loop; ``l2ctl.autotune`` records the app's own calls): the first run is a warm-up (first
    allocations, lazy loads; recorded, not compared), then ``steps`` runs whose launch calls are recorded and
    whose kernels' arguments on ``device`` are mapped to memory as :func:`map_pointers` does (torch's blocks read
    after each run, freed ones included). The recorder is subscribed only while a run runs and is released on every
    path. CountersUnavailableError, saying what to install or which tool holds CUPTI, where CUPTI cannot record:
    at construction or before the run."""

    def __init__(self, device: int, names: Optional[Mapping[str, object]] = None, steps: int = 3) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 16:
            raise ValueError(f"steps must be an int from 2 to 16 (the steps compared), got {steps!r}")
        self.device, self.steps, self._named = device, steps, _named(names)
        try:
            load_cupti()
            self._recorder = _backend.current().LaunchRecorder(MAX_LAUNCHES)
        except CountersUnavailableError as exc:  # CuptiError is one
            raise CountersUnavailableError(f"{exc}; {CUPTI_HINT}") from exc
        self._runs = 0
        #: why the runs cannot be compared (set after a run that launched too many kernels): ``result()`` raises it
        self.refused: Optional[str] = None
        self._recorded: list[tuple[list[tuple[int, str, list[tuple[int, int, int]]]], list[tuple[int, int, str]]]] = []

    @property
    def done(self) -> bool:
        return self._runs > self.steps or self.refused is not None

    def run(self, run: Callable[[], T]) -> T:
        """``run()``, its launches recorded; what it returned."""
        try:
            self._recorder.start()
        except CuptiError as exc:
            raise CountersUnavailableError(
                f"eager discovery cannot record the launches: {exc} (another CUPTI user, such as l2ctl.counters, "
                f"Nsight or torch.profiler, holds the process's one subscription: run discovery without it)") from exc
        # a recorded run's allocations through torch, by their own extents (the warm-up's are not compared)
        traced = _torch_graphs.trace_allocations(self.device) if self._runs else None
        try:
            out = run()
        finally:
            launches = self._recorder.stop()
            temporaries = traced() if traced is not None else []
        if self._recorder.dropped:  # the run itself happened: its result is the caller's, the refusal is kept
            self.refused = f"the step launched more than {MAX_LAUNCHES} kernels: too many to discover from"
            return out
        if self._runs:
            ours = [(i, str(name), list(words))  # numbered among this device's launches: matched by position
                    for i, (name, words) in enumerate((n, w) for n, _stream, dev, w in launches if dev == self.device)]
            blocks = [(base, nbytes, STEP_TEMPORARY) for base, nbytes in temporaries]
            self._recorded.append((ours, blocks + _torch_blocks(self.device, True)))
        self._runs += 1
        return out

    def result(self) -> StepBuffers:
        if self.refused is not None:
            raise ValueError(self.refused)
        if not self.done:
            raise RuntimeError(f"{self._runs} of the {self.steps + 1} runs recorded")
        return _compare_steps(self._recorded, self._named)


def record_steps(run: Callable[[], object], device: int, names: Optional[Mapping[str, object]] = None,
                 steps: int = 3) -> StepBuffers:
    """Run ``run()`` once as a warm-up, then ``steps`` times with the launch calls recorded, and map the arguments
    of the kernels launched on ``device`` to memory (:class:`StepRecorder`, whose errors it raises)."""
    recorder = StepRecorder(device, names, steps)
    while not recorder.done:
        recorder.run(run)
    return recorder.result()


def _compare_steps(recorded: list[tuple[list[tuple[int, str, list[tuple[int, int, int]]]],
                                        list[tuple[int, int, str]]]],
                   named: list[tuple[str, int, int]]) -> StepBuffers:
    """The ranges found at the same place in every step, and those a launch was given at different places."""
    per_step = [_map_words(launches, named, blocks) for launches, blocks in recorded]
    keys = [{(b.ptr, b.nbytes) for b in found} for found, _ in per_step]
    stable_keys = set.intersection(*keys)
    stable = [b for b in per_step[-1][0] if (b.ptr, b.nbytes) in stable_keys]
    # the same launch (by position, when every step launched the same kernels) and argument in each step
    moved: dict[str, set[int]] = {}
    sequences = [[name for _, name, _ in launches] for launches, _ in recorded]
    if all(seq == sequences[0] for seq in sequences):
        for i in range(len(sequences[0])):
            given = [[(b.ptr, b.nbytes, b.name) for b in by_launch.get(i, [])] for _, by_launch in per_step]
            for slot in range(min(len(g) for g in given)):
                places = {g[slot][:2] for g in given}
                if len(places) > 1 and not places & stable_keys:
                    label = given[-1][slot][2]
                    moved.setdefault(label, set()).update(p[0] for p in places)
    why = {label: (f"moves between steps: at {', '.join(f'0x{p:x}' for p in sorted(bases))} in {len(recorded)} "
                   f"recorded steps, so a window on one step's address misses the next step's data")
           for label, bases in moved.items()}
    for b in per_step[-1][0]:  # the rest of what is not where it was: seen in some steps only
        if (b.ptr, b.nbytes) not in stable_keys and b.name not in why:
            seen = sum((b.ptr, b.nbytes) in k for k in keys)
            why[b.name] = (f"moves between steps: at 0x{b.ptr:x} in {seen} of {len(recorded)} recorded steps, so a "
                           f"window there would miss in the others")
    return StepBuffers(stable, why, len(recorded), tuple(len(seq) for seq in sequences))
