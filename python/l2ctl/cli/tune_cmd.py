"""``l2ctl tune``: the set-aside and hit ratio that make reset-data fastest (l2ctl.tune), per LUT size."""

from __future__ import annotations

import argparse
from typing import Any

from .exitcodes import EXIT_OK
from .options import CSV, DEVICE, JSON, LUT_SIZES, OUT_BYTES, QUIET, REPEAT, VARIANT, WARMUP, Option
from .output import fmt_bytes, header, numbered_path, write_report
from .parsing import Command

__all__ = ["cmd_tune", "TUNE"]


def cmd_tune(args: argparse.Namespace) -> int:
    import l2ctl

    from .. import sweep, tuner

    sizes: list[int] = args.lut_sizes
    many = len(sizes) > 1
    rows: list[tuple[int, Any]] = []
    with l2ctl.Stream(args.device) as s:
        for lut in sizes:
            with sweep.ResetDataWorkload(lut, args.out_bytes, variant=args.variant, device=args.device) as w:
                tuned = tuner.tune(w, s, w.buf, warmup=args.warmup, repeat=args.repeat, bystander=args.bystander,
                                   progress=not args.quiet)
            rows.append((lut, tuned))
            # written as each size finishes: a long run interrupted keeps what it measured
            write_report(tuned.report(), args.json and (numbered_path(args.json, lut) if many else args.json),
                         args.csv and (numbered_path(args.csv, lut) if many else args.csv))
    print(header(rows[0][1].report()))
    for lut, tuned in rows:
        print(f"reset-data ({args.variant}) LUT {fmt_bytes(lut)}: {tuned}")
        if tuned.bystander:
            b = tuned.bystander
            print(f"  bystander copy: {b['copy_gbps_without']:,.0f} GB/s without the set-aside, "
                  f"{b['copy_gbps_with']:,.0f} with it ({b['copy_slowdown']:.2f}x slower)")
    return EXIT_OK


PER_SIZE = "; with several LUT sizes, one file per size: PATH_<bytes>.ext"

TUNE = Command(
    "tune", "find the best set-aside and hit ratio for reset-data, or that persistence does not pay",
    (LUT_SIZES.but(default=[4 << 20], shown_default="4M"), OUT_BYTES, VARIANT,
     Option("--bystander", "also measure the set-aside's tax on a plain copy", False, switch=True),
     DEVICE, REPEAT.but(default=7), WARMUP.but(default=2),
     JSON.but(help=JSON.help + PER_SIZE), CSV.but(help=CSV.help + PER_SIZE), QUIET),
    cmd_tune,
    "The tuner (l2ctl.tune) on reset-data, one LUT size at a time: a coarse then a fine search over\n"
    "set-aside and hit ratio; the best point wins only if it beats the baseline by more than the noise.")
