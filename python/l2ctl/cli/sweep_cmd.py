"""``l2ctl sweep KIND``: the sweeps of l2ctl.sweep over reset-data (hit ratio, set-aside, the surface of
both) and the set-aside tax on unrelated kernels. Each kind takes only the options it uses."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from .exitcodes import EXIT_OK
from .options import COMMON, LUT_BYTES, OUT_BYTES, PLOT, SET_ASIDE, VARIANT, Option
from .output import fmt_bytes, header, save_plot, write_report
from .parsing import Command, Group

__all__ = ["cmd_sweep_hit_ratio", "cmd_sweep_set_aside", "cmd_sweep_surface", "cmd_sweep_tax", "HIT_RATIO",
           "SET_ASIDE_SWEEP", "SURFACE", "TAX", "SWEEPS", "SWEEP"]

# (workload, stream, measurement keywords) -> SweepResult
Sweeper = Callable[[Any, Any, "dict[str, Any]"], Any]


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    return {"warmup": args.warmup, "repeat": args.repeat, "progress": not args.quiet}


def _reset_data_sweep(args: argparse.Namespace, sweeper: Sweeper, draw: Callable[[Any], Any]) -> int:
    """A sweep of reset-data (LUT --lut-bytes, output --out-bytes, kernel --variant), its table and files."""
    import l2ctl

    from .. import sweep

    with l2ctl.Stream(args.device) as s, \
            sweep.ResetDataWorkload(args.lut_bytes, args.out_bytes, variant=args.variant, device=args.device) as w:
        result = sweeper(w, s, _measure(args))
    report = result.report()
    print(header(report))
    print(f"reset-data ({args.variant}), LUT {fmt_bytes(args.lut_bytes)}: baseline {result.baseline.median_ms:.3f} ms; "
          "every output verified")
    print(f"{'set-aside':>12} {'hit ratio':>9} {'ms':>8} {'speedup':>8}")
    for r in result.records:
        print(f"{fmt_bytes(r.config['set_aside_granted']):>12} {r.config['hit_ratio']:9.3f} {r.median_ms:8.3f} "
              f"{r.metrics['speedup_vs_baseline']:7.2f}x")
    write_report(report, args.json, args.csv)
    save_plot(args.plot, draw, result)
    return EXIT_OK


def cmd_sweep_hit_ratio(args: argparse.Namespace) -> int:
    from .. import plot, sweep

    return _reset_data_sweep(
        args, lambda w, s, kw: sweep.sweep_hit_ratio(w, s, w.buf, set_aside=args.set_aside, **kw), plot.hit_ratio)


def cmd_sweep_set_aside(args: argparse.Namespace) -> int:
    from .. import plot, sweep

    return _reset_data_sweep(args, lambda w, s, kw: sweep.sweep_set_aside(w, s, w.buf, **kw), plot.set_aside)


def cmd_sweep_surface(args: argparse.Namespace) -> int:
    from .. import plot, sweep

    return _reset_data_sweep(args, lambda w, s, kw: sweep.sweep_surface(w, s, w.buf, **kw), plot.surface)


def cmd_sweep_tax(args: argparse.Namespace) -> int:
    import l2ctl

    from .. import plot, sweep

    with l2ctl.Stream(args.device) as s:
        report = sweep.sweep_tax(s, **_measure(args))
    print(header(report))
    print(f"{'set-aside':>12} {'write GB/s':>11} {'copy GB/s':>10}")
    for r in report.records:
        print(f"{fmt_bytes(r.config['set_aside_granted']):>12} {r.metrics['write_gbps']:11,.0f} "
              f"{r.metrics['copy_gbps']:10,.0f}")
    write_report(report, args.json, args.csv)
    save_plot(args.plot, plot.tax, report)
    return EXIT_OK


WORKLOAD: tuple[Option, ...] = (LUT_BYTES, OUT_BYTES, VARIANT)
MEASURE: tuple[Option, ...] = COMMON + (PLOT,)

HIT_RATIO = Command(
    "hit-ratio", "reset-data time against the window's hit ratio (0 to 1) at one set-aside",
    WORKLOAD + (SET_ASIDE.but(help="set-aside limit to sweep at",
                              shown_default="the LUT rounded up to the granularity, capped at the max"),) + MEASURE,
    cmd_sweep_hit_ratio)
SET_ASIDE_SWEEP = Command(
    "set-aside", "reset-data time against the set-aside (every granule), hit ratio min(1, set-aside / LUT)",
    WORKLOAD + MEASURE, cmd_sweep_set_aside)
SURFACE = Command(
    "surface", "reset-data speedup over set-aside x hit ratio (every granule x 0.1 .. 1.0)",
    WORKLOAD + MEASURE, cmd_sweep_surface)
TAX = Command(
    "tax", "write-only and copy bandwidth of plain kernels (no window anywhere) at each set-aside",
    MEASURE, cmd_sweep_tax)

SWEEPS: tuple[Command, ...] = (HIT_RATIO, SET_ASIDE_SWEEP, SURFACE, TAX)


def _union(commands: tuple[Command, ...]) -> tuple[Option, ...]:
    """Every option of the kinds, once; the help of one that not every kind takes names the kinds."""
    seen: dict[str, Option] = {}
    for command in commands:
        for o in command.options:
            seen.setdefault(o.dest, o)
    out = []
    for dest, o in seen.items():
        takers = [c.name for c in commands if dest in c.dests]
        out.append(o if len(takers) == len(commands) else o.but(help=f"{o.help}; {', '.join(takers)} only"))
    return tuple(out)


SWEEP = Group(
    "sweep", "hit-ratio / set-aside / surface sweeps of reset-data, and the set-aside tax", SWEEPS,
    _union(SWEEPS), None,
    "Sweeps; every point starts from a clean state and the device's limit is restored afterwards.\n"
    "Options may come before or after the kind (sweep --json x.json tax); one the kind does not take is\n"
    "refused (the tax runs no reset-data: no --lut-bytes, --out-bytes, --variant, --set-aside).",
    "KIND")
