"""``l2ctl.autotune``: persistence tuned online, on the app's own calls of its step (the tuner's online form).

``tune`` runs the step itself, points x rounds x repeats times: fine for a benchmark, not for a training or decode
step with side effects. ``autotune(step)`` returns a callable with the step's signature that the app calls as before.
It never calls the step more often than the app does. Each decision (one per shape of the arguments) goes through:

1. **Discover** (``candidates="discover"``): the first calls run as they are, the launches of calls 2-4 recorded
   through CUPTI (l2ctl._kernel_buffers.StepRecorder), which gives the ranges the step's kernels are given, by the
   tuner's rule (l2ctl.candidates.from_recorded). Listed candidates skip this; their first call is a warm-up.
2. **Search:** the tuner's screen points (tuner.screen_points), then its refine points around the best winner
   (tuner.refine_points), each interleaved with calls under no window in shuffled rounds of one call each. A
   point's call enters ``persist`` with the point's exact set-aside around the step, a baseline call nothing; the
   step itself is timed inside the scope with CUDA events on its stream, read back as they complete (never more
   than ``MAX_LAG`` calls behind; all of a stage's once it ends), so the app's stream is not synchronized on every
   call.
3. **Decide** by the tuner's rules (tuner.choose, tuner.winners: one copy), then **confirm** in fresh rounds.
4. **Steady:** every call runs under the choice, held from the decision to ``stop()``, the finalizer or interpreter
   exit: the set-aside (``l2ctl.set_aside``) and the window, started once on the kept graphs torch replays or on
   the step's stream (where it stays between calls); or untouched. A call then costs the wrapper's dict lookup.

A call that arrives while another thread's call of the same decision is measured runs untouched and unmeasured:
the search times one call at a time. After the decision every thread's calls on the step's stream run under it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, ParamSpec, TypeVar, Union

import numpy as np

from ._device import require_persistence, stream_device
from ._errors import CountersUnavailableError, NotSupportedError, PersistenceUnavailableWarning
from ._interop import BufferRef, resolve_stream
from ._kernel_buffers import StepRecorder
from ._limit import auto_set_aside_cap, set_aside, set_aside_grid
from ._memory import BufferLike, Event, StreamLike
from ._persist import Policy, persist
from ._plan import clip_window
from ._targets import Target
from . import _torch_graphs
from ._units import format_bytes
from .bench.paired import bootstrap_speedup, check_confidence
from .candidates import ModelCandidates, from_captures, from_recorded
from .graph import TorchCaptures, torch_captures
from .graph import buffers as graph_buffers
from .tuner import (REFINE_POINTS, TAX_GAIN, CandidateResult, PointResult, TunePoint, check_gains, choose,
                    confirmed_reason, is_discover, no_winner_reason, refine_points, resolve_candidates, screen_points,
                    unconfirmed_reason, winners)

__all__ = ["autotune", "AutoTuned", "Decision", "MAX_CALLS", "MAX_LAG"]

P = ParamSpec("P")
R = TypeVar("R")
#: The app's calls a decision may take, discovery and confirmation included: for a 1-5 ms step, under a second.
MAX_CALLS = 200
#: How far behind the app the timing may fall before the oldest call is waited for.
MAX_LAG = 8
#: Calls recorded through CUPTI to discover the candidates (after one warm-up).
DISCOVERY_STEPS = 3
#: Calls for the screen: the discovery, the refine stage (three rounds at least) and the confirmation taken out.
_SEARCH_CALLS = MAX_CALLS - (DISCOVERY_STEPS + 1) - 3 * (REFINE_POINTS + 1) - 2 * 6

Candidates = Union[BufferLike, Mapping[str, BufferLike], str]


@dataclass
class Decision:
    """What autotune decided for one shape of the step's arguments (``key``), and what it cost: ``calls`` of the
    app's made under this decision, ``phase`` ("discover", "search", "confirm", "decided"), the ``policy`` chosen
    ("no persistence": disabled) on ``buffer_name``, the confirmed ``speedup`` and its ``ci``, ``points`` (every
    point measured) and ``tuning_cost_ms``: the time the calls under the points that lost spent beyond the
    baseline's median."""

    key: tuple[Any, ...]
    phase: str = "search"
    calls: int = 0
    decided_at: int = 0
    policy: Policy = field(default_factory=lambda: Policy(enabled=False))
    buffer_name: Optional[str] = None
    speedup: float = 1.0
    ci: tuple[float, float] = (1.0, 1.0)
    reason: str = ""
    points: list[PointResult] = field(default_factory=list)
    tuning_cost_ms: float = 0.0
    considered: Optional[ModelCandidates] = None

    def __str__(self) -> str:
        shapes = ", ".join(_describe_key(self.key)) or "no array arguments"
        if self.phase != "decided":
            return f"[{shapes}] {self.phase}: {self.calls} calls so far"
        what = "no persistence" if not self.policy.enabled else (
            f"persist {self.buffer_name}: set-aside {_mib(self.policy.set_aside)}, hit ratio "
            f"{self.policy.hit_ratio:.3f}" + ("" if self.policy.num_bytes is None
                                              else f" over its first {_mib(self.policy.num_bytes)}")
            + f", {self.speedup:.3f}x ({self.ci[0]:.3f}-{self.ci[1]:.3f})")
        return (f"[{shapes}] {what}, decided at call {self.decided_at} of the app's ({len(self.points)} point"
                f"{'s' * (len(self.points) != 1)}; tuning cost {self.tuning_cost_ms:.2f} ms): {self.reason}")


def _mib(nbytes: object) -> str:
    return format_bytes(nbytes) if isinstance(nbytes, int) else str(nbytes)


def _describe_key(key: tuple[Any, ...]) -> list[str]:
    return [f"{tuple(shape)} {dtype}" + (f" on {device}" if device is not None else "")
            for _type, shape, dtype, device in key if shape is not None]


def _key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What a decision is for: each argument's type, shape, dtype and device (values of other arguments do not
    change which memory the step's kernels stream)."""
    values = args + tuple((k, kwargs[k]) for k in sorted(kwargs)) if kwargs else args
    return tuple((type(v), getattr(v, "shape", None), getattr(v, "dtype", None), getattr(v, "device", None))
                 for v in values)


#: Said when discovery saw the step launch no kernel at all.
NOTHING_SEEN_HINT = ("; the step launched no kernel that l2ctl could read: where it replays CUDA graphs made outside "
                     "l2ctl.graph.torch_captures() (torch.cuda.graph, make_graphed_callables), make them inside `with "
                     "l2ctl.graph.torch_captures():`, whose graphs keep their templates and take windows")


def _torch_captures(device: int) -> Optional[TorchCaptures]:
    """Where the step may run through torch (torch imported, its CUDA in use): a torch_captures() object for the
    device, which the tuning calls run inside (what torch records there keeps its template) and which becomes the
    target when torch replays graphs; None without torch, or where torch cannot keep a template (before 2.9)."""
    if not _torch_graphs.trees.in_use():
        return None
    captures = torch_captures(device)
    try:
        with captures:
            pass
    except ValueError:  # torch < 2.9: the stream alone is the target
        return None
    _torch_graphs.trees.capture_streams(device)  # torch's graph trees made as a scope makes them (l2ctl.graph)
    return captures


def _unreached_hint(state: _State) -> str:
    """What a "no persistence" answer adds where torch's graph trees hold recordings no window reaches (made
    before the step was wrapped, their templates gone): the step may replay them."""
    if state.captures is None:
        return ""
    gone = [node for node in _torch_graphs.trees.recorded(state.device)
            if not _torch_graphs.is_kept(getattr(node, "graph", None))]
    if not gone:
        return ""
    return (f"; PyTorch's CUDA graph trees hold {len(gone)} recording(s) made before autotune saw the step, their "
            "templates gone: if the step replays them, no window reaches them. Wrap the compiled step before its "
            "first call (autotune then keeps what torch records), or call torch.compiler.reset() first")


def _current_stream() -> StreamLike:
    """The stream the step's work is queued on when none is given: torch's current stream where torch is in use,
    else l2ctl's current one (``with l2ctl.Stream()``), else the legacy default."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        current: StreamLike = torch.cuda.current_stream()
        return current
    return None


class _Range:
    """A discovered range (ptr, nbytes) as an object (``__cuda_array_interface__``): a persist scope remembers its
    pointer check while the object lives (a tuple is checked at every entry, a driver call)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


class _Timed:
    """One measured call: its arm (0: the baseline; k: the k-th point), its round and its two events."""

    __slots__ = ("arm", "round", "start", "end")

    def __init__(self, arm: int, round_: int, start: Event, end: Event) -> None:
        self.arm, self.round, self.start, self.end = arm, round_, start, end


class _State:
    """A decision in progress and what it needs: the stream, the candidates, the schedule and the times."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.decision = Decision(key)
        self.busy = threading.Lock()  # one measured call at a time
        self.started = False  # whether a measured call has begun the decision (_start)
        self.stream: StreamLike = None  # where the step's work is queued and timed
        self.target: Target = None  # where the windows go: the stream, or torch's captures (graphs and streams)
        self.captures: Optional[TorchCaptures] = None  # where torch runs the step
        self.device = -1
        self.recorder: Optional[StepRecorder] = None
        self.named: dict[str, tuple[BufferLike, BufferRef]] = {}
        self.points: list[TunePoint] = []  # the stage's
        self.rounds_refine = 3
        self.windows: dict[str, int] = {}  # each candidate's window bytes (clipped to the device's max window)
        self.costs: dict[TunePoint, float] = {}  # ms beyond the baseline's median, summed over a point's calls
        self.times = np.zeros((0, 0))
        self.schedule: collections.deque[tuple[int, int]] = collections.deque()  # (arm, round) still to run
        self.pending: collections.deque[_Timed] = collections.deque()
        self.events: list[Event] = []
        self.chosen: Optional[PointResult] = None
        self.ends: list[Callable[[], None]] = []  # what the steady state holds, ended in order: windows, the limit


class AutoTuned(Generic[P, R]):
    """``fn`` (its signature kept: ``functools.wraps``) with persistence tuned on the app's own calls: see the
    module's docstring. ``report()`` says what was decided per argument shape, ``stop()`` restores the device and
    lets every later call run untouched."""

    def __init__(self, fn: Callable[P, R], candidates: Candidates, stream: StreamLike, rounds: int, confidence: float,
                 min_gain: float, tax_gain: float, strict: bool, max_decisions: int, seed: int) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._discover = is_discover(candidates)
        self._named = {} if self._discover else resolve_candidates(candidates)
        self._stream = stream
        self._rounds, self._confidence, self._min_gain, self._tax_gain = rounds, confidence, min_gain, tax_gain
        self._strict, self._max_decisions, self._seed = strict, max_decisions, seed
        self._states: collections.OrderedDict[tuple[Any, ...], _State] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stopped = False
        self._warned = False
        # the set-asides held, released with this object or at stop(); interpreter exit restores them too
        self._ends: list[Callable[[], None]] = []
        self._finalizer = weakref.finalize(self, _restore, self._ends)

    # ---- the app's call -------------------------------------------------------------------------------------------
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._stopped:
            return self._fn(*args, **kwargs)
        key = _key(args, kwargs) if args or kwargs else ()
        state = self._states.get(key)
        if state is None:
            state = self._new_state(key)
        d = state.decision
        d.calls += 1
        if d.phase == "decided":  # the choice's windows and set-aside are held: nothing to do per call
            return self._fn(*args, **kwargs)
        if not state.busy.acquire(blocking=False):  # another thread's call of this decision is measured
            return self._fn(*args, **kwargs)
        try:
            return self._tuning_call(state, args, kwargs)
        finally:
            state.busy.release()

    def _new_state(self, key: tuple[Any, ...]) -> _State:
        evicted: Optional[_State] = None
        with self._lock:
            state = self._states.get(key)
            if state is not None:
                return state
            state = _State(key)
            if len(self._states) >= self._max_decisions:  # the oldest decision goes, its set-aside with it
                _, evicted = self._states.popitem(last=False)
            self._states[key] = state
            state.decision.phase = "discover" if self._discover else "warm-up"
        if evicted is not None:
            self._release(evicted)
        return state

    def _tuning_call(self, state: _State, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        if not state.started:  # the first call measured (under `busy`; another thread's may have counted first)
            started = self._start(state)  # a strict refusal raises here, and the next call starts again
            state.started = True
            if not started:
                return self._fn(*args, **kwargs)
        # torch's graphs recorded in a tuning call keep their templates, so every window reaches their replays
        with state.captures if state.captures is not None else contextlib.nullcontext():
            return self._measured_call(state, args, kwargs)

    def _start(self, state: _State) -> bool:
        """The decision's first call: its stream and device, whether the device can persist (False: it cannot,
        and the decision is made), CUPTI's recorder for discovery, and torch's captures where torch runs."""
        state.stream = self._stream if self._stream is not None else _current_stream()
        state.device = stream_device(resolve_stream(state.stream))
        try:
            require_persistence(state.device)
        except NotSupportedError as exc:
            if self._strict:
                raise
            self._decide_nothing(state, str(exc))
            self._warn_once(f"l2ctl.autotune(strict=False) changes nothing here: {exc}")
            return False
        state.captures = _torch_captures(state.device)
        if self._discover:
            try:
                state.recorder = StepRecorder(state.device, steps=DISCOVERY_STEPS)
            except CountersUnavailableError as exc:  # raised before the step ran: strict raises, else says why
                if self._strict:
                    raise
                self._decide_nothing(state, f"discovery cannot record the step's launches: {exc}")
                self._warn_once(f"l2ctl.autotune(strict=False) changes nothing here: {exc}")
                return False
        return True

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            warnings.warn(message, PersistenceUnavailableWarning, stacklevel=5)
            self._warned = True

    def _measured_call(self, state: _State, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        d = state.decision
        if d.phase == "discover":
            assert state.recorder is not None
            out = state.recorder.run(lambda: self._fn(*args, **kwargs))
            if state.recorder.refused is not None:  # the step ran; what it launched cannot be compared
                self._decide_nothing(state, f"no range can be discovered: {state.recorder.refused}")
                state.recorder = None
            elif state.recorder.done:
                recorded, state.recorder = state.recorder.result(), None
                found = from_recorded(recorded, state.device) if state.captures is None else \
                    from_captures(state.captures, recorded=recorded, every_kept=True)
                d.considered = found
                if not found.tried:
                    self._decide_nothing(state, f"no range the step's kernels are given can be tried: {found.summary()}"
                                         + ("" if found.total else NOTHING_SEEN_HINT))
                else:
                    self._plan(state, resolve_candidates(dict(found.tried)))
            return out
        if d.phase == "warm-up":
            out = self._fn(*args, **kwargs)
            self._plan(state, self._named)
            return out
        self._harvest(state)
        if not state.schedule:  # every call of the stage was made: its times (waited for, once a stage) decide
            self._harvest(state, wait=True)
            self._advance(state)
            if d.phase == "decided":  # this call is the decision's first
                return self._fn(*args, **kwargs)
        arm, round_ = state.schedule.popleft()
        scope = self._arm_scope(state, arm)
        start, end = self._event_pair(state)
        try:
            with scope if scope is not None else contextlib.nullcontext():
                # timed inside the scope: the step's own work under the window, as tune times it (a limit's
                # change at the scope's entry is no part of the app's steady state)
                start.record(state.stream)
                out = self._fn(*args, **kwargs)
                end.record(state.stream)
        except BaseException:  # a call that failed times nothing: its arm runs again at the next call
            state.schedule.appendleft((arm, round_))
            state.events += [start, end]
            raise
        state.pending.append(_Timed(arm, round_, start, end))
        return out

    # ---- the search -------------------------------------------------------------------------------------------------
    def _plan(self, state: _State, named: dict[str, tuple[BufferLike, BufferRef]]) -> None:
        """The search's points and rounds for these candidates, within the calls a decision may take."""
        for name, (_, buf) in named.items():
            if buf.device is not None and buf.device != state.device:
                raise ValueError(f"candidate {name!r} is on device {buf.device}, the step's stream on device "
                                 f"{state.device}")
        state.target = state.stream
        if state.captures is not None and _torch_graphs.kept(state.device):  # torch replays graphs: their nodes take the window too
            try:
                state.captures._refuse_unreached(state.device, ())
            except ValueError as exc:
                self._decide_nothing(state, str(exc))
                return
            state.target = state.captures
        max_window = require_persistence(state.device).access_policy_max_window_size
        grid, cap = set_aside_grid(state.device, include_zero=False), auto_set_aside_cap(state.device)
        # the largest candidates first, as many as the calls allow three rounds of
        by_size = sorted(named.items(), key=lambda item: -item[1][1].nbytes)
        while True:
            state.named = dict(by_size)
            state.windows = {n: clip_window(0, None, b.nbytes, max_window)[0] for n, (_, b) in state.named.items()}
            state.points = screen_points(state.windows, grid, cap)
            if 3 * (len(state.points) + 1) <= _SEARCH_CALLS or len(by_size) == 1:
                break
            by_size.pop()
        if 3 * (len(state.points) + 1) > _SEARCH_CALLS:  # one candidate with more points than that: the largest
            state.points = state.points[-(_SEARCH_CALLS // 3 - 1):]
        rounds = max(3, min(self._rounds, _SEARCH_CALLS // (len(state.points) + 1)))
        left = _SEARCH_CALLS + 3 * (REFINE_POINTS + 1) - rounds * (len(state.points) + 1)
        state.rounds_refine = max(3, min(self._rounds, left // (REFINE_POINTS + 1)))
        self._schedule(state, len(state.points) + 1, rounds, "search")

    def _schedule(self, state: _State, arms: int, rounds: int, phase: str) -> None:
        rng = np.random.default_rng(self._seed + len(state.decision.points))
        state.times = np.zeros((arms, rounds))
        state.schedule = collections.deque((int(arm), r) for r in range(rounds) for arm in rng.permutation(arms))
        state.decision.phase = phase

    def _arm_scope(self, state: _State, arm: int) -> Any:
        if arm == 0:
            return None
        point = state.chosen.point if state.decision.phase == "confirm" else state.points[arm - 1]  # type: ignore
        return persist(state.target, state.named[point.candidate][0], point.hit_ratio, set_aside=point.set_aside,
                       **point.span(state.named[point.candidate][1].nbytes))

    @staticmethod
    def _event_pair(state: _State) -> tuple[Event, Event]:
        if len(state.events) < 2:
            state.events += [Event(state.device) for _ in range(2 * MAX_LAG + 2)]
        return state.events.pop(), state.events.pop()

    @staticmethod
    def _harvest(state: _State, wait: bool = False) -> None:
        """Read the times of the calls that completed; wait for the oldest when the timing falls MAX_LAG behind
        (for all of them with ``wait``)."""
        while state.pending and (wait or len(state.pending) > MAX_LAG or state.pending[0].end.query()):
            timed = state.pending.popleft()
            state.times[timed.arm, timed.round] = timed.start.elapsed_time(timed.end)
            state.events += [timed.start, timed.end]

    def _advance(self, state: _State) -> None:
        """A stage's times are all in: the search chooses and the confirmation decides."""
        d = state.decision
        cap = auto_set_aside_cap(state.device)
        baseline = state.times[0].reshape(-1, 1)
        if d.phase in ("search", "refine"):
            stage = d.phase
            measured = []
            for k, point in enumerate(state.points, start=1):
                speedup, ci = bootstrap_speedup(baseline, state.times[k].reshape(-1, 1), self._confidence,
                                                seed=self._seed + k)
                measured.append(PointResult(point, speedup, ci, float(np.median(state.times[k])),
                                            float(np.median(baseline)), stage, False))
            for k, point in enumerate(state.points, start=1):
                state.costs[point] = state.costs.get(point, 0.0) + float(
                    np.clip(state.times[k] - np.median(baseline), 0, None).sum())
            redone = {p.point for p in measured}  # the refine stage measures its anchor again: the newer counts
            d.points = [p for p in d.points if p.point not in redone] + measured
            won = winners(d.points, cap, self._min_gain, self._tax_gain)
            if stage == "search" and won:  # the tuner's refine stage, around the best winner
                anchor = max(won, key=lambda p: p.speedup).point
                result = CandidateResult(anchor.candidate, state.windows[anchor.candidate],
                                         [p for p in d.points if p.point.candidate == anchor.candidate])
                state.points = refine_points(anchor, set_aside_grid(state.device, include_zero=False), result)
                self._schedule(state, len(state.points) + 1, state.rounds_refine, "refine")
                return
            chosen = choose(d.points, cap, self._min_gain, self._tax_gain)
            if chosen is None:
                best = max(d.points, key=lambda p: p.speedup) if d.points else None
                self._decide_nothing(state, no_winner_reason(best, self._confidence) + _unreached_hint(state))
                return
            state.chosen = chosen
            self._schedule(state, 2, max(self._rounds, 6), "confirm")
            return
        assert state.chosen is not None
        speedup, ci = bootstrap_speedup(baseline, state.times[1].reshape(-1, 1), self._confidence, seed=self._seed)
        confirmed = PointResult(state.chosen.point, speedup, ci, float(np.median(state.times[1])),
                                float(np.median(baseline)), "confirm", False)
        d.points.append(confirmed)
        if not winners([confirmed], cap, self._min_gain, self._tax_gain):
            self._decide_nothing(state, unconfirmed_reason(state.chosen, confirmed, self._confidence)
                                 + _unreached_hint(state))
            return
        self._steady(state, confirmed)

    def _steady(self, state: _State, confirmed: PointResult) -> None:
        """Every later call under the choice, held from now to stop(): its set-aside and its window, started once
        where the step's kernels run (no per-call scope: the wrapper's own cost per call is a dict lookup)."""
        d, pt = state.decision, confirmed.point
        buffer = state.named[pt.candidate][0]
        if isinstance(buffer, tuple):  # a discovered range: an owner the entry's pointer check can remember
            buffer = _Range(*buffer)
        span = pt.span(state.named[pt.candidate][1].nbytes)
        limit = set_aside(pt.set_aside, state.device)
        state.ends.append(limit.restore)
        if state.target is not state.stream:  # torch's kept graphs that are given the buffer: windowed once
            ptr = state.named[pt.candidate][1].ptr
            for kept_graph in _torch_graphs.kept(state.device):
                if any(b.ptr <= ptr < b.ptr + b.nbytes for b in graph_buffers(kept_graph)):
                    state.ends.insert(0, persist(kept_graph, buffer, pt.hit_ratio, set_aside=None, **span).start().stop)
        # a range torch's graphs are given: their windows reach it (a stream window on the same bytes would ask the
        # set-aside for them twice); a range only kernels launched outside graphs are given: the step's stream,
        # whose window stays on it between calls (its persisting lines reset once, at the end)
        if len(state.ends) == 1:
            state.ends.insert(0, persist(state.stream, buffer, pt.hit_ratio, set_aside=None, **span).start().stop)
        with self._lock:
            self._ends.extend(state.ends)
        d.policy = Policy(set_aside=pt.set_aside, hit_ratio=pt.hit_ratio, offset=pt.offset,
                          num_bytes=span.get("num_bytes"))
        d.buffer_name, d.speedup, d.ci = pt.candidate, confirmed.speedup, confirmed.ci
        d.reason = confirmed_reason(confirmed)
        d.phase, d.decided_at = "decided", d.calls
        d.tuning_cost_ms = sum(cost for point, cost in state.costs.items() if point != pt)

    @staticmethod
    def _decide_nothing(state: _State, reason: str) -> None:
        d = state.decision
        d.reason, d.phase, d.decided_at = reason, "decided", d.calls
        d.tuning_cost_ms = sum(state.costs.values())

    # ---- introspection and the end ------------------------------------------------------------------------------
    def report(self) -> list[Decision]:
        """Every decision kept (at most ``max_decisions``: the oldest goes first), oldest first."""
        return [s.decision for s in list(self._states.values())]

    def __str__(self) -> str:
        decisions = self.report()
        head = f"autotune({getattr(self._fn, '__qualname__', self._fn)!s})"
        return head + (":\n  " + "\n  ".join(map(str, decisions)) if decisions else ": not called yet")

    def stop(self) -> None:
        """Restore the device (the set-asides held) and run every later call untouched. Idempotent."""
        self._stopped = True
        with self._lock:
            states = list(self._states.values())
        for state in states:
            self._release(state)

    def _release(self, state: _State) -> None:
        ends, state.ends = state.ends, []
        with self._lock:
            for end in ends:
                if end in self._ends:
                    self._ends.remove(end)
        for end in ends:  # the windows first, then the set-aside
            end()


def _restore(ends: list[Callable[[], None]]) -> None:
    """The finalizer: what an AutoTuned held (graphs' windows, set-asides), ended (interpreter exit ends them in any
    case)."""
    for end in list(ends):
        end()
    ends.clear()


def autotune(fn: Callable[P, R], candidates: Candidates = "discover", *, stream: StreamLike = None, rounds: int = 6,
             confidence: float = 0.95, min_gain: float = 0.01, tax_gain: float = TAX_GAIN, strict: bool = True,
             max_decisions: int = 8, seed: int = 0) -> AutoTuned[P, R]:
    """``fn`` with L2 persistence tuned on the app's own calls: call the result as you called ``fn``.

    It never calls ``fn`` more often than the app does. Over the first calls (at most ``MAX_CALLS`` per shape of
    the arguments) each call runs under one point of the tuner's search or under no window, interleaved and timed
    with CUDA events; then the tuner's rules decide (``l2ctl.tune``'s confidence, ``min_gain`` and ``tax_gain``),
    and every later call runs under the choice or untouched. ``candidates``: "discover" (the ranges the step's
    kernels are given, recorded through CUPTI over its calls 2-4), a buffer, or a dict name -> buffer. ``stream``:
    the stream the step's work runs on (default: torch's current stream when torch is in use, else l2ctl's current
    one). ``strict=False``: where the device cannot persist, every call runs untouched, with one warning.
    ``report()`` lists the decisions, ``stop()`` restores the device."""
    if not callable(fn):
        raise TypeError(f"autotune needs the step to call, not {type(fn).__name__}")
    for name, value, low, high in (("rounds", rounds, 3, 100), ("max_decisions", max_decisions, 1, 1024),
                                   ("seed", seed, 0, 2**63 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be an int from {low} to {high}, got {value!r}")
    confidence = check_confidence(confidence)
    check_gains(min_gain, tax_gain)
    if not isinstance(strict, bool):
        raise TypeError("strict must be a bool")
    if stream is not None:
        resolve_stream(stream)  # refused now, not at the app's first call
    return AutoTuned(fn, candidates, stream, rounds, confidence, float(min_gain), float(tax_gain), strict,
                     max_decisions, seed)
