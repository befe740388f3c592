"""Paired comparisons against a baseline: block-interleaved repetitions and bootstrap confidence intervals.

Two medians measured one after the other are not enough to call a gain of a few percent: clocks, the
other tenants of the GPU and where buffers landed drift over seconds. ``compare`` measures the baseline
and every other arm in *rounds*: each round runs one block of each arm, in a shuffled order, every
block from a declared state (bench.clean_state: its limit, no window, lines reset, L2 flushed) with a
warm-up before its timed repetitions. An arm's speedup is the baseline's pooled median over its own;
its confidence interval comes from resampling whole rounds (a paired, block bootstrap: the baseline and
the arm are resampled together, so drift between rounds widens the interval instead of biasing it).

The bootstrap is written with NumPy (scipy.stats.bootstrap does the same, but would make SciPy a
requirement); it is deterministic for a given ``seed``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional, Sequence

import numpy as np

from .._memory import StreamLike
from .._plan import check_count, check_nbytes
from .._errors import check
from ..workloads import enqueue_of, verifier_of
from .progress import Progress
from .records import Record
from .state import clean_state
from .timing import Timing, check_repeats, time_gpu

__all__ = ["Arm", "Comparison", "compare", "bootstrap_speedup", "check_confidence", "MAX_ROUNDS"]

MAX_ROUNDS = 1000
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Arm:
    """One configuration to measure: the limit its blocks run under and, optionally, a scope entered
    around its timed repetitions (``lambda: persist(stream, buf, 0.5, set_aside=None)``). The arm with
    no scope and a limit of 0 is the baseline."""

    label: str
    set_aside: int = 0
    scope: Optional[Callable[[], ContextManager[Any]]] = None
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class Comparison:
    """An arm's repetitions (rounds x repeat, ms) beside the baseline's from the same rounds."""

    arm: Arm
    times_ms: np.ndarray
    baseline_ms: np.ndarray
    granted: int
    verified: bool
    speedup: float
    ci: tuple[float, float]
    confidence: float

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_ms))

    @property
    def baseline_median_ms(self) -> float:
        return float(np.median(self.baseline_ms))

    @property
    def faster(self) -> bool:
        """Faster than the baseline beyond the noise, at the stated confidence."""
        return self.ci[0] > 1.0

    @property
    def slower(self) -> bool:
        """Slower than the baseline beyond the noise, at the stated confidence."""
        return self.ci[1] < 1.0

    def record(self, benchmark: str, extra: Optional[dict[str, Any]] = None) -> Record:
        timing = Timing(tuple(float(t) for t in self.times_ms.ravel()))
        config = {**self.arm.config, "set_aside_requested": self.arm.set_aside, "set_aside_granted": self.granted,
                  **(extra or {})}
        return Record.from_timing(benchmark, self.arm.label, config, timing, {
            "speedup_vs_baseline": self.speedup, "speedup_ci_low": self.ci[0], "speedup_ci_high": self.ci[1],
            "confidence": self.confidence, "baseline_median_ms": self.baseline_median_ms,
            "rounds": int(self.times_ms.shape[0])}, self.verified)


def check_confidence(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"confidence must be a float in (0.5, 1), not {type(value).__name__}")
    x = float(value)
    if not 0.5 < x < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {x!r}")
    return x


def bootstrap_speedup(baseline: np.ndarray, arm: np.ndarray, confidence: float = 0.95, *, seed: int = 0,
                      samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, tuple[float, float]]:
    """median(baseline) / median(arm) over all repetitions, and its two-sided percentile interval from
    resampling rounds (rows) of both arrays together."""
    baseline = np.asarray(baseline, dtype=np.float64)
    arm = np.asarray(arm, dtype=np.float64)
    if baseline.ndim != 2 or arm.shape[0] != baseline.shape[0] or not baseline.size or not arm.size:
        raise ValueError("baseline and arm must be (rounds, repeat) arrays with the same rounds")
    estimate = float(np.median(baseline) / np.median(arm))
    rounds = baseline.shape[0]
    if rounds < 2:
        return estimate, (estimate, estimate)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, rounds, size=(samples, rounds))
    base_medians = np.median(baseline[picks].reshape(samples, -1), axis=1)
    arm_medians = np.median(arm[picks].reshape(samples, -1), axis=1)
    ratios = base_medians / arm_medians
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return estimate, (float(min(low, estimate)), float(max(high, estimate)))


def compare(workload: Any, stream: StreamLike, arms: Sequence[Arm], *, rounds: int = 5, repeat: int = 5,
            warmup: int = 1, confidence: float = 0.95, seed: int = 0, benchmark: str = "compare",
            progress: Optional[Progress] = None) -> tuple[Comparison, list[Comparison]]:
    """Measure a baseline and ``arms`` in ``rounds`` shuffled rounds; returns (baseline, one Comparison per
    arm). The workload is verified after each arm's last block (poisoned before it, when it can be);
    a wrong output raises bench.VerificationError."""
    enqueue = enqueue_of(workload)
    warmup, repeat = check_repeats(warmup, repeat)
    rounds = check_count(rounds, "rounds", minimum=1, maximum=MAX_ROUNDS)
    confidence = check_confidence(confidence)
    for arm in arms:
        if not isinstance(arm, Arm):
            raise TypeError(f"arms must be bench.Arm values, not {type(arm).__name__}")
        check_nbytes(arm.set_aside, f"{arm.label}: set_aside", allow_zero=True)
    everything = [Arm("baseline")] + list(arms)
    times = np.zeros((len(everything), rounds, repeat))
    granted = [0] * len(everything)
    verified = [False] * len(everything)
    verify = verifier_of(workload)
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        last = r == rounds - 1
        for k in rng.permutation(len(everything)):
            arm = everything[k]
            with clean_state(stream, set_aside=arm.set_aside) as limit:
                if last and hasattr(workload, "poison"):
                    workload.poison(stream)
                with arm.scope() if arm.scope is not None else contextlib.nullcontext():
                    timing = time_gpu(enqueue, stream, warmup=warmup, repeat=repeat)
                if last and verify is not None:
                    verified[k] = bool(verify(stream))
                    check(verified[k], f"{benchmark}: {arm.label} (set-aside {limit} B) produced a wrong output")
            if k == 0 and r == 0 and timing.median_ms <= 0:
                raise ValueError("the workload took 0 ms: it queued no GPU work on the stream it was given, so there "
                                 "is nothing to compare (launch its kernels on that stream)")
            times[k, r] = timing.times_ms
            granted[k] = int(limit)
            if progress is not None:
                progress.step(f"round {r + 1}/{rounds} {arm.label}")
    results = []
    for k, arm in enumerate(everything):
        speedup, ci = bootstrap_speedup(times[0], times[k], confidence, seed=seed + k)
        results.append(Comparison(arm, times[k], times[0], granted[k], verified[k], speedup, ci, confidence))
    return results[0], results[1:]
