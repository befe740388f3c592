"""The documented torch recipes, measured as a user would run them: ``l2ctl.persist(l2ctl.graph.torch_captures(),
buf, set_aside=S)`` entered before the first call of a compiled or graphed step, against the same code
without l2ctl, in one process (torch events, medians of interleaved rounds, every output verified).

Rows (sizes from the device's L2: an accumulator of 0.64 x L2, a bias of 0.4 x L2; S = the buffer rounded up
to the set-aside granularity, capped at the max):

- ``compiled-graphed``: an in-place scatter-add, its tensors marked static, compiled with
  ``torch.compile(mode="reduce-overhead")``: torch records CUDA graphs;
- ``compiled-eager``: the same step, nothing marked static: torch skips its graphs (a mutated input) and runs
  Inductor's kernels eagerly on the current stream;
- ``compiled-temp``: the zeroing compiled with it, accumulator static: graphed, but Inductor scatters into a
  temporary of its own, so a window on ``acc`` reaches nothing (the set-aside is then only a tax: the
  docs warn; ``tune`` finds no gain there);
- ``graphed-callable``: ``torch.cuda.make_graphed_callables`` on ``x + bias``, captured inside the scope with
  ``replays="new"``, in a process whose graph trees already hold the recordings of the rows above.

    python scripts/torch_recipes.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from typing import Any, Callable

import torch

import l2ctl
from l2ctl import graph
from l2ctl.bench.records import environment

MiB = 1 << 20


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def fresh(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A copy of ``fn`` with its own code object: Dynamo compiles (and the graph trees record) it anew."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, None, fn.__closure__)


def median_ms(step: Callable[[], None], steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(steps):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def compiled_rows(device: int, rounds: int, steps: int) -> list[dict[str, Any]]:
    info = l2ctl.device_info(device)
    slots = int(0.64 * info.l2_cache_size) // 4
    updates = (3 << 30) // 2 // 12
    g = torch.Generator(device=device).manual_seed(0)
    acc = torch.zeros(slots, device=device)
    index = torch.randint(0, slots, (updates,), device=device, generator=g)
    values = torch.randint(1, 5, (updates,), device=device, generator=g).to(torch.float32)
    expected = torch.zeros(slots, dtype=torch.float64, device=device).index_add_(0, index, values.double())
    set_aside = min(round_up(acc.numel() * 4, l2ctl.set_aside_granularity(device)),
                    info.persisting_l2_cache_max_size)

    # The step reads its tensors from an object, as a model's step reads its own attributes (the gallery's
    # workloads do the same): Dynamo lifts them as inputs, and a static mark then lets torch graph the update.
    state = types.SimpleNamespace(acc=acc, index=index, values=values)

    def scatter() -> None:
        state.acc.index_add_(0, state.index, state.values)

    def zero_and_scatter() -> None:
        state.acc.zero_()
        state.acc.index_add_(0, state.index, state.values)

    # unmarked first: torch cannot unmark a tensor marked static
    variants = [("compiled-eager", scatter, False), ("compiled-graphed", scatter, True),
                ("compiled-temp", zero_and_scatter, True)]
    rows = []
    for name, body, static in variants:
        torch.compiler.reset()
        if static:
            torch._dynamo.mark_static_address(acc)
        zero_outside = body is scatter

        def run(fn: Callable[[], None]) -> None:
            torch.compiler.cudagraph_mark_step_begin()
            if zero_outside:
                acc.zero_()
            fn()

        def measure(fn: Callable[[], None]) -> float:
            for _ in range(3):  # warm-up, recording, first replay: inside whatever scope is live
                run(fn)
            ms = median_ms(lambda: run(fn), steps)
            torch.cuda.synchronize()
            if not torch.equal(acc.double(), expected):
                raise AssertionError(f"{name}: the accumulator is wrong")
            return ms

        skips = graph_skips()
        base_fn = torch.compile(fresh(body), mode="reduce-overhead")
        base, recipe = [], []
        for _ in range(rounds):
            base.append(measure(base_fn))
            with l2ctl.persist(graph.torch_captures(device, replays="new"), acc, set_aside=set_aside) as p:
                recipe.append(measure(torch.compile(fresh(body), mode="reduce-overhead")))
                window = p.window
        rows.append(_row(name, base, recipe, set_aside, window, graphed=graph_skips() == skips))
    torch.compiler.reset()
    return rows


def graph_skips() -> int:
    """How many times torch.compile skipped CUDA graphs in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def graphed_callable_row(device: int, rounds: int, steps: int) -> dict[str, Any]:
    info = l2ctl.device_info(device)
    cols = int(0.4 * info.l2_cache_size) // 4
    rows_n = (1 << 30) // 4 // cols
    x = torch.randn(rows_n, cols, device=device)
    bias = torch.randn(cols, device=device)
    reference = x + bias
    set_aside = min(round_up(cols * 4, l2ctl.set_aside_granularity(device)), info.persisting_l2_cache_max_size)

    def add(t: torch.Tensor) -> torch.Tensor:
        return t + bias

    def make() -> Callable[..., torch.Tensor]:
        return torch.cuda.make_graphed_callables(add, (x,), allow_unused_input=True)  # type: ignore[no-any-return]

    def measure(fn: Callable[..., torch.Tensor]) -> float:
        for _ in range(3):
            fn(x)
        ms = median_ms(lambda: fn(x), steps)
        torch.cuda.synchronize()
        if not torch.equal(fn(x), reference):
            raise AssertionError("graphed-callable: x + bias is wrong")
        return ms

    with torch.no_grad():
        plain = make()
        base, recipe = [], []
        for _ in range(rounds):
            base.append(measure(plain))
            with l2ctl.persist(graph.torch_captures(device, replays="new"), bias, set_aside=set_aside) as p:
                recipe.append(measure(make()))
                window = p.window
    return _row("graphed-callable", base, recipe, set_aside, window)


def _row(name: str, base: list[float], recipe: list[float], set_aside: int, window: Any, **extra: Any) -> dict[str, Any]:
    b, r = statistics.median(base), statistics.median(recipe)
    return {"workload": name, "baseline_ms": b, "recipe_ms": r, "speedup": b / r,
            "round_speedups": [x / y for x, y in zip(base, recipe)], "baseline_runs_ms": base, "recipe_runs_ms": recipe,
            "set_aside": set_aside, "window_bytes": int(window.num_bytes), "hit_ratio": float(window.hit_ratio),
            "verified": True, **extra}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    device = torch.cuda.current_device()
    limit = l2ctl.get_set_aside(device)
    started = time.monotonic()
    rows = compiled_rows(device, args.rounds, args.steps)
    rows.append(graphed_callable_row(device, args.rounds, args.steps))
    if l2ctl.get_set_aside(device) != limit:
        raise AssertionError("the set-aside limit was left changed")
    record = {"benchmark": "torch_recipes", "environment": environment(device),
              "config": {"rounds": args.rounds, "steps": args.steps}, "seconds": time.monotonic() - started,
              "summary": {"rows": rows, "limit_before": limit, "limit_after": l2ctl.get_set_aside(device)}}
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)
    print(f"{'row':18} {'baseline ms':>11} {'recipe ms':>9} {'speedup':>7}  rounds")
    for row in rows:
        print(f"{row['workload']:18} {row['baseline_ms']:11.3f} {row['recipe_ms']:9.3f} {row['speedup']:6.2f}x  "
              + " ".join(f"{x:.2f}" for x in row["round_speedups"])
              + (f"  {'graphed' if row['graphed'] else 'not graphed'}" if "graphed" in row else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
