"""``l2ctl.autotune`` on torch's forms of a step (issue 42), on the GPU at hand, each as an app writes it and wraps it:

    step = l2ctl.autotune(step)            # one line; the step is called as before

- ``compiled-module``: ``acc.zero_(); acc.index_add_(0, index, values)`` into an accumulator of 0.64 x L2, written at
  a module's top level over the module's tensors (marked static, as a model's buffers are) and compiled with
  ``torch.compile(mode="reduce-overhead")``: torch records CUDA graphs and replays them.
- ``compiled-in-function``: the same step written inside a function over tensors in its closure: torch skips CUDA
  graphs ("mutated inputs") and runs Inductor's kernels eagerly.
- ``default-graph``: the scatter captured in ``torch.cuda.CUDAGraph()`` (torch's defaults) inside
  ``with l2ctl.graph.torch_captures():``, the step a replay.
- ``graphed-callables``: ``torch.cuda.make_graphed_callables(x + bias)`` made inside that block (bias 0.4 x L2,
  x 1 GiB), the step a call of the graphed function.

Three arms side by side in one process, in shuffled rounds of ``--calls`` calls timed with CUDA events on the step's
stream (the speedup a paired bootstrap over the rounds): the step without l2ctl (``untouched``: the limit autotune
holds put back for its block), the step wrapped by autotune, and today's manual recipe (``l2ctl.tune(run, captures,
"discover")`` then ``with tuned.persist(captures):`` around the calls). Each arm's output is verified after its last
block. Also recorded: the calls autotune took to decide, that the step ran exactly as often as the app called it,
and autotune's host cost per call in steady state.

    python scripts/bench_autotune_torch.py --json torch_autotune.json [--forms compiled-module,default-graph]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

import l2ctl
from l2ctl import graph
from l2ctl.bench.records import environment

from bench_autotune import (HOST_CALLS, _block_ms, host_cost_us,  # the eager benchmark's (scripts/ is on the path)
                            speedups_over_untouched)

FORMS = ("compiled-module", "compiled-in-function", "default-graph", "graphed-callables")
HOST_BLOCKS = 21  # blocks of bench_autotune.HOST_CALLS calls
MAX_APP_CALLS = 400  # the calls made before the decision is read (autotune decides within MAX_CALLS)

MODULE_SOURCE = '''
def zero_and_scatter():
    acc.zero_()
    acc.index_add_(0, index, values)
'''


@dataclass
class Form:
    """A step as the app wrote it (no arguments, on torch's current stream), its untouched twin (the same code, made
    apart, that no l2ctl window reaches), how to check the output, and the ``torch_captures()`` object the manual
    recipe tunes and persists on."""

    step: Callable[[], Any]
    make_untouched: Callable[[], Callable[[], Any]]  # called once autotune and tune have decided
    check: Callable[[], bool]
    captures: Any
    #: the tensors a CUDA graph reads and writes: torch's CUDAGraph does not keep them alive, the app must (freed,
    #: the replays touch memory the allocator gives to others, then returns: wrong outputs, an illegal address)
    held: tuple[Any, ...] = ()


def _scatter_tensors(device: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    slots = int(0.64 * l2ctl.device_info(device).l2_cache_size) // 4
    updates = (3 << 30) // 2 // 12
    g = torch.Generator(device=device).manual_seed(0)
    acc = torch.zeros(slots, device=device)
    index = torch.randint(0, slots, (updates,), device=device, generator=g)
    values = torch.randint(1, 5, (updates,), device=device, generator=g).float()
    expected = torch.zeros(slots, dtype=torch.float64, device=device).index_add_(0, index, values.double())
    return acc, index, values, expected


def _compiled_step(name: str, acc: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> Callable[[], Any]:
    if name == "compiled-module":  # a module's top-level function over the module's tensors
        module_name = f"app_step_{id(acc):x}"
        module = types.ModuleType(module_name)
        module.__dict__.update(acc=acc, index=index, values=values, torch=torch)
        sys.modules[module_name] = module  # Dynamo reads a function's globals through its module
        exec(compile(MODULE_SOURCE, f"{module_name}.py", "exec"), module.__dict__)
        return torch.compile(module.zero_and_scatter, mode="reduce-overhead")  # type: ignore[no-any-return]

    def build() -> Callable[[], None]:
        def zero_and_scatter() -> None:  # its tensors in closure cells
            acc.zero_()
            acc.index_add_(0, index, values)
        return torch.compile(zero_and_scatter, mode="reduce-overhead")  # type: ignore[no-any-return]

    return build()


def make_form(name: str, device: int) -> Form:
    if name == "graphed-callables":
        cols = int(0.4 * l2ctl.device_info(device).l2_cache_size) // 4
        x = torch.randn((1 << 30) // 4 // cols, cols, device=device)
        bias = torch.randn(cols, device=device)
        reference = x + bias
        out: list[torch.Tensor] = []

        def add(t: torch.Tensor) -> torch.Tensor:
            return t + bias

        with torch.no_grad():
            twin = torch.cuda.make_graphed_callables(add, (x,), allow_unused_input=True)
            with graph.torch_captures(device) as captures:
                graphed = torch.cuda.make_graphed_callables(add, (x,), allow_unused_input=True)

        def call(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                with torch.no_grad():
                    out[:] = [fn(x)]
            return run

        return Form(call(graphed), lambda: call(twin), lambda: bool(torch.equal(out[0], reference)), captures)
    acc, index, values, expected = _scatter_tensors(device)

    def right() -> bool:
        torch.cuda.synchronize()
        return bool(torch.equal(acc.double(), expected))

    if name == "default-graph":
        capture = torch.cuda.Stream(device)
        graphs = []
        for inside in (False, True):
            with graph.torch_captures(device) if inside else contextlib.nullcontext() as captures:
                g = torch.cuda.CUDAGraph()  # made inside the block: torch keeps its template
                with torch.cuda.stream(capture):
                    acc.zero_()  # warmed up on the capture stream first, as torch.cuda.graph asks
                    acc.index_add_(0, index, values)
                    with torch.cuda.graph(g, stream=capture):
                        acc.zero_()
                        acc.index_add_(0, index, values)
            graphs.append(g)
        torch.cuda.synchronize()
        return Form(graphs[1].replay, lambda: graphs[0].replay, right, captures, (acc, index, values))
    if name not in FORMS:
        raise ValueError(f"unknown form {name!r}; one of {', '.join(FORMS)}")
    torch.compiler.reset()
    if name == "compiled-module":
        for t in (acc, index, values):  # as a model's buffers are
            torch._dynamo.mark_static_address(t)

    def make_twin() -> Callable[[], Any]:  # made after the decisions: a recording outside every block would
        twin = _compiled_step(name, acc, index, values)  # otherwise (rightly) stop autotune's search
        for _ in range(3):
            twin()  # warmed up and, where torch graphs it, recorded outside any block: no window reaches it
        return twin

    return Form(_compiled_step(name, acc, index, values), make_twin, right,
                graph.torch_captures(device, replays="new"))


def measure(name: str, rounds: int, calls: int, seed: int) -> dict[str, Any]:
    device = torch.cuda.current_device()
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the app's stream: torch's current one, where its step runs
        form = make_form(name, device)
        made = [0]

        def step() -> None:  # the app's step, counted
            made[0] += 1
            form.step()

        initial = l2ctl.get_set_aside()
        t0 = time.perf_counter()
        tuned = l2ctl.autotune(step)
        app_calls = 0
        while app_calls < MAX_APP_CALLS and (not tuned.report() or tuned.report()[0].phase != "decided"):
            tuned()
            app_calls += 1
        decide_s = time.perf_counter() - t0
        decision = tuned.report()[0]

        def run(stream: torch.cuda.Stream) -> None:
            with torch.cuda.stream(stream):
                form.step()

        t0 = time.perf_counter()
        manual = l2ctl.tune(run, form.captures, "discover", stream=s)
        tune_s = time.perf_counter() - t0
        untouched = form.make_untouched()
        u = torch.cuda.Stream(device)
        arms = ("untouched", "autotune", "tune+persist")
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        verified: dict[str, bool] = {}
        rng = np.random.default_rng(seed)
        for r in range(rounds):
            for arm in rng.permutation(list(arms)):
                if arm == "tune+persist":
                    with manual.persist(form.captures):
                        times[arm].append(_block_ms(form.step, s, calls))
                        if r == rounds - 1:
                            verified[arm] = form.check()
                elif arm == "untouched":  # the limit autotune holds put back for the block: the app without l2ctl
                    # (lines other arms' windows left persisting are reset first: autotune's graphs keep theirs
                    # between calls, and the twin reads the same tensors)
                    l2ctl.reset_persisting_lines()
                    u.wait_stream(s)
                    with l2ctl.set_aside(initial), torch.cuda.stream(u):  # a stream of its own: autotune's window
                        times[arm].append(_block_ms(untouched, u, calls))  # stays on s between calls
                        if r == rounds - 1:
                            verified[arm] = form.check()
                    s.wait_stream(u)
                else:
                    times[arm].append(_block_ms(tuned, s, calls))
                    if r == rounds - 1:
                        verified[arm] = form.check()
        speedups = speedups_over_untouched(times, seed)
        host = host_cost_us(untouched, tuned, HOST_BLOCKS)
        torch.cuda.synchronize()
        expected_calls = app_calls + rounds * calls + HOST_BLOCKS * HOST_CALLS
        tuned.stop()
        limit_restored = l2ctl.get_set_aside() == initial
    return {"form": name, "decided_at_call": decision.decided_at, "app_calls_to_decide": app_calls,
            "decide_s": decide_s, "decision": str(decision), "autotune_persists": decision.policy.enabled,
            "autotune_considered": None if decision.considered is None else decision.considered.summary(),
            "manual": str(manual), "manual_reason": manual.reason, "manual_persists": manual.persists,
            "manual_tune_s": tune_s, "step_calls": made[0], "step_calls_expected": expected_calls,
            "calls_match": made[0] == expected_calls, "baseline_median_ms": statistics.median(times["untouched"]),
            **{f"{arm}_{k}": v for arm, d in speedups.items() for k, v in d.items()},
            "autotune_vs_manual": speedups["autotune"]["speedup"] / speedups["tune+persist"]["speedup"],
            "host_us_untouched": statistics.median(host["untouched"]),
            "host_us_autotune": statistics.median(host["autotune"]),
            "autotune_cost_us": statistics.median(host["autotune"]) - statistics.median(host["untouched"]),
            "verified": verified, "limit_restored": limit_restored, "times_ms": times,
            "config": {"rounds": rounds, "calls": calls, "seed": seed}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    results = []
    for name in a.forms.split(","):
        try:
            r = measure(name, a.rounds, a.calls, a.seed)
        except Exception as exc:  # one form's failure is recorded, the others still run
            import traceback

            traceback.print_exc()
            results.append({"form": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        print(f"{name}: autotune {r['autotune_speedup']:.3f}x ({r['autotune_ci'][0]:.3f}-{r['autotune_ci'][1]:.3f}), "
              f"tune+persist {r['tune+persist_speedup']:.3f}x, ratio {r['autotune_vs_manual']:.3f}; decided at call "
              f"{r['decided_at_call']}; host cost {r['autotune_cost_us']:.2f} us/call; calls match "
              f"{r['calls_match']}; verified {r['verified']}\n  {r['decision']}\n  manual: {r['manual_reason']}",
              flush=True)
        results.append(r)
    record = {"benchmark": "autotune-torch", "environment": environment(), "results": results}
    with open(a.json, "w") as f:
        json.dump(record, f, indent=1, default=str)
    ok = all("error" not in r and all(r["verified"].values()) and r["calls_match"] and r["limit_restored"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
