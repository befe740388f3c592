"""The tuner's targets, measured in one process: for each LUT size, the no-persistence baseline, the
best point of an exhaustive grid (every set-aside granule x hit ratio 0.1 .. 1.0), and tune()'s choice
re-measured next to them. Writes JSON and prints a Markdown table.

    python scripts/tuner_targets.py [--variant plain|scalar] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import l2ctl
from l2ctl import sweep
from l2ctl._plan import hit_ratio_grid

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="plain")
    ap.add_argument("--sizes", default="1,4,8,12,16,32,48")
    ap.add_argument("--json")
    args = ap.parse_args()
    sizes = [int(float(x) * MiB) for x in args.sizes.split(",")]
    rows = []
    with l2ctl.Stream() as s:
        for lut in sizes:
            with sweep.ResetDataWorkload(lut, variant=args.variant) as w:
                grid = sweep.sweep_surface(w, s, w.buf, hit_ratios=hit_ratio_grid(10, 0.1, 1.0), warmup=2, repeat=7,
                                           progress=False)
                best = min(grid.records, key=lambda r: r.median_ms)
                tuned = l2ctl.tune(w, s, w.buf)
                # the chosen policy and the baseline measured again, side by side, after both searches
                base = sweep.measure_point(w, s, w.buf, 0, None, warmup=2, repeat=9, label="baseline")
                if tuned.persists:
                    chosen = sweep.measure_point(w, s, w.buf, tuned.policy.set_aside, tuned.policy.hit_ratio, warmup=2,
                                                 repeat=9, label="tuned")
                else:
                    chosen = base
                grid_best = sweep.measure_point(w, s, w.buf, best.config["set_aside_granted"], best.config["hit_ratio"],
                                                warmup=2, repeat=9, label="grid-best")
            row = {
                "lut_mib": lut / MiB,
                "baseline_ms": base.median_ms,
                "grid_best_ms": grid_best.median_ms,
                "grid_best_set_aside_mib": best.config["set_aside_granted"] / MiB,
                "grid_best_hit_ratio": best.config["hit_ratio"],
                "grid_points": len(grid.records) + 1,
                "tuned_ms": chosen.median_ms,
                "tuned_persists": tuned.persists,
                "tuned_set_aside_mib": (tuned.policy.set_aside / MiB) if tuned.persists else 0.0,
                "tuned_hit_ratio": tuned.policy.hit_ratio if tuned.persists else None,
                "tune_points": len(tuned.table),
                "tune_seconds": tuned.seconds,
            }
            row["tuned_vs_grid_best"] = row["tuned_ms"] / row["grid_best_ms"]
            row["tuned_speedup"] = row["baseline_ms"] / row["tuned_ms"]
            row["grid_best_speedup"] = row["baseline_ms"] / row["grid_best_ms"]
            rows.append(row)
            print(f"LUT {lut / MiB:g} MiB done: {row}", flush=True)
    info = l2ctl.device_info()
    print(f"\n{info.name}, reset-data ({args.variant}), 1 GiB output; times are medians (ms) re-measured side by side\n")
    print("| LUT | baseline | grid best (set-aside, hitRatio) | tuned (set-aside, hitRatio) | tuned / grid best | "
          "tuned speedup | tune time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        tuned = (f"{r['tuned_ms']:.3f} ({r['tuned_set_aside_mib']:.2f} MiB, {r['tuned_hit_ratio']:.2f})" if r["tuned_persists"]
                 else f"{r['tuned_ms']:.3f} (no persistence)")
        print(f"| {r['lut_mib']:g} MiB | {r['baseline_ms']:.3f} | {r['grid_best_ms']:.3f} ({r['grid_best_set_aside_mib']:.2f} MiB, "
              f"{r['grid_best_hit_ratio']:.1f}) | {tuned} | {r['tuned_vs_grid_best']:.3f} | {r['tuned_speedup']:.2f}x | "
              f"{r['tune_seconds']:.1f} s ({r['tune_points']} points) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "variant": args.variant, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
