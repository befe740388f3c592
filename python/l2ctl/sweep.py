"""Sweeps over hit ratio, set-aside and LUT size, the set-aside tax, and a tuner that does no harm.

A *workload* is anything with ``enqueue(stream)`` (queue the work) and, optionally, ``verify(stream)``
(True when the last run's output is right); a plain callable ``f(stream)`` works too (then nothing is
verified, and records say so). ``ResetDataWorkload`` is the built-in one. Every point starts from a
declared state (bench.clean_state: limit set, no window, lines reset, L2 flushed) and the device's
limit is restored afterwards.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import kernels
from ._device import require_persistence, set_aside_granularity
from ._errors import L2BudgetWarning
from ._interop import resolve_buffer, resolve_stream
from ._memory import DeviceBuffer
from ._persist import Policy, persist
from ._plan import hit_ratio_grid, normalize_hit_ratio, round_up
from ._window import stream_device
from .bench import Record, Report, _Progress, _verify, clean_state, environment, time_gpu

__all__ = [
    "ResetDataWorkload",
    "measure_point",
    "sweep_hit_ratio",
    "sweep_set_aside",
    "sweep_surface",
    "sweep_lut_size",
    "sweep_tax",
    "set_aside_grid",
    "TunedPolicy",
    "tune",
]

MiB = 1 << 20


class ResetDataWorkload:
    """reset-data as a workload: a random LUT of ``lut_bytes`` repeated into ``out_bytes``; the LUT is
    the buffer to persist (``.buf``)."""

    def __init__(self, lut_bytes: int, out_bytes: int = 1 << 30, *, variant: str = "plain", device: object = None,
                 seed: int = 0) -> None:
        if lut_bytes <= 0 or lut_bytes % 4:
            raise ValueError(f"lut_bytes must be a positive multiple of 4, got {lut_bytes}")
        rng = np.random.default_rng(seed)
        self.lut_bytes, self.variant = lut_bytes, variant
        self.buf = DeviceBuffer.from_numpy(rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32), device)
        self.out = DeviceBuffer(round_up(out_bytes, 16), self.buf.device)

    def enqueue(self, stream: object) -> None:
        kernels.reset_data(self.out, self.buf, stream, variant=self.variant)

    def poison(self, stream: object) -> None:
        self.out.fill_bytes(0xFF, stream)

    def verify(self, stream: object) -> bool:
        return kernels.verify_reset_data(self.out, self.buf, stream) == 0

    def describe(self) -> dict:
        return {"workload": "reset-data", "lut_bytes": self.lut_bytes, "out_bytes": self.out.nbytes,
                "kernel_variant": self.variant}

    def close(self) -> None:
        self.buf.free()
        self.out.free()

    def __enter__(self) -> "ResetDataWorkload":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _enqueue_of(workload: Any) -> Callable[[Any], Any]:
    return workload.enqueue if hasattr(workload, "enqueue") else workload


def measure_point(workload: Any, stream: object, buf: object, set_aside: int, hit_ratio: Optional[float], *,
                  warmup: int = 3, repeat: int = 9, label: str = "point") -> Record:
    """One verified measurement: limit ``set_aside`` bytes, and a window over ``buf`` with ``hit_ratio``
    (None: no window)."""
    enqueue = _enqueue_of(workload)
    with clean_state(stream, set_aside=set_aside) as granted:
        if hasattr(workload, "poison"):
            workload.poison(stream)
        if hit_ratio is None:
            timing = time_gpu(enqueue, stream, warmup=warmup, repeat=repeat)
            applied = None
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", L2BudgetWarning)  # oversubscription is what some points test
                with persist(stream, buf, hit_ratio, set_aside=None) as p:
                    timing = time_gpu(enqueue, stream, warmup=warmup, repeat=repeat)
                    applied = p.window.hit_ratio
        verified = bool(workload.verify(stream)) if hasattr(workload, "verify") else False
        if hasattr(workload, "verify"):
            _verify(verified, f"{label}: set-aside {granted}, hit ratio {hit_ratio}")
    config = dict(getattr(workload, "describe", dict)())
    config.update({"set_aside_requested": set_aside, "set_aside_granted": granted, "hit_ratio": applied,
                   "window_bytes": resolve_buffer(buf).nbytes if hit_ratio is not None else 0})
    rec = Record.from_timing("sweep", label, config, timing, {})
    rec.verified = verified
    return rec


def set_aside_grid(device: object = None, *, include_zero: bool = True) -> list[int]:
    """Every limit the driver can grant: multiples of its granularity up to the max."""
    info = require_persistence(device)
    g = set_aside_granularity(info.index)
    steps = max(1, info.persisting_l2_cache_max_size // g)
    if steps > 64:  # drivers with a fine granularity: 32 even steps
        g, steps = round_up(info.persisting_l2_cache_max_size // 32, g), 32
    grid = [min(k * g, info.persisting_l2_cache_max_size) for k in range(0 if include_zero else 1, steps + 1)]
    return sorted(set(grid))


@dataclass
class SweepResult:
    kind: str
    records: list[Record]
    baseline: Record
    environment: dict

    def report(self) -> Report:
        r = Report(f"sweep-{self.kind}", self.environment, [self.baseline] + self.records)
        r.summary = {"baseline_ms": self.baseline.median_ms,
                     "best": min(self.records, key=lambda x: x.median_ms).config if self.records else None}
        return r

    def speedups(self) -> list[float]:
        return [self.baseline.median_ms / r.median_ms for r in self.records]


def _run(kind: str, workload: Any, stream: object, buf: object, points: Sequence[tuple[int, Optional[float]]],
         warmup: int, repeat: int, progress: bool) -> SweepResult:
    ref = resolve_stream(stream)
    device = stream_device(ref)
    bar = _Progress(len(points) + 1, f"sweep {kind}", progress)
    baseline = measure_point(workload, stream, buf, 0, None, warmup=warmup, repeat=repeat, label="baseline")
    bar.step("baseline")
    records = []
    for set_aside, hit_ratio in points:
        rec = measure_point(workload, stream, buf, set_aside, hit_ratio, warmup=warmup, repeat=repeat, label=kind)
        rec.metrics["speedup_vs_baseline"] = baseline.median_ms / rec.median_ms
        records.append(rec)
        bar.step(f"set-aside {set_aside / MiB:.2f} MiB, hit ratio {hit_ratio}")
    return SweepResult(kind, records, baseline, environment(device))


def sweep_hit_ratio(workload: Any, stream: object, buf: object, *, set_aside: Optional[int] = None,
                    hit_ratios: Optional[Sequence[float]] = None, warmup: int = 3, repeat: int = 9,
                    progress: bool = True) -> SweepResult:
    """Time against hit ratio at one set-aside (default: buf rounded up to the granularity, capped).
    Hit ratios come from an exact grid (i / 10), never accumulated."""
    info = require_persistence(stream_device(resolve_stream(stream)))
    if set_aside is None:
        set_aside = min(info.persisting_l2_cache_max_size,
                        round_up(resolve_buffer(buf).nbytes, set_aside_granularity(info.index)))
    ratios = [normalize_hit_ratio(h) for h in (hit_ratios if hit_ratios is not None else hit_ratio_grid(11))]
    return _run("hit-ratio", workload, stream, buf, [(set_aside, h) for h in ratios], warmup, repeat, progress)


def sweep_set_aside(workload: Any, stream: object, buf: object, *, hit_ratio: Optional[float] = None,
                    set_asides: Optional[Sequence[int]] = None, warmup: int = 3, repeat: int = 9,
                    progress: bool = True) -> SweepResult:
    """Time against the set-aside (every granule by default). ``hit_ratio=None``: min(1, set-aside / buf)."""
    nbytes = resolve_buffer(buf).nbytes
    sizes = list(set_asides) if set_asides is not None else set_aside_grid(stream_device(resolve_stream(stream)),
                                                                             include_zero=False)
    points = [(s, hit_ratio if hit_ratio is not None else min(1.0, s / nbytes)) for s in sizes]
    return _run("set-aside", workload, stream, buf, points, warmup, repeat, progress)


def sweep_surface(workload: Any, stream: object, buf: object, *, set_asides: Optional[Sequence[int]] = None,
                  hit_ratios: Optional[Sequence[float]] = None, warmup: int = 2, repeat: int = 7,
                  progress: bool = True) -> SweepResult:
    """The 2-D surface set-aside x hit ratio (every granule x 0.1 .. 1.0 by default)."""
    sizes = list(set_asides) if set_asides is not None else set_aside_grid(stream_device(resolve_stream(stream)),
                                                                             include_zero=False)
    ratios = list(hit_ratios) if hit_ratios is not None else hit_ratio_grid(10, 0.1, 1.0)
    return _run("surface", workload, stream, buf, [(s, normalize_hit_ratio(h)) for s in sizes for h in ratios],
                warmup, repeat, progress)


def sweep_lut_size(lut_sizes: Sequence[int], stream: object, *, out_bytes: int = 1 << 30, policy: str = "right_sized",
                   variant: str = "plain", warmup: int = 3, repeat: int = 9, progress: bool = True) -> Report:
    """reset-data over LUT sizes, baseline vs one policy ("right_sized": the LUT rounded up to the
    granularity, hit ratio set-aside / LUT; "max": the largest set-aside, same rule)."""
    device = stream_device(resolve_stream(stream))
    info = require_persistence(device)
    g = set_aside_granularity(device)
    records = []
    bar = _Progress(2 * len(lut_sizes), "sweep lut-size", progress)
    for lut in lut_sizes:
        with ResetDataWorkload(lut, out_bytes, variant=variant, device=device) as w:
            base = measure_point(w, stream, w.buf, 0, None, warmup=warmup, repeat=repeat, label="baseline")
            bar.step(f"LUT {lut / MiB:g} MiB baseline")
            size = info.persisting_l2_cache_max_size if policy == "max" else min(info.persisting_l2_cache_max_size,
                                                                                   round_up(lut, g))
            rec = measure_point(w, stream, w.buf, size, min(1.0, size / lut), warmup=warmup, repeat=repeat, label=policy)
            rec.metrics["speedup_vs_baseline"] = base.median_ms / rec.median_ms
            records += [base, rec]
            bar.step(f"LUT {lut / MiB:g} MiB {policy}")
    return Report("sweep-lut-size", environment(device), records)


def sweep_tax(stream: object, *, set_asides: Optional[Sequence[int]] = None, nbytes: int = 1 << 30,
              warmup: int = 3, repeat: int = 9, progress: bool = True) -> Report:
    """The set-aside tax: write-only and copy bandwidth of plain kernels (no window anywhere) at each limit."""
    from .bench import measure_ceilings

    device = stream_device(resolve_stream(stream))
    sizes = list(set_asides) if set_asides is not None else set_aside_grid(device)
    records = []
    bar = _Progress(len(sizes), "sweep tax", progress)
    for size in sizes:
        with clean_state(stream, set_aside=size) as granted:
            c = measure_ceilings(stream, nbytes, warmup=warmup, repeat=repeat)
        rec = Record("tax", "ceilings", {"set_aside_requested": size, "set_aside_granted": granted, "nbytes": nbytes},
                     c.copy_ms, c.copy_ms, c.copy_ms, 0.0, repeat, True,
                     {"write_gbps": c.write_gbps, "copy_gbps": c.copy_gbps, "read_gbps": c.read_gbps,
                      "write_ms": c.write_ms, "copy_ms": c.copy_ms, "read_ms": c.read_ms})
        records.append(rec)
        bar.step(f"set-aside {granted / MiB:.2f} MiB: copy {c.copy_gbps:,.0f} GB/s")
    report = Report("sweep-tax", environment(device), records)
    first = records[0].metrics
    report.summary = {"copy_slowdown_at_max": first["copy_gbps"] / records[-1].metrics["copy_gbps"],
                      "write_slowdown_at_max": first["write_gbps"] / records[-1].metrics["write_gbps"]}
    return report


# ---- tuner ----------------------------------------------------------------------------------------


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
    bystander: Optional[dict] = None
    environment: dict = field(default_factory=dict)

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
    ref = resolve_stream(stream)
    device = stream_device(ref)
    info = require_persistence(device)
    grid = set_aside_grid(device, include_zero=False)
    nbytes = min(resolve_buffer(buf).nbytes, info.access_policy_max_window_size)
    bar = _Progress(0, "tune", progress)

    def point(size: int, ratio: Optional[float], label: str) -> Record:
        rec = measure_point(workload, stream, buf, size, ratio, warmup=warmup, repeat=repeat, label=label)
        bar.step(f"{label} {size / MiB:.2f} MiB {ratio}")
        return rec

    b1, b2 = point(0, None, "baseline"), point(0, None, "baseline")
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

    coarse = sorted({grid[min(k, len(grid)) - 1] for k in (1, 2, 3, 4, 6, 8)} | {grid[-1]})
    for size in coarse:
        for ratio in {1.0, min(1.0, size / nbytes)}:
            measure(size, ratio, "coarse")
    best = min(seen.items(), key=lambda kv: kv[1].median_ms)
    (size0, ratio0) = best[0]
    index = grid.index(size0)
    for size in grid[max(0, index - 1): index + 2]:
        fit = min(1.0, size / nbytes)
        ratios = {fit, 1.0} | {round(r, 1) for r in np.arange(0.1, 1.01, 0.1) if fit / 2 <= r <= min(1.0, 2 * fit)}
        for ratio in sorted(ratios):
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
    tax = None
    if bystander:
        tax = _bystander(stream, policy.set_aside if policy.enabled else 0)
    return TunedPolicy(policy, baseline_ms, best_ms, noise, table, time.monotonic() - start, tax, environment(device))


def _bystander(stream: object, set_aside: int, nbytes: int = 512 * MiB) -> dict:
    from .bench import measure_ceilings

    with clean_state(stream, set_aside=0):
        free = measure_ceilings(stream, nbytes, warmup=2, repeat=7)
    with clean_state(stream, set_aside=set_aside):
        taxed = measure_ceilings(stream, nbytes, warmup=2, repeat=7)
    return {"set_aside": set_aside, "copy_gbps_without": free.copy_gbps, "copy_gbps_with": taxed.copy_gbps,
            "copy_slowdown": free.copy_gbps / taxed.copy_gbps}
