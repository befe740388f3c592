"""The tuner: the set-aside and hit ratio that make a workload fastest with a buffer persisted, or the
answer "no persistence" when nothing beats the baseline beyond the noise."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ._device import require_persistence, stream_device
from ._interop import resolve_buffer, resolve_stream
from ._persist import Policy
from ._plan import normalize_hit_ratio
from .bench import Progress, Record, Report, check_repeats, clean_state, environment, measure_ceilings
from .sweep import measure_point, set_aside_grid
from .workloads import enqueue_of

__all__ = ["TunedPolicy", "tune"]

MiB = 1 << 20


@dataclass
class TunedPolicy:
    """What tune() found. ``policy`` is what to pass to ``persist(stream, buf, policy=...)``; when nothing
    beat the baseline beyond the noise it is "no persistence" (``policy.enabled`` is False)."""

    policy: Policy
    baseline_ms: float
    best_ms: float
    noise: float
    table: list[Record]
    seconds: float
    bystander: Optional[dict[str, Any]] = None
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.best_ms

    @property
    def persists(self) -> bool:
        return self.policy.enabled

    @property
    def set_aside(self) -> Any:
        return self.policy.set_aside

    @property
    def hit_ratio(self) -> Any:
        return self.policy.hit_ratio

    def __str__(self) -> str:
        if not self.persists:
            return (f"no persistence: nothing beat the baseline ({self.baseline_ms:.3f} ms) by more than the noise "
                    f"({self.noise:.1%}); {len(self.table)} points in {self.seconds:.1f} s")
        return (f"set-aside {self.policy.set_aside:,} B, hit ratio {self.policy.hit_ratio:.3f}: {self.best_ms:.3f} ms vs "
                f"{self.baseline_ms:.3f} ms without persistence ({self.speedup:.2f}x); {len(self.table)} points in "
                f"{self.seconds:.1f} s")

    def report(self) -> Report:
        r = Report("tune", self.environment, list(self.table))
        r.summary = {"policy": {"enabled": self.policy.enabled, "set_aside": self.policy.set_aside,
                                "hit_ratio": self.policy.hit_ratio},
                     "baseline_ms": self.baseline_ms, "best_ms": self.best_ms, "speedup": self.speedup,
                     "noise": self.noise, "seconds": self.seconds, "bystander": self.bystander}
        return r


def tune(workload: Any, stream: object, buf: object, *, warmup: int = 2, repeat: int = 7, bystander: bool = False,
         progress: bool = False) -> TunedPolicy:
    """Find the set-aside and hit ratio that make ``workload`` fastest with ``buf`` persisted, or decide
    that persistence does not pay.

    1. The baseline (no set-aside, no window), measured twice: the noise is how far the two medians
       differ (at least 0.5%).
    2. Coarse: set-asides of 1, 2, 3, 4, 6, 8 granules and the max, each with hit ratio 1.0 and
       min(1, set-aside / buf).
    3. Fine: around the best point, the neighbouring granules, and hit ratios from half to twice
       set-aside / buf in 0.1 steps.
    4. The best point wins only if it beats the baseline by more than the noise; it is then measured
       again and must still win. Otherwise the answer is "no persistence".
    ``bystander=True`` also reports the copy bandwidth of unrelated work at the chosen set-aside vs none.
    """
    start = time.monotonic()
    enqueue_of(workload)
    resolve_buffer(buf)
    warmup, repeat = check_repeats(warmup, repeat)
    if not isinstance(bystander, bool) or not isinstance(progress, bool):
        raise TypeError("bystander and progress must be bools")
    ref = resolve_stream(stream)
    device = stream_device(ref)
    info = require_persistence(device)
    grid = set_aside_grid(device, include_zero=False)
    nbytes = min(resolve_buffer(buf).nbytes, info.access_policy_max_window_size)
    coarse = sorted({grid[min(k, len(grid)) - 1] for k in (1, 2, 3, 4, 6, 8)} | {grid[-1]})
    # The plan: two baselines and two ratios per coarse set-aside; the fine stage adds itself when known.
    bar = Progress(2 + 2 * len(coarse), "tune", progress)

    def point(size: int, ratio: Optional[float], label: str) -> Record:
        rec = measure_point(workload, stream, buf, size, ratio, warmup=warmup, repeat=repeat, label=label)
        bar.step(f"{label} {size / MiB:.2f} MiB {ratio}")
        return rec

    b1, b2 = point(0, None, "baseline"), point(0, None, "baseline")
    if min(b1.median_ms, b2.median_ms) <= 0:
        bar.close()
        raise ValueError("the workload took 0 ms: it queued no GPU work on the stream it was given, so there is "
                         "nothing to tune (launch its kernels on that stream)")
    baseline_ms = min(b1.median_ms, b2.median_ms)
    # The noise of a median: how far two independent baseline medians differ (at least 0.5%). The
    # per-repetition spread would overstate it and refuse real gains of a few percent.
    noise = max(0.005, abs(b1.median_ms - b2.median_ms) / baseline_ms)
    table: list[Record] = [b1, b2]
    seen: dict[tuple[int, float], Record] = {}

    def measure(size: int, ratio: float, label: str) -> Record:
        key = (size, round(ratio, 4))
        if key not in seen:
            seen[key] = point(size, normalize_hit_ratio(ratio), label)
            table.append(seen[key])
        return seen[key]

    for size in coarse:
        for ratio in {1.0, min(1.0, size / nbytes)}:
            measure(size, ratio, "coarse")
    best = min(seen.items(), key=lambda kv: kv[1].median_ms)
    (size0, ratio0) = best[0]
    index = grid.index(size0)
    fine = []
    for size in grid[max(0, index - 1): index + 2]:
        fit = min(1.0, size / nbytes)
        ratios = {fit, 1.0} | {round(r, 1) for r in np.arange(0.1, 1.01, 0.1) if fit / 2 <= r <= min(1.0, 2 * fit)}
        fine += [(size, ratio) for ratio in sorted(ratios) if (size, round(ratio, 4)) not in seen]
    bar.grow(len(fine) + 1)  # + the confirmation
    for size, ratio in fine:
        measure(size, ratio, "fine")
    (size_best, ratio_best), rec_best = min(seen.items(), key=lambda kv: kv[1].median_ms)
    policy = Policy(enabled=False)
    best_ms = baseline_ms
    if rec_best.median_ms < baseline_ms * (1 - noise):
        again = point(size_best, normalize_hit_ratio(ratio_best), "confirm")
        table.append(again)
        confirmed = max(rec_best.median_ms, again.median_ms)
        if confirmed < baseline_ms * (1 - noise):
            policy = Policy(set_aside=rec_best.config["set_aside_granted"], hit_ratio=normalize_hit_ratio(ratio_best))
            best_ms = confirmed
    bar.close()
    tax = None
    if bystander:
        tax = _bystander(stream, int(policy.set_aside) if policy.enabled and isinstance(policy.set_aside, int) else 0)
    return TunedPolicy(policy, baseline_ms, best_ms, noise, table, time.monotonic() - start, tax, environment(device))


def _bystander(stream: object, set_aside: int, nbytes: int = 512 * MiB) -> dict[str, Any]:
    with clean_state(stream, set_aside=0):
        free = measure_ceilings(stream, nbytes, warmup=2, repeat=7)
    with clean_state(stream, set_aside=set_aside):
        taxed = measure_ceilings(stream, nbytes, warmup=2, repeat=7)
    return {"set_aside": set_aside, "copy_gbps_without": free.copy_gbps, "copy_gbps_with": taxed.copy_gbps,
            "copy_slowdown": free.copy_gbps / taxed.copy_gbps}
