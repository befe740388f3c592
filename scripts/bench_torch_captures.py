"""Issue 35's targets on a GPU: what ``l2ctl.graph.torch_captures()`` buys on the torch forms users write, each
against the same code without l2ctl in the same process (torch events, medians of interleaved rounds, every
output verified), with sizes from the device's L2.

Parts (``--parts``, default all):

- ``compiled``: ``acc.zero_(); acc.index_add_(0, index, values)`` into an accumulator of 0.64 x L2, compiled with
  ``torch.compile(mode="reduce-overhead")`` (its three tensors marked static, as a module's buffers are), first
  called inside ``with torch_captures() as captures``, tuned by ``tune(step, captures, "discover")``: Inductor
  scatters into a temporary of its own, which discovery finds. Baseline: the same code compiled again and recorded in the same
  block, replayed with no scope; and a copy compiled and measured before l2ctl kept anything (``untouched``).
- ``compiled-unmarked``: the same with only ``acc`` marked: torch copies ``index`` and ``values`` (1.5 GiB) into its
  pool before every replay, copies no cache setting shortens.
- ``default-graph``: ``index_add_`` into 0.64 x L2 captured in ``torch.cuda.CUDAGraph()`` (torch's defaults) inside
  the block: persisted on the graph (the buffer, set-aside = it rounded up to the granularity) and tuned.
  Baseline: the same graph replayed with no scope, and one captured outside any block (``untouched``).
- ``nothing-pays``: ``table.index_select(0, rows)`` from a table of 0.64 x L2 (random rows), reduce-overhead,
  tuned by discovery: "no persistence" is the expected answer, and the tuned step must not be slower.
- ``model100``: a 50-layer MLP (100 tensors: weights and biases), reduce-overhead, tuned by discovery: its time.
- ``cost``: what keeping templates costs: host memory (RSS) and free device memory per kept graph (64 graphs of
  the scatter step, in a block against outside one), torch's ``instantiate()`` of a kept graph (what every scope
  entry and end pays per kept graph that has an executable), and a ``persist(captures, ...)`` entry + end.

    python scripts/bench_torch_captures.py --json out.json [--parts compiled,default-graph] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
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
PARTS = ("compiled", "compiled-unmarked", "default-graph", "nothing-pays", "model100", "cost")


def fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object: Dynamo compiles (and the graph trees record) it anew."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, None, fn.__closure__)


def median_ms(run: Callable[[torch.cuda.Stream], None], stream: torch.cuda.Stream, steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(steps):
        start.record(stream)
        run(stream)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def on(fn: Callable[[], Any]) -> Callable[[torch.cuda.Stream], None]:
    """The user's step called on ``stream``, as tune times it."""
    def run(stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            torch.compiler.cudagraph_mark_step_begin()
            fn()
    return run


def graph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def interleaved(base: Callable[[], float], other: Callable[[], float], rounds: int) -> tuple[list[float], list[float]]:
    b, o = [], []
    for _ in range(rounds):
        b.append(base())
        o.append(other())
    return b, o


def summary(name: str, base: list[float], other: list[float], **extra: Any) -> dict[str, Any]:
    b, o = statistics.median(base), statistics.median(other)
    return {"name": name, "baseline_ms": b, "ms": o, "speedup": b / o,
            "round_speedups": [x / y for x, y in zip(base, other)], "baseline_runs_ms": base, "runs_ms": other,
            **extra}


def tuned_dict(tuned: l2ctl.TunedPolicy, seconds: float) -> dict[str, Any]:
    report = tuned.report()
    return {"persists": tuned.persists, "buffer": tuned.buffer_name, "reason": tuned.reason,
            "set_aside": tuned.set_aside, "hit_ratio": tuned.hit_ratio, "search_speedup": tuned.speedup,
            "seconds": seconds, "text": str(report), "considered": report.summary.get("considered")}


def scatter_state(device: int, zero_inside: bool) -> tuple[types.SimpleNamespace, torch.Tensor]:
    info = l2ctl.device_info(device)
    slots = int(0.64 * info.l2_cache_size) // 4
    updates = (3 << 30) // 2 // 12
    g = torch.Generator(device=device).manual_seed(0)
    state = types.SimpleNamespace(acc=torch.zeros(slots, device=device),
                                  index=torch.randint(0, slots, (updates,), device=device, generator=g),
                                  values=torch.randint(1, 5, (updates,), device=device, generator=g).float())
    expected = torch.zeros(slots, dtype=torch.float64, device=device).index_add_(0, state.index, state.values.double())
    return state, expected


def check(acc: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.cuda.synchronize()
    if not torch.equal(acc.double(), expected):
        raise AssertionError(f"{what}: the accumulator is wrong")


def part_compiled(device: int, s: torch.cuda.Stream, rounds: int, steps: int,
                  unmarked_inputs: bool = False) -> dict[str, Any]:
    state, expected = scatter_state(device, True)
    for t in (state.acc, state.index, state.values):  # as a module's buffers are, and as the README marks them:
        if not unmarked_inputs or t is state.acc:    # unmarked, torch copies them into its pool at every replay
            torch._dynamo.mark_static_address(t)

    def zero_and_scatter() -> None:  # the user's step, as written
        state.acc.zero_()
        state.acc.index_add_(0, state.index, state.values)

    torch.compiler.reset()
    untouched = on(torch.compile(fresh(zero_and_scatter), mode="reduce-overhead"))
    for _ in range(3):
        untouched(s)
    untouched_ms = median_ms(untouched, s, steps)
    check(state.acc, expected, "untouched")
    torch.compiler.reset()  # its recording (template gone) would refuse the block's scopes
    skips = graph_skips()
    user = on(torch.compile(zero_and_scatter, mode="reduce-overhead"))
    base = on(torch.compile(fresh(zero_and_scatter), mode="reduce-overhead"))
    with graph.torch_captures(device):
        for _ in range(3):
            base(s)  # recorded in a block too: a recording without its template would refuse the scopes
    with graph.torch_captures(device) as captures:  # the user's: what discovery reads is what it saw recorded
        started = time.monotonic()
        tuned = l2ctl.tune(user, captures, "discover", stream=s)
        seconds = time.monotonic() - started
        graphs = len(captures.graphs())

        def tuned_ms() -> float:
            with tuned.persist(captures):
                ms = median_ms(user, s, steps)
            check(state.acc, expected, "tuned")
            return ms

        b, t = interleaved(lambda: median_ms(base, s, steps), tuned_ms, rounds)
    check(state.acc, expected, "baseline")
    name = "compiled zero + index_add_, discovered" + (", index and values unmarked" if unmarked_inputs else "")
    return {**summary(name, b, t), "untouched_baseline_ms": untouched_ms,
            "graphed": graph_skips() == skips, "kept_graphs": graphs, "acc_bytes": state.acc.numel() * 4,
            "updates": state.index.numel(), "inductor_atomics": inductor_atomics(), "tuned": tuned_dict(tuned, seconds)}


def inductor_atomics() -> list[str]:
    """The atomic lines of the Triton kernels Inductor wrote (its cache): why its scatter gains less than torch's
    own kernel does under the same window is in how it adds."""
    import glob

    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError as exc:
        return [f"unavailable: {exc}"]
    lines = set()
    for path in glob.glob(os.path.join(cache_dir(), "**", "*.py"), recursive=True):
        with open(path, errors="replace") as f:
            lines.update(line.strip() for line in f if "tl.atomic_add" in line)
    return sorted(lines)[:8]


def part_default_graph(device: int, s: torch.cuda.Stream, rounds: int, steps: int) -> dict[str, Any]:
    state, expected = scatter_state(device, False)
    info = l2ctl.device_info(device)
    granule = l2ctl.set_aside_granularity(device)
    set_aside = min(-(-state.acc.numel() * 4 // granule) * granule, info.persisting_l2_cache_max_size)

    def capture() -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()  # torch's defaults: keep_graph=False
        with torch.cuda.stream(s):
            state.acc.zero_()
            state.acc.index_add_(0, state.index, state.values)  # warm-up
            with torch.cuda.graph(g, stream=s):
                state.acc.zero_()
                state.acc.index_add_(0, state.index, state.values)
        return g

    outside = capture()
    with graph.torch_captures(device):
        g = capture()
    executable_at_capture_end = bool(g.raw_cuda_graph_exec())

    def replay(graph_: torch.cuda.CUDAGraph) -> Callable[[torch.cuda.Stream], None]:
        def run(stream: torch.cuda.Stream) -> None:
            with torch.cuda.stream(stream):
                graph_.replay()
        return run

    def persisted_ms() -> float:
        with l2ctl.persist(g, state.acc, set_aside=set_aside):
            ms = median_ms(replay(g), s, steps)
        check(state.acc, expected, "persisted")
        return ms

    untouched_ms = median_ms(replay(outside), s, steps)
    b1, p = interleaved(lambda: median_ms(replay(g), s, steps), persisted_ms, rounds)
    started = time.monotonic()
    tuned = l2ctl.tune(replay(g), g, {"acc": state.acc}, stream=s)
    seconds = time.monotonic() - started

    def tuned_ms() -> float:
        with tuned.persist(g):
            ms = median_ms(replay(g), s, steps)
        check(state.acc, expected, "tuned")
        return ms

    b2, t = interleaved(lambda: median_ms(replay(g), s, steps), tuned_ms, rounds)
    check(state.acc, expected, "baseline")
    return {"persisted": summary("default-flag graph, index_add_, persisted", b1, p, set_aside=set_aside),
            "tuned": {**summary("default-flag graph, index_add_, tuned", b2, t), "tuned": tuned_dict(tuned, seconds)},
            "untouched_baseline_ms": untouched_ms, "executable_at_capture_end": executable_at_capture_end,
            "acc_bytes": state.acc.numel() * 4}


def part_nothing_pays(device: int, s: torch.cuda.Stream, rounds: int, steps: int) -> dict[str, Any]:
    info = l2ctl.device_info(device)
    cols = 256
    g = torch.Generator(device=device).manual_seed(1)
    table = torch.randn(int(0.64 * info.l2_cache_size) // 4 // cols, cols, device=device)
    rows = torch.randint(0, table.shape[0], ((1 << 30) // 4 // cols // 2,), device=device, generator=g)
    expected = table.index_select(0, rows)
    outputs: list[torch.Tensor] = []

    def gather() -> torch.Tensor:  # random rows of a table: bound by the gathers' latency, not by DRAM
        return table.index_select(0, rows)

    torch.compiler.reset()
    user_fn = torch.compile(gather, mode="reduce-overhead")

    def call_user() -> None:
        outputs.clear()  # the last output only: graph trees overwrite it at the next replay
        outputs.append(user_fn())

    user = on(call_user)
    base = on(torch.compile(fresh(gather), mode="reduce-overhead"))
    with graph.torch_captures(device):
        for _ in range(3):
            base(s)
    with graph.torch_captures(device) as captures:
        started = time.monotonic()
        tuned = l2ctl.tune(user, captures, "discover", stream=s)
        seconds = time.monotonic() - started

        def tuned_ms() -> float:
            with tuned.persist(captures):
                return median_ms(user, s, steps)

        b, t = interleaved(lambda: median_ms(base, s, steps), tuned_ms, rounds)
    torch.cuda.synchronize()
    if not outputs or not torch.equal(outputs[-1], expected):
        raise AssertionError("nothing-pays: the gather is wrong")
    return {**summary("compiled index_select, discovered", b, t), "tuned": tuned_dict(tuned, seconds)}


def part_model100(device: int, s: torch.cuda.Stream, rounds: int, steps: int) -> dict[str, Any]:
    width = 2048
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(50)]).to(device)
    tensors = sum(1 for _ in model.parameters())
    x = torch.randn(256, width, device=device)
    torch.compiler.reset()
    with torch.no_grad():
        user = on(torch.compile(lambda: model(x), mode="reduce-overhead"))
        with graph.torch_captures(device) as captures:
            started = time.monotonic()
            tuned = l2ctl.tune(user, captures, "discover", stream=s)
            seconds = time.monotonic() - started
    return {"tensors": tensors, "seconds": seconds, "tuned": tuned_dict(tuned, seconds)}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def part_cost(device: int, s: torch.cuda.Stream, rounds: int, steps: int) -> dict[str, Any]:
    torch.compiler.reset()  # the other parts' recordings: no kept graph but this part's
    gc.collect()
    state, _ = scatter_state(device, False)
    count = 64

    def capture_many() -> tuple[list[torch.cuda.CUDAGraph], int, int]:
        gc.collect()
        torch.cuda.synchronize()
        host, free = rss(), torch.cuda.mem_get_info(device)[0]
        graphs = []
        with torch.cuda.stream(s):
            for _ in range(count):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s):
                    state.acc.index_add_(0, state.index, state.values)
                graphs.append(g)
        torch.cuda.synchronize()
        return graphs, rss() - host, free - torch.cuda.mem_get_info(device)[0]

    with torch.cuda.stream(s):
        state.acc.index_add_(0, state.index, state.values)  # warm-up
    plain, plain_host, plain_device = capture_many()
    with graph.torch_captures(device) as captures:
        kept, kept_host, kept_device = capture_many()
    nodes = len(graph.as_graph(kept[0]).kernel_nodes())
    instantiate = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kept[0].instantiate()
        instantiate.append((time.perf_counter() - t0) * 1e3)
    del plain
    one = kept[:1]
    del kept
    gc.collect()
    scope = []
    for _ in range(20):
        t0 = time.perf_counter()
        with l2ctl.persist(captures, state.acc, 1.0):
            pass
        scope.append((time.perf_counter() - t0) * 1e3)
    return {"graphs": count, "kernel_nodes_per_graph": nodes,
            "host_bytes_per_graph": {"kept": kept_host / count, "default": plain_host / count},
            "device_bytes_per_graph": {"kept": kept_device / count, "default": plain_device / count},
            "instantiate_ms": {"median": statistics.median(instantiate), "runs": instantiate},
            "persist_scope_ms_one_kept_graph": {"median": statistics.median(scope), "runs": scope},
            "kept_graphs_live": len(one)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose among {', '.join(PARTS)}")
    device = torch.cuda.current_device()
    limit = l2ctl.get_set_aside(device)
    functions = {"compiled": part_compiled, "default-graph": part_default_graph, "nothing-pays": part_nothing_pays,
                 "model100": part_model100, "cost": part_cost,
                 "compiled-unmarked": functools.partial(part_compiled, unmarked_inputs=True)}
    results: dict[str, Any] = {}
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    started = time.monotonic()
    for name in parts:
        t0 = time.monotonic()
        results[name] = {**functions[name](device, s, args.rounds, args.steps), "part_seconds": time.monotonic() - t0}
        print(f"{name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    if l2ctl.get_set_aside(device) != limit:
        raise AssertionError("the set-aside limit was left changed")
    record = {"benchmark": "torch_captures", "environment": environment(device), "torch": torch.__version__,
              "config": {"rounds": args.rounds, "steps": args.steps, "parts": parts},
              "seconds": time.monotonic() - started, "summary": results}
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)
    json.dump({k: {kk: vv for kk, vv in v.items() if kk not in ("tuned",) or not isinstance(vv, dict)}
               for k, v in results.items()}, sys.stdout, indent=1, default=str)
    print()
    for name, part in results.items():
        for row in (part.get("persisted"), part.get("tuned"), part):
            if isinstance(row, dict) and "speedup" in row:
                print(f"{row['name']}: {row['speedup']:.2f}x ({row['baseline_ms']:.3f} -> {row['ms']:.3f} ms)")
            if isinstance(row, dict) and isinstance(row.get("tuned"), dict) and row["tuned"].get("text"):
                print(f"  tune: {row['tuned']['text'].splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
