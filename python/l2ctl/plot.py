"""Plots of l2ctl's measurements (matplotlib, optional: ``pip install l2ctl[plot]``).

Every function takes a result or Report, draws on ``ax`` (a new figure when None), labels axes with
units, names the GPU in the title ("simulated (<GPU>)" for a simulated result), and returns the Axes.
"""

from __future__ import annotations

from typing import Any

from ._units import MiB
from .bench.records import simulated_label

__all__ = ["hit_ratio", "set_aside", "surface", "tax", "stride", "cache_streaming", "reset_data", "save"]


def _plt() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("l2ctl.plot needs matplotlib: pip install 'l2ctl[plot]'") from exc
    return plt


def _axes(ax: Any, figsize: tuple[float, float] = (7, 4)) -> Any:
    if ax is not None:
        return ax
    _, ax = _plt().subplots(figsize=figsize, constrained_layout=True)
    return ax


def _gpu(env: dict[str, Any]) -> str:
    """The GPU a title names: for a simulated result, "simulated (<the simulated GPU>)"."""
    return simulated_label(env) or str(env.get("device", {}).get("name", "GPU"))


def _finish(ax: Any, xlabel: str, ylabel: str, title: str, **legend: Any) -> Any:
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(loc="best", **legend)
    return ax


def hit_ratio(result: Any, ax: Any = None) -> Any:
    """Time and speedup against hit ratio (a sweep_hit_ratio result), the baseline drawn."""
    ax = _axes(ax)
    recs = sorted(result.records, key=lambda r: r.config["hit_ratio"])
    x = [r.config["hit_ratio"] for r in recs]
    ax.plot(x, [r.median_ms for r in recs], "o-", label="with window")
    ax.fill_between(x, [r.min_ms for r in recs], [r.max_ms for r in recs], alpha=0.2, label="min-max")
    ax.axhline(result.baseline.median_ms, color="k", ls="--", label="no set-aside, no window")
    sa = recs[0].config["set_aside_granted"] / MiB if recs else 0
    lut = recs[0].config.get("lut_bytes", recs[0].config.get("window_bytes", 0)) / MiB if recs else 0
    right = ax.twinx()
    right.plot(x, [result.baseline.median_ms / r.median_ms for r in recs], "s:", color="tab:green", alpha=0.7)
    right.set_ylabel("speedup over baseline (x)", color="tab:green")
    return _finish(ax, "hitRatio", "kernel time (ms)",
                   f"{_gpu(result.environment)}: {lut:g} MiB window, set-aside {sa:.2f} MiB")


def set_aside(result: Any, ax: Any = None) -> Any:
    """Time against the set-aside size (a sweep_set_aside result)."""
    ax = _axes(ax)
    recs = sorted(result.records, key=lambda r: r.config["set_aside_granted"])
    ax.plot([r.config["set_aside_granted"] / MiB for r in recs], [r.median_ms for r in recs], "o-",
            label="window, hitRatio = min(1, set-aside / window)")
    ax.axhline(result.baseline.median_ms, color="k", ls="--", label="no set-aside, no window")
    return _finish(ax, "set-aside (MiB)", "kernel time (ms)", f"{_gpu(result.environment)}: time against set-aside")


def surface(result: Any, ax: Any = None) -> Any:
    """Speedup heatmap over set-aside x hit ratio (a sweep_surface result)."""
    import numpy as np

    ax = _axes(ax, (8, 5))
    sizes = sorted({r.config["set_aside_granted"] for r in result.records})
    ratios = sorted({round(r.config["hit_ratio"], 4) for r in result.records})
    grid = np.full((len(ratios), len(sizes)), np.nan)
    for r in result.records:
        grid[ratios.index(round(r.config["hit_ratio"], 4)), sizes.index(r.config["set_aside_granted"])] = (
            result.baseline.median_ms / r.median_ms)
    span = max(abs(np.nanmax(grid) - 1), abs(1 - np.nanmin(grid)), 0.05)
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdBu", vmin=1 - span, vmax=1 + span,
                      extent=(-0.5, len(sizes) - 0.5, -0.5, len(ratios) - 0.5))
    ax.set_xticks(range(len(sizes)), [f"{s / MiB:.1f}" for s in sizes], rotation=45)
    ax.set_yticks(range(len(ratios)), [f"{h:.1f}" for h in ratios])
    for i in range(len(ratios)):
        for j in range(len(sizes)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
    ax.figure.colorbar(image, ax=ax, label="speedup over no persistence (x)")
    lut = result.records[0].config.get("lut_bytes", 0) / MiB if result.records else 0
    ax.set(xlabel="set-aside (MiB)", ylabel="hitRatio",
           title=f"{_gpu(result.environment)}: reset-data, {lut:g} MiB LUT")
    return ax


def tax(report: Any, ax: Any = None) -> Any:
    """Copy and write-only bandwidth of unrelated kernels against the set-aside (a sweep_tax Report)."""
    ax = _axes(ax)
    x = [r.config["set_aside_granted"] / MiB for r in report.records]
    ax.plot(x, [r.metrics["copy_gbps"] for r in report.records], "o-", label="copy (read + write)")
    ax.plot(x, [r.metrics["write_gbps"] for r in report.records], "s-", label="write-only")
    ax.set_ylim(bottom=0)
    return _finish(ax, "set-aside limit (MiB), no window anywhere", "bandwidth (GB/s)",
                   f"{_gpu(report.environment)}: the set-aside tax on every other kernel")


def stride(report: Any, ax: Any = None) -> Any:
    """Strided 4-byte loads: useful, sector and DRAM-model bandwidth, with the read ceiling (a bench_stride Report)."""
    ax = _axes(ax)
    x = [r.config["stride_bytes"] for r in report.records]
    m = [r.metrics for r in report.records]
    ax.plot(x, [v["useful_gbps"] for v in m], "o-", label="useful bytes (4 B per thread)")
    ax.plot(x, [v["sector_gbps"] for v in m], "s-", label="32 B sectors (model: 4, 8, 16, 32 per request)")
    ax.plot(x, [v["dram_model_gbps"] for v in m], "^--", label="DRAM bytes (model: 64 B granularity)")
    ax.axhline(report.summary["read_ceiling_gbps"], color="k", ls=":", label="read ceiling")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(v) for v in x])
    return _finish(ax, "stride between threads (bytes)", "bandwidth (GB/s)",
                   f"{_gpu(report.environment)}: sectors per request", fontsize=8)


def cache_streaming(report: Any, ax: Any = None) -> Any:
    """Normal vs .cs loads for the two scenarios (a bench_cache_streaming Report)."""
    ax = _axes(ax)
    scenarios = ["sparse_vector", "stream_analysis"]
    normal = [report.find(f"{s}/normal").median_ms for s in scenarios]
    cs = [report.find(f"{s}/cs").median_ms for s in scenarios]
    xs = range(len(scenarios))
    ax.bar([i - 0.2 for i in xs], normal, 0.4, label="normal loads")
    ax.bar([i + 0.2 for i in xs], cs, 0.4, label="ld.global.cs")
    for i in xs:
        ax.text(i + 0.2, cs[i], f"{normal[i] / cs[i]:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(xs), scenarios)
    return _finish(ax, "", "kernel time (ms)", f"{_gpu(report.environment)}: cache-streaming loads")


def reset_data(report: Any, ax: Any = None) -> Any:
    """Speedup over no persistence against LUT size, one line per policy (a bench_reset_data Report)."""
    ax = _axes(ax)
    table = report.summary["table_ms"]
    x = [row["lut_bytes"] / MiB for row in table]
    for name in [k for k in table[0] if k not in ("lut_bytes", "baseline")]:
        ax.plot(x, [row["baseline"] / row[name] for row in table], "o-", label=name)
    ax.axhline(1.0, color="k", ls="--", label="baseline")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    out = report.records[0].config["out_bytes"] / MiB
    return _finish(ax, "LUT size (MiB)", "speedup over no persistence (x)",
                   f"{_gpu(report.environment)}: reset-data, {out:g} MiB output", fontsize=8)


def save(ax: Any, path: str) -> str:
    ax.figure.savefig(path, dpi=110)
    _plt().close(ax.figure)
    return path
