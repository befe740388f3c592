"""The tuner: which of a workload's buffers to persist (or none), with which set-aside, hit ratio and
window range, decided by paired measurements with stated confidence, and at the least tax.

The search, for candidates c with window bytes N_c (the buffer, or its first accessPolicyMaxWindowSize
bytes):

1. **Screen.** One paired comparison (bench.compare: shuffled rounds, a baseline block in each) of every
   candidate at set-asides of 1, 2, 3, 4, 6, 8 granules and the max, up to the first that holds all of
   N_c, and the next ``ABOVE_HOLDING`` (2) set-asides above that one, each with the hit ratio that fits,
   min(1, set-aside / N_c): a chosen policy never oversubscribes its set-aside, so ``persist(policy=...)``
   raises no warning. A larger set-aside holds the same window, but the time is not monotonic in it: on an
   H200 an 8 MiB LUT ran 0.42 ms under 11.25 MiB (the first that holds it), 0.36 ms under 15 MiB and 0.48 ms
   under 18.75 MiB; further up only the tax grows. Where the buffer is larger than a set-aside at or below
   the tax-free limit, the buffer's first set-aside bytes with hit ratio 1.0 are screened too.
2. **Refine** the two candidates whose best screened point won: that point again, its neighbouring
   granules on the whole grid (above the screened ones too), lower hit ratios (0.5 and 0.75 of the fitting
   one) and the window cut to the first set-aside bytes of the buffer with hit ratio 1.0.
3. **Choose.** A point *wins* when its speedup's lower confidence bound is above 1 and the speedup is at
   least ``1 + min_gain``. A set-aside above the driver's default limit (where the bystander tax begins,
   l2ctl.auto_set_aside_cap) must also gain 2% at its lower bound, and 2% over the best point below it.
   Among the winners whose interval reaches the best one's speedup (within noise of the best), the
   smallest set-aside is chosen.
4. **Confirm.** The choice and the baseline are measured again in fresh rounds; if the choice is not
   faster beyond the noise there, the answer is "no persistence".

The tax of the chosen set-aside (and of the grid's best, for comparison) on a plain copy is always
measured and reported; it is cached per set-aside for the process.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple, Optional, Union, cast

import numpy as np

from ._device import require_persistence, stream_device
from ._interop import BufferRef, resolve_buffer, resolve_stream
from ._targets import Target, as_target, resolve_target
from ._limit import auto_set_aside_cap, set_aside_grid
from ._memory import BufferLike, StreamLike
from ._persist import Persist, Policy, persist
from ._window import AccessProperty
from .graph import Graph, TorchCaptures
from ._plan import check_count, clip_window, default_hit_ratio, normalize_hit_ratio
from ._units import format_bytes
from .bench.records import Record, Report, environment, simulated_label
from .candidates import (ModelCandidates, SupportsNamedTensors, from_captures, from_graph, from_module, from_steps,
                         is_module)
from .bench.tax import NO_TAX, Tax, measure_tax
from .bench.timing import check_repeats
from .workloads import Workload, describe, enqueue_of

if TYPE_CHECKING:  # the measuring modules (paired rounds, the progress bar) load when a tune runs
    from .bench.paired import Arm

__all__ = ["TunedPolicy", "TuneReport", "CandidateResult", "PointResult", "TunePoint", "tune", "TAX_GAIN",
           "resolve_candidates", "winners", "choose", "check_gains", "screen_points", "refine_points", "no_winner_reason",
           "confirmed_reason", "unconfirmed_reason"]

#: What tune times: a callable f(stream) or an object with enqueue(stream) (l2ctl.workloads.Workload).
WorkloadLike = Union[Callable[[Any], Any], Workload]
#: What tune chooses among: one buffer, a sequence of them, a dict name -> buffer, a model (its tensors,
#: filtered by l2ctl.candidates' rule), or "discover" (the memory a graph target's kernels are given).
Candidates = Union[BufferLike, Sequence[BufferLike], Mapping[str, BufferLike], SupportsNamedTensors, Literal["discover"]]
DISCOVER_HINT = ("'discover' reads the arguments of the kernels the workload runs: give it as the target a graph "
                 "whose template l2ctl can read (an l2ctl Graph, a torch.cuda.CUDAGraph captured inside "
                 "`with l2ctl.graph.torch_captures():` or with keep_graph=True), for code compiled with "
                 "torch.compile(mode='reduce-overhead') or graphed by make_graphed_callables the "
                 "l2ctl.graph.torch_captures() object itself (tune runs the step inside it first, so torch keeps the "
                 "templates of what it records), or the stream an eager step runs on (its launches are recorded "
                 "through CUPTI); not a selection of a graph's nodes")
#: What a "no persistence" answer found nothing to try on carries as its buffer: a range persist never reads (a
#: scope whose policy is disabled changes nothing and checks no pointer).
_NO_BUFFER = (256, 256)
#: Calls of the step before a torch_captures() target is searched: torch.compile(mode="reduce-overhead") warms
#: up at the first, records at the second and replays from the third.
RECORDING_CALLS = 3

#: A set-aside above the driver's default limit must buy at least this much (and this much more than the
#: best point below it): the bystander tax there is real (docs/results.md).
TAX_GAIN = 0.02
COARSE_GRANULES = (1, 2, 3, 4, 6, 8)
#: Set-asides screened above the first that holds a candidate's whole window (the module docstring's step 1):
#: each costs a point of the screen for every candidate whose window a set-aside below the max holds.
ABOVE_HOLDING = 2
REFINED_CANDIDATES = 2
#: The most points the refine stage measures per candidate (_refine_points: the anchor, its two neighbouring
#: set-asides, two lower hit ratios, the window cut to the set-aside): what the progress bar plans for.
REFINE_POINTS = 6


class TunePoint(NamedTuple):
    """One configuration: persist ``candidate`` with ``hit_ratio`` over ``num_bytes`` from ``offset``,
    under a limit of ``set_aside`` bytes."""

    candidate: str
    set_aside: int
    hit_ratio: float
    offset: int
    num_bytes: int

    def span(self, buffer_bytes: int) -> dict[str, Any]:
        """persist's ``offset`` and ``num_bytes`` for this point on a buffer of ``buffer_bytes``: none for the whole."""
        return {} if self.offset == 0 and self.num_bytes == buffer_bytes else {"offset": self.offset,
                                                                               "num_bytes": self.num_bytes}

    def describe(self) -> str:
        where = format_bytes(self.num_bytes) + (f" at +{self.offset}" if self.offset else "")
        return (f"{self.candidate}: set-aside {format_bytes(self.set_aside)}, hit ratio {self.hit_ratio:.3f} over "
                f"{where}")


@dataclass
class PointResult:
    """A point's paired measurement: speedup over the baseline of its own rounds, with its interval."""

    point: TunePoint
    speedup: float
    ci: tuple[float, float]
    median_ms: float
    baseline_ms: float
    stage: str
    verified: bool

    def as_dict(self) -> dict[str, Any]:
        """The point as a report holds it: its configuration, speedup and interval."""
        return {**self.point._asdict(), "speedup": self.speedup, "ci": list(self.ci)}


@dataclass
class CandidateResult:
    """What one candidate buffer can do: every point measured on it and the best of them."""

    name: str
    window_bytes: int
    points: list[PointResult] = field(default_factory=list)

    @property
    def best(self) -> Optional[PointResult]:
        return max(self.points, key=lambda p: p.speedup) if self.points else None


@dataclass
class TunedPolicy:
    """What tune() found. ``policy`` goes to ``persist(stream, buffer, policy=...)`` (or call
    ``tuned.persist(stream)``); when nothing beat the baseline beyond the noise it is "no persistence"
    (``policy.enabled`` is False, ``buffer_name`` None) and persist then changes nothing.

    ``speedup`` and ``ci`` come from the confirmation: the choice and the baseline re-measured side by side
    after the search. ``candidates`` holds every candidate's points, ``grid_best`` the fastest point seen
    (it may use a larger set-aside for a gain within noise), ``tax`` the chosen set-aside's cost to a
    plain copy elsewhere on the GPU and ``grid_best_tax`` the grid best's.
    """

    policy: Policy
    buffer_name: Optional[str]
    buffer: BufferLike = field(repr=False)
    baseline_ms: float
    best_ms: float
    ci: tuple[float, float]
    confidence: float
    candidates: dict[str, CandidateResult]
    grid_best: Optional[PointResult]
    tax: Tax
    grid_best_tax: Tax
    reason: str
    table: list[Record]
    seconds: float
    cap: int
    environment: dict[str, Any] = field(default_factory=dict)
    considered: Optional[ModelCandidates] = field(default=None, repr=False)  # a model's tensors: tried and skipped

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.best_ms if self.best_ms else 1.0

    @property
    def persists(self) -> bool:
        return self.policy.enabled

    @property
    def set_aside(self) -> int:
        """The chosen set-aside in bytes (0 for "no persistence")."""
        return self.policy.set_aside if self.persists and isinstance(self.policy.set_aside, int) else 0

    @property
    def hit_ratio(self) -> float:
        """The chosen hit ratio (0.0 for "no persistence")."""
        return float(self.policy.hit_ratio) if self.persists and self.policy.hit_ratio is not None else 0.0

    def persist(self, target: Target, *, num_bytes: Optional[int] = None, offset: int = 0,
                hit_prop: AccessProperty = AccessProperty.PERSISTING,
                miss_prop: AccessProperty = AccessProperty.STREAMING, reset_on_exit: bool = True, share: bool = False,
                strict: bool = True, clamp: bool = False) -> Persist:
        """``l2ctl.persist(target, <the chosen buffer>, policy=self, ...)`` (a stream or a graph, as tune's) with
        persist's keywords a policy leaves open (the hit ratio and set-aside are the policy's): a ``with`` block, or
        ``.start()`` ... ``.stop()`` for an app's lifetime. When the answer is "no persistence" the scope changes
        nothing and its ``reason`` says why; ``strict=False`` gives the same where the device cannot persist."""
        return persist(target, self.buffer, policy=self, num_bytes=num_bytes, offset=offset, hit_prop=hit_prop,
                       miss_prop=miss_prop, reset_on_exit=reset_on_exit, share=share, strict=strict, clamp=clamp)

    def __str__(self) -> str:
        n = sum(len(c.points) for c in self.candidates.values())
        simulated = simulated_label(self.environment)
        said = f"{simulated}: " if simulated else ""  # a simulated choice never passes for a measured one
        if not self.persists:
            return (f"{said}no persistence: {self.reason}; {_count(n, 'point')} over {len(self.candidates)} "
                    f"candidate(s) in {self.seconds:.1f} s")
        p = self.policy
        assert isinstance(p.set_aside, int) and p.hit_ratio is not None
        span = "" if p.num_bytes is None else f" over its first {format_bytes(p.num_bytes)}"
        return (f"{said}persist {self.buffer_name}{span}: set-aside {format_bytes(p.set_aside)}, hit ratio {p.hit_ratio:.3f}: "
                f"{self.best_ms:.3f} ms vs {self.baseline_ms:.3f} ms ({self.speedup:.2f}x, {self.confidence:.0%} CI "
                f"{self.ci[0]:.2f}-{self.ci[1]:.2f}); a plain copy elsewhere runs {self.tax.pace} meanwhile;"
                f" {_count(n, 'point')} in {self.seconds:.1f} s{_DDP_ADVICE if p.set_aside > self.cap and _ranks() > 1 else ''}")

    def __repr__(self) -> str:  # the dataclass's would spell out every record of the search
        return f"<TunedPolicy: {self}>"

    def candidate_table(self) -> list[str]:
        """What the choice was made from, readable: a row per candidate (its best point), the points measured
        on the chosen candidate (or the best one) by set-aside, and the grid's best with its tax."""
        lines = [] if self.considered is None else [f"candidates: {self.considered.summary()}"]
        chosen = self.considered.details.get(self.buffer_name or "") if self.considered is not None else None
        if chosen:
            lines.append(f"the chosen range: {chosen}")
        width = max([16] + [len(c.name) for c in self.candidates.values()])  # a long discovered name widens the column
        lines.append(f"{'candidate':<{width}} {'window':>11} {'points':>6}  best point ({self.confidence:.0%} CI)")
        for c in self.candidates.values():
            b = c.best
            best = "-" if b is None else (f"{b.speedup:.3f}x [{b.ci[0]:.3f}, {b.ci[1]:.3f}] at set-aside "
                                          f"{format_bytes(b.point.set_aside)}, hit {b.point.hit_ratio:.3f} over "
                                          f"{format_bytes(b.point.num_bytes)}")
            lines.append(f"{c.name:<{width}} {format_bytes(c.window_bytes):>11} {len(c.points):>6}  {best}")
        name = self.buffer_name or (self.grid_best.point.candidate if self.grid_best else None)
        if name is None:
            return lines
        lines.append(f"points on {name} (speedup, {self.confidence:.0%} CI):")
        for p in sorted(self.candidates[name].points, key=lambda p: (p.point.set_aside, p.point.hit_ratio)):
            mark = " <- chosen" if self.persists and p.stage == "confirm" else ""
            lines.append(f"  {p.stage:7s} set-aside {format_bytes(p.point.set_aside):>11} hit {p.point.hit_ratio:.3f} over "
                         f"{format_bytes(p.point.num_bytes)}: {p.speedup:.3f}x [{p.ci[0]:.3f}, {p.ci[1]:.3f}]{mark}")
        if self.grid_best is not None:
            g = self.grid_best
            lines.append(f"grid best: {g.point.describe()} {g.speedup:.3f}x; under its set-aside a plain copy runs "
                         f"{self.grid_best_tax.pace} (under the chosen one: {self.tax.pace})")
        return lines

    def report(self) -> "TuneReport":
        """The search as a benchmark Report (to_json, to_csv); printed, the choice and :meth:`candidate_table`."""
        p = self.policy
        return TuneReport("tune", self.environment, list(self.table), summary={
            "policy": {"enabled": p.enabled, "set_aside": p.set_aside, "hit_ratio": p.hit_ratio, "offset": p.offset,
                       "num_bytes": p.num_bytes},
            "buffer": self.buffer_name, "reason": self.reason,
            "baseline_ms": self.baseline_ms, "best_ms": self.best_ms, "speedup": self.speedup, "ci": list(self.ci),
            "confidence": self.confidence, "seconds": self.seconds, "auto_set_aside_cap": self.cap,
            "tax": self.tax.as_dict(), "grid_best_tax": self.grid_best_tax.as_dict(),
            "grid_best": None if self.grid_best is None else self.grid_best.as_dict(),
            "candidates": {name: {"window_bytes": c.window_bytes, "best": None if c.best is None else c.best.as_dict()}
                           for name, c in self.candidates.items()},
            "considered": None if self.considered is None else {
                "rule": self.considered.rule.describe(), "total": self.considered.total,
                "tried": list(self.considered.tried), "skipped": dict(self.considered.skipped),
                "details": dict(self.considered.details)},
        }, text="\n".join([str(self)] + self.candidate_table()))


@dataclass
class TuneReport(Report):
    """tune's Report: written as every report (JSON, CSV); printed, the choice and its table (not the records)."""

    text: str = field(default="", repr=False, compare=False)

    def __str__(self) -> str:
        return self.text


#: The rule for DDP (docs/DESIGN.md, "Multi-GPU"): NCCL's kernels run beside the step and pay the tax too.
_DDP_ADVICE = ("; in this distributed job a set-aside above the driver's default also taxes NCCL's collectives: "
               "measure it with torchrun ... -m l2ctl bench collectives, or keep set_aside at the default")


def _ranks() -> int:
    """The processes of the torch.distributed job this process is in (1 outside one); never imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        return int(dist.get_world_size()) if dist is not None and dist.is_available() and dist.is_initialized() else 1
    except (RuntimeError, ValueError):
        return 1


def _raw_pair(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value)


def resolve_candidates(candidates: object) -> dict[str, tuple[BufferLike, BufferRef]]:
    """name -> (the object, its buffer reference) from one buffer, a sequence or a dict of buffers."""
    if isinstance(candidates, Mapping):
        items = [(str(k), v) for k, v in candidates.items()]
    elif isinstance(candidates, list) or (isinstance(candidates, tuple) and not _raw_pair(candidates)):
        items = [(f"[{i}]", v) for i, v in enumerate(candidates)]
    else:
        items = [("buffer", candidates)]
    if not items:
        raise ValueError("candidates: give at least one buffer (a buffer, a sequence or a dict name -> buffer)")
    out: dict[str, tuple[BufferLike, BufferRef]] = {}
    for name, obj in items:
        try:
            out[name] = (obj, resolve_buffer(obj))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"candidate {name!r}: {exc}") from None
    return out


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1 ("1 point", "3 points")."""
    return f"{n} {noun}{'s' * (n != 1)}"


def tune(workload: WorkloadLike, target: Target, candidates: Candidates, *, stream: StreamLike = None, rounds: int = 5,
         repeat: int = 5, warmup: int = 1, confidence: float = 0.95, min_gain: float = 0.01,
         tax_gain: float = TAX_GAIN, seed: int = 0, progress: bool = False) -> TunedPolicy:
    """Find which of ``candidates`` to persist while ``workload`` runs, and how, or decide that persistence
    does not pay. ``candidates``: one buffer, a sequence or a dict name -> buffer (tensors, CuPy arrays,
    DeviceBuffers, (ptr, nbytes), anything with __cuda_array_interface__ or DLPack), or a ``torch.nn.Module``:
    its parameters, their gradients and its buffers, named by module path and filtered by size before
    anything is measured (l2ctl.candidates says the rule; ``l2ctl.candidates.from_module(model, optimizer)``
    adds the optimizer's state and shows the list first; ``report()`` lists what was tried and why not the rest).

    ``target`` is what each point's window goes on: the stream the workload runs on, or a graph it replays
    (an l2ctl Graph or a selection of its nodes, a torch.cuda.CUDAGraph captured with keep_graph=True),
    whose kernel nodes then carry each point's window and whose executables are made anew for it. With a
    graph, ``stream`` is required: the stream the workload replays on, where it is timed.
    With ``graph.torch_captures()`` as the target (a ``torch.compile(mode="reduce-overhead")`` step,
    ``make_graphed_callables``), tune keeps the templates of what torch records for the whole search and
    first calls the workload a few times (``RECORDING_CALLS``: torch's warm-up and recording, without a
    window); every point's window then goes on the recorded graphs' kernel nodes, torch's executables made
    anew, and on the streams the step's eager kernels run on. The step's graphs must be recorded here or in
    an earlier ``with torch_captures()`` block: a recording whose template is gone refuses the first point.
    A workload that records its step anew under each window (``l2ctl.workloads.Compiled``) is run as it is.
    ``candidates="discover"`` tries the memory the workload's kernels are given, nobody naming it: a graph
    target's kernel nodes' arguments; for a ``torch_captures()`` target those of every kept graph on the device and
    of the kernels the step launches outside graphs (l2ctl.candidates.from_captures: what the scope reaches; where
    torch ran the step without graphs, the answer quotes its reason); or, on a stream, the arguments of the
    kernels the step launches as it runs
    (l2ctl.candidates.from_steps: read through CUPTI over three steps after a warm-up; a temporary the step
    allocates inside is tried when it comes back at the same address every step, one that moves is listed as
    such and never tried). Where no range can be tried, the answer is "no persistence", saying why.

    ``rounds`` x ``repeat`` timed runs per point and stage (after ``warmup`` runs per block); a point
    counts only when faster than the baseline at ``confidence`` by at least ``min_gain``; a set-aside above
    the driver's default limit must buy ``tax_gain`` more (raise it when other work shares the GPU: that
    set-aside slows every other kernel). See the module docstring for the search and the rule that picks
    the smallest set-aside within noise of the best.
    """
    # the pipeline: the arguments checked, the target resolved, the candidates gathered, the points searched (screen,
    # refine), the choice made and confirmed; a torch_captures() target keeps its templates throughout
    records = isinstance(target, TorchCaptures) and not getattr(workload, "records_each_window", False)
    with cast(TorchCaptures, target) if records else contextlib.nullcontext():
        start = time.monotonic()
        enqueue = enqueue_of(workload)
        discover = is_discover(candidates)
        if discover and hasattr(type(target), "_l2ctl_target") and not isinstance(target, (Graph, TorchCaptures)):
            raise ValueError(DISCOVER_HINT)
        listed = {} if is_module(candidates) or discover else resolve_candidates(candidates)
        warmup, repeat = check_repeats(warmup, repeat)
        rounds = check_count(rounds, "rounds", minimum=3, maximum=1000)
        from .bench.paired import check_confidence

        confidence = check_confidence(confidence)
        check_gains(min_gain, tax_gain)
        check_count(seed, "seed", minimum=0)
        if not isinstance(progress, bool):
            raise TypeError("progress must be a bool")
        where = _resolve_target(target, stream)
        if records:  # torch's warm-up and recording, templates kept (the block above), no window
            for _ in range(RECORDING_CALLS):
                enqueue(where.stream)
            cast(TorchCaptures, where.target)._refuse_unreached(where.device, ())  # the points vary the window
        named, considered = _gather_candidates(enqueue, where, candidates, listed)
        if not named:
            assert considered is not None
            what = "graph" if not where.is_stream and not isinstance(where.target, TorchCaptures) else "step"
            if considered.launches == 0:  # as explicit candidates say it (bench.paired)
                raise ValueError(f"the workload queued no GPU work on the stream it was given: discovery found no "
                                 f"kernel launch in its {what}, so there is nothing to persist or compare (launch its "
                                 "kernels on that stream)")
            found = f"no range the {what}'s kernels are given can be tried: {considered.summary()}"
            return _nothing_to_try(found, where.device, start, confidence, considered)
        search = _Search(workload, where, named, rounds=rounds, repeat=repeat, warmup=warmup, confidence=confidence,
                         min_gain=min_gain, tax_gain=tax_gain, seed=seed, progress=progress)
        search.screen()
        search.refine()
        return search.decide(start, considered)


def check_gains(min_gain: object, tax_gain: object) -> None:
    """The gains a winner must make (tune's and autotune's ``min_gain``, ``tax_gain``): fractions in [0, 1)."""
    for name, gain in (("min_gain", min_gain), ("tax_gain", tax_gain)):
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= float(gain) < 1:
            raise ValueError(f"{name} must be a fraction in [0, 1), got {gain!r}")


def is_discover(candidates: object) -> bool:
    """Whether ``candidates`` asks for discovery ("discover"); any other str is refused, naming "discover" (a str is
    no buffer, so a typo would otherwise read as one: "cannot use a str as a device buffer")."""
    if not isinstance(candidates, str):
        return False
    if candidates != "discover":
        near = "did you mean 'discover'? " if difflib.get_close_matches(candidates, ["discover"], cutoff=0.6) else ""
        raise ValueError(f"candidates={candidates!r}: {near}the one word candidates takes is 'discover' (the memory the "
                         "workload's kernels are given); otherwise pass a buffer, a sequence or dict of them, or a module")
    return True


class _Where(NamedTuple):
    """What a search runs against: the target (a stream or a graph), the stream the workload runs and is timed on,
    the device and its properties."""

    target: Any
    stream: StreamLike
    device: int
    is_stream: bool
    max_window: int


def _resolve_target(target: Target, stream: StreamLike) -> _Where:
    target_ref, target = as_target(target)
    if target_ref is None:
        if stream is None:
            raise ValueError("with a graph as target, pass stream=: the stream the workload replays it on, where it "
                             "is timed")
        device = resolve_target(target).device  # the graph's kernel nodes, listed once here
    else:
        if stream is not None and resolve_stream(stream).handle != target_ref.handle:
            raise ValueError("the target is a stream: the workload runs on it, so pass no other stream=")
        stream = cast(StreamLike, target)  # as_target found a stream
        device = stream_device(target_ref)
    if stream_device(resolve_stream(stream)) != device:
        raise ValueError(f"the stream is on device {stream_device(resolve_stream(stream))}, the graph on device {device}")
    info = require_persistence(device)
    return _Where(target, stream, device, target_ref is not None, info.access_policy_max_window_size)


def _gather_candidates(enqueue: Callable[[Any], Any], where: _Where, candidates: Candidates,
                       listed: dict[str, tuple[BufferLike, BufferRef]]
                       ) -> tuple[dict[str, tuple[BufferLike, BufferRef]], Optional[ModelCandidates]]:
    """The buffers to try, by name, and what was considered (a model's tensors, a discovery's ranges); none when
    nothing can be tried."""
    considered: Optional[ModelCandidates] = None
    named = listed
    if is_module(candidates):  # the model's tensors that a window could serve on this device, named by path
        considered = from_module(cast(SupportsNamedTensors, candidates), device=where.device)
        if not considered.tried:
            raise ValueError(f"no tensor of the model can be tried: {considered.summary()}")
        named = resolve_candidates(dict(considered.tried))
    elif isinstance(candidates, str) and candidates == "discover":  # the memory the kernels are given, yours or not
        if isinstance(where.target, TorchCaptures):  # the recorded graphs' kernels and those launched outside them
            considered = from_captures(where.target, lambda: enqueue(where.stream), every_kept=True)
        elif not where.is_stream:
            considered = from_graph(where.target)
        else:  # the step runs eagerly: its launches recorded over a few steps (each in a fresh scope of nothing)
            considered = from_steps(lambda: enqueue(where.stream), where.device)
        named = resolve_candidates(dict(considered.tried)) if considered.tried else {}
    elif isinstance(candidates, ModelCandidates):
        considered = candidates
    for name, (_, buf) in named.items():
        if buf.device is not None and buf.device != where.device:
            raise ValueError(f"candidate {name!r} is on device {buf.device}, the stream on device {where.device}")
    return named, considered


class _Search:
    """The points measured (``compare``: paired rounds) and what they gave, per candidate; screen, refine, decide."""

    def __init__(self, workload: WorkloadLike, where: _Where, named: dict[str, tuple[BufferLike, BufferRef]], *,
                 rounds: int, repeat: int, warmup: int, confidence: float, min_gain: float, tax_gain: float,
                 seed: int, progress: bool) -> None:
        self.workload, self.where, self.named = workload, where, named
        self.rounds, self.repeat, self.warmup, self.confidence = rounds, repeat, warmup, confidence
        self.min_gain, self.tax_gain, self.seed = min_gain, tax_gain, seed
        self.grid = set_aside_grid(where.device, include_zero=False)
        self.cap = auto_set_aside_cap(where.device)
        self.results = {name: CandidateResult(name, clip_window(0, None, buf.nbytes, where.max_window)[0])
                        for name, (_, buf) in named.items()}
        self.table: list[Record] = []
        self.base_config = describe(workload)
        self.screened = screen_points({name: res.window_bytes for name, res in self.results.items()}, self.grid,
                                      self.cap)
        # one total up front: the screen, the most the refine stage can take, the confirmation
        self.planned = {"screen": self._blocks(len(self.screened)),
                        "refine": self._blocks(REFINE_POINTS * min(REFINED_CANDIDATES, len(named))),
                        "confirm": self._blocks(1)}
        from .bench.progress import Progress

        self.bar = Progress(sum(self.planned.values()), "tune", progress)

    def _blocks(self, points: int) -> int:  # what compare runs: the baseline and each point, once a round
        return self.rounds * (points + 1)

    def _arm(self, point: TunePoint) -> Arm:
        (buffer, ref), target = self.named[point.candidate], self.where.target
        span = point.span(ref.nbytes)

        def scope() -> Any:
            return persist(target, buffer, point.hit_ratio, set_aside=None, **span)

        from .bench.paired import Arm

        return Arm(point.describe(), point.set_aside, scope, {**self.base_config, **point._asdict()})

    def run(self, points: list[TunePoint], stage: str, stage_seed: int) -> list[PointResult]:
        assert self._blocks(len(points)) <= self.planned[stage], f"the {stage} stage outgrew its plan: see REFINE_POINTS"
        self.bar.skip(self.planned[stage] - self._blocks(len(points)))  # what this stage does not need of its plan
        from .bench.paired import compare

        base, comps = compare(self.workload, self.where.stream, [self._arm(p) for p in points], rounds=self.rounds,
                              repeat=self.repeat, warmup=self.warmup, confidence=self.confidence, seed=stage_seed,
                              benchmark="tune", progress=self.bar)
        self.table.append(base.record("tune", {**self.base_config, "stage": stage}))
        out = []
        for p, c in zip(points, comps):
            self.table.append(c.record("tune", {"stage": stage}))
            out.append(PointResult(p, c.speedup, c.ci, c.median_ms, c.baseline_median_ms, stage, c.verified))
        return out

    def points(self) -> list[PointResult]:
        return [p for c in self.results.values() for p in c.points]

    def screen(self) -> None:
        """1. Every candidate at the screened set-asides."""
        for pr in self.run(self.screened, "screen", self.seed):
            self.results[pr.point.candidate].points.append(pr)

    def refine(self) -> None:
        """2. The candidates whose best screened point won, around that point (the newer measurement counts)."""
        won = winners(self.points(), self.cap, self.min_gain, self.tax_gain)
        leaders = sorted((c for c in self.results.values() if any(p in won for p in c.points)),
                         key=lambda c: -max(p.speedup for p in c.points if p in won))[:REFINED_CANDIDATES]
        refine: list[TunePoint] = []
        for c in leaders:
            anchor = max((p for p in c.points if p in won), key=lambda p: p.speedup).point
            refine += refine_points(anchor, self.grid, c)
        if not refine:
            self.bar.skip(self.planned["refine"])
            return
        fresh = self.run(refine, "refine", self.seed + 1)
        redone = {p.point for p in fresh}
        for c in self.results.values():
            c.points = [p for p in c.points if p.point not in redone]
        for pr in fresh:
            self.results[pr.point.candidate].points.append(pr)

    def decide(self, start: float, considered: Optional[ModelCandidates]) -> TunedPolicy:
        """3. The smallest set-aside among the winners within noise of the best; 4. confirmed in fresh rounds."""
        everything = self.points()
        chosen = choose(everything, self.cap, self.min_gain, self.tax_gain)
        grid_best = max(everything, key=lambda p: p.speedup) if everything else None
        chosen_name: Optional[str] = None
        policy, buffer = Policy(enabled=False), next(iter(self.named.values()))[0]  # persist ignores the buffer then
        baseline_ms = float(np.median([p.baseline_ms for p in everything])) if everything else 0.0
        best_ms, ci = baseline_ms, (1.0, 1.0)
        if chosen is None:
            self.bar.skip(self.planned["confirm"])
            reason = no_winner_reason(grid_best, self.confidence)
        else:
            (confirmed,) = self.run([chosen.point], "confirm", self.seed + 2)
            self.results[chosen.point.candidate].points.append(confirmed)
            if winners([confirmed], self.cap, self.min_gain, self.tax_gain):
                pt = chosen.point
                policy = Policy(set_aside=pt.set_aside, hit_ratio=pt.hit_ratio, offset=pt.offset,
                                num_bytes=pt.span(self.named[pt.candidate][1].nbytes).get("num_bytes"))
                chosen_name, buffer = pt.candidate, self.named[pt.candidate][0]
                baseline_ms, best_ms, ci = confirmed.baseline_ms, confirmed.median_ms, confirmed.ci
                reason = confirmed_reason(chosen)
            else:
                reason = unconfirmed_reason(chosen, confirmed, self.confidence)
        if considered is not None and considered.notes:  # torch ran the step without graphs: said with its reason
            reason += "; " + "; ".join(considered.notes)
        self.bar.close()
        stream = self.where.stream
        tax = measure_tax(stream, policy.set_aside if policy.enabled and isinstance(policy.set_aside, int) else 0)
        grid_tax = measure_tax(stream, grid_best.point.set_aside if grid_best is not None else 0)
        return TunedPolicy(policy, chosen_name, buffer, baseline_ms, best_ms, ci, self.confidence, self.results,
                           grid_best, tax, grid_tax, reason, self.table, time.monotonic() - start, self.cap,
                           environment(self.where.device), considered)


def _nothing_to_try(reason: str, device: int, start: float, confidence: float,
                    considered: Optional[ModelCandidates]) -> TunedPolicy:
    """"no persistence" without a measurement: nothing could be tried, for ``reason``."""
    return TunedPolicy(Policy(enabled=False), None, _NO_BUFFER, 0.0, 0.0, (1.0, 1.0), confidence, {}, None, NO_TAX,
                       NO_TAX, reason, [], time.monotonic() - start, auto_set_aside_cap(device), environment(device),
                       considered)


def winners(points: list[PointResult], cap: int, min_gain: float, tax_gain: float = TAX_GAIN) -> list[PointResult]:
    """The points that count: faster than their baseline beyond the noise (lower bound above 1) by at
    least ``min_gain``; above the ``cap`` (the tax-free limit) also by ``tax_gain`` at the lower bound and
    by ``tax_gain`` over the best winner at or below the cap."""
    def counts(p: PointResult) -> bool:
        return p.ci[0] > 1.0 and p.speedup >= 1.0 + min_gain

    below = [p for p in points if p.point.set_aside <= cap and counts(p)]
    floor = max((p.speedup for p in below), default=1.0)
    above = [p for p in points if p.point.set_aside > cap and counts(p) and p.ci[0] >= 1.0 + tax_gain
             and p.speedup >= (1.0 + tax_gain) * floor]
    return [p for p in points if p in below or p in above]


def choose(points: list[PointResult], cap: int, min_gain: float, tax_gain: float = TAX_GAIN) -> Optional[PointResult]:
    """The smallest set-aside among the winners whose interval reaches the best winner's speedup (within
    noise of the best); ties go to the faster. None: nothing won."""
    won = winners(points, cap, min_gain, tax_gain)
    if not won:
        return None
    top = max(p.speedup for p in won)
    near = [p for p in won if p.ci[1] >= top]
    return min(near, key=lambda p: (p.point.set_aside, -p.speedup))


def screen_points(windows: Mapping[str, int], grid: list[int], cap: int) -> list[TunePoint]:
    """The screen (the module docstring's step 1) of candidates whose windows are ``windows`` (name -> bytes): each
    at the screened set-asides with the hit ratio that fits, and, where the window is larger than a tax-free
    set-aside, its first set-aside bytes with every line persisting."""
    points: list[TunePoint] = []
    for name, window_bytes in windows.items():
        sizes = _screen_sizes(grid, window_bytes)
        points += [TunePoint(name, s, default_hit_ratio(s, window_bytes), 0, window_bytes) for s in sizes]
        points += [TunePoint(name, s, 1.0, 0, _span(s)) for s in sizes if s < window_bytes and s <= cap]
    return points


def no_winner_reason(best: Optional[PointResult], confidence: float) -> str:
    return ("no point was faster than the baseline beyond the noise"
            + (f" (the best, {best.point.describe()}, measured {best.speedup:.3f}x, "
               f"{confidence:.0%} CI {best.ci[0]:.3f}-{best.ci[1]:.3f})" if best else ""))


def confirmed_reason(chosen: PointResult) -> str:
    return f"{chosen.point.describe()} was the smallest set-aside within noise of the best point and was confirmed"


def unconfirmed_reason(chosen: PointResult, confirmed: PointResult, confidence: float) -> str:
    return (f"the choice ({chosen.point.describe()}, {chosen.speedup:.3f}x in the search) did not reproduce: "
            f"{confirmed.speedup:.3f}x, {confidence:.0%} CI {confirmed.ci[0]:.3f}-{confirmed.ci[1]:.3f}")


def _screen_sizes(grid: list[int], window_bytes: int) -> list[int]:
    """The screened set-asides: granule counts 1, 2, 3, 4, 6, 8 and the max, up to the first size that holds
    the whole window, and the ``ABOVE_HOLDING`` sizes after that one (the time need not fall, or stay, as the
    set-aside grows past the window: the module docstring)."""
    holding = [s for s in grid if s >= window_bytes]
    useful = [s for s in grid if s < window_bytes] + holding[:1]
    if len(useful) <= len(COARSE_GRANULES):
        picked = set(useful)
    else:
        picked = {useful[k - 1] for k in COARSE_GRANULES if k <= len(useful)} | {useful[-1]}
    return sorted(picked | set(holding[1:1 + ABOVE_HOLDING]))


def refine_points(anchor: TunePoint, grid: list[int], result: CandidateResult) -> list[TunePoint]:
    """The anchor again, its neighbouring set-asides on the grid (either side, whether or not the screen went
    there), lower hit ratios and the window cut to the set-aside."""
    n = result.window_bytes
    seen = {(p.point.set_aside, round(p.point.hit_ratio, 6), p.point.num_bytes) for p in result.points}
    k = grid.index(anchor.set_aside) if anchor.set_aside in grid else 0
    points = [anchor]
    for s in grid[max(0, k - 1): k + 2]:
        if (s, round(default_hit_ratio(s, n), 6), n) not in seen and s != anchor.set_aside:
            points.append(TunePoint(anchor.candidate, s, default_hit_ratio(s, n), 0, n))
    fit = default_hit_ratio(anchor.set_aside, n)
    for share in (0.5, 0.75):
        ratio = normalize_hit_ratio(fit * share)
        if ratio >= 0.05:
            points.append(TunePoint(anchor.candidate, anchor.set_aside, ratio, 0, n))
    if n > anchor.set_aside:
        points.append(TunePoint(anchor.candidate, anchor.set_aside, 1.0, 0, _span(anchor.set_aside)))
    return list(dict.fromkeys(points))


def _span(set_aside: int) -> int:
    """The window that a set-aside holds whole, in 256-byte units."""
    return max(256, math.floor(set_aside / 256) * 256)
