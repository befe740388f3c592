"""``l2ctl.autotune`` on the GPU at hand (issue 42): the gallery's eager workloads, each as an app would wrap its step,

    step = l2ctl.autotune(step)            # the README's form: candidates discovered from the step's kernels

measured against the same step without l2ctl and against today's best manual recipe (``l2ctl.tune`` on the step,
then ``with tuned.persist(stream)`` around the calls), side by side in one process: rounds of ``--calls`` calls of
each arm in a shuffled order, timed with CUDA events on the step's stream, the speedup a paired bootstrap over the
rounds. Each arm's output is verified after its last block. Also recorded: how many of the app's calls autotune took
to decide, that the step ran exactly as often as it was called, and autotune's host cost per call in steady state
(the host time of a block of calls, wrapped against unwrapped, interleaved).

    python scripts/bench_autotune.py --json autotune.json [--workloads scatter-add,broadcast,index_select]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import torch

import l2ctl
from l2ctl.bench.paired import bootstrap_speedup
from l2ctl.bench.records import environment
from l2ctl.workloads import gallery

HOST_BLOCKS, HOST_CALLS = 31, 40  # the host-cost blocks: a median over blocks of calls, wrapped and not


def _block_ms(run: Callable[[], None], stream: torch.cuda.Stream, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(calls):
        run()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / calls


def speedups_over_untouched(times: dict[str, list[float]], seed: int) -> dict[str, dict[str, Any]]:
    """Each arm's speedup over "untouched" (a paired bootstrap over the rounds), its interval and median."""
    base = np.array(times["untouched"]).reshape(-1, 1)
    speedups = {}
    for arm in ("autotune", "tune+persist"):
        x, ci = bootstrap_speedup(base, np.array(times[arm]).reshape(-1, 1), 0.95, seed=seed)
        speedups[arm] = {"speedup": x, "ci": list(ci), "median_ms": statistics.median(times[arm])}
    return speedups


def host_cost_us(untouched: Callable[[], Any], wrapped: Callable[[], Any], blocks: int) -> dict[str, list[float]]:
    """The host time per call of blocks of ``HOST_CALLS`` calls, unwrapped and wrapped, interleaved (the wrapper's
    cost in steady state), each block started on an idle device."""
    host: dict[str, list[float]] = {"autotune": [], "untouched": []}
    for _ in range(blocks):
        for arm, run in (("untouched", untouched), ("autotune", wrapped)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(HOST_CALLS):
                run()
            host[arm].append((time.perf_counter() - t0) / HOST_CALLS * 1e6)
    return host


def measure(name: str, rounds: int, calls: int, seed: int) -> dict[str, Any]:
    entry = gallery.entry(name)
    with entry.make() as w:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        made = [0]

        def step() -> None:  # the app's step, as it wrote it: its work on the stream it runs on
            made[0] += 1
            w.enqueue(s)

        initial = l2ctl.get_set_aside()
        tuned = l2ctl.autotune(step, stream=s)
        app_calls = 0
        while not (tuned.report() and tuned.report()[0].phase == "decided") and app_calls < 1000:
            tuned()
            app_calls += 1
        decision = tuned.report()[0]
        manual = l2ctl.tune(lambda stream: w.enqueue(stream), s, w.candidates())
        u = torch.cuda.Stream()  # the untouched arm's
        arms: dict[str, Callable[[], None]] = {"untouched": lambda: w.enqueue(u), "autotune": tuned}
        times: dict[str, list[float]] = {arm: [] for arm in (*arms, "tune+persist")}
        verified: dict[str, bool] = {}
        rng = np.random.default_rng(seed)
        for r in range(rounds):
            for arm in rng.permutation(list(times)):
                if r == rounds - 1:
                    w.poison(s)
                if arm == "tune+persist":
                    with manual.persist(s):
                        times[arm].append(_block_ms(lambda: w.enqueue(s), s, calls))
                elif arm == "untouched":  # the app without l2ctl: the limit autotune holds put back for the
                    # block, the lines left persisting reset, on a stream of its own (autotune's window stays on s)
                    l2ctl.reset_persisting_lines()
                    u.wait_stream(s)
                    with l2ctl.set_aside(initial):
                        times[arm].append(_block_ms(lambda: w.enqueue(u), u, calls))
                    s.wait_stream(u)
                else:
                    times[arm].append(_block_ms(arms[arm], s, calls))
                if r == rounds - 1:
                    verified[arm] = bool(w.verify(s))
        speedups = speedups_over_untouched(times, seed)
        host = host_cost_us(lambda: w.enqueue(s), tuned, HOST_BLOCKS)
        torch.cuda.synchronize()
        steady_calls = made[0] - app_calls  # the step's calls through the wrapper after the decision
        expected = app_calls + rounds * calls + HOST_BLOCKS * HOST_CALLS
        tuned.stop()
        return {"workload": name, "pattern": entry.pattern, "decided_at_call": decision.decided_at,
                "app_calls_to_decide": app_calls, "step_calls": made[0], "step_calls_expected": expected,
                "calls_match": made[0] == expected, "decision": str(decision),
                "autotune_persists": decision.policy.enabled, "manual": str(manual),
                "manual_persists": manual.persists, "baseline_median_ms": statistics.median(times["untouched"]),
                **{f"{arm}_{k}": v for arm, d in speedups.items() for k, v in d.items()},
                "autotune_vs_manual": speedups["autotune"]["speedup"] / speedups["tune+persist"]["speedup"],
                "host_us_untouched": statistics.median(host["untouched"]),
                "host_us_autotune": statistics.median(host["autotune"]),
                "autotune_cost_us": statistics.median(host["autotune"]) - statistics.median(host["untouched"]),
                "verified": verified, "steady_calls": steady_calls,
                "config": {"rounds": rounds, "calls": calls, "seed": seed}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--workloads", default="scatter-add,broadcast,index_select")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    results = []
    for name in a.workloads.split(","):
        r = measure(name, a.rounds, a.calls, a.seed)
        print(f"{name}: autotune {r['autotune_speedup']:.3f}x ({r['autotune_ci'][0]:.3f}-{r['autotune_ci'][1]:.3f}), "
              f"tune+persist {r['tune+persist_speedup']:.3f}x, ratio {r['autotune_vs_manual']:.3f}; decided at call "
              f"{r['decided_at_call']}; host cost {r['autotune_cost_us']:.2f} us/call; calls match "
              f"{r['calls_match']}; verified {r['verified']}\n  {r['decision']}", flush=True)
        results.append(r)
    record = {"benchmark": "autotune", "environment": environment(), "results": results}
    with open(a.json, "w") as f:
        json.dump(record, f, indent=1, default=str)
    return 0 if all(all(r["verified"].values()) and r["calls_match"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
