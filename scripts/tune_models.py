"""Tune from a model's tensors (``l2ctl.tune(step, stream, model)``), on the GPU at hand, against the same step
without l2ctl: which tensors the rule lets through, what tune chose, its confirmed speedup, how long it took.
Sizes come from the device's L2.

- ``graphsage``: a GraphSAGE-like layer: mean of the neighbours' features (gather + scatter-add into an
  aggregate), then ``lin_self(x) + lin_neigh(mean)``; its weights and its node-feature buffer are the module's
  tensors;
- ``mlp-decode``: a batch-1 decode step through a stack of Linear + LayerNorm blocks (over 100 tensors):
  every weight streams once per step;
- ``compiled-temp``: ``acc.zero_(); acc.index_add_(...)`` compiled together (Inductor scatters into a temporary
  of its own and copies it into ``acc``; acc of 0.64 x L2), captured in a ``torch.cuda.CUDAGraph(keep_graph=True)``
  (reduce-overhead's graph trees keep no template to read): tuned with ``{"acc": acc}``, then with
  ``"discover"``, which finds the temporary through the graph's kernel arguments.

    python scripts/tune_models.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

import l2ctl
from l2ctl.bench.records import environment


class GraphSAGE(torch.nn.Module):
    """Node features (a buffer of 0.64 x L2) and one mean-aggregation layer over random edges."""

    def __init__(self, l2_bytes: int, device: torch.device, features: int = 256, degree: int = 16) -> None:
        super().__init__()
        nodes = int(0.64 * l2_bytes) // (4 * features)
        g = torch.Generator(device=device).manual_seed(0)
        self.register_buffer("x", torch.randn(nodes, features, device=device, generator=g))
        self.register_buffer("src", torch.randint(0, nodes, (nodes * degree,), device=device, generator=g))
        self.register_buffer("dst", torch.randint(0, nodes, (nodes * degree,), device=device, generator=g))
        self.register_buffer("degree", torch.zeros(nodes, device=device).index_add_(
            0, self.dst, torch.ones(nodes * degree, device=device)).clamp_(min=1).unsqueeze(1))
        self.lin_self = torch.nn.Linear(features, features, device=device)
        self.lin_neigh = torch.nn.Linear(features, features, device=device)
        self.aggregate = torch.zeros_like(self.x)

    @torch.no_grad()
    def forward(self) -> torch.Tensor:
        self.aggregate.zero_()
        self.aggregate.index_add_(0, self.dst, self.x[self.src])
        return self.lin_self(self.x) + self.lin_neigh(self.aggregate / self.degree)


class MLPDecode(torch.nn.Module):
    """A batch-1 step through ``layers`` blocks of Linear(hidden, hidden) + LayerNorm, fp16."""

    def __init__(self, l2_bytes: int, device: torch.device, layers: int = 26) -> None:
        super().__init__()
        hidden = max(1024, int((0.16 * l2_bytes / 2) ** 0.5) // 256 * 256)  # a weight of about 0.16 x L2
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(hidden, hidden, device=device, dtype=torch.float16),
                                torch.nn.LayerNorm(hidden, device=device, dtype=torch.float16))
            for _ in range(layers))
        self.x = torch.randn(1, hidden, device=device, dtype=torch.float16)

    @torch.no_grad()
    def forward(self) -> torch.Tensor:
        h = self.x
        for block in self.blocks:
            h = torch.relu(block(h))
        return h


def run(name: str, model: torch.nn.Module, stream: torch.cuda.Stream) -> dict[str, Any]:
    with torch.cuda.stream(stream):
        reference = model().clone()
    out: list[torch.Tensor] = []

    def step(s: torch.cuda.Stream) -> None:
        with torch.cuda.stream(s):
            out[:] = [model()]

    def verify(s: torch.cuda.Stream) -> bool:
        s.synchronize()
        return bool(out) and bool(torch.allclose(out[0], reference, rtol=1e-2, atol=1e-2))

    step.verify = verify  # type: ignore[attr-defined]
    tensors = sum(1 for _ in model.named_parameters()) + sum(1 for _ in model.named_buffers())
    start = time.monotonic()
    tuned = l2ctl.tune(step, stream, model)
    seconds = time.monotonic() - start
    if not verify(stream):
        raise AssertionError(f"{name}: the output is wrong")
    considered = tuned.considered
    assert considered is not None
    return {"workload": name, "tensors": tensors, "tried": list(considered.tried), "skipped": len(considered.skipped),
            "rule": considered.rule.describe(), "chosen": tuned.buffer_name, "persists": tuned.persists,
            "speedup": tuned.speedup, "ci": list(tuned.ci), "baseline_ms": tuned.baseline_ms, "best_ms": tuned.best_ms,
            "set_aside": tuned.set_aside, "hit_ratio": tuned.hit_ratio, "copy_slowdown": tuned.tax.copy_slowdown,
            "tune_seconds": seconds, "reason": tuned.reason, "summary": considered.summary()}


def compiled_temp(l2_bytes: int, device: torch.device, stream: torch.cuda.Stream) -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(0)
    acc = torch.zeros(int(0.64 * l2_bytes) // 4, device=device)
    updates = (3 << 30) // 2 // 12
    index = torch.randint(0, acc.numel(), (updates,), device=device, generator=g)
    values = torch.randint(1, 5, (updates,), device=device, generator=g).float()
    expected = torch.zeros_like(acc, dtype=torch.float64).index_add_(0, index, values.double())

    def zero_and_scatter() -> None:
        acc.zero_()
        acc.index_add_(0, index, values)

    compiled = torch.compile(zero_and_scatter)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(stream):
        compiled()  # compile and warm up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            compiled()
        graph.replay()

    def step(s: torch.cuda.Stream) -> None:
        with torch.cuda.stream(s):
            graph.replay()

    def verify(s: torch.cuda.Stream) -> bool:
        s.synchronize()
        return bool(torch.equal(acc.double(), expected))

    step.verify = verify  # type: ignore[attr-defined]
    nodes = l2ctl.graph.inspect(graph, {"acc": acc})
    yours = l2ctl.tune(step, graph, {"acc": acc}, stream=stream)
    start = time.monotonic()
    found = l2ctl.tune(step, graph, "discover", stream=stream)
    seconds = time.monotonic() - start
    if not verify(stream):
        raise AssertionError("compiled-temp: the accumulator is wrong")
    considered = found.considered
    assert considered is not None
    return {"workload": "compiled-temp", "kernels": [[k.function, [b.describe() for b in k.buffers]] for k in nodes],
            "yours_speedup": yours.speedup, "yours_persists": yours.persists, "yours_reason": yours.reason,
            "chosen": found.buffer_name, "persists": found.persists, "speedup": found.speedup, "ci": list(found.ci),
            "baseline_ms": found.baseline_ms, "best_ms": found.best_ms, "set_aside": found.set_aside,
            "hit_ratio": found.hit_ratio, "copy_slowdown": found.tax.copy_slowdown, "tune_seconds": seconds,
            "chosen_range": considered.details.get(found.buffer_name or "", ""), "summary": considered.summary(),
            "tried": list(considered.tried), "tensors": considered.total, "reason": found.reason}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    info = l2ctl.device_info()
    device = torch.device("cuda", info.index)
    limit = l2ctl.get_set_aside()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    rows = [run("graphsage", GraphSAGE(info.l2_cache_size, device), stream),
            run("mlp-decode", MLPDecode(info.l2_cache_size, device), stream),
            compiled_temp(info.l2_cache_size, device, stream)]
    if l2ctl.get_set_aside() != limit:
        raise AssertionError("the set-aside limit was left changed")
    with open(args.json, "w") as f:
        json.dump({"benchmark": "tune_models", "environment": environment(), "summary": {"rows": rows}}, f, indent=1)
    for r in rows:
        if "yours_speedup" in r:
            print(f"{r['workload']}: with acc named {r['yours_speedup']:.3f}x; discovered: {r['chosen_range']}")
        choice = f"{r['chosen']} ({r['set_aside'] / 2**20:.2f} MiB, hit {r['hit_ratio']:.2f})" if r["persists"] \
            else "no persistence"
        print(f"{r['workload']:11} {r['tensors']:4d} tensors, {len(r['tried'])} tried; {choice}: {r['speedup']:.3f}x "
              f"(CI {r['ci'][0]:.3f}-{r['ci'][1]:.3f}) over {r['baseline_ms']:.3f} ms; tune {r['tune_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
