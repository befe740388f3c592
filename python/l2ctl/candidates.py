"""Candidates for the tuner that nobody has to list: the tensors of a ``torch.nn.Module`` (its parameters,
their gradients, its buffers) and, with an optimizer, the optimizer's state, named by module path
(``encoder.layers.3.bias``, ``encoder.layers.3.weight.exp_avg``); or the memory a graph's kernels are given
(:func:`from_graph`, ``tune(step, graph, "discover")``: a compiled graph's temporaries included), or the memory
the kernels of an eager step are given as it runs (:func:`from_steps`, ``tune(step, stream, "discover")``: the
temporaries it allocates inside, when they come back at the same address every step). All are
filtered by size before anything is measured, so that a model of hundreds of tensors is tuned over the few
a window could serve.

The rule (``CandidateRule``, sizes from the device's own properties):

- **large enough to miss**: at least 1/64 of the L2 (0.78 MiB on a 50 MiB L2). A smaller tensor stays in the
  L2 beside the data streaming past or costs too little DRAM traffic when it misses for a window to show;
- **small enough to hold**: at most 4 x the largest set-aside (125 MiB on an H100): the set-aside then holds
  at least a quarter of it; of a larger tensor read evenly, too small a share hits to pay the tax;
- **one name per memory**: tensors over the same bytes (tied weights) are one candidate, named by both;
- **the largest first**: of those, the ``most`` (8) that the largest set-aside covers best (their bytes, up
  to the set-aside's) are tried; the rest are listed as skipped.

A module's tensors can also be picked by name first (``from_module(model, include="*.attn*.to_[qkv].weight",
exclude=...)``: shell-style patterns, ``fnmatch``, matched against the whole path; one pattern or a list): the
rule then applies to the tensors they pick. An ``include`` pattern that matches no name is an error that
shows the names closest to it, so a typo never tunes nothing; ``exclude`` patterns may match nothing.

Torch is never imported: a module is anything with ``named_parameters()`` and ``named_buffers()``, an
optimizer anything with ``state`` (parameter -> dict of tensors), a tensor anything l2ctl takes as a
buffer. ``tune(step, target, model)`` uses this; call :func:`from_module` to see the list first, or to pick by
name, and pass what it returns to ``tune`` as the candidates.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any, Callable, Optional, Protocol, Union

from ._device import properties, resolve_device
from ._interop import BufferRef, resolve_buffer
from . import _torch_graphs
from ._errors import CountersUnavailableError
from ._kernel_buffers import GraphBuffer, StepBuffers, map_pointers, record_steps
from ._memory import BufferLike
from ._units import format_bytes
from .graph import TorchCaptures, as_graph

__all__ = ["Patterns", "SupportsNamedTensors", "CandidateRule", "ModelCandidates", "is_module", "rule_for",
           "from_module", "from_graph", "from_steps", "from_captures", "from_recorded"]

#: Tried at most, by default: each costs the tuner a screen of a few points.
MOST = 8
#: Names to pick or leave out: one shell-style pattern, or several.
Patterns = Union[str, Sequence[str], None]


class SupportsNamedTensors(Protocol):
    """What l2ctl reads of a ``torch.nn.Module``."""

    def named_parameters(self) -> Iterator[tuple[str, Any]]: ...
    def named_buffers(self) -> Iterator[tuple[str, Any]]: ...


def is_module(obj: object) -> bool:
    """A torch.nn.Module, or anything that lists its tensors the same way."""
    return callable(getattr(obj, "named_parameters", None)) and callable(getattr(obj, "named_buffers", None))


@dataclass(frozen=True)
class CandidateRule:
    """Which tensors the tuner tries: ``min_bytes <= bytes <= max_bytes``, the ``most`` largest."""

    min_bytes: int
    max_bytes: int
    most: int

    def describe(self) -> str:
        return (f"tensors of {format_bytes(self.min_bytes)} (1/64 of the L2) to {format_bytes(self.max_bytes)} "
                f"(4 x the largest set-aside), tied ones once, the {self.most} largest")


def rule_for(device: object = None, most: int = MOST) -> CandidateRule:
    """The rule on ``device``, from its L2 size and largest set-aside."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"most must be a positive int, got {most!r}")
    props = properties(resolve_device(device))
    return CandidateRule(props.l2_cache_size // 64, 4 * props.persisting_l2_cache_max_size, most)


@dataclass
class ModelCandidates(Mapping[str, BufferLike]):
    """The tensors to try (name -> tensor, a Mapping: ``tune`` takes it as its candidates), every tensor
    that was not tried with the reason (``skipped``), the ``rule`` and how many tensors the model has."""

    tried: dict[str, BufferLike]
    skipped: dict[str, str]
    rule: CandidateRule
    total: int
    device: int
    nbytes: dict[str, int] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # a discovered range: what it is, which kernels use it
    kind: str = "tensor"  # what was listed: a model's tensors, or the ranges a graph's kernels are given
    notes: tuple[str, ...] = ()  # what else the answer must say: torch ran the step without CUDA graphs, and why
    launches: Optional[int] = None  # an eager step's kernel launches over the recorded runs (None: not counted)

    def __getitem__(self, name: str) -> BufferLike:
        return self.tried[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tried)

    def __len__(self) -> int:
        return len(self.tried)

    def summary(self) -> str:
        """One line: how many tensors, how many tried, and why the others were not."""
        reasons = Counter(why.split(":")[0] for why in self.skipped.values())
        why = "; ".join(f"{n} {key}" for key, n in reasons.most_common())
        return (f"{self.total} {self.kind}{'s' * (self.total != 1)}, {len(self.tried)} tried "
                f"({self.rule.describe()})" + (f"; not tried: {why}" if why else "")
                + "".join(f"; {note}" for note in self.notes))

    def __str__(self) -> str:
        return self.summary()


def _named_tensors(module: SupportsNamedTensors, optimizer: Optional[object]) -> list[tuple[str, Any]]:
    """(name, tensor) for the parameters, their gradients, the buffers and the optimizer's state."""
    found: list[tuple[str, Any]] = []
    names: dict[int, str] = {}
    for name, param in module.named_parameters():
        found.append((name, param))
        names[id(param)] = name
        grad = getattr(param, "grad", None)
        if grad is not None:
            found.append((f"{name}.grad", grad))
    found.extend(module.named_buffers())
    if optimizer is not None:
        state = getattr(optimizer, "state", None)
        if not isinstance(state, Mapping):
            raise TypeError(f"optimizer: expected an object with a state mapping (a torch.optim.Optimizer), got "
                            f"{type(optimizer).__name__}")
        for param, values in state.items():
            owner = names.get(id(param), "(a parameter not in the module)")
            for key, value in (values.items() if isinstance(values, Mapping) else ()):
                if getattr(value, "ndim", 1) != 0:  # skip scalars (a step count)
                    found.append((f"{owner}.{key}", value))
    return found


def _filtered(entries: list[tuple[list[str], Any, BufferRef]], skipped: dict[str, str], rule: CandidateRule,
              device: int) -> tuple[dict[str, BufferLike], dict[str, int]]:
    """The ``rule.most`` entries the largest set-aside covers best, by label; the rest into ``skipped``."""
    cover = properties(device).persisting_l2_cache_max_size
    tried: dict[str, BufferLike] = {}
    nbytes: dict[str, int] = {}
    for names, obj, ref in sorted(entries, key=lambda e: -min(e[2].nbytes, cover)):
        label = " = ".join(names)
        if len(tried) < rule.most:
            tried[label], nbytes[label] = obj, ref.nbytes
        else:
            skipped[label] = f"ranked below the {rule.most} largest: {format_bytes(ref.nbytes)}"
    return tried, nbytes


def _size_reason(nbytes: int, rule: CandidateRule) -> Optional[str]:
    if nbytes < rule.min_bytes:
        return f"too small: {format_bytes(nbytes)}"
    if nbytes > rule.max_bytes:
        return f"too large: {format_bytes(nbytes)}"
    return None


def from_graph(graph: object, names: Optional[Mapping[str, object]] = None, *, most: int = MOST) -> ModelCandidates:
    """The tuner's candidates from the memory ``graph``'s kernel nodes are given (l2ctl.graph.buffers: an l2ctl
    Graph or a torch.cuda.CUDAGraph that kept its template), or those of every graph a ``torch_captures()``
    object saw recorded (``captures.graphs()``), by the same rule; ``names`` (name -> tensor) names the ranges
    that are yours, the rest are named by the kernels given them. ``details`` says of each what it is (yours,
    a temporary of a captured graph, torch's cache, an allocation), which kernels use it and, for several
    graphs, in which."""
    graphs = [as_graph(g) for g in graph.graphs()] if isinstance(graph, TorchCaptures) else [as_graph(graph)]
    device = graphs[0].device if graphs else resolve_device(getattr(graph, "_device", None))
    rule_for(device, most)  # checks ``most`` before the graphs are read
    found, where = _graph_buffers(graph, graphs, device, names)
    return _from_buffers(found, device, most, {}, where)


def _graph_buffers(graph: object, graphs: list[Any], device: int, names: Optional[Mapping[str, object]]
                   ) -> tuple[list[GraphBuffer], dict[int, list[str]]]:
    """The ranges the kernel nodes of ``graphs`` are given, and, for a torch_captures() object, in which graphs."""
    nodes = [(g, k.node, k.function) for g in graphs for k in g.kernel_nodes()]
    found, per_node = map_pointers(device, [(node, function) for _, node, function in nodes], names)
    where: dict[int, list[str]] = {}  # a range (its address) -> the graphs whose kernels are given it
    if isinstance(graph, TorchCaptures):
        labels = {id(g): _torch_graphs.describe(g._torch() if g._torch is not None else None, i, len(graphs))
                  for i, g in enumerate(graphs)}
        for g, node, _ in nodes:
            for b in per_node.get(node, ()):
                if labels[id(g)] not in where.setdefault(b.ptr, []):
                    where[b.ptr].append(labels[id(g)])
    return found, where


def from_captures(captures: TorchCaptures, step: Optional[Callable[[], object]] = None, *,
                  recorded: Optional[StepBuffers] = None, names: Optional[Mapping[str, object]] = None, steps: int = 3,
                  every_kept: bool = False, most: int = MOST) -> ModelCandidates:
    """The tuner's candidates for a ``torch_captures()`` target, what its scope's window reaches: the ranges the
    graphs ``captures`` saw recorded are given (:func:`from_graph`) and the ranges the kernels the step launches
    outside any graph are given (read through CUPTI over ``steps`` runs of ``step`` after a warm-up, as
    :func:`from_steps`; or ``recorded``, runs already recorded), one list by the same rule. A step torch.compile
    runs without graphs (an input it mutates, graph breaks, CPU ops, dynamic shapes) is found through its eager
    launches, and ``notes`` gives torch's reason. Where CUPTI cannot record, the graphs alone are read and
    ``notes`` says why; with no graph either, CountersUnavailableError. ``every_kept``: the graphs of every
    torch_captures() block and scope on the device (what a scope's window reaches), not only this object's."""
    device = resolve_device(captures._device)
    rule_for(device, most)
    graphs = [as_graph(g) for g in (_torch_graphs.kept(device) if every_kept else captures.graphs())]
    found, where = _graph_buffers(captures, graphs, device, names)
    notes = [f"torch ran compiled code without CUDA graphs ({reason})" for reason in captures.skips()]
    skipped: dict[str, str] = {}
    if recorded is None and step is not None:
        try:
            recorded = record_steps(step, device, names, steps)
        except CountersUnavailableError as exc:
            if not graphs:
                raise
            notes.append(f"the launches outside the graphs were not read: {exc}")
    if recorded is not None:
        in_graphs = {b.ptr for b in found}
        found = sorted(found + [b for b in recorded.stable if b.ptr not in in_graphs], key=lambda b: -b.nbytes)
        skipped = dict(recorded.moved)
    result = _from_buffers(found, device, most, skipped, where)
    result.notes = tuple(notes)
    return result


def from_steps(step: Callable[[], object], device: object = None, names: Optional[Mapping[str, object]] = None, *,
               steps: int = 3, most: int = MOST) -> ModelCandidates:
    """The tuner's candidates from the memory the kernels of an eager ``step`` (called with no arguments) are
    given as they launch, read over ``steps`` runs after a warm-up (l2ctl._kernel_buffers.record_steps), by the
    same rule. A range found at the same address in every run is a candidate (a temporary the step allocates
    inside, which torch's cache hands back at the same place, included); one a kernel is given at different
    addresses from run to run is listed in ``skipped`` as moving, never tried: a window on one run's address
    misses the next run's data. Runs the step ``steps + 1`` times; CountersUnavailableError, saying what to
    install, where CUPTI cannot record the launches."""
    dev = resolve_device(device)
    rule_for(dev, most)  # checks ``most`` before the step runs
    return from_recorded(record_steps(step, dev, names, steps), dev, most)


def from_recorded(found: StepBuffers, device: int, most: int = MOST) -> ModelCandidates:
    """The candidates among what an eager step's recorded runs found (``from_steps``; ``l2ctl.autotune`` records
    the app's own calls with l2ctl._kernel_buffers.StepRecorder), by the same rule."""
    return replace(_from_buffers(found.stable, device, most, dict(found.moved)), launches=sum(found.launches))


def _from_buffers(found: list[GraphBuffer], device: int, most: int, skipped: dict[str, str],
                  where: Optional[Mapping[int, list[str]]] = None) -> ModelCandidates:
    """The candidates among ranges kernels are given (largest first), by the rule; ``skipped`` already holds
    the ranges excluded for another reason; ``where`` names, by address, the graphs a range is used in."""
    rule = rule_for(device, most)
    total = len(found) + len(skipped)
    entries = []
    details = {}
    for b in found:
        why = _size_reason(b.nbytes, rule)
        if why is not None:
            skipped[b.name] = why
            continue
        entries.append(([b.name], (b.ptr, b.nbytes), resolve_buffer((b.ptr, b.nbytes))))
        details[b.name] = b.describe() + (f"; in {', '.join(where[b.ptr])}" if where and b.ptr in where else "")
    tried, nbytes = _filtered(entries, skipped, rule, device)
    return ModelCandidates(tried, skipped, rule, total, device, nbytes,
                           {name: details[name] for name in tried}, "range")


def _patterns(value: Patterns, what: str) -> tuple[str, ...]:
    """``include``/``exclude`` as a tuple of patterns (None: none)."""
    if value is None:
        return ()
    patterns = (value,) if isinstance(value, str) else tuple(value)
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"{what} must be a pattern (a non-empty str) or a list of them, got {value!r}")
    return patterns


def _unmatched(pattern: str, names: list[str]) -> str:
    """The error for an include pattern that picks nothing: the names closest to it, and how many there are."""
    near = difflib.get_close_matches(pattern, names, n=3, cutoff=0.0) or names[:3]
    shown = ", ".join(near) if near else "none: the model has no tensors"
    return f"include pattern {pattern!r} matches no tensor of the model ({len(names)} in all; closest: {shown})"


def _name_reason(name: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> Optional[str]:
    if include and not any(fnmatchcase(name, p) for p in include):
        return "not included: matches no include pattern"
    for pattern in exclude:
        if fnmatchcase(name, pattern):
            return f"excluded: matches {pattern!r}"
    return None


def from_module(module: SupportsNamedTensors, optimizer: Optional[object] = None, *, device: object = None,
                most: int = MOST, include: Patterns = None, exclude: Patterns = None) -> ModelCandidates:
    """The tuner's candidates from ``module`` (and ``optimizer``'s state) on ``device`` (None: the current
    one), by the rule in the module docstring. ``include``: only the tensors whose path matches one of these
    patterns (fnmatch: ``*``, ``?``, ``[qkv]``; ValueError, naming the closest paths, for one that matches
    none); ``exclude``: not those that match one of these."""
    if not is_module(module):
        raise TypeError(f"expected a torch.nn.Module (named_parameters() and named_buffers()), got "
                        f"{type(module).__name__}")
    included, excluded = _patterns(include, "include"), _patterns(exclude, "exclude")
    dev = resolve_device(device)
    rule = rule_for(dev, most)
    tensors = _named_tensors(module, optimizer)
    names = [name for name, _ in tensors]
    for pattern in included:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ValueError(_unmatched(pattern, names))
    skipped: dict[str, str] = {}
    eligible: dict[tuple[int, int], tuple[list[str], Any, BufferRef]] = {}
    for name, tensor in tensors:
        by_name = _name_reason(name, included, excluded)
        if by_name is not None:
            skipped[name] = by_name
            continue
        try:
            ref = resolve_buffer(tensor)
        except (TypeError, ValueError):
            skipped[name] = "not on a GPU: host memory or not a tensor l2ctl can read"
            continue
        why = (f"on another device: device {ref.device}" if ref.device is not None and ref.device != dev
               else _size_reason(ref.nbytes, rule))
        if why is not None:
            skipped[name] = why
            continue
        key = (ref.ptr, ref.nbytes)
        if key in eligible:
            eligible[key][0].append(name)  # tied: the same bytes under another name
        else:
            eligible[key] = ([name], tensor, ref)
    tried, nbytes = _filtered(list(eligible.values()), skipped, rule, dev)
    return ModelCandidates(tried, skipped, rule, len(tensors), dev, nbytes)
