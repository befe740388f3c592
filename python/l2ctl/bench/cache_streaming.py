"""The cache-streaming document's two scenarios, normal loads against ld.global.cs, no set-aside."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Callable

import numpy as np

from .. import kernels
from .._device import resolve_device
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_count
from .._errors import check
from .progress import Progress
from .records import Record, Report, environment
from .state import clean_state, owned_stream
from .timing import check_repeats, time_gpu

__all__ = ["bench_cache_streaming"]


def bench_cache_streaming(
    n: int = 10_000_000,
    *,
    stream: StreamLike = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    seed: int = 0,
    progress: bool = True,
) -> Report:
    """Outputs of both versions must be bit-identical and match a float64 NumPy reference."""
    warmup, repeat = check_repeats(warmup, repeat)
    n = check_count(n, "n", minimum=1, maximum=1 << 28)
    index = resolve_device(device)
    rng = np.random.default_rng(seed)
    records: list[Record] = []
    values = rng.random(n, dtype=np.float32)
    indices = rng.integers(0, 1024, size=n, dtype=np.int32)
    dense = rng.random(1024, dtype=np.float32)
    ref_sparse = values * dense[indices].astype(np.float64) + np.sin(values.astype(np.float64) * 0.1)
    data = rng.random(8 * n, dtype=np.float32)
    cats = rng.integers(0, 32, size=8 * n, dtype=np.int32)
    weights = rng.random(32, dtype=np.float32)
    x = data.astype(np.float64).reshape(n, 8)
    ref_stream = (x * weights[cats.reshape(n, 8)] + np.cos(x * 0.01)).sum(axis=1)
    with Progress(4, "cache-streaming", progress) as bar, owned_stream(stream, index) as s, \
            clean_state(s, set_aside=0), ExitStack() as held:
        bufs = [held.enter_context(DeviceBuffer.from_numpy(a, index, s))
                for a in (values, indices, dense, data, cats, weights)]
        outs = {k: held.enter_context(DeviceBuffer(4 * n, index, dtype=np.float32)) for k in ("sn", "sc", "an", "ac")}
        # scenario -> (kernel, inputs, bytes moved, float64 reference)
        scenarios: dict[str, tuple[Callable[..., None], list[DeviceBuffer], int, np.ndarray]] = {
            "sparse_vector": (kernels.sparse_vector, bufs[:3], n * 12, ref_sparse),
            "stream_analysis": (kernels.stream_analysis, bufs[3:], n * 8 * 8 + n * 4, ref_stream)}
        results = {}
        for scenario, key, streaming in (("sparse_vector", "sn", False), ("sparse_vector", "sc", True),
                                         ("stream_analysis", "an", False), ("stream_analysis", "ac", True)):
            kernel, inputs, moved, ref = scenarios[scenario]
            o, how = outs[key], "cs" if streaming else "normal"
            o.fill_bytes(0xFF, s)  # NaN poison
            timing = time_gpu(lambda st: kernel(*inputs, o, st, streaming=streaming), s, warmup=warmup, repeat=repeat)
            got = results[key] = o.to_numpy(s)
            err = float(np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref))))
            check(bool(np.all(np.isfinite(got))) and err < 1e-5, f"{scenario} {key} max error {err:g}")
            config = {"n": n, "scenario": scenario, "streaming_loads": streaming}
            records.append(Record.from_timing("cache-streaming", f"{scenario}/{how}", config, timing, {
                "max_rel_error_vs_float64": err, "gbps": moved / timing.median_ms / 1e6}))
            bar.step(f"{scenario} {how}")
        check(np.array_equal(results["sn"], results["sc"]), "sparse_vector normal and .cs outputs differ")
        check(np.array_equal(results["an"], results["ac"]), "stream_analysis normal and .cs outputs differ")
    ms = {r.variant: r.median_ms for r in records}
    return Report("cache-streaming", environment(index), records, summary={
        f"{sc}_speedup_cs": ms[f"{sc}/normal"] / ms[f"{sc}/cs"] for sc in ("sparse_vector", "stream_analysis")})
