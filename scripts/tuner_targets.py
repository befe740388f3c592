"""The tuner against an exhaustive grid, in one process: for each LUT size, every set-aside granule x hit
ratio 0.1 .. 1.0 (sweep_surface), then tune(), then the baseline, the grid's best point and the tuned
policy re-measured side by side in paired rounds (bench.compare), with the tax of each set-aside. Writes
JSON and prints a Markdown table.

    python scripts/tuner_targets.py [--variant plain|scalar] [--sizes 1,4,16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import warnings

import l2ctl
from l2ctl import bench, sweep
from l2ctl._plan import hit_ratio_grid

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="plain")
    ap.add_argument("--sizes", default="", help="LUT sizes in MiB (default: 2, 8, 16, 24, 32, 64 and 96%% of the L2)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.sizes:
        sizes = [int(float(x) * MiB) for x in args.sizes.split(",")]
    else:  # the GPU's own scale: 1, 4, 8, 12, 16, 32 and 48 MiB on a 50 MiB L2
        l2 = l2ctl.device_info().l2_cache_size
        sizes = [max(MiB, int(f * l2) // MiB * MiB) for f in (0.02, 0.08, 0.16, 0.24, 0.32, 0.64, 0.96)]
    rows = []
    with l2ctl.Stream() as s:
        for lut in sizes:
            with sweep.ResetDataWorkload(lut, variant=args.variant) as w:
                grid = sweep.sweep_surface(w, s, w.buf, hit_ratios=hit_ratio_grid(10, 0.1, 1.0), warmup=2, repeat=7,
                                           progress=False)
                best = min(grid.records, key=lambda r: r.median_ms)
                best_sa, best_hr = best.config["set_aside_granted"], best.config["hit_ratio"]
                tuned = l2ctl.tune(w, s, {"lut": w.buf})
                arms = [bench.Arm("grid best", best_sa, lambda: l2ctl.persist(s, w.buf, best_hr, set_aside=None)),
                        bench.Arm("tuned", 0, lambda: tuned.persist(s))]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", l2ctl.L2BudgetWarning)  # the grid's best may oversubscribe
                    base, (grid_best, chosen) = bench.compare(w, s, arms, rounds=7, repeat=5, seed=11)
            row = {
                "lut_mib": lut / MiB,
                "baseline_ms": base.median_ms,
                "grid_points": len(grid.records) + 1,
                "grid_best_set_aside_mib": best_sa / MiB, "grid_best_hit_ratio": best_hr,
                "grid_best_speedup": grid_best.speedup, "grid_best_ci": list(grid_best.ci),
                "grid_best_copy_slowdown": bench.measure_tax(s, best_sa).copy_slowdown,
                "tuned_persists": tuned.persists,
                "tuned_set_aside_mib": (tuned.policy.set_aside / MiB) if tuned.persists else 0.0,
                "tuned_hit_ratio": tuned.policy.hit_ratio if tuned.persists else None,
                "tuned_num_bytes": tuned.policy.num_bytes,
                "tuned_speedup": chosen.speedup, "tuned_ci": list(chosen.ci),
                "tuned_copy_slowdown": tuned.tax.copy_slowdown,
                "tune_points": sum(len(c.points) for c in tuned.candidates.values()),
                "tune_seconds": tuned.seconds,
            }
            row["tuned_vs_grid_best"] = row["grid_best_speedup"] / row["tuned_speedup"]
            rows.append(row)
            print(f"LUT {lut / MiB:g} MiB done: {row}", flush=True)
    info = l2ctl.device_info()
    print(f"\n{info.name}, reset-data ({args.variant}), 1 GiB output; speedups over the baseline re-measured side "
          "by side (paired rounds); copy = a plain copy's slowdown under that set-aside\n")
    print("| LUT | baseline ms | grid best (set-aside, hitRatio) | copy | tuned (set-aside, hitRatio) | copy | "
          "grid best / tuned | tune time |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        tuned_cell = (f"{r['tuned_speedup']:.2f}x ({r['tuned_set_aside_mib']:.2f} MiB, {r['tuned_hit_ratio']:.2f})"
                      if r["tuned_persists"] else f"{r['tuned_speedup']:.2f}x (no persistence)")
        print(f"| {r['lut_mib']:g} MiB | {r['baseline_ms']:.3f} | {r['grid_best_speedup']:.2f}x "
              f"({r['grid_best_set_aside_mib']:.2f} MiB, {r['grid_best_hit_ratio']:.1f}) | "
              f"{r['grid_best_copy_slowdown']:.2f}x | {tuned_cell} | {r['tuned_copy_slowdown']:.2f}x | "
              f"{r['tuned_vs_grid_best']:.3f} | {r['tune_seconds']:.1f} s ({r['tune_points']} points) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "variant": args.variant, "environment": bench.environment(), "rows": rows},
                      f, indent=2, default=str)


if __name__ == "__main__":
    main()
