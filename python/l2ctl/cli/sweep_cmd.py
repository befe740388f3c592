"""``l2ctl sweep KIND``: the sweeps of l2ctl.sweep over reset-data (hit ratio, set-aside, the surface of
both) and the set-aside tax on unrelated kernels. Each kind takes only the options it uses."""

from __future__ import annotations

import argparse
from typing import Any

import l2ctl

from .. import plot
from .options import COMMON, LUT_BYTES, OUT_BYTES, PLOT, SET_ASIDE, VARIANT, Option
from .output import done, format_bytes, header, measure
from .parsing import Command, Group

__all__ = ["cmd_sweep_hit_ratio", "cmd_sweep_set_aside", "cmd_sweep_surface", "cmd_sweep_tax", "HIT_RATIO",
           "SET_ASIDE_SWEEP", "SURFACE", "TAX", "SWEEPS", "SWEEP"]


def _reset_data_sweep(args: argparse.Namespace, kind: str, **options: Any) -> int:
    """``sweep.sweep_<kind>`` of reset-data (LUT --lut-bytes, output --out-bytes, kernel --variant), its table
    and files (the plot: ``plot.<kind>``)."""
    from .. import sweep

    with l2ctl.Stream(args.device) as s, \
            sweep.ResetDataWorkload(args.lut_bytes, args.out_bytes, variant=args.variant, device=args.device) as w:
        result = getattr(sweep, f"sweep_{kind}")(w, s, w.buf, **options, **measure(args))
    report = result.report()
    print(header(report))
    print(f"reset-data ({args.variant}), LUT {format_bytes(args.lut_bytes)}: baseline {result.baseline.median_ms:.3f} ms; "
          "every output verified")
    print(f"{'set-aside':>12} {'hit ratio':>9} {'ms':>8} {'speedup':>8}")
    for r in result.records:
        print(f"{format_bytes(r.config['set_aside_granted']):>12} {r.config['hit_ratio']:9.3f} {r.median_ms:8.3f} "
              f"{r.metrics['speedup_vs_baseline']:7.2f}x")
    return done(args, report, getattr(plot, kind), result)


def cmd_sweep_hit_ratio(args: argparse.Namespace) -> int:
    return _reset_data_sweep(args, "hit_ratio", set_aside=args.set_aside)


def cmd_sweep_set_aside(args: argparse.Namespace) -> int:
    return _reset_data_sweep(args, "set_aside")


def cmd_sweep_surface(args: argparse.Namespace) -> int:
    return _reset_data_sweep(args, "surface")


def cmd_sweep_tax(args: argparse.Namespace) -> int:
    from .. import sweep

    with l2ctl.Stream(args.device) as s:
        report = sweep.sweep_tax(s, **measure(args))
    print(header(report))
    print(f"{'set-aside':>12} {'write GB/s':>11} {'copy GB/s':>10}")
    for r in report.records:
        print(f"{format_bytes(r.config['set_aside_granted']):>12} {r.metrics['write_gbps']:11,.0f} "
              f"{r.metrics['copy_gbps']:10,.0f}")
    return done(args, report, plot.tax)


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
    takers = {dest: [c.name for c in commands if any(o.dest == dest for o in c.options)] for dest in seen}
    return tuple(o if len(takers[d]) == len(commands) else o.but(help=f"{o.help}; {', '.join(takers[d])} only")
                 for d, o in seen.items())


SWEEP = Group(
    "sweep", "hit-ratio / set-aside / surface sweeps of reset-data, and the set-aside tax", SWEEPS,
    _union(SWEEPS), None,
    "Sweeps; every point starts from a clean state and the device's limit is restored afterwards.\n"
    "Options may come before or after the kind (sweep --json x.json tax); one the kind does not take is\n"
    "refused (the tax runs no reset-data: no --lut-bytes, --out-bytes, --variant, --set-aside).",
    "KIND")
