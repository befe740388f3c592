"""Benchmark harness: CUDA-event timing, declared device state, verified outputs, JSON/CSV records.

Every number reported here comes from a run whose output was checked on the device (mismatch counts
or checksums) before the number was kept; a failed check raises VerificationError.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import _backend, kernels
from ._device import device_info, require_persistence, resolve_device, set_aside_granularity, versions
from ._errors import L2BudgetWarning, L2ctlError
from ._interop import resolve_stream
from ._memory import DeviceBuffer, Stream
from ._persist import persist
from ._plan import round_up
from ._window import AccessPolicyWindow, get_window, stream_device

__all__ = [
    "VerificationError",
    "Timing",
    "time_gpu",
    "flush_l2",
    "clean_state",
    "Ceilings",
    "measure_ceilings",
    "Record",
    "Report",
    "environment",
    "bench_reset_data",
    "bench_stride",
    "bench_cache_streaming",
    "default_lut_sizes",
    "RESET_COLUMNS",
    "bench_graph",
    "bench_concurrent",
]

GB = 1e9
MiB = 1 << 20


class VerificationError(L2ctlError, AssertionError):
    """A benchmark's output was wrong; its timing is discarded."""


# ---- timing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Per-repetition times (ms) of one measured region."""

    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.times_ms))

    @property
    def min_ms(self) -> float:
        return float(min(self.times_ms))

    @property
    def max_ms(self) -> float:
        return float(max(self.times_ms))

    @property
    def spread(self) -> float:
        """Inter-quartile range over the median: the noise of this measurement."""
        if len(self.times_ms) < 4:
            return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms else 0.0
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4)
        return (q3 - q1) / self.median_ms if self.median_ms else 0.0


def time_gpu(
    enqueue: Callable[[Any], Any],
    stream: object = None,
    *,
    warmup: int = 3,
    repeat: int = 15,
    flush: Optional[Callable[[], Any]] = None,
) -> Timing:
    """Time ``enqueue(stream)`` with a pair of CUDA events per repetition, after ``warmup`` untimed runs.

    ``flush`` (e.g. ``lambda: flush_l2(stream)``) runs before every repetition, outside the timed region:
    cold-L2 timing. Repetitions are queued back to back and read after, so host overhead stays out.
    """
    if warmup < 0 or repeat < 1:
        raise ValueError("warmup must be >= 0 and repeat >= 1")
    ref = resolve_stream(stream)
    backend = _backend.current()
    for _ in range(warmup):
        if flush is not None:
            flush()
        enqueue(stream)
    events = [backend.EventPair() for _ in range(repeat)]
    for pair in events:
        if flush is not None:
            flush()
        pair.record_start(ref.handle)
        enqueue(stream)
        pair.record_stop(ref.handle)
    return Timing(tuple(float(pair.elapsed_ms()) for pair in events))


# ---- device state -------------------------------------------------------------------------------

_scratch: dict[int, tuple[DeviceBuffer, DeviceBuffer]] = {}


def flush_l2(stream: object = None, *, persisting: bool = True) -> None:
    """Evict L2 (queued on ``stream``): write a scratch region twice the L2 size, then read a different
    one of the same size, so L2 ends holding clean lines and no write-back of earlier data lands in the
    next measurement (reading lines just written would leave them dirty). With ``persisting``, first
    demote persisting lines too (normal accesses do not evict them)."""
    ref = resolve_stream(stream)
    device = stream_device(ref)
    if device not in _scratch:
        scratch = DeviceBuffer(4 * device_info(device).l2_cache_size, device)
        partials = DeviceBuffer(8 * kernels.max_read_partials(device), device)
        _scratch[device] = (scratch, partials)
    scratch, partials = _scratch[device]
    if persisting and device_info(device).supports_persistence:
        _backend.current().reset_persisting_lines(device)
    half = scratch.nbytes // 2
    _backend.current().memset_device(scratch.ptr, 0x5A, half, resolve_stream(stream).handle)
    kernels.read_sum((scratch.ptr + half, half), partials, stream)


@contextmanager
def clean_state(stream: object = None, *, set_aside: Optional[int] = 0, flush: bool = True) -> Iterator[int]:
    """A declared starting state for measuring work on ``stream``: no window on the stream, the limit
    set to ``set_aside`` bytes (None: unchanged), persisting lines reset, L2 flushed. Yields the granted
    limit. Afterwards the stream's window and the device's limit are put back and lines reset.
    """
    ref = resolve_stream(stream)
    device = stream_device(ref)
    backend = _backend.current()
    info = device_info(device)
    previous_window = backend.get_stream_window(ref.handle)
    previous_limit = info.persisting_l2_cache_size
    try:
        backend.set_stream_window(ref.handle, *AccessPolicyWindow().as_tuple())
        granted = previous_limit
        if info.supports_persistence:
            if set_aside is not None and set_aside != previous_limit:
                granted = int(backend.set_persisting_limit(device, int(set_aside)))
            backend.reset_persisting_lines(device)
        if flush:
            flush_l2(stream)
        backend.stream_synchronize(ref.handle)
        yield granted
    finally:
        backend.stream_synchronize(ref.handle)
        backend.set_stream_window(ref.handle, *previous_window)
        if info.supports_persistence:
            backend.reset_persisting_lines(device)
            if int(backend.get_persisting_limit(device)) != previous_limit:
                backend.set_persisting_limit(device, previous_limit)


# ---- records ------------------------------------------------------------------------------------


def environment(device: object = None) -> dict:
    """Device, driver, runtime and package versions for a benchmark record."""
    from . import __version__

    info = device_info(device)
    v = versions()
    return {
        "device": {
            "index": info.index,
            "name": info.name,
            "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1]}",
            "multiprocessor_count": info.multiprocessor_count,
            "l2_cache_size": info.l2_cache_size,
            "persisting_l2_cache_max_size": info.persisting_l2_cache_max_size,
            "access_policy_max_window_size": info.access_policy_max_window_size,
            "persisting_limit_at_start": info.persisting_l2_cache_size,
            "set_aside_granularity": info.set_aside_granularity,
            "total_memory": info.total_memory,
            "pci_bus_id": info.pci_bus_id,
            "uuid": info.uuid,
        },
        "driver_version": v["driver"],
        "runtime_version": v["runtime"],
        "l2ctl_version": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass
class Record:
    """One verified measurement."""

    benchmark: str
    variant: str
    config: dict
    median_ms: float
    min_ms: float
    max_ms: float
    spread: float
    repeat: int
    verified: bool
    metrics: dict = field(default_factory=dict)

    @classmethod
    def from_timing(cls, benchmark: str, variant: str, config: dict, timing: Timing, metrics: dict) -> "Record":
        return cls(benchmark, variant, config, timing.median_ms, timing.min_ms, timing.max_ms, timing.spread,
                   len(timing.times_ms), True, metrics)

    def flat(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "metrics")}
        row.update({f"config.{k}": v for k, v in self.config.items()})
        row.update({f"metrics.{k}": v for k, v in self.metrics.items()})
        return row


@dataclass
class Ceilings:
    """Bandwidth ceilings measured with l2ctl's own kernels (GB/s = 1e9 B/s; copy counts read + write)."""

    nbytes: int
    write_gbps: float
    copy_gbps: float
    read_gbps: float
    write_ms: float
    copy_ms: float
    read_ms: float


@dataclass
class Report:
    benchmark: str
    environment: dict
    records: list[Record]
    ceilings: Optional[Ceilings] = None
    summary: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "benchmark": self.benchmark,
            "environment": self.environment,
            "ceilings": None if self.ceilings is None else asdict(self.ceilings),
            "summary": self.summary,
            "records": [asdict(r) for r in self.records],
        }

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, default=_json_default)
            f.write("\n")

    def to_csv(self, path: str) -> None:
        rows = [r.flat() for r in self.records]
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    def find(self, variant: str, **config: Any) -> Record:
        for r in self.records:
            if r.variant == variant and all(r.config.get(k) == v for k, v in config.items()):
                return r
        raise KeyError(f"no record {variant} {config}")


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


class _Progress:
    """A progress line on stderr: a bar on a terminal, one line per step otherwise."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.done, self.enabled = total, label, 0, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {what:<40}")
            if self.done >= self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(f"{self.label} {self.done}/{self.total} {what} ({time.monotonic() - self.start:.1f} s)\n")
        sys.stderr.flush()


def _verify(ok: bool, what: str) -> None:
    if not ok:
        raise VerificationError(f"verification failed: {what}; the timing was discarded")


# ---- ceilings -----------------------------------------------------------------------------------


def measure_ceilings(stream: object = None, nbytes: int = 1 << 30, *, warmup: int = 3, repeat: int = 15) -> Ceilings:
    """Write-only, copy and read bandwidth of ``nbytes`` buffers with l2ctl's 16-byte kernels, each verified.
    Run inside clean_state() to measure with a given set-aside (the set-aside lowers these)."""
    nbytes = round_up(nbytes, 16)
    ref = resolve_stream(stream)
    device = stream_device(ref)
    words = nbytes // 4
    with DeviceBuffer(nbytes, device) as a, DeviceBuffer(nbytes, device) as b, \
            DeviceBuffer(8 * kernels.max_read_partials(device), device) as partials:
        write = time_gpu(lambda s: kernels.write_index(a, s), stream, warmup=warmup, repeat=repeat)
        _verify(kernels.count_index_mismatches(a, stream) == 0, "write_index left wrong words")
        b.fill_bytes(0xFF, stream)
        copy = time_gpu(lambda s: kernels.copy_words(b, a, s), stream, warmup=warmup, repeat=repeat)
        _verify(kernels.count_mismatches(a, b, stream) == 0, "copy_words left wrong words")
        blocks = [0]

        def read(s: object) -> None:
            blocks[0] = kernels.read_sum(a, partials, s)

        rd = time_gpu(read, stream, warmup=warmup, repeat=repeat)
        expected = (words * (words - 1) // 2) % (1 << 64)
        _verify(kernels.sum_u64(partials, blocks[0], stream) == expected, "read_sum checksum")
    return Ceilings(nbytes, nbytes / write.median_ms / 1e6, 2 * nbytes / copy.median_ms / 1e6,
                    nbytes / rd.median_ms / 1e6, write.median_ms, copy.median_ms, rd.median_ms)


# ---- reset data ---------------------------------------------------------------------------------

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


def _reset_plan(column: str, lut_bytes: int, info: Any, granularity: int) -> tuple[int, Optional[float], str]:
    """(set-aside request, hit ratio or None for no window, kernel variant); hit ratio -1 means
    granted / LUT, computed once the driver has rounded the set-aside."""
    recipe = min(int(0.75 * info.l2_cache_size), info.persisting_l2_cache_max_size)
    if column == "baseline":
        return 0, None, "plain"
    if column == "recipe_hr1":
        return recipe, 1.0, "plain"
    if column == "recipe_fit":
        return recipe, -1.0, "plain"
    if column == "right_sized":
        return min(info.persisting_l2_cache_max_size, round_up(lut_bytes, granularity)), -1.0, "plain"
    if column == "hints":
        return 0, None, "hinted"
    if column == "annotated":
        return 0, None, "annotated"
    if column == "seed_shape":
        return 0, None, "seed"
    raise ValueError(f"unknown column {column!r}; one of {[c for c, _ in RESET_COLUMNS]}")


def bench_reset_data(
    lut_sizes: Optional[Sequence[int]] = None,
    *,
    out_bytes: int = 1 << 30,
    columns: Optional[Sequence[str]] = None,
    stream: object = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    seed: int = 0,
    progress: bool = True,
    counters: bool = False,
) -> Report:
    """The main job: reset-data (a LUT repeated into ``out_bytes``) for LUT sizes from well inside the
    set-aside to past its max, under each policy in RESET_COLUMNS; every output verified."""
    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    sizes = list(lut_sizes) if lut_sizes is not None else default_lut_sizes(info.l2_cache_size)
    names = list(columns) if columns is not None else [c for c, _ in RESET_COLUMNS]
    for n in names:
        _reset_plan(n, 16, info, granularity)  # validates names before any allocation
    for size in sizes:
        if size <= 0 or size % 4:
            raise ValueError(f"LUT sizes must be positive multiples of 4 bytes, got {size}")
    own_stream = Stream(info.index) if stream is None else None
    s = own_stream if own_stream is not None else stream
    rng = np.random.default_rng(seed)
    env = environment(info.index)
    records: list[Record] = []
    bar = _Progress(len(sizes) * len(names) + 1, "reset-data", progress)
    try:
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
                        rec = _measure_reset(s, out, lut, lut_bytes, column, request, hit_ratio, variant, warmup, repeat,
                                             counters)
                        if column == "baseline":
                            baseline_ms = rec.median_ms
                        rec.metrics["write_gbps"] = out.nbytes / rec.median_ms / 1e6
                        rec.metrics["fraction_of_write_ceiling"] = ceilings.write_ms / rec.median_ms
                        if baseline_ms is not None:
                            rec.metrics["speedup_vs_baseline"] = baseline_ms / rec.median_ms
                        records.append(rec)
                        bar.step(f"LUT {lut_bytes / MiB:.2f} MiB {column}")
    finally:
        if own_stream is not None:
            own_stream.close()
    report = Report("reset-data", env, records, ceilings)
    report.environment["device"]["set_aside_granularity"] = granularity
    report.summary = _reset_summary(report, sizes, names)
    return report


def _measure_reset(stream: object, out: DeviceBuffer, lut: DeviceBuffer, lut_bytes: int, column: str, request: int,
                   hit_ratio: Optional[float], variant: str, warmup: int, repeat: int,
                   counters: bool = False) -> Record:
    shape: list[Any] = []
    collected: dict = {}

    def run(st: object) -> None:
        shape[:] = [kernels.reset_data(out, lut, st, variant=variant)]

    def measure() -> Timing:
        timing = time_gpu(run, stream, warmup=warmup, repeat=repeat)
        if counters:  # one more launch, untimed, in the steady state of the timed ones: after another
            from ._counters import DEFAULT_METRICS, collect

            results, _ = collect(lambda: run(stream), setup=lambda: run(stream), metrics=DEFAULT_METRICS)
            collected.update(results[-1].values)
        return timing

    with clean_state(stream, set_aside=request) as granted:
        out.fill_bytes(0xFF, stream)  # poison: -1 never appears in the LUT
        applied_ratio: Optional[float] = None
        if hit_ratio is None:
            timing = measure()
        else:
            applied_ratio = min(1.0, granted / lut_bytes) if hit_ratio < 0 else hit_ratio
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", L2BudgetWarning)  # recipe_hr1 oversubscribes on purpose
                with persist(stream, lut, applied_ratio, set_aside=None) as p:
                    timing = measure()
                    applied_ratio = p.window.hit_ratio
        mismatches = kernels.verify_reset_data(out, lut, stream)
    _verify(mismatches == 0, f"reset-data {column} LUT {lut_bytes} B: {mismatches} wrong words")
    config = {
        "lut_bytes": lut_bytes,
        "out_bytes": out.nbytes,
        "set_aside_requested": request,
        "set_aside_granted": granted,
        "hit_ratio": applied_ratio,
        "window": hit_ratio is not None,
        "kernel_variant": variant,
        "blocks": shape[0].blocks,
        "threads": shape[0].threads,
        "vector_stores": shape[0].vector_out,
        "vector_lut_loads": shape[0].vector_lut,
    }
    metrics: dict = {"mismatches": mismatches}
    if collected:
        metrics["counters"] = collected
    return Record.from_timing("reset-data", column, config, timing, metrics)


def _reset_summary(report: Report, sizes: Sequence[int], names: Sequence[str]) -> dict:
    table = []
    for size in sizes:
        row = {"lut_bytes": size}
        for name in names:
            row[name] = report.find(name, lut_bytes=size).median_ms
        table.append(row)
    summary: dict = {"table_ms": table}
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
                       f"(best {sp[best]:.2f}x at {sizes[best] / MiB:g} MiB)")
    if "recipe_hr1" in names or "recipe_fit" in names:
        recipe = [min(row.get("recipe_hr1", math.inf), row.get("recipe_fit", math.inf)) for row in table]
        sp = [row["baseline"] / r for row, r in zip(table, recipe)]
        losses = sum(x < 0.98 for x in sp)
        verdict.append(f"the 75%-of-L2 recipe (better of its two hit ratios) is slower than doing nothing at "
                       f"{losses}/{len(sp)} sizes (worst {min(sp):.2f}x)")
    if "hints" in names:
        sp = speedups("hints")
        verdict.append(f"eviction hints alone, with no set-aside, reach up to {max(sp):.2f}x")
    summary["verdict"] = f"{gpu}: " + "; ".join(verdict) + "."
    summary["best_fraction_of_write_ceiling"] = max(
        (r.metrics["fraction_of_write_ceiling"], r.variant, r.config["lut_bytes"]) for r in report.records
        if r.config["lut_bytes"] <= 8 * MiB)[0] if any(r.config["lut_bytes"] <= 8 * MiB for r in report.records) else None
    return summary


# ---- strided loads ------------------------------------------------------------------------------


def bench_stride(
    strides: Sequence[int] = (4, 8, 16, 32, 64, 128),
    *,
    threads: int = 1 << 25,
    stream: object = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    progress: bool = True,
) -> Report:
    """One 4-byte load per thread at each stride, no set-aside; sector and DRAM throughput from l2ctl's
    sector model, compared with the read ceiling measured on the same buffer."""
    index = resolve_device(device)
    strides = [int(s) for s in strides]
    for st in strides:
        if st <= 0 or st % 4:
            raise ValueError(f"strides must be positive multiples of 4 bytes, got {st}")
    max_words = max(strides) // 4
    nbytes = round_up(((threads - 1) * max_words + 1) * 4, 16)
    own_stream = Stream(index) if stream is None else None
    s = own_stream if own_stream is not None else stream
    records: list[Record] = []
    bar = _Progress(len(strides) + 1, "stride", progress)
    blocks_max = -(-threads // 256)
    try:
        with clean_state(s, set_aside=0), DeviceBuffer(nbytes, index) as buf, \
                DeviceBuffer(8 * max(blocks_max, kernels.max_read_partials(index)), index) as partials:
            kernels.write_index(buf, s)
            _verify(kernels.count_index_mismatches(buf, s) == 0, "stride buffer fill")
            words = nbytes // 4
            nblocks = [0]

            def read(st_: object) -> None:
                nblocks[0] = kernels.read_sum(buf, partials, st_)

            rd = time_gpu(read, s, warmup=warmup, repeat=repeat)
            _verify(kernels.sum_u64(partials, nblocks[0], s) == (words * (words - 1) // 2) % (1 << 64), "read ceiling")
            read_gbps = nbytes / rd.median_ms / 1e6
            bar.step("read ceiling")
            for stride in strides:
                sw = stride // 4

                def run(st_: object, sw: int = sw) -> None:
                    nblocks[0] = kernels.stride_read(buf, sw * 4, partials, st_, threads=threads)

                timing = time_gpu(run, s, warmup=warmup, repeat=repeat)
                total = kernels.sum_u64(partials, nblocks[0], s)
                _verify(total == sw * threads * (threads - 1) // 2 % (1 << 64), f"stride {stride} B checksum")
                requests = threads / 32
                spr = kernels.sectors_per_request(stride)
                dram = kernels.dram_bytes_per_request(stride)
                t = timing.median_ms / 1e3
                metrics = {
                    "useful_gbps": threads * 4 / t / GB,
                    "sectors_per_request_model": spr,
                    "sector_gbps": requests * spr * 32 / t / GB,
                    "dram_bytes_per_request_model": dram,
                    "dram_model_gbps": requests * dram / t / GB,
                    "read_ceiling_gbps": read_gbps,
                }
                metrics["sector_fraction_of_read_ceiling"] = metrics["sector_gbps"] / read_gbps
                metrics["dram_fraction_of_read_ceiling"] = metrics["dram_model_gbps"] / read_gbps
                records.append(Record.from_timing("stride", f"{stride}B", {"stride_bytes": stride, "threads": threads,
                                                                            "buffer_bytes": nbytes}, timing, metrics))
                bar.step(f"stride {stride} B")
    finally:
        if own_stream is not None:
            own_stream.close()
    report = Report("stride", environment(index), records)
    report.summary = {"read_ceiling_gbps": read_gbps, "read_ceiling_ms": rd.median_ms}
    return report


# ---- cache streaming ----------------------------------------------------------------------------


def bench_cache_streaming(
    n: int = 10_000_000,
    *,
    stream: object = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    seed: int = 0,
    progress: bool = True,
) -> Report:
    """The cache-streaming document's two scenarios, normal loads vs ld.global.cs, no set-aside.
    Outputs of both versions must be bit-identical and match a float64 NumPy reference."""
    index = resolve_device(device)
    rng = np.random.default_rng(seed)
    own_stream = Stream(index) if stream is None else None
    s = own_stream if own_stream is not None else stream
    records: list[Record] = []
    bar = _Progress(4, "cache-streaming", progress)
    try:
        values = rng.random(n, dtype=np.float32)
        indices = rng.integers(0, 1024, size=n, dtype=np.int32)
        dense = rng.random(1024, dtype=np.float32)
        ref_sparse = values * dense[indices].astype(np.float64) + np.sin(values.astype(np.float64) * 0.1)
        data = rng.random(8 * n, dtype=np.float32)
        cats = rng.integers(0, 32, size=8 * n, dtype=np.int32)
        weights = rng.random(32, dtype=np.float32)
        x = data.astype(np.float64).reshape(n, 8)
        ref_stream = (x * weights[cats.reshape(n, 8)] + np.cos(x * 0.01)).sum(axis=1)
        with clean_state(s, set_aside=0):
            bufs = [DeviceBuffer.from_numpy(a, index, s) for a in (values, indices, dense, data, cats, weights)]
            dv, di, dd, dx, dc, dw = bufs
            outs = {k: DeviceBuffer(4 * n, index, dtype=np.float32) for k in ("sn", "sc", "an", "ac")}
            try:
                results = {}
                for scenario, key, streaming in (("sparse_vector", "sn", False), ("sparse_vector", "sc", True),
                                                 ("stream_analysis", "an", False), ("stream_analysis", "ac", True)):
                    o = outs[key]
                    o.fill_bytes(0xFF, s)  # NaN poison
                    if scenario == "sparse_vector":
                        fn = lambda st, o=o, c=streaming: kernels.sparse_vector(dv, di, dd, o, st, streaming=c)
                        moved = n * 12
                    else:
                        fn = lambda st, o=o, c=streaming: kernels.stream_analysis(dx, dc, dw, o, st, streaming=c)
                        moved = n * 8 * 8 + n * 4
                    timing = time_gpu(fn, s, warmup=warmup, repeat=repeat)
                    got = o.to_numpy(s)
                    results[key] = got
                    ref = ref_sparse if scenario == "sparse_vector" else ref_stream
                    err = float(np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref))))
                    _verify(bool(np.all(np.isfinite(got))) and err < 1e-5, f"{scenario} {key} max error {err:g}")
                    rec = Record.from_timing("cache-streaming", f"{scenario}/{'cs' if streaming else 'normal'}",
                                             {"n": n, "scenario": scenario, "streaming_loads": streaming}, timing,
                                             {"max_rel_error_vs_float64": err, "gbps": moved / timing.median_ms / 1e6})
                    records.append(rec)
                    bar.step(f"{scenario} {'cs' if streaming else 'normal'}")
                _verify(np.array_equal(results["sn"], results["sc"]), "sparse_vector normal and .cs outputs differ")
                _verify(np.array_equal(results["an"], results["ac"]), "stream_analysis normal and .cs outputs differ")
            finally:
                for b in list(bufs) + list(outs.values()):
                    b.free()
    finally:
        if own_stream is not None:
            own_stream.close()
    report = Report("cache-streaming", environment(index), records)
    for scenario in ("sparse_vector", "stream_analysis"):
        normal = report.find(f"{scenario}/normal").median_ms
        cs = report.find(f"{scenario}/cs").median_ms
        report.summary[f"{scenario}_speedup_cs"] = normal / cs
    return report


# ---- graphs and concurrent streams ------------------------------------------------------------


def bench_graph(
    lut_bytes: Optional[int] = None,
    *,
    out_bytes: int = 1 << 30,
    kernels_per_graph: int = 4,
    stream: object = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
) -> Report:
    """Replays of a captured graph of reset-data kernels, with no window and with a window applied to
    its kernel nodes by ``l2ctl.persist(graph, lut)`` (right-sized set-aside). Outputs verified."""
    from . import graph as graphs

    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    lut_bytes = lut_bytes or round_up(info.l2_cache_size * 4 // 50, 16)
    own_stream = Stream(info.index) if stream is None else None
    s = own_stream if own_stream is not None else stream
    rng = np.random.default_rng(1)
    records = []
    try:
        host_lut = rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32)
        with DeviceBuffer(round_up(out_bytes, 16), info.index) as out, \
                DeviceBuffer.from_numpy(host_lut, info.index, s) as lut, clean_state(s, set_aside=0):
            with graphs.capture(s) as g:
                for _ in range(kernels_per_graph):
                    kernels.reset_data(out, lut, s)
            with g:
                out.fill_bytes(0xFF, s)
                plain = time_gpu(lambda st: g.launch(st), s, warmup=warmup, repeat=repeat)
                _verify(kernels.verify_reset_data(out, lut, s) == 0, "graph replay without window")
                config = {"lut_bytes": lut_bytes, "out_bytes": out_bytes, "kernels_per_graph": kernels_per_graph}
                records.append(Record.from_timing("graph", "replay_no_window", dict(config), plain, {}))
                request = min(info.persisting_l2_cache_max_size, round_up(lut_bytes, granularity))
                for refresh in ("update", "reinstantiate"):
                    g.refresh = refresh
                    g.instantiate()  # an instance made before the window, as a user would have
                    out.fill_bytes(0xFF, s)
                    updates, reinst = g.updates, g.reinstantiations
                    with persist(g, lut, set_aside=request) as p:
                        _verify(all(k.window == p.window for k in g.kernel_nodes()), "node windows read back")
                        windowed = time_gpu(lambda st: g.launch(st), s, warmup=warmup, repeat=repeat)
                        _verify(kernels.verify_reset_data(out, lut, s) == 0, f"graph replay with window ({refresh})")
                        granted, ratio = p.set_aside, p.window.hit_ratio
                    _verify(all(k.window.empty for k in g.kernel_nodes()), "node windows restored")
                    g.launch(s)  # bring the instance back to no window for the next variant
                    records.append(Record.from_timing(
                        "graph", f"replay_window_{refresh}", dict(config, set_aside_granted=granted, hit_ratio=ratio),
                        windowed, {"speedup_vs_no_window": plain.median_ms / windowed.median_ms,
                                   "instance_updates": g.updates - updates,
                                   "reinstantiations": g.reinstantiations - reinst}))
    finally:
        if own_stream is not None:
            own_stream.close()
    report = Report("graph", environment(info.index), records)
    report.summary = {r.variant: r.metrics.get("speedup_vs_no_window", 1.0) for r in records}
    return report


def bench_concurrent(
    *,
    set_aside: Optional[int] = None,
    out_bytes: int = 512 << 20,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
) -> Report:
    """Two reset-data kernels at once on two streams, each with its own LUT and a window as large as the
    set-aside: no windows, hit ratio 1.0 each (twice the set-aside asked for), and share=True (scaled
    to fit, 0.5 each). Reports each kernel's time and the time for both."""
    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    request = set_aside or min(info.persisting_l2_cache_max_size, round_up(info.l2_cache_size * 6 // 50, granularity))
    backend = _backend.current()
    rng = np.random.default_rng(2)
    records = []
    with Stream(info.index) as s1, Stream(info.index) as s2, clean_state(s1, set_aside=request) as granted:
        lut_bytes = round_up(granted, 16)
        luts = [DeviceBuffer.from_numpy(rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32), info.index, s1)
                for _ in range(2)]
        outs = [DeviceBuffer(round_up(out_bytes, 16), info.index) for _ in range(2)]
        try:
            def run_pair() -> tuple[float, float, float]:
                times = []
                for _ in range(warmup + repeat):
                    start, end1, end2 = backend.Event(), backend.Event(), backend.Event()
                    start.record(s1.handle)
                    start.wait_on(s2.handle)
                    kernels.reset_data(outs[0], luts[0], s1)
                    kernels.reset_data(outs[1], luts[1], s2)
                    end1.record(s1.handle)
                    end2.record(s2.handle)
                    times.append((start, end1, end2))
                result = [(e1.elapsed_since(st), e2.elapsed_since(st)) for st, e1, e2 in times[warmup:]]
                k1 = Timing(tuple(a for a, _ in result))
                k2 = Timing(tuple(b for _, b in result))
                both = Timing(tuple(max(a, b) for a, b in result))
                return k1, k2, both

            for variant in ("no_window", "hit_ratio_1_each", "shared"):
                for o in outs:
                    o.fill_bytes(0xFF, s1)
                s1.synchronize()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", L2BudgetWarning)
                    if variant == "no_window":
                        k1, k2, both = run_pair()
                        ratios = (None, None)
                    else:
                        share = variant == "shared"
                        with persist(s1, luts[0], 1.0, set_aside=None, share=share), \
                                persist(s2, luts[1], 1.0, set_aside=None, share=share):
                            ratios = (get_window(s1).hit_ratio, get_window(s2).hit_ratio)
                            k1, k2, both = run_pair()
                for o, l, name in zip(outs, luts, ("stream 1", "stream 2")):
                    _verify(kernels.verify_reset_data(o, l, s1) == 0, f"concurrent {variant} {name}")
                config = {"set_aside_granted": granted, "lut_bytes_each": lut_bytes, "out_bytes_each": out_bytes,
                          "hit_ratios": ratios}
                records.append(Record.from_timing("concurrent", variant, config, both,
                                                  {"kernel1_median_ms": k1.median_ms,
                                                   "kernel2_median_ms": k2.median_ms}))
        finally:
            for b in luts + outs:
                b.free()
    report = Report("concurrent", environment(info.index), records)
    base = records[0].median_ms
    report.summary = {r.variant: {"both_ms": r.median_ms, "speedup_vs_no_window": base / r.median_ms,
                                  "hit_ratios": r.config["hit_ratios"]} for r in records}
    return report
