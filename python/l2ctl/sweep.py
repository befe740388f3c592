"""Sweeps over hit ratio, set-aside and LUT size, and the set-aside tax.

A workload is what ``l2ctl.workloads`` describes: a callable ``f(stream)`` or an object with ``enqueue``
and, optionally, ``verify`` (without it, records say unverified). Every point starts from a declared
state (bench.clean_state: limit set, no window, lines reset, L2 flushed); the limit is restored after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, Union

from ._memory import BufferLike, StreamLike
from ._device import require_persistence, stream_device
from ._errors import check
from ._limit import set_aside_grid, set_aside_granularity
from ._interop import resolve_buffer, resolve_stream
from ._plan import check_nbytes, check_set_aside, hit_ratio_grid, normalize_hit_ratio, parse_set_aside_request, round_up
from ._units import format_bytes
from .kernels import check_variant
from .bench.ceilings import measure_ceilings
from .bench.progress import Progress
from .bench.records import Record, Report, environment
from .bench.state import clean_state, in_window
from .bench.timing import check_repeats, time_gpu
from .workloads import describe, enqueue_of, verifier_of
from .workloads.reset_data import ResetDataWorkload

__all__ = ["ResetDataWorkload", "measure_point", "sweep_hit_ratio", "sweep_set_aside", "sweep_surface",
           "sweep_lut_size", "sweep_tax", "set_aside_grid", "SweepResult"]


def measure_point(workload: Any, stream: StreamLike, buf: BufferLike, set_aside: int, hit_ratio: Optional[float], *,
                  warmup: int = 3, repeat: int = 9, label: str = "point") -> Record:
    """One verified measurement: limit ``set_aside`` bytes, and a window over ``buf`` with ``hit_ratio``
    (None: no window)."""
    enqueue = enqueue_of(workload)
    warmup, repeat = check_repeats(warmup, repeat)
    set_aside = check_nbytes(set_aside, "set_aside", allow_zero=True)
    if hit_ratio is not None:
        hit_ratio = normalize_hit_ratio(hit_ratio)
        resolve_buffer(buf)
    with clean_state(stream, set_aside=set_aside) as granted:
        if hasattr(workload, "poison"):
            workload.poison(stream)
        timing, applied = in_window(stream, buf, hit_ratio,
                                    lambda: time_gpu(enqueue, stream, warmup=warmup, repeat=repeat))
        verify = verifier_of(workload)
        verified = verify is not None and bool(verify(stream))
        check(verified or verify is None, f"{label}: set-aside {granted}, hit ratio {hit_ratio}")
    config = {**describe(workload), "set_aside_requested": set_aside, "set_aside_granted": granted,
              "hit_ratio": applied, "window_bytes": resolve_buffer(buf).nbytes if hit_ratio is not None else 0}
    return Record.from_timing("sweep", label, config, timing, {}, verified)


@dataclass
class SweepResult:
    kind: str
    records: list[Record]
    baseline: Record
    environment: dict[str, Any]

    def report(self) -> Report:
        return Report(f"sweep-{self.kind}", self.environment, [self.baseline] + self.records, summary={
            "baseline_ms": self.baseline.median_ms,
            "best": min(self.records, key=lambda x: x.median_ms).config if self.records else None})

    def speedups(self) -> list[float]:
        return [self.baseline.median_ms / r.median_ms for r in self.records]


def _check_sweep(workload: Any, buf: BufferLike, warmup: int, repeat: int) -> tuple[int, int]:
    """What every sweep checks before it touches the device: the workload, the buffer, the counts."""
    enqueue_of(workload)
    resolve_buffer(buf)
    return check_repeats(warmup, repeat)


def _sizes(values: Sequence[int], name: str) -> list[int]:
    sizes = [check_nbytes(v, name, allow_zero=True) for v in values]
    if not sizes:
        raise ValueError(f"{name}: at least one value is needed")
    return sizes


def _set_asides(values: Optional[Sequence[int]], stream: StreamLike, include_zero: bool = False) -> list[int]:
    """The set-asides given (checked), or every limit the driver can grant on the stream's device."""
    if values is not None:
        return _sizes(values, "set_asides")
    return set_aside_grid(stream_device(resolve_stream(stream)), include_zero=include_zero)


def _ratios(values: Sequence[float]) -> list[float]:
    ratios = [normalize_hit_ratio(h) for h in values]
    if not ratios:
        raise ValueError("hit_ratios: at least one value is needed")
    return ratios


def _run(kind: str, workload: Any, stream: StreamLike, buf: BufferLike, points: Sequence[tuple[int, Optional[float]]],
         warmup: int, repeat: int, progress: bool) -> SweepResult:
    device = stream_device(resolve_stream(stream))
    bar = Progress(len(points) + 1, f"sweep {kind}", progress)
    baseline = measure_point(workload, stream, buf, 0, None, warmup=warmup, repeat=repeat, label="baseline")
    bar.step("baseline")
    records = []
    for set_aside, hit_ratio in points:
        rec = measure_point(workload, stream, buf, set_aside, hit_ratio, warmup=warmup, repeat=repeat, label=kind)
        rec.metrics["speedup_vs_baseline"] = baseline.median_ms / rec.median_ms
        records.append(rec)
        bar.step(f"set-aside {format_bytes(set_aside)}, hit ratio {hit_ratio}")
    return SweepResult(kind, records, baseline, environment(device))


def sweep_hit_ratio(workload: Any, stream: StreamLike, buf: BufferLike, *,
                    set_aside: Union[int, float, Literal["max"], None] = None,
                    hit_ratios: Optional[Sequence[float]] = None, warmup: int = 3, repeat: int = 9,
                    progress: bool = True) -> SweepResult:
    """Time against hit ratio at one set-aside (default: buf rounded up to the granularity, capped; else what
    l2ctl.set_aside takes: bytes, "max" or a fraction of the max). Hit ratios come from an exact grid (i / 10),
    never accumulated."""
    warmup, repeat = _check_sweep(workload, buf, warmup, repeat)
    ratios = _ratios(hit_ratios if hit_ratios is not None else hit_ratio_grid(11))
    if set_aside is not None:
        check_set_aside(set_aside)
    info = require_persistence(stream_device(resolve_stream(stream)))
    if set_aside is None:
        nbytes = min(info.persisting_l2_cache_max_size,
                     round_up(resolve_buffer(buf).nbytes, set_aside_granularity(info.index)))
    else:
        nbytes = parse_set_aside_request(set_aside, info.persisting_l2_cache_max_size)
    return _run("hit-ratio", workload, stream, buf, [(nbytes, h) for h in ratios], warmup, repeat, progress)


def sweep_set_aside(workload: Any, stream: StreamLike, buf: BufferLike, *, hit_ratio: Optional[float] = None,
                    set_asides: Optional[Sequence[int]] = None, warmup: int = 3, repeat: int = 9,
                    progress: bool = True) -> SweepResult:
    """Time against the set-aside (every granule by default). ``hit_ratio=None``: min(1, set-aside / buf)."""
    warmup, repeat = _check_sweep(workload, buf, warmup, repeat)
    if hit_ratio is not None:
        hit_ratio = normalize_hit_ratio(hit_ratio)
    nbytes = resolve_buffer(buf).nbytes
    sizes = _set_asides(set_asides, stream)
    points = [(s, hit_ratio if hit_ratio is not None else min(1.0, s / nbytes)) for s in sizes]
    return _run("set-aside", workload, stream, buf, points, warmup, repeat, progress)


def sweep_surface(workload: Any, stream: StreamLike, buf: BufferLike, *, set_asides: Optional[Sequence[int]] = None,
                  hit_ratios: Optional[Sequence[float]] = None, warmup: int = 2, repeat: int = 7,
                  progress: bool = True) -> SweepResult:
    """The 2-D surface set-aside x hit ratio (every granule x 0.1 .. 1.0 by default)."""
    warmup, repeat = _check_sweep(workload, buf, warmup, repeat)
    ratios = _ratios(hit_ratios if hit_ratios is not None else hit_ratio_grid(10, 0.1, 1.0))
    sizes = _set_asides(set_asides, stream)
    return _run("surface", workload, stream, buf, [(s, h) for s in sizes for h in ratios], warmup, repeat, progress)


def sweep_lut_size(lut_sizes: Sequence[int], stream: StreamLike, *, out_bytes: int = 1 << 30, policy: str = "right_sized",
                   variant: str = "plain", warmup: int = 3, repeat: int = 9, progress: bool = True) -> Report:
    """reset-data over LUT sizes, baseline vs one policy ("right_sized": the LUT rounded up to the
    granularity, hit ratio set-aside / LUT; "max": the largest set-aside, same rule)."""
    warmup, repeat = check_repeats(warmup, repeat)
    if policy not in ("right_sized", "max"):
        raise ValueError(f"policy must be 'right_sized' or 'max', got {policy!r}")
    luts = _sizes(lut_sizes, "lut_sizes")
    if any(lut == 0 or lut % 4 for lut in luts):
        raise ValueError(f"LUT sizes must be positive multiples of 4 bytes, got {luts}")
    out_bytes = check_nbytes(out_bytes, "out_bytes")
    check_variant(variant)
    device = stream_device(resolve_stream(stream))
    cap = require_persistence(device).persisting_l2_cache_max_size
    g = set_aside_granularity(device)
    records = []
    bar = Progress(2 * len(luts), "sweep lut-size", progress)
    for lut in luts:
        with ResetDataWorkload(lut, out_bytes, variant=variant, device=device) as w:
            base = measure_point(w, stream, w.buf, 0, None, warmup=warmup, repeat=repeat, label="baseline")
            bar.step(f"LUT {format_bytes(lut)} baseline")
            size = cap if policy == "max" else min(cap, round_up(lut, g))
            rec = measure_point(w, stream, w.buf, size, min(1.0, size / lut), warmup=warmup, repeat=repeat, label=policy)
            rec.metrics["speedup_vs_baseline"] = base.median_ms / rec.median_ms
            records += [base, rec]
            bar.step(f"LUT {format_bytes(lut)} {policy}")
    return Report("sweep-lut-size", environment(device), records)


def sweep_tax(stream: StreamLike, *, set_asides: Optional[Sequence[int]] = None, nbytes: int = 1 << 30,
              warmup: int = 3, repeat: int = 9, progress: bool = True) -> Report:
    """The set-aside tax: write-only and copy bandwidth of plain kernels (no window anywhere) at each limit."""
    warmup, repeat = check_repeats(warmup, repeat)
    nbytes = check_nbytes(nbytes, "nbytes")
    sizes = _set_asides(set_asides, stream, include_zero=True)
    device = stream_device(resolve_stream(stream))
    records = []
    bar = Progress(len(sizes), "sweep tax", progress)
    for size in sizes:
        with clean_state(stream, set_aside=size) as granted:
            c = measure_ceilings(stream, nbytes, warmup=warmup, repeat=repeat)
        records.append(Record(
            "tax", "ceilings", {"set_aside_requested": size, "set_aside_granted": granted, "nbytes": nbytes},
            c.copy_ms, c.copy_ms, c.copy_ms, 0.0, repeat, True,
            {"write_gbps": c.write_gbps, "copy_gbps": c.copy_gbps, "read_gbps": c.read_gbps,
             "write_ms": c.write_ms, "copy_ms": c.copy_ms, "read_ms": c.read_ms}))
        bar.step(f"set-aside {format_bytes(granted)}: copy {c.copy_gbps:,.0f} GB/s")
    report = Report("sweep-tax", environment(device), records)
    first = records[0].metrics
    report.summary = {"copy_slowdown_at_max": first["copy_gbps"] / records[-1].metrics["copy_gbps"],
                      "write_slowdown_at_max": first["write_gbps"] / records[-1].metrics["write_gbps"]}
    return report

