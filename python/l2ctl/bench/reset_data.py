"""The main job: reset-data (a LUT repeated into a large output) for LUT sizes around the set-aside,
under each persistence policy, every output verified on the device."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from .. import kernels
from .._device import DeviceProperties, require_persistence
from .._limit import set_aside_granularity
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_nbytes, round_up
from .._units import MiB, format_bytes
from .._errors import check
from .progress import Progress
from .records import Record, Report, environment
from .state import clean_state, in_window, owned_stream
from .ceilings import measure_ceilings
from .timing import Timing, check_repeats, time_gpu

__all__ = ["RESET_COLUMNS", "default_lut_sizes", "bench_reset_data"]

#: The columns of the main benchmark: (name, description).
RESET_COLUMNS: tuple[tuple[str, str], ...] = (
    ("baseline", "no set-aside, no window, plain kernel"),
    ("recipe_hr1", "textbook recipe: set-aside min(0.75 x L2, max), window hit ratio 1.0"),
    ("recipe_fit", "textbook recipe: set-aside min(0.75 x L2, max), hit ratio set-aside/LUT"),
    ("right_sized", "set-aside = LUT rounded up to the granularity (capped), hit ratio set-aside/LUT"),
    ("hints", "no set-aside: L2 evict_last LUT loads + .cs stores"),
    ("annotated", "no set-aside: cuda::annotated_ptr<persisting> LUT"),
    ("seed_shape", "no set-aside: the blog's 32x1024 kernel with 64-bit i % n"),
)


def default_lut_sizes(l2_cache_size: int) -> list[int]:
    """LUT sizes scaled to the L2: on a 50 MiB L2 (H100) 1, 4, 8, 12, 16, 24, 32 and 48 MiB."""
    return [max(16, round_up(int(l2_cache_size * k / 50), 16)) for k in (1, 4, 8, 12, 16, 24, 32, 48)]


def _reset_plan(column: str, lut_bytes: int, info: DeviceProperties, granularity: int) -> tuple[int, Optional[float], str]:
    """(set-aside request, hit ratio or None for no window, kernel variant); hit ratio -1 means
    granted / LUT, computed once the driver has rounded the set-aside."""
    recipe = min(int(0.75 * info.l2_cache_size), info.persisting_l2_cache_max_size)
    return {
        "baseline": (0, None, "plain"),
        "recipe_hr1": (recipe, 1.0, "plain"),
        "recipe_fit": (recipe, -1.0, "plain"),
        "right_sized": (min(info.persisting_l2_cache_max_size, round_up(lut_bytes, granularity)), -1.0, "plain"),
        "hints": (0, None, "hinted"),
        "annotated": (0, None, "annotated"),
        "seed_shape": (0, None, "seed"),
    }[column]


def check_columns(columns: Optional[Sequence[str]]) -> list[str]:
    """The column names to run (all by default), validated without a device."""
    known = [c for c, _ in RESET_COLUMNS]
    names = list(columns) if columns is not None else list(known)
    for n in names:
        if n not in known:
            raise ValueError(f"unknown column {n!r}; one of {known}")
    if not names:
        raise ValueError("at least one column is needed")
    if len(set(names)) < len(names):  # the table has one column per name
        raise ValueError(f"columns: each at most once, got {names}")
    return names


def bench_reset_data(
    lut_sizes: Optional[Sequence[int]] = None,
    *,
    out_bytes: int = 1 << 30,
    columns: Optional[Sequence[str]] = None,
    stream: StreamLike = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    seed: int = 0,
    progress: bool = True,
    counters: bool = False,
) -> Report:
    """The main job: reset-data (a LUT repeated into ``out_bytes``) for LUT sizes from well inside the
    set-aside to past its max, under each policy in RESET_COLUMNS; every output verified."""
    warmup, repeat = check_repeats(warmup, repeat)
    names = check_columns(columns)
    out_bytes = check_nbytes(out_bytes, "out_bytes")
    for size in lut_sizes or ():
        if check_nbytes(size, "LUT size") % 4:
            raise ValueError(f"LUT sizes must be positive multiples of 4 bytes, got {size}")
    if lut_sizes is not None and len(set(lut_sizes)) < len(lut_sizes):  # the table has one row per size
        raise ValueError(f"LUT sizes: each at most once, got {list(lut_sizes)}")
    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    sizes = list(lut_sizes) if lut_sizes is not None else default_lut_sizes(info.l2_cache_size)
    rng = np.random.default_rng(seed)
    env = environment(info.index)
    records: list[Record] = []
    with Progress(len(sizes) * len(names) + 1, "reset-data", progress) as bar, owned_stream(stream, info.index) as s:
        with clean_state(s, set_aside=0):
            ceilings = measure_ceilings(s, out_bytes, warmup=warmup, repeat=repeat)
        bar.step("ceilings")
        with DeviceBuffer(round_up(out_bytes, 16), info.index, dtype=np.int32) as out:
            for lut_bytes in sizes:
                host_lut = rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32)
                with DeviceBuffer.from_numpy(host_lut, info.index, s) as lut:
                    baseline_ms = None
                    for column in names:
                        request, hit_ratio, variant = _reset_plan(column, lut_bytes, info, granularity)
                        rec = _measure_reset(s, out, lut, lut_bytes, column, request, hit_ratio, variant, warmup,
                                             repeat, counters)
                        if column == "baseline":
                            baseline_ms = rec.median_ms
                        rec.metrics["write_gbps"] = out.nbytes / rec.median_ms / 1e6
                        rec.metrics["fraction_of_write_ceiling"] = ceilings.write_ms / rec.median_ms
                        if baseline_ms is not None:
                            rec.metrics["speedup_vs_baseline"] = baseline_ms / rec.median_ms
                        records.append(rec)
                        bar.step(f"LUT {format_bytes(lut_bytes)} {column}")
    report = Report("reset-data", env, records, ceilings)
    report.environment["device"]["set_aside_granularity"] = granularity
    report.summary = _reset_summary(report, sizes, names)
    return report


def _measure_reset(stream: StreamLike, out: DeviceBuffer, lut: DeviceBuffer, lut_bytes: int, column: str, request: int,
                   hit_ratio: Optional[float], variant: str, warmup: int, repeat: int,
                   counters: bool = False) -> Record:
    shape: list[kernels.LaunchShape] = []
    collected: dict[str, float] = {}

    def run(st: StreamLike) -> None:
        shape[:] = [kernels.reset_data(out, lut, st, variant=variant)]

    def measure() -> Timing:
        timing = time_gpu(run, stream, warmup=warmup, repeat=repeat)
        if counters:  # one more launch, untimed, in the steady state of the timed ones: after another
            from .._counters import DEFAULT_METRICS, collect

            results, _ = collect(lambda: run(stream), setup=lambda: run(stream), metrics=DEFAULT_METRICS)
            collected.update(results[-1].values)
        return timing

    with clean_state(stream, set_aside=request) as granted:
        out.fill_bytes(0xFF, stream)  # poison: -1 never appears in the LUT
        ratio = None if hit_ratio is None else min(1.0, granted / lut_bytes) if hit_ratio < 0 else hit_ratio
        timing, applied_ratio = in_window(stream, lut, ratio, measure)
        mismatches = kernels.verify_reset_data(out, lut, stream)
    check(mismatches == 0, f"reset-data {column} LUT {lut_bytes} B: {mismatches} wrong words")
    launch = shape[0]
    config: dict[str, Any] = {
        "lut_bytes": lut_bytes, "out_bytes": out.nbytes, "set_aside_requested": request, "set_aside_granted": granted,
        "hit_ratio": applied_ratio, "window": hit_ratio is not None, "kernel_variant": variant,
        "blocks": launch.blocks, "threads": launch.threads, "vector_stores": launch.vector_out,
        "vector_lut_loads": launch.vector_lut}
    metrics: dict[str, Any] = {"mismatches": mismatches}
    if collected:
        metrics["counters"] = collected
    return Record.from_timing("reset-data", column, config, timing, metrics)


def _reset_summary(report: Report, sizes: Sequence[int], names: Sequence[str]) -> dict[str, Any]:
    table = [{"lut_bytes": size, **{name: report.find(name, lut_bytes=size).median_ms for name in names}}
             for size in sizes]
    summary: dict[str, Any] = {"table_ms": table}
    if "baseline" not in names:
        return summary

    def speedups(name: str) -> list[float]:
        return [row["baseline"] / row[name] for row in table]

    verdict = []
    gpu = report.environment["device"]["name"]
    if "right_sized" in names:
        sp = speedups("right_sized")
        wins = sum(x > 1.02 for x in sp)
        best = max(range(len(sp)), key=lambda i: sp[i])
        verdict.append(f"a right-sized set-aside beats no persistence at {wins}/{len(sp)} LUT sizes "
                       f"(best {sp[best]:.2f}x at {format_bytes(sizes[best])})")
    if "recipe_hr1" in names or "recipe_fit" in names:
        recipe = [min(row.get("recipe_hr1", math.inf), row.get("recipe_fit", math.inf)) for row in table]
        sp = [row["baseline"] / r for row, r in zip(table, recipe)]
        losses = sum(x < 0.98 for x in sp)
        verdict.append(f"the 75%-of-L2 recipe (better of its two hit ratios) is slower than doing nothing at "
                       f"{losses}/{len(sp)} sizes (worst {min(sp):.2f}x)")
    if "hints" in names:
        sp = speedups("hints")
        verdict.append(f"eviction hints alone, with no set-aside, reach up to {max(sp):.2f}x")
    if verdict:  # none when no column it speaks of was measured (the baseline alone)
        summary["verdict"] = f"{gpu}: " + "; ".join(verdict) + "."
    small = [r for r in report.records if r.config["lut_bytes"] <= 8 * MiB]
    summary["best_fraction_of_write_ceiling"] = (
        max(r.metrics["fraction_of_write_ceiling"] for r in small) if small else None)
    return summary
