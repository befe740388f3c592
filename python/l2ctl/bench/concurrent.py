"""Two reset-data kernels at once on two streams sharing one set-aside: no windows, hit ratio 1.0 each
(twice the set-aside asked for), and share=True (scaled to fit)."""

from __future__ import annotations

import warnings
from contextlib import ExitStack
from typing import Any, Literal, Optional, Union

import numpy as np

from .. import _backend, kernels
from .._device import require_persistence
from .._limit import set_aside_granularity
from .._errors import L2BudgetWarning, check
from .._memory import DeviceBuffer, Stream
from .._persist import persist
from .._plan import check_nbytes, check_set_aside, parse_set_aside_request, round_up
from .._stream_window import get_window
from .progress import Progress
from .records import Record, Report, environment
from .state import clean_state
from .timing import Timing, check_repeats

__all__ = ["bench_concurrent"]

VARIANTS = ("no_window", "hit_ratio_1_each", "shared")


def bench_concurrent(
    *,
    set_aside: Union[int, float, Literal["max"], None] = None,
    out_bytes: int = 512 << 20,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    progress: bool = True,
) -> Report:
    """Each stream has its own LUT and a window as large as the set-aside (what l2ctl.set_aside takes: bytes, "max"
    or a fraction of the max; None: 6/50 of the L2). Reports each kernel's time and the time for both (from one
    start event to the later of the two end events)."""
    if set_aside is not None and check_set_aside(set_aside) == 0:
        raise ValueError("set_aside must be positive here (each stream's LUT is as large), got 0")
    out_bytes = check_nbytes(out_bytes, "out_bytes")
    warmup, repeat = check_repeats(warmup, repeat)
    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    request = (parse_set_aside_request(set_aside, info.persisting_l2_cache_max_size) if set_aside is not None
               else min(info.persisting_l2_cache_max_size, round_up(info.l2_cache_size * 6 // 50, granularity)))
    backend = _backend.current()
    rng = np.random.default_rng(2)
    records = []
    with Progress(len(VARIANTS), "concurrent", progress) as bar, Stream(info.index) as s1, Stream(info.index) as s2, \
            clean_state(s1, set_aside=request) as granted, ExitStack() as buffers:
        lut_bytes = round_up(granted, 16)
        luts = [buffers.enter_context(DeviceBuffer.from_numpy(
            rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32), info.index, s1)) for _ in range(2)]
        outs = [buffers.enter_context(DeviceBuffer(round_up(out_bytes, 16), info.index)) for _ in range(2)]

        def run_pair() -> tuple[Timing, Timing, Timing]:
            times = []
            for _ in range(warmup + repeat):
                start, end1, end2 = (backend.Event(info.index) for _ in range(3))
                start.record(s1.handle)
                start.wait_on(s2.handle)
                kernels.reset_data(outs[0], luts[0], s1)
                kernels.reset_data(outs[1], luts[1], s2)
                end1.record(s1.handle)
                end2.record(s2.handle)
                times.append((start, end1, end2))
            result = [(e1.elapsed_since(st), e2.elapsed_since(st)) for st, e1, e2 in times[warmup:]]
            return (Timing(tuple(a for a, _ in result)), Timing(tuple(b for _, b in result)),
                    Timing(tuple(max(a, b) for a, b in result)))

        for variant in VARIANTS:
            for o in outs:
                o.fill_bytes(0xFF, s1)
            s1.synchronize()
            ratios: tuple[Optional[float], Optional[float]] = (None, None)
            with warnings.catch_warnings(), ExitStack() as scopes:
                warnings.simplefilter("ignore", L2BudgetWarning)
                if variant != "no_window":
                    for st, lut in zip((s1, s2), luts):
                        scopes.enter_context(persist(st, lut, 1.0, set_aside=None, share=variant == "shared"))
                    ratios = (get_window(s1).hit_ratio, get_window(s2).hit_ratio)
                k1, k2, both = run_pair()
            for o, lut, name in zip(outs, luts, ("stream 1", "stream 2")):
                check(kernels.verify_reset_data(o, lut, s1) == 0, f"concurrent {variant} {name}")
            config: dict[str, Any] = {"set_aside_granted": granted, "lut_bytes_each": lut_bytes,
                                      "out_bytes_each": out_bytes, "hit_ratios": ratios}
            records.append(Record.from_timing("concurrent", variant, config, both,
                                              {"kernel1_median_ms": k1.median_ms, "kernel2_median_ms": k2.median_ms}))
            bar.step(variant)
    base = records[0].median_ms
    return Report("concurrent", environment(info.index), records, summary={
        r.variant: {"both_ms": r.median_ms, "speedup_vs_no_window": base / r.median_ms,
                    "hit_ratios": r.config["hit_ratios"]} for r in records})
