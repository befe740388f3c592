"""Eager discovery on the GPU at hand (issue 35's target): a GNN layer that allocates its output inside the step,

    out = torch.zeros(N, D, device=...).index_add_(0, dst, x[src])

with N x D x 4 about 0.6 x L2 (sized from this GPU), tuned by ``l2ctl.tune(step, stream, "discover")``: the
tuner reads the kernels' arguments as the step launches them and tries the temporary it finds at the same
address every step. Reported against the same code without l2ctl in the same process: tune's confirmed
speedup and an independent check (rounds of ``--steps`` steps, alternating with and without the tuned scope,
timed with CUDA events). The second form keeps each step's output until the next (``prev = out``), so the
temporary comes from another block every step: discovery must say so and answer "no persistence". The third
form, ``named``, is the reference for what discovery could find at best: the same layer with its output allocated
once, outside the step (``out.zero_().index_add_(...)``), tuned with the output named by hand. Each form runs at
every ``--dims`` (D): at D = 1 each message is one float scattered to a random node, at D = 16 a 64-byte row.

    python scripts/bench_eager_discovery.py --json eager_discovery.json [--forms stays,moving,named] [--dims 1,16]

Target (H100): >= 1.3x, or "no persistence" with the reason when the temporary moves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

import l2ctl
from l2ctl.bench.records import environment


class GNNLayer:
    """Message passing (a sum): each step gathers the features of ``edges`` source nodes and scatter-adds them
    into a fresh output of N x D floats (0.6 x L2); ``colsum`` (a preallocated D-vector) reads the output, as the
    next layer would, and is what is checked."""

    def __init__(self, l2_bytes: int, device: torch.device, dim: int, edges: int, form: str) -> None:
        self.nodes = int(0.6 * l2_bytes) // (4 * dim)
        g = torch.Generator(device=device).manual_seed(0)
        self.x = torch.randint(0, 4, (self.nodes, dim), device=device, generator=g).float()
        self.src = torch.randint(0, self.nodes, (edges,), device=device, generator=g)
        self.dst = torch.randint(0, self.nodes, (edges,), device=device, generator=g)
        self.colsum = torch.zeros(dim, device=device)
        # each node's features times how often it is a source: what the column sums of every output must be
        self.expected = torch.bincount(self.src, minlength=self.nodes).double() @ self.x.double()
        self.form = form
        self.kept: list[torch.Tensor] = []
        self.out = torch.zeros(self.nodes, dim, device=device) if form == "named" else None
        self.dim, self.edges = dim, edges

    def step(self, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            if self.out is not None:  # the reference: allocated once, named to tune
                out = self.out.zero_().index_add_(0, self.dst, self.x[self.src])
            else:
                out = torch.zeros(self.nodes, self.dim, device=self.x.device).index_add_(0, self.dst, self.x[self.src])
            torch.sum(out, 0, out=self.colsum)
            if self.form == "moving":
                self.kept[:] = [out]  # alive until the next step has allocated its own: another block each step

    def verify(self, stream: torch.cuda.Stream) -> bool:
        stream.synchronize()  # float32 sums of millions of terms, in an order the kernels choose: a tolerance
        return bool(torch.allclose(self.colsum.double(), self.expected, rtol=1e-4))


def timed(run: Callable[[], None], stream: torch.cuda.Stream, steps: int) -> float:
    """Milliseconds per step over ``steps`` steps (CUDA events on ``stream``), after one warm-up step."""
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(steps):
        run()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / steps


def run(layer: GNNLayer, stream: torch.cuda.Stream, rounds: int, steps: int) -> dict[str, Any]:
    """Tune ``layer`` by discovery on ``stream``; when it persists, check the choice against the same code without
    l2ctl in alternating rounds."""
    def step(s: torch.cuda.Stream) -> None:
        layer.step(s)

    step.verify = layer.verify  # type: ignore[attr-defined]  # tune checks the output after its measurements
    start = time.monotonic()
    tuned = None
    refusal = ""
    try:
        tuned = l2ctl.tune(step, stream, "discover" if layer.out is None else {"out": layer.out})
    except ValueError as exc:  # kept to record a refusal, should one come back: tune answers "no persistence"
        refusal = str(exc)
    seconds = time.monotonic() - start
    if not layer.verify(stream):
        raise AssertionError("the layer's output is wrong")
    row: dict[str, Any] = {"form": layer.form, "nodes": layer.nodes, "dim": layer.dim,
                           "edges": layer.edges, "out_bytes": layer.nodes * layer.dim * 4, "tune_seconds": seconds}
    considered = None if tuned is None else tuned.considered
    if considered is not None:
        row.update(summary=considered.summary(), skipped=dict(considered.skipped), tried=list(considered.tried))
    if tuned is None or not tuned.persists:
        row.update(persists=False, reason=refusal or (tuned.reason if tuned else ""),
                   speedup=1.0 if tuned is None else tuned.speedup)
        return row
    baseline, persisted = [], []
    for _ in range(rounds):  # alternating: drift hits both the same way
        baseline.append(timed(lambda: layer.step(stream), stream, steps))
        with tuned.persist(stream):
            persisted.append(timed(lambda: layer.step(stream), stream, steps))
    if not layer.verify(stream):
        raise AssertionError("the layer's output is wrong under the tuned scope")
    b, p = statistics.median(baseline), statistics.median(persisted)
    chosen_range = considered.details.get(tuned.buffer_name or "") if considered else tuned.buffer_name
    row.update(persists=True, chosen=tuned.buffer_name, chosen_range=chosen_range,
               reason=tuned.reason, speedup=tuned.speedup, ci=list(tuned.ci), baseline_ms=tuned.baseline_ms,
               best_ms=tuned.best_ms, set_aside=tuned.set_aside, hit_ratio=tuned.hit_ratio,
               copy_slowdown=tuned.tax.copy_slowdown, check_baseline_ms=b, check_persisted_ms=p, check_speedup=b / p,
               baseline_rounds_ms=baseline, persisted_rounds_ms=persisted)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--forms", default="stays,moving,named",
                        help="which layers: stays (its output freed each step), moving (kept until the next), "
                             "named (allocated once and named: the reference)")
    parser.add_argument("--dims", default="1,16", help="features per node (D), one run of each form per value")
    parser.add_argument("--edges", type=int, default=16 << 20)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block of the independent check")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of the independent check")
    args = parser.parse_args(argv)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or set(forms) - {"stays", "moving", "named"}:
        parser.error("--forms: any of stays, moving, named")
    dims = [int(d) for d in args.dims.split(",") if d.strip()]
    info = l2ctl.device_info()
    device = torch.device("cuda", info.index)
    limit = l2ctl.get_set_aside()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    rows = []
    for dim in dims:
        for form in forms:
            layer = GNNLayer(info.l2_cache_size, device, dim, args.edges, form)
            rows.append(run(layer, stream, args.rounds, args.steps))
            del layer
            torch.cuda.synchronize(device)
    if l2ctl.get_set_aside() != limit:
        raise AssertionError("the set-aside limit was left changed")
    with open(args.json, "w") as f:
        json.dump({"benchmark": "eager_discovery", "environment": environment(),
                   "torch_cuda": torch.version.cuda, "config": vars(args), "summary": {"rows": rows}}, f, indent=1)
    for row in rows:
        head = f"eager GNN layer D={row['dim']}, output {row['form']} (out {row['out_bytes'] / 2**20:.1f} MiB)"
        if row["persists"]:
            print(f"{head}: persist {row['chosen_range']}: tune {row['speedup']:.3f}x (CI {row['ci'][0]:.3f}-"
                  f"{row['ci'][1]:.3f}) over {row['baseline_ms']:.3f} ms; check {row['check_speedup']:.3f}x "
                  f"({row['check_baseline_ms']:.3f} -> {row['check_persisted_ms']:.3f} ms); tune "
                  f"{row['tune_seconds']:.1f} s; target >= 1.3x: {'met' if row['check_speedup'] >= 1.3 else 'NOT met'}")
        else:
            print(f"{head}: no persistence: {row['reason']}; tune {row['tune_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
