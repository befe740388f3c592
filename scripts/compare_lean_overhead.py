"""The lean scope's host cost in every argument form, two builds of l2ctl side by side on one host (issue 44's "no
speed regression": before against after). Each build is an installed copy (``pip install --target DIR``); the two
run alternately, one process at a time, ``--runs`` times each, so a busy spell of the host falls on both. Each run
is ``l2ctl.bench.overhead.bench_overhead`` over the lean variants; the record keeps every run's medians and, per
variant, the median over runs of each build and after / before.

    python scripts/compare_lean_overhead.py --before /tmp/before --before-commit 5d8e706 --after /tmp/after \
        --after-commit HEAD --json lean_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

VARIANTS = ("persist_lean", "persist_lean_reused", "persist_lean_keyword", "persist_lean_policy", "persist_lean_1_0",
            "persist_lean_int_1", "persist_lean_np_float32", "persist_lean_limit", "persist_lean_torch",
            "persist_lean_torch_1_0", "persist_graph_1")

RUN = """
import json, sys
import l2ctl
from l2ctl.bench.overhead import bench_overhead
from l2ctl.bench.records import environment
report = bench_overhead(rounds={rounds}, iterations={iterations}, variants={variants!r})
print(json.dumps({{"file": l2ctl.__file__, "environment": environment(),
                  "medians": {{r.variant: r.metrics["median_us"] for r in report.records if r.verified}}}}))
"""


def run(site: str, commit: str, rounds: int, iterations: int) -> dict:
    env = {**os.environ, "PYTHONPATH": site, "L2CTL_COMMIT": commit}
    code = RUN.format(rounds=rounds, iterations=iterations, variants=list(VARIANTS))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         cwd="/tmp")
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["file"].startswith(site):
        raise RuntimeError(f"the run imported {result['file']}, not the build in {site}")
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--before-commit", default="")
    p.add_argument("--after-commit", default="")
    p.add_argument("--json", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=2000)
    a = p.parse_args(argv)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(a.runs):
        for build in (("before", "after") if i % 2 == 0 else ("after", "before")):
            runs[build].append(run(getattr(a, build), getattr(a, f"{build}_commit"), a.rounds, a.iterations))
            print(f"run {i + 1} {build}: " + ", ".join(f"{v} {us:.2f}" for v, us in runs[build][-1]["medians"].items()),
                  flush=True)
    summary = {}
    for variant in VARIANTS:
        per = {b: [r["medians"][variant] for r in runs[b] if variant in r["medians"]] for b in runs}
        if all(per.values()):
            before, after = statistics.median(per["before"]), statistics.median(per["after"])
            summary[variant] = {"before_us": before, "after_us": after, "after_over_before": after / before}
            print(f"{variant:26s} before {before:6.2f} us  after {after:6.2f} us  {after / before:.3f}")
    record = {"benchmark": "lean-overhead-before-after", "environment": runs["after"][0]["environment"],
              "before_environment": runs["before"][0]["environment"], "summary": summary, "runs": runs,
              "config": {"runs": a.runs, "rounds": a.rounds, "iterations": a.iterations, "variants": list(VARIANTS)}}
    with open(a.json, "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
