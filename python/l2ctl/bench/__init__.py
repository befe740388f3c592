"""The measurement harness: timing, device-state hygiene, verification, records, ceilings, and the
benchmark scenarios (one module each). Nothing in l2ctl's control core imports this package, and importing it
loads none of its modules: each name below is imported on first use.

    from l2ctl import bench
    report = bench.bench_reset_data([4 << 20], out_bytes=256 << 20)
    report.to_json("reset_data.json")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy_attributes
from .._errors import VerificationError as VerificationError, check as check

if TYPE_CHECKING:  # what __getattr__ imports at run time
    from .cache_streaming import bench_cache_streaming as bench_cache_streaming
    from .ceilings import Ceilings as Ceilings, measure_ceilings as measure_ceilings
    from .collectives import bench_collectives as bench_collectives
    from .concurrent import bench_concurrent as bench_concurrent
    from .graph_replay import bench_graph as bench_graph
    from .overhead import OVERHEAD_VARIANTS as OVERHEAD_VARIANTS, bench_overhead as bench_overhead
    from .paired import (Arm as Arm, Comparison as Comparison, bootstrap_speedup as bootstrap_speedup,
                         compare as compare)
    from .progress import Progress as Progress
    from .records import Record as Record, Report as Report, environment as environment
    from .reset_data import (RESET_COLUMNS as RESET_COLUMNS, bench_reset_data as bench_reset_data,
                             default_lut_sizes as default_lut_sizes)
    from .state import clean_state as clean_state, flush_l2 as flush_l2, owned_stream as owned_stream
    from .stride import bench_stride as bench_stride
    from .tax import Tax as Tax, copy_pace as copy_pace, forget_taxes as forget_taxes, measure_tax as measure_tax
    from .timing import (MAX_REPEAT as MAX_REPEAT, Timer as Timer, Timing as Timing, check_repeats as check_repeats,
                         time_gpu as time_gpu)

#: submodule -> the names it gives
_LAZY = {"timing": ("Timing", "Timer", "time_gpu", "MAX_REPEAT", "check_repeats"),
         "state": ("flush_l2", "clean_state", "owned_stream"), "progress": ("Progress",),
         "ceilings": ("Ceilings", "measure_ceilings"), "records": ("Record", "Report", "environment"),
         "paired": ("Arm", "Comparison", "compare", "bootstrap_speedup"),
         "tax": ("Tax", "copy_pace", "measure_tax", "forget_taxes"),
         "reset_data": ("bench_reset_data", "default_lut_sizes", "RESET_COLUMNS"), "stride": ("bench_stride",),
         "cache_streaming": ("bench_cache_streaming",), "graph_replay": ("bench_graph",),
         "concurrent": ("bench_concurrent",), "overhead": ("bench_overhead", "OVERHEAD_VARIANTS"),
         "collectives": ("bench_collectives",)}
__getattr__ = _lazy_attributes(__name__, _LAZY)
__all__ = ["VerificationError", "check", *(name for names in _LAZY.values() for name in names)]
