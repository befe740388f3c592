"""``l2ctl bench [NAME]``: the benchmarks of l2ctl.bench, one command each, with their tables.

A new benchmark is a function ``cmd_bench_x(args) -> int`` and a :class:`Command` naming its options,
added to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from .. import bench, plot  # the package loads a benchmark's module when it runs
from .._errors import NotSupportedError
from .options import (COLUMN_NAMES, COMMON, CSV, DEVICE, EVERYWHERE, GALLERY_NAMES, JSON, LUT_BYTES, LUT_SIZES,
                      OUT_BYTES, PLOT, QUIET, REPEAT, ROUNDS, SET_ASIDE, SIMULATE, SIZE_HELP, WARMUP, Option,
                      collective_sizes, columns, count, gallery_names, strides)
from .exitcodes import EXIT_OK, EXIT_UNSUPPORTED, EXIT_USAGE
from .output import done, format_bytes, header, measure, note
from .parsing import Command, Group

__all__ = ["cmd_bench_reset", "cmd_bench_stride", "cmd_bench_cs", "cmd_bench_graph", "cmd_bench_concurrent",
           "cmd_bench_overhead", "cmd_bench_workloads", "cmd_bench_collectives", "COLLECTIVES", "frameworks_missing",
           "WORKLOADS", "RESET_DATA", "STRIDE", "CACHE_STREAMING", "GRAPH", "CONCURRENT", "OVERHEAD", "BENCHMARKS",
           "BENCH"]


def _measured(args: argparse.Namespace, run: Callable[..., bench.Report], *given: Any, **options: Any) -> bench.Report:
    """``run(*given, **options)`` on --device with the measurement options; prints its report's header."""
    report = run(*given, device=args.device, **measure(args), **options)
    print(header(report))
    return report


def _lut_table(report: bench.Report, names: list[str], cell: Callable[[dict[str, Any], str], str]) -> None:
    """reset-data's table: a row per LUT size, ``cell(row, name)`` per column."""
    print(f"{'LUT':>10} " + " ".join(f"{n:>17}" for n in names))
    for row in report.summary["table_ms"]:
        print(f"{format_bytes(row['lut_bytes']):>10} " + " ".join(f"{cell(row, n):>17}" for n in names))


def cmd_bench_reset(args: argparse.Namespace) -> int:
    report = _measured(args, bench.bench_reset_data, args.lut_sizes, out_bytes=args.out_bytes, columns=args.columns,
                       counters=args.counters)
    c = report.ceilings
    ceilings = ("" if c is None else f"; write-only ceiling {c.write_ms:.3f} ms ({c.write_gbps:,.0f} GB/s), "
                f"copy {c.copy_gbps:,.0f} GB/s, read {c.read_gbps:,.0f} GB/s")
    print(f"reset-data: {format_bytes(report.records[0].config['out_bytes'])} output, median of {args.repeat} "
          f"(CUDA events), every output verified{ceilings}")
    names = [r.variant for r in report.records if r.config["lut_bytes"] == report.records[0].config["lut_bytes"]]
    _lut_table(report, names, lambda row, n: f"{row[n]:8.3f} {row['baseline'] / row[n]:6.2f}x" if "baseline" in row
               else f"{row[n]:8.3f}        ")
    print("ms and speedup over baseline; columns: " + "; ".join(f"{n} = {d}" for n, d in bench.RESET_COLUMNS
                                                               if n in names))
    if args.counters:
        print("\nHardware counters (one extra launch per point, after another, by l2ctl.collect): "
              "DRAM MB read / L2 hit rate")

        def counted(row: dict[str, Any], n: str) -> str:
            k = report.find(n, lut_bytes=row["lut_bytes"]).metrics["counters"]
            return f"{k['dram__bytes_read.sum'] / 1e6:7.1f} {k['lts__t_sector_hit_rate.pct']:5.1f}%"

        _lut_table(report, names, counted)
    if "verdict" in report.summary:
        print("Verdict: " + report.summary["verdict"])
    return done(args, report, plot.reset_data)


def cmd_bench_stride(args: argparse.Namespace) -> int:
    report = _measured(args, bench.bench_stride, args.strides, threads=args.threads)
    print(f"strided 4-byte loads, {args.threads:,} threads, "
          f"read ceiling {report.summary['read_ceiling_gbps']:,.0f} GB/s")
    print(f"{'stride':>7} {'ms':>8} {'useful GB/s':>12} {'sectors/req':>12} {'sector GB/s':>12} {'of ceiling':>11} "
          f"{'DRAM model GB/s':>16}")
    for r in report.records:
        m = r.metrics
        print(f"{r.config['stride_bytes']:>6}B {r.median_ms:8.3f} {m['useful_gbps']:12,.0f} "
              f"{m['sectors_per_request_model']:12d} {m['sector_gbps']:12,.0f} "
              f"{m['sector_fraction_of_read_ceiling']:10.0%} {m['dram_model_gbps']:16,.0f}")
    return done(args, report, plot.stride)


def cmd_bench_cs(args: argparse.Namespace) -> int:
    report = _measured(args, bench.bench_cache_streaming, args.n)
    print(f"cache-streaming loads, {args.n:,} elements; outputs of both versions identical and within 1e-5 of float64")
    print(f"{'scenario':>16} {'normal ms':>10} {'.cs ms':>10} {'speedup':>8}")
    for scenario in ("sparse_vector", "stream_analysis"):
        normal, cs = (report.find(f"{scenario}/{kind}").median_ms for kind in ("normal", "cs"))
        print(f"{scenario:>16} {normal:10.4f} {cs:10.4f} {normal / cs:7.2f}x")
    return done(args, report, plot.cache_streaming)


def cmd_bench_graph(args: argparse.Namespace) -> int:
    report = _measured(args, bench.bench_graph, args.lut_bytes)
    plain = report.records[0]
    print(f"graph of {plain.config['kernels_per_graph']} reset-data kernels, LUT {format_bytes(plain.config['lut_bytes'])}, "
          f"output {format_bytes(plain.config['out_bytes'])}; outputs verified")
    rows = [("replay, no window:", plain.median_ms, "")]
    for r in report.records[1:]:
        how = r.variant.replace("replay_window_", "")
        rows.append((f"replay, window on nodes, instance refreshed by {how}:", r.median_ms,
                     f"  ({r.metrics['speedup_vs_no_window']:.2f}x; set-aside "
                     f"{format_bytes(r.config['set_aside_granted'])}, hit ratio {r.config['hit_ratio']:.3f})"))
    width = max(len(label) for label, _, _ in rows)  # the times in one column, however long a variant's name
    for label, ms, speedup in rows:
        print(f"  {label:<{width}} {ms:8.3f} ms{speedup}")
    return done(args, report)


def cmd_bench_concurrent(args: argparse.Namespace) -> int:
    report = _measured(args, bench.bench_concurrent, set_aside=args.set_aside)
    r0 = report.records[0]
    print(f"two reset-data kernels on two streams at once, set-aside {format_bytes(r0.config['set_aside_granted'])}, "
          f"each LUT {format_bytes(r0.config['lut_bytes_each'])}; outputs verified")
    print(f"{'variant':>18} {'hit ratios':>14} {'kernel 1 ms':>12} {'kernel 2 ms':>12} {'both ms':>9} {'speedup':>8}")
    for r in report.records:
        hr = r.config["hit_ratios"]
        hrs = "-" if hr[0] is None else f"{hr[0]:.2f}/{hr[1]:.2f}"
        print(f"{r.variant:>18} {hrs:>14} {r.metrics['kernel1_median_ms']:12.3f} "
              f"{r.metrics['kernel2_median_ms']:12.3f} {r.median_ms:9.3f} {r0.median_ms / r.median_ms:7.2f}x")
    return done(args, report)


def cmd_bench_overhead(args: argparse.Namespace) -> int:
    report = bench.bench_overhead(device=args.device, rounds=args.rounds, iterations=args.iterations,
                                  progress=not args.quiet)
    print(header(report))
    print(f"host time per operation, median of {args.rounds} rounds of {args.iterations:,} (no GPU work, no "
          "synchronisation); every variant checked to apply and restore its state")
    print(f"{'operation':<24} {'us':>8}  what")
    for r in report.records:
        value = f"{r.metrics['median_us']:8.2f}" if r.verified else f"{'-':>8}"
        note = r.config["operation"] if r.verified else f"skipped: {r.config['skipped']}"
        print(f"{r.variant:<24} {value}  {note}")
    return done(args, report)


def cmd_bench_collectives(args: argparse.Namespace) -> int:
    from ..bench.collectives import collectives_table

    try:
        report = bench.bench_collectives(args.sizes, device=args.device, rounds=args.rounds, **measure(args))
    except RuntimeError as error:
        if "torchrun" not in str(error):
            raise
        note(f"bench collectives: {error}")
        return EXIT_USAGE
    if report.environment["distributed"]["rank"] != 0:
        return EXIT_OK  # every rank measured; rank 0 prints and writes
    print(header(report))
    print("\n".join(collectives_table(report)))
    return done(args, report)


def frameworks_missing(names: Optional[list[str]]) -> Optional[str]:
    """Why none of the gallery workloads ``names`` (None: all) can run here, when no framework they need can
    (one line, with how to install it); None when one can."""
    from ..workloads import _frameworks, gallery

    needed = dict.fromkeys(gallery.entry(n).framework for n in (names or gallery.names()))
    reasons = [(_frameworks.torch_missing if f == "torch" else _frameworks.cupy_missing)() for f in needed]
    if any(r is None for r in reasons):
        return None
    return "nothing to measure here: " + "; ".join(map(str, reasons))


def cmd_bench_workloads(args: argparse.Namespace) -> int:
    from .. import benchmark_gallery

    missing = frameworks_missing(args.names)
    if missing:  # before any device work: a clear line and exit 3, not a table of skipped rows
        raise NotSupportedError(f"bench workloads: {missing}")
    report = _measured(args, benchmark_gallery.bench_workloads, names=args.names, runs=args.runs, rounds=args.rounds)
    s = report.summary
    print(f"framework workloads, paired rounds against the baseline ({s['rounds']} rounds x {s['repeat']} runs per "
          f"arm), speedup over the baseline; every output verified; recipe set-aside "
          f"{format_bytes(s['recipe_set_aside'])}")
    print(f"{'workload':<14} {'base ms':>8} {'recipe':>7} {'copy':>6} {'hit 1.0':>8} {'tuned (' + str(s['runs']) + ' runs)':>20}"
          f" {'copy':>6} {'tune s':>7}  choice")
    for r in s["rows"]:
        tuned = " ".join(f"{x:.2f}" for x in r["tuned_speedups"])
        if r["tuned_buffer"] is None:
            choice = "no persistence"
        else:
            span = "" if r["tuned_num_bytes"] is None else f" (first {format_bytes(r['tuned_num_bytes'])})"
            choice = (f"{r['tuned_buffer']}{span}: set-aside {format_bytes(r['tuned_set_aside'])}, hit ratio "
                      f"{r['tuned_hit_ratio']:.2f}")
        print(f"{r['workload']:<14} {r['baseline_ms']:8.3f} {r['recipe_speedup']:6.2f}x {r['recipe_copy_slowdown']:5.2f}x "
              f"{r['hit1_speedup']:7.2f}x {tuned:>19}x {r['tuned_copy_slowdown']:5.2f}x {r['tune_seconds']:7.1f}  {choice}")
    for r in s["rows"]:
        g = r["grid_best"]
        if g is not None:
            print(f"  {r['workload']}: grid best {g['candidate']} set-aside {format_bytes(g['set_aside'])} hit ratio "
                  f"{g['hit_ratio']:.2f}: {g['speedup']:.3f}x (copy {bench.copy_pace(g['copy_slowdown'])}); "
                  f"{r['tune_reason']}")
    for name, reason in s["skipped"].items():
        print(f"{name:<14} skipped: {reason}")
    if not s["rows"]:
        note("l2ctl: bench workloads: nothing was measured: every workload was skipped (the reasons above)")
        done(args, report)
        return EXIT_UNSUPPORTED
    print("recipe: the obvious buffer with set-aside min(0.75 x L2, max); hit 1.0: persist(s, buffer, 1.0) with the "
          "defaults; tuned: l2ctl.tune over every candidate, re-measured; copy: how much slower a plain copy runs "
          "under that set-aside")
    return done(args, report)


RESET_DATA = Command(
    "reset-data", "a LUT repeated into a large buffer, per persistence policy and LUT size (the main job)",
    (LUT_SIZES, OUT_BYTES,
     Option("--columns", f"policies to run, comma-separated, from: {', '.join(COLUMN_NAMES)}", None, "all", columns,
            "NAMES"),
     Option("--counters", "add DRAM bytes and L2 hit rate from CUPTI (one extra untimed launch per point)", False,
            switch=True),
     PLOT) + COMMON,
    cmd_bench_reset,
    "reset-data: a random LUT repeated into a large output, for LUT sizes from well inside the set-aside to\n"
    "past its max, under each persistence policy (the columns); every output verified on the device.")
STRIDE = Command(
    "stride", "4-byte loads at growing strides: sectors per request against the read ceiling",
    (Option("--strides", "strides between threads in bytes, comma-separated, multiples of 4 up to 1M",
            [4, 8, 16, 32, 64, 128], "4,8,16,32,64,128", strides, "BYTES"),
     Option("--threads", "threads, one 4-byte load each (32 to 2**31)", 1 << 25, f"{1 << 25} (32M)",
            count(32, 1 << 31, "threads"), "N"),
     PLOT) + COMMON,
    cmd_bench_stride)
CACHE_STREAMING = Command(
    "cache-streaming", "normal vs .cs (evict-first) loads in the cache-streaming document's two scenarios",
    (Option("--n", "elements per scenario (1 to 2**28)", 10_000_000, type=count(1, 1 << 28, "n"), metavar="N"),
     PLOT) + COMMON,
    cmd_bench_cs)
GRAPH = Command(
    "graph", "graph replay with and without a window on its kernel nodes",
    (LUT_BYTES.but(help="LUT size of the reset-data kernels in the graph (a multiple of 4)", default=None,
                   shown_default="4/50 of the L2: 4 MiB on a 50 MiB L2"),) + COMMON,
    cmd_bench_graph)
CONCURRENT = Command(
    "concurrent", "two streams sharing one set-aside",
    (SET_ASIDE.but(help="set-aside limit both streams share; each LUT is as large",
                   shown_default="6/50 of the L2 rounded up to the granularity, capped at the max"),) + COMMON,
    cmd_bench_concurrent)

OVERHEAD = Command(
    "overhead", "host cost of persist, windows, set_aside and resets, beside the raw CUDA calls",
    (ROUNDS.but(help="rounds; the median is reported (3 to 1000)", default=7),
     Option("--iterations", "operations per round (1 to 1,000,000)", 2000, type=count(1, 1_000_000, "iterations"),
            metavar="N")) + EVERYWHERE,
    cmd_bench_overhead,
    "Host microseconds per operation: persist enter+exit (lean and default settings, on a stream and on\n"
    "graphs of 1 and 32 kernel nodes; the lean scope in each argument form: hit ratio 0.75, 1.0, 1,\n"
    "np.float32, keyword, Policy, an int set-aside equal to the limit, a torch stream and tensor at 0.75\n"
    "and 1.0), set/clear of a window, a set_aside scope, a reset of persisting lines, and the same through\n"
    "cuda-python's cuda.bindings when it is installed.")

WORKLOADS = Command(
    "workloads", "the framework gallery (PyTorch, CuPy): baseline, recipe, hit 1.0 and tuned, with the tax",
    (Option("--names", f"gallery workloads, comma-separated, from: {', '.join(GALLERY_NAMES)}", None, "all",
            gallery_names, "NAMES"),
     Option("--runs", "separate paired re-measures of the tuned choice (1 to 100)", 3, type=count(1, 100, "runs"),
            metavar="N"),
     ROUNDS, REPEAT.but(default=5), WARMUP.but(default=1)) + EVERYWHERE,
    cmd_bench_workloads,
    "The gallery of real framework workloads (l2ctl.workloads.gallery), each measured side by side with\n"
    "its baseline: the textbook recipe, persist(..., 1.0) with l2ctl's defaults, and l2ctl.tune's choice\n"
    "over all of the workload's tensors; a workload whose framework is missing is skipped with the reason.")

COLLECTIVES = Command(
    "collectives", "NCCL all-reduce and all-gather bus bandwidth at each set-aside (run it under torchrun)",
    (Option("--sizes", f"message sizes, comma-separated ({SIZE_HELP}; multiples of 4 x the ranks)", None,
            "64M,128M,256M,512M,1G (simulated: 64K,256K)", collective_sizes, "SIZES", device_bytes=True),
     ROUNDS.but(default=3), REPEAT.but(default=5), WARMUP.but(default=2),
     DEVICE.but(help="this rank's CUDA device", shown_default="LOCAL_RANK"), JSON, CSV, QUIET, SIMULATE),
    cmd_bench_collectives,
    "The set-aside's tax on NCCL's collectives: bus bandwidth (as nccl-tests computes it) of all-reduce and\n"
    "all-gather per message size, at each set-aside from 0 to the max, interleaved with no set-aside. Launch\n"
    "it on every GPU: torchrun --standalone --nproc-per-node N -m l2ctl bench collectives --json c.json")

#: The benchmarks, in the order ``bench --help`` lists them.
BENCHMARKS: tuple[Command, ...] = (RESET_DATA, STRIDE, CACHE_STREAMING, GRAPH, CONCURRENT, OVERHEAD, WORKLOADS,
                                   COLLECTIVES)

BENCH = Group(
    "bench", "benchmarks (no name: reset-data, the main job)", BENCHMARKS, RESET_DATA.options, RESET_DATA,
    "Benchmarks; every output is verified on the device before its time is kept.\n"
    "With no benchmark named, runs reset-data (the main job); the options shown here are reset-data's and\n"
    "may come before or after the name (bench --json x.json stride): an option the chosen benchmark does\n"
    "not take is refused.",
    "BENCHMARK")
