"""The lean scope's host cost in every argument form, several builds of l2ctl side by side on one host (issue 44's
"no speed regression": before against after).

Each build is an installed copy (``pip install --target DIR``). The builds run alternately, one process at a time,
in an order that rotates each run, ``--runs`` times each, so that a busy spell of the host falls on all of them.
Every build is timed by the same code, this script's own (not the build's ``bench`` package, which changes between
commits), through l2ctl's public API only. Each run also times a reference that does not depend on l2ctl: the same
two stream-attribute calls through cuda.bindings, interleaved with the variants round by round. The host of a
cloud GPU switches between speeds whose per-call costs differ by up to 2x, for minutes at a time, and not in
proportion for every operation; the reference tells which speed a run had, and the verdict compares builds within
one speed (``fast_*`` and ``slow_*`` in the summary). The record also keeps the raw medians over all runs and each
variant over the reference.

    python scripts/compare_lean_overhead.py --build before=/tmp/before@ff88d18 --build after=/tmp/after@HEAD \
        --runs 8 --json lean_overhead.json
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
            "persist_lean_torch_1_0", "persist_graph_1", "persist_graph_32")
REFERENCE = "raw_set_clear_window"

# One run in one process: the operations, each checked once to apply what it claims, then timed round-robin.
RUN = r"""
import json, statistics, time
import numpy as np
import torch
from cuda.bindings import runtime as rt
import l2ctl
from l2ctl import DeviceBuffer, Policy, Stream, get_set_aside, get_window, persist
from l2ctl.bench.records import environment

ROUNDS, ITERATIONS = {rounds}, {iterations}
MiB = 1 << 20
s = Stream(0)
buf = DeviceBuffer(4 * MiB, 0)
out = DeviceBuffer(MiB, 0)
limit = get_set_aside(0)
graphs = []
for nodes in (1, 32):
    with l2ctl.graph.capture(s) as g:
        for _ in range(nodes):
            l2ctl.kernels.write_index(out, s)
    graphs.append(g)
t_stream = torch.cuda.Stream(device=0)
t_buf = torch.empty(MiB, dtype=torch.int32, device="cuda:0")
lean_policy = Policy(set_aside=None, hit_ratio=0.75)
reusable = persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)

def lean(target, b, ratio, set_aside=None):
    def op():
        with persist(target, b, ratio, set_aside=set_aside, reset_on_exit=False):
            pass
    return op

def reused():
    with reusable:
        pass

def keyword():
    with persist(s, buf, hit_ratio=0.75, set_aside=None, reset_on_exit=False):
        pass

def policy():
    with persist(s, buf, policy=lean_policy, reset_on_exit=False):
        pass

# The reference written here, not taken from l2ctl.bench.overhead: each build under test has its own bench package,
# and the reference must be the same code in every build's process.
ids = rt.cudaStreamAttrID
attribute = getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None) or ids.cudaStreamAttributeAccessPolicyWindow
value_type = getattr(rt, "cudaStreamAttrValue", None) or rt.cudaLaunchAttributeValue
window, empty = value_type(), value_type()
window.accessPolicyWindow.base_ptr = buf.ptr
window.accessPolicyWindow.num_bytes = buf.nbytes
window.accessPolicyWindow.hitRatio = 0.75
window.accessPolicyWindow.hitProp = rt.cudaAccessProperty.cudaAccessPropertyPersisting
window.accessPolicyWindow.missProp = rt.cudaAccessProperty.cudaAccessPropertyStreaming
raw_stream = rt.cudaStream_t(s.handle)
ok = rt.cudaError_t.cudaSuccess

def raw_set_clear_window():
    (e1,) = rt.cudaStreamSetAttribute(raw_stream, attribute, window)
    (e2,) = rt.cudaStreamSetAttribute(raw_stream, attribute, empty)
    if e1 != ok or e2 != ok:
        raise RuntimeError(f"cudaStreamSetAttribute: {{e1}}, {{e2}}")

ops = {{"persist_lean": lean(s, buf, 0.75), "persist_lean_reused": reused, "persist_lean_keyword": keyword,
       "persist_lean_policy": policy, "persist_lean_1_0": lean(s, buf, 1.0), "persist_lean_int_1": lean(s, buf, 1),
       "persist_lean_np_float32": lean(s, buf, np.float32(0.75)), "persist_lean_limit": lean(s, buf, 0.75, limit),
       "persist_lean_torch": lean(t_stream, t_buf, 0.75), "persist_lean_torch_1_0": lean(t_stream, t_buf, 1.0),
       "persist_graph_1": lean(graphs[0], buf, 0.75), "persist_graph_32": lean(graphs[1], buf, 0.75),
       "raw_set_clear_window": raw_set_clear_window}}
names = {names!r}
# Checked once, untimed: inside each scope the window is where it belongs; after it, nothing is left.
for name in names:
    if name.startswith("persist_graph"):
        g = graphs[0 if name.endswith("_1") else 1]
        with persist(g, buf, 0.75, set_aside=None, reset_on_exit=False):
            assert all(k.window.num_bytes == buf.nbytes for k in g.kernel_nodes()), name
        assert all(k.window.empty for k in g.kernel_nodes()), name
    elif name == "persist_lean_torch":
        with persist(t_stream, t_buf, 0.75, set_aside=None, reset_on_exit=False):
            assert get_window(t_stream).num_bytes == t_buf.nbytes, name
        assert get_window(t_stream).empty, name
    elif name != "raw_set_clear_window":
        ops[name]()
    assert get_window(s).empty and get_set_aside(0) == limit, name
with persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
    assert get_window(s).num_bytes == buf.nbytes and abs(get_window(s).hit_ratio - 0.75) < 1e-6

samples = {{name: [] for name in names}}
for _ in range(ROUNDS):
    for name in names:
        op = ops[name]
        op()
        start = time.perf_counter_ns()
        for _ in range(ITERATIONS):
            op()
        samples[name].append((time.perf_counter_ns() - start) / ITERATIONS / 1e3)
assert get_window(s).empty and get_set_aside(0) == limit
print(json.dumps({{"file": l2ctl.__file__, "environment": environment(0),
                  "medians": {{n: statistics.median(v) for n, v in samples.items()}}, "rounds_us": samples}}))
"""


def run(site: str, commit: str, rounds: int, iterations: int) -> dict:
    env = {**os.environ, "PYTHONPATH": site, "L2CTL_COMMIT": commit}
    code = RUN.format(rounds=rounds, iterations=iterations, names=list(VARIANTS) + [REFERENCE])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         cwd="/tmp")
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["file"].startswith(site):
        raise RuntimeError(f"the run imported {result['file']}, not the build in {site}")
    return result


def parse_build(text: str) -> tuple[str, str, str]:
    name, _, rest = text.partition("=")
    site, _, commit = rest.partition("@")
    if not name or not site:
        raise argparse.ArgumentTypeError(f"--build wants NAME=DIR[@COMMIT], not {text!r}")
    return name, site, commit


def by_state(runs: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """The runs of each build in each state of the host, known by the reference's cost: "fast" within 1.25x of the
    fastest reference of any run, "slow" over 1.5x; a run between the two (a state changing under it) is in neither."""
    fastest = min(r["medians"][REFERENCE] for rs in runs.values() for r in rs)
    states: dict[str, dict[str, list[dict]]] = {"fast": {}, "slow": {}}
    for name, rs in runs.items():
        states["fast"][name] = [r for r in rs if r["medians"][REFERENCE] <= 1.25 * fastest]
        states["slow"][name] = [r for r in rs if r["medians"][REFERENCE] > 1.5 * fastest]
    return states


def summarise(runs: dict[str, list[dict]], builds: list[tuple[str, str, str]]) -> dict:
    """Per variant: each build's median over runs (raw, and over the reference), each build over each one given
    before it, and the same within each state of the host (the verdict: builds compared where the host was alike)."""
    baseline = builds[0][0]
    states = by_state(runs)
    summary: dict[str, dict] = {}
    for variant in VARIANTS:
        entry: dict[str, float | None] = {}
        for name in runs:
            entry[f"{name}_us"] = statistics.median(r["medians"][variant] for r in runs[name])
            entry[f"{name}_over_reference"] = statistics.median(r["medians"][variant] / r["medians"][REFERENCE]
                                                                for r in runs[name])
        for state, chosen in states.items():
            for name in runs:
                entry[f"{state}_{name}_us"] = (statistics.median(r["medians"][variant] for r in chosen[name])
                                               if chosen[name] else None)
        names = list(runs)
        pairs = [(name, base) for i, name in enumerate(names) for base in names[:i]]
        for name, base in pairs:
            entry[f"{name}_over_{base}"] = entry[f"{name}_us"] / entry[f"{base}_us"]
            entry[f"{name}_over_{base}_normalised"] = entry[f"{name}_over_reference"] / entry[f"{base}_over_reference"]
            for state in states:
                mine, theirs = entry[f"{state}_{name}_us"], entry[f"{state}_{base}_us"]
                entry[f"{state}_{name}_over_{base}"] = mine / theirs if mine and theirs else None
        summary[variant] = entry
        print(f"{variant:24s} " + "  ".join(f"{n} {entry[f'{n}_us']:5.2f}" for n in runs) + "  |  " + "  ".join(
            f"{n}/{b} {state} {entry[f'{state}_{n}_over_{b}'] or float('nan'):.3f}" for n, b in pairs for state in states))
    reference = {f"{n}_us": statistics.median(r["medians"][REFERENCE] for r in runs[n]) for n in runs}
    return {"benchmark": "lean-overhead-before-after", "baseline": baseline,
            "environments": {n: runs[n][0]["environment"] for n in runs},
            "builds": {n: {"commit": c} for n, _, c in builds}, "reference": {"operation": REFERENCE, **reference},
            "runs_by_state": {state: {n: len(rs) for n, rs in chosen.items()} for state, chosen in by_state(runs).items()},
            "summary": summary, "runs": runs}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=parse_build, action="append", required=True,
                   help="NAME=DIR[@COMMIT], at least two; each is divided by each one given before it")
    p.add_argument("--json", required=True)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--from-json", help="summarise the runs of an earlier record again (no GPU), into --json")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            earlier = json.load(f)
        record = summarise(earlier["runs"], a.build)
        record["config"] = earlier["config"]
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
        return 0
    if len(a.build) < 2:
        p.error("give at least two builds")
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in a.build}
    for i in range(a.runs):
        order = a.build[i % len(a.build):] + a.build[:i % len(a.build)]
        for name, site, commit in order:
            runs[name].append(run(site, commit, a.rounds, a.iterations))
            medians = runs[name][-1]["medians"]
            print(f"run {i + 1} {name}: " + ", ".join(f"{v} {us:.2f}" for v, us in medians.items()), flush=True)
    record = summarise(runs, a.build)
    record["config"] = {"runs": a.runs, "rounds": a.rounds, "iterations": a.iterations, "variants": list(VARIANTS)}
    with open(a.json, "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
