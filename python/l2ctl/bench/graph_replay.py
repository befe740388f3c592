"""Replays of a captured graph of reset-data kernels, without and with a window on its kernel nodes, and
the two ways one might bring an executable made before the window up to date: re-instantiation (what
l2ctl does) and cudaGraphExecUpdate (which reports success but carries no window: this is the record
that shows it)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import _backend, kernels
from .. import graph as graphs
from .._device import require_persistence
from .._limit import set_aside_granularity
from .._memory import DeviceBuffer, StreamLike
from .._persist import persist
from .._interop import resolve_stream
from .._plan import check_count, check_nbytes, round_up
from .._errors import check
from .progress import Progress
from .records import Record, Report, environment
from .state import clean_state, owned_stream
from .timing import check_repeats, time_gpu

__all__ = ["bench_graph"]


def bench_graph(
    lut_bytes: Optional[int] = None,
    *,
    out_bytes: int = 1 << 30,
    kernels_per_graph: int = 4,
    stream: StreamLike = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    progress: bool = True,
) -> Report:
    """No window, then a window applied to the kernel nodes by ``l2ctl.persist(graph, lut)`` (right-sized
    set-aside), replayed through l2ctl's executable (re-instantiated) and through one made before the window
    and then brought up to date with cudaGraphExecUpdate. Outputs verified."""
    if lut_bytes is not None and check_nbytes(lut_bytes, "lut_bytes") % 4:
        raise ValueError(f"lut_bytes must be a multiple of 4, got {lut_bytes}")
    warmup, repeat = check_repeats(warmup, repeat)
    out_bytes = check_nbytes(out_bytes, "out_bytes")
    kernels_per_graph = check_count(kernels_per_graph, "kernels_per_graph", minimum=1, maximum=1024)
    info = require_persistence(device)
    granularity = set_aside_granularity(info.index)
    lut_bytes = lut_bytes or round_up(info.l2_cache_size * 4 // 50, 16)
    rng = np.random.default_rng(1)
    records = []
    host_lut = rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32)
    with Progress(3, "graph", progress) as bar, owned_stream(stream, info.index) as s, \
            DeviceBuffer(round_up(out_bytes, 16), info.index) as out, \
            DeviceBuffer.from_numpy(host_lut, info.index, s) as lut, clean_state(s, set_aside=0):
        with graphs.capture(s) as g:
            for _ in range(kernels_per_graph):
                kernels.reset_data(out, lut, s)
        with g:
            out.fill_bytes(0xFF, s)
            plain = time_gpu(g.launch, s, warmup=warmup, repeat=repeat)
            check(kernels.verify_reset_data(out, lut, s) == 0, "graph replay without window")
            config: dict[str, Any] = {"lut_bytes": lut_bytes, "out_bytes": out_bytes,
                                      "kernels_per_graph": kernels_per_graph}
            records.append(Record.from_timing("graph", "replay_no_window", dict(config), plain, {}))
            bar.step("no window")
            request = min(info.persisting_l2_cache_max_size, round_up(lut_bytes, granularity))
            g.instantiate()  # an executable made before the window, as a user would have
            stale = _backend.current().GraphExec(g.handle)  # and one brought up to date by an update
            stale.launch(resolve_stream(s).handle)  # launched before the window, as after a user's warm-up
            try:
                for how in ("update", "reinstantiate"):
                    out.fill_bytes(0xFF, s)
                    before = g.reinstantiations
                    with persist(g, lut, set_aside=request) as p:
                        check(all(k.window == p.window for k in g.kernel_nodes()), "node windows read back")
                        if how == "update":
                            check(stale.update(g.handle), "cudaGraphExecUpdate refused a graph whose topology is unchanged")
                        replay = (lambda st: stale.launch(resolve_stream(st).handle)) if how == "update" else g.launch
                        windowed = time_gpu(replay, s, warmup=warmup, repeat=repeat)
                        check(kernels.verify_reset_data(out, lut, s) == 0, f"graph replay with window ({how})")
                        assert p.window is not None
                        granted, ratio = p.set_aside, p.window.hit_ratio
                    check(all(k.window.empty for k in g.kernel_nodes()), "node windows restored")
                    records.append(Record.from_timing(
                        "graph", f"replay_window_{how}", dict(config, set_aside_granted=granted, hit_ratio=ratio),
                        windowed, {"speedup_vs_no_window": plain.median_ms / windowed.median_ms,
                                   "reinstantiations": g.reinstantiations - before}))
                    bar.step(f"window, {how}")
            finally:
                stale.destroy()
    return Report("graph", environment(info.index), records,
                  summary={r.variant: r.metrics.get("speedup_vs_no_window", 1.0) for r in records})
