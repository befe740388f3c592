"""A DDP training step tuned for L2 persistence on every rank, one process per GPU.

    torchrun --nproc-per-node 2 examples/ddp_step.py --json ddp_step.json
    torchrun --nproc-per-node 2 examples/ddp_step.py --simulate       # no GPU: gloo on CPU, l2ctl simulated

The step: hashed feature ids counted into a dense accumulator (``acc.index_add_``, ``acc`` 0.64 x the L2 of the
GPU at hand, read from l2ctl), a linear head over the counts, and DDP's NCCL all-reduce of the head's gradient.

Each rank tunes the step *without* DDP: tune's plan depends on its own measurements, so ranks would issue
different numbers of steps, and a collective inside them would hang. It then times four arms side by side,
in rounds shuffled the same way on every rank (each block starts at a barrier): the step alone (the
single-GPU step) and under DDP, each without and with ``tuned.persist(stream)``. Rank 0 prints every rank's
choice, both gains and the DDP gain as a fraction of the single-GPU gain (the target: >= 90%). Every rank
checks that it leaves its device as it found it: the set-aside limit and the stream's window, read through
l2ctl and, on a GPU, through cuda.bindings (cudaDeviceGetLimit, cudaStreamGetAttribute).

``--simulate [GPU]``: torch runs the step on CPU tensors with gloo; l2ctl's device is the simulator (one per
process); tuning and timing run on a modeled stand-in for the step's kernels on the simulated stream
(``l2ctl.testing``'s scatter-add, its accumulator sized from the simulated L2 the same way). Every number is
then the simulator's model, and the output says SIMULATED.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import random
import statistics
import sys
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

import l2ctl
from l2ctl import bench
from l2ctl.testing import FakeBackend, simulate
from l2ctl.workloads.modeled import ModeledWorkload

MiB = 1 << 20
ARMS = (("single", False), ("single", True), ("ddp", False), ("ddp", True))


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--simulate", nargs="?", const="h100", default=None, metavar="GPU",
                   help="l2ctl on a simulated GPU (h100, h200, ...), torch on CPU with gloo")
    p.add_argument("--update-bytes", type=size, default=None,
                   help="bytes of updates per step, 12 per update (default 1.5G; simulated: 3M)")
    p.add_argument("--hidden", type=int, default=None, help="head outputs (default 1024; simulated: 8)")
    p.add_argument("--rounds", type=int, default=6, help="rounds of the four arms")
    p.add_argument("--repeat", type=int, default=5, help="timed steps per arm and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per arm and round")
    p.add_argument("--tune-rounds", type=int, default=5, help="l2ctl.tune's paired rounds")
    p.add_argument("--steps", type=int, default=20, help="steps of the training loop run under the policy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the record here")
    return p.parse_args(argv)


def raw_state(machine: Optional[FakeBackend], device: int, handle: int) -> Optional[dict[str, Any]]:
    """The limit and the stream's window read past l2ctl: through cuda.bindings on a GPU, from the simulator's
    own state under simulation; None where cuda.bindings is not installed."""
    if machine is not None:
        w = machine.get_stream_window(handle)
        return {"via": "simulator", "limit": int(machine.device(device).limit),
                "window": [int(w[0]), int(w[1]), round(float(w[2]), 6)]}
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return None
    ok = rt.cudaError_t.cudaSuccess
    (err,) = rt.cudaSetDevice(device)
    err_limit, limit = rt.cudaDeviceGetLimit(rt.cudaLimit.cudaLimitPersistingL2CacheSize)
    ids = rt.cudaStreamAttrID  # cuda-python 13 names it as a launch attribute, 12 as a stream attribute
    attribute = getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None) or ids.cudaStreamAttributeAccessPolicyWindow
    err_window, value = rt.cudaStreamGetAttribute(rt.cudaStream_t(handle), attribute)
    if (err, err_limit, err_window) != (ok, ok, ok):
        raise RuntimeError(f"cuda.bindings: cudaSetDevice {err}, cudaDeviceGetLimit {err_limit}, "
                           f"cudaStreamGetAttribute {err_window}")
    w = value.accessPolicyWindow
    return {"via": "cuda.bindings", "limit": int(limit),
            "window": [int(w.base_ptr), int(w.num_bytes), round(float(w.hitRatio), 6)]}


def state(machine: Optional[FakeBackend], device: int, stream: Any) -> dict[str, Any]:
    """What this rank's device holds now, through l2ctl and past it."""
    w = l2ctl.get_window(stream)
    handle = stream.handle if machine is not None else stream.cuda_stream
    return {"limit": l2ctl.get_set_aside(device), "window": [w.base_ptr, w.num_bytes, round(w.hit_ratio, 6)],
            "raw": raw_state(machine, device, handle)}


class CountsHead(torch.nn.Module):
    """Feature ids counted into ``acc`` (a count: no gradient flows through it), then a linear head."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(features, hidden, bias=False)

    def forward(self, acc: torch.Tensor, index: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
        with torch.no_grad():
            acc.zero_()
            acc.index_add_(0, index, values)  # random read-modify-writes of acc while the updates stream past
        return self.head(acc.view(-1, self.head.in_features) * scale)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    gpus = args.simulate or os.environ.get("L2CTL_SIMULATE")
    machine = simulate(gpus) if gpus else None  # a fresh simulator per process, kept to read its state
    simulated = machine is not None
    if not simulated and not torch.cuda.is_available():
        sys.exit("ddp_step: no CUDA GPU visible to torch; run with --simulate to try it on CPU")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not simulated:
        torch.cuda.set_device(local)
    dist.init_process_group("gloo" if simulated else "nccl")
    everyone, config = measure(args, machine, local)
    gc.collect()  # the DDP model (held in cycles by the step closures) ends before its process group
    if dist.get_rank() == 0:
        report(everyone, config, args.json)
    dist.barrier(**({} if simulated else {"device_ids": [local]}))
    dist.destroy_process_group()
    return 0 if all(r["restored"] and not r["wrong"] for r in everyone) else 1


def measure(args: argparse.Namespace, machine: Optional[FakeBackend], local: int) -> tuple[list[Any], dict[str, Any]]:
    """This rank's part: tune, time the four arms, run the loop under the policy; every rank's results."""
    simulated = machine is not None
    rank, ranks = dist.get_rank(), dist.get_world_size()
    where = torch.device("cpu") if simulated else torch.device("cuda", local)
    device = 0 if simulated else local  # the simulator gives every process its own device 0
    info = l2ctl.device_info(device)
    stream: Any = l2ctl.Stream(device) if simulated else torch.cuda.Stream(where)
    before = state(machine, device, stream)

    # the data and the two models (the DDP one a copy: the single-GPU arm trains without syncing it)
    g = torch.Generator(device=where).manual_seed(args.seed + rank)
    slots = max(1, int(0.64 * info.l2_cache_size) // MiB * MiB // 4)
    updates = max(1, (args.update_bytes or (3 * MiB if simulated else 3 << 29)) // 12)
    features = next(f for f in (4096, 1024, 256, 64, 16, 4, 1) if slots % f == 0)
    acc = torch.zeros(slots, device=where)
    index = torch.randint(0, slots, (updates,), device=where, generator=g)
    values = torch.randint(1, 5, (updates,), device=where, generator=g).to(torch.float32)
    expected = torch.zeros(slots, dtype=torch.float64, device=where).index_add_(0, index, values.double())
    inputs = (acc, index, values, slots / float(values.sum()))  # scaled to mean 1: SGD stays stable
    on_stream: Callable[[], Any] = (contextlib.nullcontext if simulated else lambda: torch.cuda.stream(stream))
    if not simulated:
        stream.wait_stream(torch.cuda.current_stream())  # the tensors first
    torch.manual_seed(args.seed)
    with on_stream():  # DDP made on the stream the steps run on, so its gradient hooks live there too
        single = CountsHead(features, args.hidden or (8 if simulated else 1024)).to(where)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(single), device_ids=None if simulated else [local])
    optimizers = {"single": torch.optim.SGD(single.parameters(), lr=1e-4),
                  "ddp": torch.optim.SGD(ddp.parameters(), lr=1e-4)}
    models: dict[str, torch.nn.Module] = {"single": single, "ddp": ddp}
    modeled = ModeledWorkload.scatter_add(device) if simulated else None

    def train(arm: str) -> Callable[[Any], None]:
        def step(_: Any) -> None:
            with on_stream():
                optimizers[arm].zero_grad()
                models[arm](*inputs).square().mean().backward()
                optimizers[arm].step()
            if modeled is not None:  # the step's GPU kernels, as the simulator models them
                modeled.enqueue(stream)
        return step

    steps = {arm: train(arm) for arm in ("single", "ddp")}

    class Local:
        """The single-GPU step as tune measures it: poisoned before, checked after."""

        def enqueue(self, s: Any) -> None:
            steps["single"](s)

        def poison(self, s: Any) -> None:
            with on_stream():
                acc.fill_(float("nan"))

        def verify(self, s: Any) -> bool:
            with on_stream():
                return bool(torch.equal(acc.double(), expected))

    # 1. each rank tunes its own step (no collective inside: see the docstring)
    if modeled is not None:
        tuned = l2ctl.tune(modeled, stream, modeled.candidates(), rounds=args.tune_rounds, seed=args.seed)
    else:
        tuned = l2ctl.tune(Local(), stream, {"acc": acc, "head.weight": single.head.weight}, rounds=args.tune_rounds,
                           seed=args.seed, progress=rank == 0)

    # 2. the four arms side by side, the same shuffled order on every rank
    def barrier() -> None:  # every rank starts a block together
        stream.synchronize()
        dist.barrier(**({} if simulated else {"device_ids": [local]}))

    order = random.Random(args.seed)
    times: dict[tuple[str, bool], list[float]] = {arm: [] for arm in ARMS}
    wrong = []  # reported at the end by every rank: raising here would leave the others waiting at a barrier
    for _ in range(args.rounds):
        for arm, tuned_on in order.sample(ARMS, len(ARMS)):
            barrier()
            Local().poison(stream)
            with tuned.persist(stream) if tuned_on else contextlib.nullcontext():
                times[arm, tuned_on] += bench.time_gpu(steps[arm], stream, warmup=args.warmup,
                                                       repeat=args.repeat).times_ms
            if not (Local().verify(stream) and (modeled is None or modeled.verify(stream))):
                wrong.append(f"rank {rank}: the {arm} step {'with' if tuned_on else 'without'} the policy computed a "
                             "wrong accumulator")

    # 3. the training loop under the policy, as an application would run it
    barrier()
    with tuned.persist(stream):
        during = state(machine, device, stream)
        for _ in range(args.steps):
            steps["ddp"](stream)
    barrier()
    after = state(machine, device, stream)

    med = {arm: statistics.median(t) for arm, t in times.items()}
    gain = {arm: med[arm, False] / med[arm, True] for arm in ("single", "ddp")}
    p = tuned.policy
    mine = {
        "rank": rank, "device": bench.environment(device)["device"], "persists": tuned.persists,
        "buffer": tuned.buffer_name, "set_aside": tuned.set_aside, "hit_ratio": tuned.hit_ratio,
        "window_bytes": p.num_bytes if p.num_bytes is not None else (tuned.candidates[tuned.buffer_name].window_bytes
                                                                    if tuned.buffer_name else 0),
        "tuned": str(tuned), "tune_speedup": tuned.speedup, "median_ms": {f"{a}/{'on' if o else 'off'}": m
                                                                        for (a, o), m in med.items()},
        "single_gain": gain["single"], "ddp_gain": gain["ddp"],
        "ddp_fraction_of_single_gain": (gain["ddp"] - 1) / (gain["single"] - 1) if gain["single"] > 1 else None,
        "before": before, "during": during, "after": after, "wrong": wrong,
        "restored": before["limit"] == after["limit"] and before["window"] == after["window"]
                    and (before["raw"] is None or before["raw"] == after["raw"]),
        "records": [bench.Record.from_timing("ddp-step", f"{a}/{'tuned' if o else 'off'}", {"rank": rank},
                                             bench.Timing(tuple(t)), {}) for (a, o), t in times.items()],
    }
    everyone: list[Any] = [None] * ranks
    dist.all_gather_object(everyone, mine)
    config = {"ranks": ranks, "backend": dist.get_backend(), "acc_bytes": acc.nbytes, "l2_bytes": info.l2_cache_size,
              "updates": updates, "features": features, "hidden": single.head.out_features,
              "gradient_bytes": single.head.weight.nbytes, "rounds": args.rounds, "repeat": args.repeat,
              "warmup": args.warmup, "steps": args.steps, "simulated": bench.environment(device)["simulated"]}
    return everyone, config


def report(everyone: list[dict[str, Any]], config: dict[str, Any], path: Optional[str]) -> None:
    c = config
    if c["simulated"]:
        print(f"SIMULATED, not a measurement of real hardware: {c['simulated']}")
    print(f"DDP step on {c['ranks']} rank(s) ({c['backend']}): acc.index_add_ into {c['acc_bytes'] / MiB:.2f} MiB "
          f"(0.64 x L2 {c['l2_bytes'] / MiB:.2f} MiB) from {c['updates']:,} updates, head {c['features']} -> {c['hidden']} "
          f"({c['gradient_bytes'] / MiB:.2f} MiB of gradient all-reduced per step); medians of "
          f"{c['rounds'] * c['repeat']} steps per arm, arms interleaved")
    for r in everyone:
        d, m = r["device"], r["median_ms"]
        choice = (f"{r['buffer']}: set-aside {r['set_aside'] / MiB:.2f} MiB, hit ratio {r['hit_ratio']:.3f}, window "
                  f"{r['window_bytes'] / MiB:.2f} MiB" if r["persists"] else "no persistence")
        fraction = r["ddp_fraction_of_single_gain"]
        share = "-" if fraction is None else f"{fraction:.0%}"
        b, a = r["before"], r["after"]
        raw = "" if b["raw"] is None else f" ({b['raw']['via']}: {b['raw']['limit']} -> {a['raw']['limit']} B)"
        print(f"rank {r['rank']} {d['name']} (device {d['index']}): {choice}\n"
              f"  single GPU {m['single/off']:.3f} -> {m['single/on']:.3f} ms ({r['single_gain']:.3f}x); "
              f"DDP {m['ddp/off']:.3f} -> {m['ddp/on']:.3f} ms ({r['ddp_gain']:.3f}x): {share} of the single-GPU gain\n"
              f"  device as found: limit {b['limit']} -> {a['limit']} B{raw}, window {b['window'][:2]} -> "
              f"{a['window'][:2]}: {'yes' if r['restored'] else 'NO'}")
    for r in everyone:
        for line in r["wrong"]:
            print(f"VERIFICATION FAILED: {line}")
    fractions = [r["ddp_fraction_of_single_gain"] for r in everyone]
    if all(f is not None for f in fractions):
        worst = min(f for f in fractions if f is not None)
        print(f"target, DDP gain >= 90% of the single-GPU gain on every rank: {'met' if worst >= 0.9 else 'not met'} "
              f"(worst {worst:.0%})")
    else:
        print("target: not applicable on the ranks where the single-GPU step gained nothing")
    if path:
        env = bench.environment(everyone[0]["device"]["index"])
        env["rank_devices"] = [r["device"] for r in everyone]
        records = [rec for r in everyone for rec in r["records"]]
        summary = {**config, "per_rank": [{k: v for k, v in r.items() if k != "records"} for r in everyone]}
        bench.Report("ddp-step", env, records, summary=summary).to_json(path)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
