"""``l2ctl tune``: the set-aside and hit ratio that make reset-data fastest (l2ctl.tune), per LUT size."""

from __future__ import annotations

import argparse

import l2ctl

from ..bench.records import Report
from .exitcodes import EXIT_OK
from .options import CSV, DEVICE, JSON, LUT_SIZES, OUT_BYTES, QUIET, REPEAT, ROUNDS, SIMULATE, VARIANT, WARMUP
from .output import format_bytes, header, measure, numbered_path, write_report, write_reports_to_stdout
from .parsing import Command

__all__ = ["cmd_tune", "TUNE"]


def cmd_tune(args: argparse.Namespace) -> int:
    from .. import sweep, tuner

    sizes: list[int] = args.lut_sizes
    many = len(sizes) > 1
    rows: list[tuple[int, tuner.TunedPolicy]] = []
    reports: list[Report] = []
    with l2ctl.Stream(args.device) as s:
        for lut in sizes:
            with sweep.ResetDataWorkload(lut, args.out_bytes, variant=args.variant, device=args.device) as w:
                tuned = tuner.tune(w, s, {"lut": w.buf}, rounds=args.rounds, **measure(args))
            rows.append((lut, tuned))
            reports.append(tuned.report())
            # written as each size finishes: a long run interrupted keeps what it measured
            write_report(reports[-1], numbered_path(args.json, lut) if many else args.json,
                         numbered_path(args.csv, lut) if many else args.csv)
    if many:
        write_reports_to_stdout(reports, args.json, args.csv)
    print(header(reports[0]))
    for lut, tuned in rows:
        print(f"reset-data ({args.variant}) LUT {format_bytes(lut)}: {tuned}")
        for line in tuned.candidate_table():
            print("  " + line)
    return EXIT_OK


PER_SIZE = "; with several LUT sizes, one file per size: PATH_<bytes>.ext (-: one document of all sizes)"

TUNE = Command(
    "tune", "find the best set-aside and hit ratio for reset-data, or that persistence does not pay",
    (LUT_SIZES.but(default=[4 << 20], shown_default="4M"), OUT_BYTES, VARIANT,
     DEVICE, ROUNDS, REPEAT.but(default=5), WARMUP.but(default=1),
     JSON.but(help=JSON.help + PER_SIZE), CSV.but(help=CSV.help + PER_SIZE), QUIET, SIMULATE),
    cmd_tune,
    "The tuner (l2ctl.tune) on reset-data, one LUT size at a time: paired rounds against the baseline;\n"
    "a point wins only when faster beyond the noise at 95% confidence, and the smallest set-aside within\n"
    "noise of the best is chosen, confirmed, and reported with its tax on a plain copy.")
