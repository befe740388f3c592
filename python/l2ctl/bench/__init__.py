"""The measurement harness: timing, device-state hygiene, verification, records, ceilings, and the
benchmark scenarios (one module each). Nothing in l2ctl's control core imports this package.

    from l2ctl import bench
    report = bench.bench_reset_data([4 << 20], out_bytes=256 << 20)
    report.to_json("reset_data.json")
"""

from __future__ import annotations

from .cache_streaming import bench_cache_streaming
from .ceilings import Ceilings, measure_ceilings
from .collectives import bench_collectives
from .concurrent import bench_concurrent
from .graph_replay import bench_graph
from .overhead import OVERHEAD_VARIANTS, bench_overhead
from .paired import Arm, Comparison, bootstrap_speedup, compare
from .progress import Progress
from .records import Record, Report, environment
from .reset_data import RESET_COLUMNS, bench_reset_data, default_lut_sizes
from .state import clean_state, flush_l2, owned_stream
from .stride import bench_stride
from .tax import Tax, copy_pace, forget_taxes, measure_tax
from .timing import MAX_REPEAT, Timer, Timing, check_repeats, time_gpu
from .verify import VerificationError, check

__all__ = ["VerificationError", "check", "Timing", "Timer", "time_gpu", "MAX_REPEAT", "check_repeats", "flush_l2",
           "clean_state", "owned_stream", "Progress", "Ceilings", "measure_ceilings", "Record", "Report", "environment",
           "bench_reset_data", "bench_stride", "bench_cache_streaming", "default_lut_sizes", "RESET_COLUMNS",
           "bench_graph", "bench_concurrent", "bench_overhead", "OVERHEAD_VARIANTS", "Arm", "Comparison", "compare",
           "bootstrap_speedup", "Tax", "copy_pace", "measure_tax", "forget_taxes", "bench_collectives"]
