"""``python -m l2ctl``: device info and the benchmarks.

Exit codes: 0 success; 2 bad arguments; 3 no GPU, or a GPU that cannot persist L2; 4 a benchmark's
output failed verification (no numbers are printed for it); 1 any other CUDA error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from ._errors import CudaError, NotSupportedError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNSUPPORTED, EXIT_VERIFY = 0, 1, 2, 3, 4
MiB = 1 << 20


def _size(text: str) -> int:
    """A byte size: 4096, 4K, 8M, 1.5MiB, 1G."""
    t = text.strip().upper().replace("IB", "").replace("B", "")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, scale = t[:-1], factor
            break
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4096, 8M, 1.5MiB, 1G)") from None
    if value <= 0 or value != value:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value)


def _sizes(text: str) -> list[int]:
    return [_size(part) for part in text.split(",") if part.strip()]


def _fmt_bytes(n: int) -> str:
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def cmd_info(args: argparse.Namespace) -> int:
    import l2ctl

    count = l2ctl.device_count()
    if count == 0:
        from . import _backend

        print(f"no CUDA device: {_backend.current().device_count_error() or 'none visible'}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    v = l2ctl.versions()
    print(f"l2ctl {l2ctl.__version__}, CUDA driver {v['driver'] // 1000}.{v['driver'] % 1000 // 10}, "
          f"runtime {v['runtime'] // 1000}.{v['runtime'] % 1000 // 10}, {count} device(s)")
    devices = range(count) if args.device is None else [args.device]
    for d in devices:
        info = l2ctl.device_info(d)
        gran = l2ctl.set_aside_granularity(d) if info.supports_persistence and args.probe else info.set_aside_granularity
        print(f"\ndevice {info.index}: {info.name} (cc {info.compute_capability[0]}.{info.compute_capability[1]}, "
              f"{info.multiprocessor_count} SMs, {info.pci_bus_id})")
        print(f"  l2CacheSize                    {info.l2_cache_size:>13,} B  ({_fmt_bytes(info.l2_cache_size)})")
        print(f"  persistingL2CacheMaxSize       {info.persisting_l2_cache_max_size:>13,} B  "
              f"({_fmt_bytes(info.persisting_l2_cache_max_size)})")
        print(f"  accessPolicyMaxWindowSize      {info.access_policy_max_window_size:>13,} B  "
              f"({_fmt_bytes(info.access_policy_max_window_size)})")
        print(f"  current set-aside limit        {info.persisting_l2_cache_size:>13,} B  "
              f"({_fmt_bytes(info.persisting_l2_cache_size)})")
        if gran:
            rounding = l2ctl.set_aside_rounding(d)
            print(f"  set-aside granularity          {gran:>13,} B  (requests are rounded {rounding} to multiples)")
        print(f"  persistence supported          {'yes' if info.supports_persistence else 'no: ' + str(info.unsupported_reason)}")
    return EXIT_OK


def _plot(args: argparse.Namespace, draw: Callable, *objs) -> None:
    if getattr(args, "plot", None):
        from . import plot

        plot.save(draw(*objs), args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)


def _write(report, args: argparse.Namespace) -> None:
    if args.json:
        report.to_json(args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.csv:
        report.to_csv(args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)


def _header(report) -> str:
    env = report.environment
    d = env["device"]
    return (f"{d['name']} (cc {d['compute_capability']}, L2 {_fmt_bytes(d['l2_cache_size'])}, persisting max "
            f"{_fmt_bytes(d['persisting_l2_cache_max_size'])}), driver {env['driver_version']}, runtime "
            f"{env['runtime_version']}")


def cmd_bench_reset(args: argparse.Namespace) -> int:
    from . import bench

    report = bench.bench_reset_data(args.lut_sizes, out_bytes=args.out_bytes, columns=args.columns,
                                    device=args.device, repeat=args.repeat, warmup=args.warmup,
                                    progress=not args.quiet, counters=args.counters)
    c = report.ceilings
    print(_header(report))
    print(f"reset-data: {_fmt_bytes(report.records[0].config['out_bytes'])} output, median of {args.repeat} "
          f"(CUDA events), every output verified; write-only ceiling {c.write_ms:.3f} ms ({c.write_gbps:,.0f} GB/s), "
          f"copy {c.copy_gbps:,.0f} GB/s, read {c.read_gbps:,.0f} GB/s")
    names = [r.variant for r in report.records if r.config["lut_bytes"] == report.records[0].config["lut_bytes"]]
    print(f"{'LUT':>10} " + " ".join(f"{n:>17}" for n in names))
    for row in report.summary["table_ms"]:
        cells = []
        for n in names:
            ms = row[n]
            cells.append(f"{ms:8.3f} {row['baseline'] / ms:6.2f}x" if "baseline" in row else f"{ms:8.3f}        ")
        print(f"{_fmt_bytes(row['lut_bytes']):>10} " + " ".join(f"{c:>17}" for c in cells))
    print("ms and speedup over baseline; columns: " + "; ".join(f"{n} = {d}" for n, d in bench.RESET_COLUMNS
                                                               if n in names))
    if args.counters:
        print("\nHardware counters (one extra launch per point, after another, by l2ctl.collect): DRAM MB read / L2 hit rate")
        print(f"{'LUT':>10} " + " ".join(f"{n:>17}" for n in names))
        for row in report.summary["table_ms"]:
            cells = []
            for n in names:
                k = report.find(n, lut_bytes=row["lut_bytes"]).metrics["counters"]
                cells.append(f"{k['dram__bytes_read.sum'] / 1e6:7.1f} {k['lts__t_sector_hit_rate.pct']:5.1f}%")
            print(f"{_fmt_bytes(row['lut_bytes']):>10} " + " ".join(f"{c:>17}" for c in cells))
    if "verdict" in report.summary:
        print("Verdict: " + report.summary["verdict"])
    _write(report, args)
    _plot(args, lambda r: __import__("l2ctl.plot").plot.reset_data(r), report)
    return EXIT_OK


def cmd_bench_stride(args: argparse.Namespace) -> int:
    from . import bench

    report = bench.bench_stride(args.strides, threads=args.threads, device=args.device, repeat=args.repeat,
                                warmup=args.warmup, progress=not args.quiet)
    print(_header(report))
    print(f"strided 4-byte loads, {args.threads:,} threads, read ceiling {report.summary['read_ceiling_gbps']:,.0f} GB/s")
    print(f"{'stride':>7} {'ms':>8} {'useful GB/s':>12} {'sectors/req':>12} {'sector GB/s':>12} {'of ceiling':>11} "
          f"{'DRAM model GB/s':>16}")
    for r in report.records:
        m = r.metrics
        print(f"{r.config['stride_bytes']:>6}B {r.median_ms:8.3f} {m['useful_gbps']:12,.0f} "
              f"{m['sectors_per_request_model']:12d} {m['sector_gbps']:12,.0f} {m['sector_fraction_of_read_ceiling']:10.0%} "
              f"{m['dram_model_gbps']:16,.0f}")
    _write(report, args)
    _plot(args, lambda r: __import__("l2ctl.plot").plot.stride(r), report)
    return EXIT_OK


def cmd_bench_cs(args: argparse.Namespace) -> int:
    from . import bench

    report = bench.bench_cache_streaming(args.n, device=args.device, repeat=args.repeat, warmup=args.warmup,
                                         progress=not args.quiet)
    print(_header(report))
    print(f"cache-streaming loads, {args.n:,} elements; outputs of both versions identical and within 1e-5 of float64")
    print(f"{'scenario':>16} {'normal ms':>10} {'.cs ms':>10} {'speedup':>8}")
    for scenario in ("sparse_vector", "stream_analysis"):
        normal = report.find(f"{scenario}/normal").median_ms
        cs = report.find(f"{scenario}/cs").median_ms
        print(f"{scenario:>16} {normal:10.4f} {cs:10.4f} {normal / cs:7.2f}x")
    _write(report, args)
    _plot(args, lambda r: __import__("l2ctl.plot").plot.cache_streaming(r), report)
    return EXIT_OK


def cmd_bench_graph(args: argparse.Namespace) -> int:
    from . import bench

    report = bench.bench_graph(args.lut_bytes, device=args.device, repeat=args.repeat, warmup=args.warmup)
    print(_header(report))
    plain = report.records[0]
    print(f"graph of {plain.config['kernels_per_graph']} reset-data kernels, LUT {_fmt_bytes(plain.config['lut_bytes'])}, "
          f"output {_fmt_bytes(plain.config['out_bytes'])}; outputs verified")
    print(f"  replay, no window:                                 {plain.median_ms:8.3f} ms")
    for r in report.records[1:]:
        how = r.variant.replace("replay_window_", "")
        print(f"  replay, window on nodes, instance refreshed by {how:<11} {r.median_ms:8.3f} ms  "
              f"({r.metrics['speedup_vs_no_window']:.2f}x; set-aside {_fmt_bytes(r.config['set_aside_granted'])}, "
              f"hit ratio {r.config['hit_ratio']:.3f})")
    _write(report, args)
    return EXIT_OK


def cmd_bench_concurrent(args: argparse.Namespace) -> int:
    from . import bench

    report = bench.bench_concurrent(set_aside=args.set_aside, device=args.device, repeat=args.repeat, warmup=args.warmup)
    print(_header(report))
    r0 = report.records[0]
    print(f"two reset-data kernels on two streams at once, set-aside {_fmt_bytes(r0.config['set_aside_granted'])}, "
          f"each LUT {_fmt_bytes(r0.config['lut_bytes_each'])}; outputs verified")
    print(f"{'variant':>18} {'hit ratios':>14} {'kernel 1 ms':>12} {'kernel 2 ms':>12} {'both ms':>9} {'speedup':>8}")
    for r in report.records:
        hr = r.config["hit_ratios"]
        hrs = "-" if hr[0] is None else f"{hr[0]:.2f}/{hr[1]:.2f}"
        print(f"{r.variant:>18} {hrs:>14} {r.metrics['kernel1_median_ms']:12.3f} {r.metrics['kernel2_median_ms']:12.3f} "
              f"{r.median_ms:9.3f} {r0.median_ms / r.median_ms:7.2f}x")
    _write(report, args)
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    import l2ctl
    from . import plot, sweep

    with l2ctl.Stream(args.device) as s:
        if args.kind == "tax":
            report = sweep.sweep_tax(s, repeat=args.repeat, warmup=args.warmup, progress=not args.quiet)
            print(_header(report))
            print(f"{'set-aside':>12} {'write GB/s':>11} {'copy GB/s':>10}")
            for r in report.records:
                print(f"{_fmt_bytes(r.config['set_aside_granted']):>12} {r.metrics['write_gbps']:11,.0f} "
                      f"{r.metrics['copy_gbps']:10,.0f}")
            _write(report, args)
            _plot(args, plot.tax, report)
            return EXIT_OK
        with sweep.ResetDataWorkload(args.lut_bytes, args.out_bytes, variant=args.variant, device=args.device) as w:
            kw = dict(warmup=args.warmup, repeat=args.repeat, progress=not args.quiet)
            if args.kind == "hit-ratio":
                result = sweep.sweep_hit_ratio(w, s, w.buf, set_aside=args.set_aside, **kw)
                draw = plot.hit_ratio
            elif args.kind == "set-aside":
                result = sweep.sweep_set_aside(w, s, w.buf, **kw)
                draw = plot.set_aside
            else:
                result = sweep.sweep_surface(w, s, w.buf, **kw)
                draw = plot.surface
    report = result.report()
    print(_header(report))
    print(f"reset-data ({args.variant}), LUT {_fmt_bytes(args.lut_bytes)}: baseline {result.baseline.median_ms:.3f} ms; "
          "every output verified")
    print(f"{'set-aside':>12} {'hit ratio':>9} {'ms':>8} {'speedup':>8}")
    for r in result.records:
        print(f"{_fmt_bytes(r.config['set_aside_granted']):>12} {r.config['hit_ratio']:9.3f} {r.median_ms:8.3f} "
              f"{r.metrics['speedup_vs_baseline']:7.2f}x")
    _write(report, args)
    _plot(args, draw, result)
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    import l2ctl
    from . import sweep, tuner

    sizes = args.lut_sizes or [4 << 20]
    rows = []
    with l2ctl.Stream(args.device) as s:
        for lut in sizes:
            with sweep.ResetDataWorkload(lut, args.out_bytes, variant=args.variant, device=args.device) as w:
                tuned = tuner.tune(w, s, w.buf, bystander=args.bystander, progress=not args.quiet)
            rows.append((lut, tuned))
            if args.json:
                tuned.report().to_json(args.json if len(sizes) == 1 else f"{args.json.rsplit('.', 1)[0]}_{lut}.json")
    print(_header(rows[0][1].report()))
    for lut, tuned in rows:
        print(f"reset-data ({args.variant}) LUT {_fmt_bytes(lut)}: {tuned}")
        if tuned.bystander:
            b = tuned.bystander
            print(f"  bystander copy: {b['copy_gbps_without']:,.0f} GB/s without the set-aside, {b['copy_gbps_with']:,.0f} "
                  f"with it ({b['copy_slowdown']:.2f}x slower)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m l2ctl", description="NVIDIA L2 persistence controls and benchmarks",
                                     epilog="exit codes: 0 ok, 1 CUDA error, 2 bad arguments, 3 no/unsupported GPU, "
                                            "4 verification failed")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="devices, L2 properties, current set-aside, support")
    p.add_argument("--device", type=int, default=None)
    p.add_argument("--probe", action="store_true", help="probe the set-aside granularity (sets and restores the limit)")
    p.set_defaults(func=cmd_info)

    b = sub.add_parser("bench", help="benchmarks (no name: reset-data, the main job)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", type=int, default=None)
    common.add_argument("--repeat", type=int, default=15, help="timed repetitions (median reported)")
    common.add_argument("--warmup", type=int, default=3)
    common.add_argument("--json", metavar="PATH", help="write the full records as JSON")
    common.add_argument("--csv", metavar="PATH", help="write one CSV row per measurement")
    common.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bsub = b.add_subparsers(dest="bench")
    r = bsub.add_parser("reset-data", parents=[common], help="a LUT repeated into a large buffer, per policy")
    for target in (b, r):
        target.add_argument("--lut-sizes", type=_sizes, default=None, help="comma-separated, e.g. 1M,4M,8M")
        target.add_argument("--out-bytes", type=_size, default=1 << 30)
        target.add_argument("--columns", type=lambda t: [c.strip() for c in t.split(",")], default=None)
        target.add_argument("--counters", action="store_true",
                            help="add DRAM bytes and L2 hit rate from CUPTI (one extra untimed launch per point)")
    for action in common._actions:
        if action.dest != "help":
            b._add_action(action)
    b.set_defaults(func=cmd_bench_reset)
    r.set_defaults(func=cmd_bench_reset)
    s = bsub.add_parser("stride", parents=[common], help="4-byte loads at growing strides")
    s.add_argument("--strides", type=lambda t: [int(x) for x in t.split(",")], default=[4, 8, 16, 32, 64, 128])
    s.add_argument("--threads", type=int, default=1 << 25)
    s.set_defaults(func=cmd_bench_stride)
    c = bsub.add_parser("cache-streaming", parents=[common], help="normal vs .cs loads, the document's two scenarios")
    c.add_argument("--n", type=int, default=10_000_000)
    c.set_defaults(func=cmd_bench_cs)
    g = bsub.add_parser("graph", parents=[common], help="graph replay with and without a window on its kernel nodes")
    g.add_argument("--lut-bytes", type=_size, default=None)
    g.set_defaults(func=cmd_bench_graph)
    k = bsub.add_parser("concurrent", parents=[common], help="two streams sharing one set-aside")
    k.add_argument("--set-aside", type=_size, default=None)
    k.set_defaults(func=cmd_bench_concurrent)
    w = sub.add_parser("sweep", parents=[common], help="hit ratio / set-aside / surface sweeps of reset-data, the tax")
    w.add_argument("kind", choices=["hit-ratio", "set-aside", "surface", "tax"])
    w.add_argument("--lut-bytes", type=_size, default=4 << 20)
    w.add_argument("--out-bytes", type=_size, default=1 << 30)
    w.add_argument("--set-aside", type=_size, default=None, help="for hit-ratio (default: LUT rounded up)")
    w.add_argument("--variant", default="plain", help="reset-data kernel variant (plain, scalar, hinted, ...)")
    w.add_argument("--plot", metavar="PNG", help="save a plot")
    w.set_defaults(func=cmd_sweep)
    t = sub.add_parser("tune", parents=[common], help="find the best set-aside and hit ratio for reset-data")
    t.add_argument("--lut-sizes", type=_sizes, default=None)
    t.add_argument("--out-bytes", type=_size, default=1 << 30)
    t.add_argument("--variant", default="plain")
    t.add_argument("--bystander", action="store_true", help="also measure the tax on a plain copy")
    t.set_defaults(func=cmd_tune)
    for parser_ in (r, s, c, b):
        parser_.add_argument("--plot", metavar="PNG", help="save a plot")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except NotSupportedError as exc:
        print(f"l2ctl: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except ValueError as exc:
        print(f"l2ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CudaError as exc:
        print(f"l2ctl: CUDA error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except AssertionError as exc:  # VerificationError
        print(f"l2ctl: {exc}", file=sys.stderr)
        return EXIT_VERIFY
    except KeyboardInterrupt:
        print("l2ctl: interrupted; device state restored", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
