"""NCCL all-reduce and all-gather bus bandwidth under each set-aside, against no set-aside measured interleaved in
the same processes: what the set-aside's tax costs the collectives between a DDP job's steps.

Runs in every process of a distributed job (``torchrun --nproc-per-node N``), each process on its own GPU,
every GPU at the same set-aside at once. Bus bandwidth as nccl-tests reports it: algbw = bytes / time, busbw =
algbw x 2(n-1)/n for all-reduce and x (n-1)/n for all-gather (whose bytes are the gathered output's).
Under the simulator (gloo on CPU tensors, host clock) the logic runs; the numbers are the CPU's, labelled so.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, Optional, Sequence

from .. import _backend
from .._device import require_persistence
from .._errors import NotSupportedError, check
from .._limit import auto_set_aside_cap, get_set_aside, set_aside, set_aside_granularity
from .._plan import check_count, check_nbytes
from .._units import MiB
from .progress import Progress
from .records import Record, Report, environment
from .timing import Timing, check_repeats, time_gpu

__all__ = ["bench_collectives", "collective_set_asides", "collective_size_problem", "bus_factor", "collectives_table",
           "COLLECTIVE_OPS", "DEFAULT_SIZES", "SIMULATED_SIZES"]

COLLECTIVE_OPS = ("all_reduce", "all_gather")
DEFAULT_SIZES = (64 * MiB, 128 * MiB, 256 * MiB, 512 * MiB, 1024 * MiB)
#: Under the simulator: gloo on CPU tensors, sizes that keep a CI run short.
SIMULATED_SIZES = (64 << 10, 256 << 10)
#: The collectives move float32 tensors.
ELEMENT_BYTES = 4


def collective_size_problem(nbytes: int, ranks: int = 1) -> Optional[str]:
    """Why a message of ``nbytes`` cannot be measured exactly over ``ranks`` ranks (every op moves whole float32
    elements, and all-gather splits the message into ``ranks`` equal parts), or None when it can: a size
    given is measured as given, never rounded down."""
    unit = ELEMENT_BYTES * ranks
    if nbytes % unit == 0:
        return None
    if ranks == 1:
        return f"{nbytes} B is not a multiple of the {ELEMENT_BYTES}-byte float32 element the collectives move"
    return (f"{nbytes} B is not a multiple of {unit} B ({ranks} ranks x the {ELEMENT_BYTES}-byte float32 element: "
            "all-gather splits it into equal parts)")


def _check_sizes(sizes: Sequence[int], ranks: int) -> None:
    problems = [p for p in (collective_size_problem(n, ranks) for n in sizes) if p]
    if problems:
        raise ValueError("sizes: " + "; ".join(problems))


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: the fraction of the bytes each rank's link carries."""
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"op must be one of {', '.join(COLLECTIVE_OPS)}, got {op!r}")
    return (2 if op == "all_reduce" else 1) * (ranks - 1) / ranks


def collective_set_asides(device: object = None) -> dict[int, str]:
    """bytes -> label: none, the driver's default limit, and 25/50/75/100% of the max rounded to the driver's
    granularity (at least one granule; labels joined where two coincide). A label names the share of the max
    the rounded set-aside is (on an H100, a quarter rounds to three granules: 9.38 MiB, 30% of the max)."""
    info = require_persistence(device)
    top, g = info.persisting_l2_cache_max_size, set_aside_granularity(info.index)
    points = [(0, "none"), (auto_set_aside_cap(info.index), "default")]
    sizes = dict.fromkeys(min(top, max(g, int(f * top / g + 0.5) * g)) for f in (0.25, 0.5, 0.75, 1.0))
    points += [(nbytes, f"{nbytes / top:.0%} of max") for nbytes in sizes]
    labels: dict[int, str] = {}
    for nbytes, label in sorted(points, key=lambda p: p[0]):
        labels[nbytes] = f"{labels[nbytes]}, {label}" if nbytes in labels else label
    return labels


def _distributed(device: object) -> tuple[Any, Any, bool, bool, object]:
    """torch, torch.distributed, whether this call initialised it, whether the tensors live on the GPU (NCCL),
    and the l2ctl device (the rank's CUDA device unless given)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise NotSupportedError("bench collectives measures torch.distributed's collectives: it needs PyTorch "
                                "(pip install torch)") from None
    ours = False
    if not dist.is_initialized():
        if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            raise RuntimeError("bench_collectives runs in every process of a distributed job: launch it with "
                               "torchrun --nproc-per-node N, or call torch.distributed.init_process_group first")
        nccl = torch.cuda.is_available() and not _backend.simulated()
        if nccl:  # one GPU per process, as torchrun numbers them
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if nccl else "gloo")
        ours = True
    on_gpu = dist.get_backend() == "nccl"
    if device is None and on_gpu and not _backend.simulated():
        device = torch.cuda.current_device()
    return torch, dist, ours, on_gpu, device


def _collective(torch: Any, dist: Any, op: str, nbytes: int, ranks: int, rank: int,
                where: Any) -> tuple[int, Callable[[], None], Callable[[], bool]]:
    """(bytes moved as nccl-tests counts them, one timed op, a check that the op computes the right thing)."""
    per_rank = nbytes // (4 * (ranks if op == "all_gather" else 1))  # float32 elements
    if per_rank == 0:
        raise ValueError(f"{op} of {nbytes} B over {ranks} ranks: at least {4 * ranks} B")
    if op == "all_reduce":
        buf = torch.zeros(per_rank, dtype=torch.float32, device=where)  # zeros stay zeros: no overflow over repeats

        def check_reduce() -> bool:
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
            ok = bool((buf == ranks * (ranks + 1) // 2).all())
            buf.zero_()
            return ok

        return per_rank * 4, lambda: dist.all_reduce(buf), check_reduce
    part = torch.full((per_rank,), float(rank + 1), dtype=torch.float32, device=where)
    out = torch.zeros(per_rank * ranks, dtype=torch.float32, device=where)

    def check_gather() -> bool:
        rows, want = out.view(ranks, per_rank), torch.arange(1, ranks + 1, dtype=torch.float32, device=where)
        return bool(torch.equal(rows.amin(1), want) and torch.equal(rows.amax(1), want))

    return per_rank * 4 * ranks, lambda: dist.all_gather_into_tensor(out, part), check_gather


def bench_collectives(
    sizes: Optional[Sequence[int]] = None,
    *,
    ops: Sequence[str] = COLLECTIVE_OPS,
    set_asides: Optional[Sequence[int]] = None,
    device: object = None,
    rounds: int = 3,
    warmup: int = 2,
    repeat: int = 5,
    seed: int = 0,
    progress: bool = True,
) -> Report:
    """All-reduce and all-gather bus bandwidth for each message size (default 64 MiB to 1 GiB; under the
    simulator 64 and 256 KiB) at each set-aside (default: :func:`collective_set_asides`; 0 is always measured,
    the baseline of every ratio). Call it in every rank; torch.distributed is initialised from torchrun's
    variables when the caller has not (NCCL on GPUs, gloo under the simulator) and shut down again.

    Per op and size: ``rounds`` rounds, each visiting every set-aside once in an order shuffled by ``seed``
    (the same on every rank: each block is collective), a block being ``warmup`` untimed and ``repeat`` timed
    ops (CUDA events) inside ``with l2ctl.set_aside(n)``, then an op that checks the result. A point's time is
    the slowest rank's median (a collective ends on every rank together). Every rank returns the same
    report; ``environment["distributed"]["rank"]`` says which rank it is (rank 0 prints and writes)."""
    for op in ops:
        bus_factor(op, 2)  # names checked before anything starts
    if not ops:
        raise ValueError("ops: name at least one of " + ", ".join(COLLECTIVE_OPS))
    given = None if sizes is None else [check_nbytes(s, "size") for s in sizes]
    _check_sizes(given or (), 1)  # before torch.distributed starts; the ranks are checked once known
    extra = None if set_asides is None else [check_nbytes(s, "set_aside", allow_zero=True) for s in set_asides]
    rounds = check_count(rounds, "rounds", minimum=1, maximum=1000)
    warmup, repeat = check_repeats(warmup, repeat)
    torch, dist, ours, on_gpu, device = _distributed(device)
    try:
        return _measure(torch, dist, on_gpu, device, list(ops), given, extra, rounds, warmup, repeat, seed, progress)
    finally:
        if ours:
            dist.destroy_process_group()


def _measure(torch: Any, dist: Any, on_gpu: bool, device: object, ops: list[str], sizes: Optional[list[int]],
             set_asides: Optional[list[int]], rounds: int, warmup: int, repeat: int, seed: int,
             progress: bool) -> Report:
    info = require_persistence(device)
    simulated = _backend.simulated()
    ranks, rank = dist.get_world_size(), dist.get_rank()
    _check_sizes(sizes or (), ranks)  # every rank refuses together, before any of them measures
    labels = collective_set_asides(info.index)
    if set_asides is not None:
        labels = {n: labels.get(n, "given") for n in sorted({0, *set_asides})}
    grid = list(labels)
    sizes = sizes or list(SIMULATED_SIZES if simulated else DEFAULT_SIZES)
    where = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if on_gpu else (lambda: None)
    token = torch.zeros(1, device=where)

    def clock(run: Callable[[], None]) -> tuple[float, ...]:
        if on_gpu:  # CUDA events on the current stream, which NCCL's stream joins before and after each op
            return time_gpu(lambda _: run(), torch.cuda.current_stream(), warmup=warmup, repeat=repeat).times_ms
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeat):  # gloo on CPU tensors returns when the op is done
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        return tuple(times)

    limit_before = get_set_aside(info.index)
    order = random.Random(seed)  # the same sequence on every rank
    mine: dict[tuple[str, int, int], list[float]] = {}
    granted: dict[int, int] = {}
    failed: list[str] = []
    moved: dict[tuple[str, int], int] = {}
    with Progress(len(ops) * len(sizes) * rounds * len(grid), "collectives", progress and rank == 0) as bar:
        for op in ops:
            for nbytes in sizes:
                moved[op, nbytes], run, verify = _collective(torch, dist, op, nbytes, ranks, rank, where)
                for _ in range(rounds):
                    for limit in order.sample(grid, len(grid)):
                        sync()
                        dist.all_reduce(token)  # every rank starts the block together
                        sync()
                        with set_aside(limit, info.index) as got:
                            mine.setdefault((op, nbytes, limit), []).extend(clock(run))
                            if not verify():
                                failed.append(f"{op} {nbytes} B at set-aside {limit} B on rank {rank}")
                            granted[limit] = int(got)
                        bar.step(f"{op} {nbytes >> 10} KiB, set-aside {limit >> 10} KiB")
                sync()
    limit_after = get_set_aside(info.index)
    env = environment(info.index)
    rank_info = {"rank": rank, "times": mine, "granted": granted, "failed": failed, "limit_before": limit_before,
                 "limit_after": limit_after, "device": env["device"]}
    everyone: list[Any] = [None] * ranks
    dist.all_gather_object(everyone, rank_info)
    problems = [f for r in everyone for f in r["failed"]]
    problems += [f"rank {r['rank']}: the set-aside limit was {r['limit_before']} B before and {r['limit_after']} B after"
                 for r in everyone if r["limit_after"] != r["limit_before"]]
    check(not problems, "; ".join(problems))  # every rank raises together: they all see the same list
    env["distributed"] = {"rank": rank, "ranks": ranks, "backend": dist.get_backend(), "tensors": str(where),
                          "timing": "CUDA events" if on_gpu else "host clock",
                          "devices": [r["device"] for r in everyone]}
    return _report(env, everyone, ops, sizes, moved, grid, labels, auto_set_aside_cap(info.index), ranks, simulated)


def _report(env: dict[str, Any], everyone: list[Any], ops: list[str], sizes: list[int], moved: dict[tuple[str, int], int],
            grid: list[int], labels: dict[int, str], default: int, ranks: int, simulated: str) -> Report:
    records, rows = [], []
    for op in ops:
        for nbytes in sizes:
            base_ms = 0.0
            for limit in grid:  # 0 first: the baseline of the ratios
                per_rank = [Timing(tuple(r["times"][op, nbytes, limit])) for r in everyone]
                slowest = max(per_rank, key=lambda t: t.median_ms)
                ms = slowest.median_ms
                base_ms = base_ms or ms
                algbw = moved[op, nbytes] / ms / 1e6  # GB/s (1e9 B/s), as nccl-tests
                row = {"op": op, "bytes": moved[op, nbytes], "set_aside": limit, "label": labels[limit],
                       "set_aside_granted": everyone[0]["granted"][limit], "median_ms": ms, "algbw_gbps": algbw,
                       "busbw_gbps": algbw * bus_factor(op, ranks), "ratio": base_ms / ms}
                rows.append(row)
                records.append(Record.from_timing("collectives", op, {k: row[k] for k in (
                    "op", "bytes", "set_aside", "label", "set_aside_granted")} | {"ranks": ranks}, slowest, {
                    "algbw_gbps": algbw, "busbw_gbps": row["busbw_gbps"], "ratio_to_no_set_aside": row["ratio"],
                    "rank_median_ms": [t.median_ms for t in per_rank]}))
    top = max(grid)
    at_default = [r for r in rows if r["op"] == "all_reduce" and r["set_aside"] == default]
    at_max = [r for r in rows if r["set_aside"] == top]
    worst = min(at_max, key=lambda r: r["ratio"]) if at_max else None
    summary = {
        "ranks": ranks, "sizes": sizes, "set_asides": grid, "default_limit": default, "max_set_aside": top,
        "table": rows,
        "all_reduce_ratio_at_default": min((r["ratio"] for r in at_default), default=None),
        "all_reduce_ratio_at_default_by_size": {r["bytes"]: r["ratio"] for r in at_default},
        "worst_ratio_at_max": None if worst is None else worst["ratio"],
        "worst_at_max": None if worst is None else {k: worst[k] for k in ("op", "bytes", "ratio")},
        "limits": [{"rank": r["rank"], "before": r["limit_before"], "after": r["limit_after"]} for r in everyone],
        "simulated": simulated,
    }
    if simulated:
        summary["note"] = ("SIMULATED: the simulator has no NCCL bandwidth model; these are gloo collectives on CPU "
                           "tensors timed by the host clock, not a measurement of any GPU")
    return Report("collectives", env, records, summary=summary)


def collectives_table(report: Report) -> list[str]:
    """The report as printed: a row per op, size and set-aside (busbw and its ratio to no set-aside), then
    the summary lines."""
    s, env = report.summary, report.environment
    d = env["distributed"]
    lines = [f"{d['ranks']} ranks ({d['backend']}, {d['timing']}), slowest rank's median; busbw as nccl-tests; "
             f"ratio: busbw over busbw with no set-aside, measured interleaved"]
    if s.get("note"):
        lines.append(s["note"])
    lines.append(f"{'op':<11} {'bytes':>10} {'set-aside':>12} {'':<22} {'ms':>9} {'busbw GB/s':>11} {'ratio':>7}")
    for r in s["table"]:
        lines.append(f"{r['op']:<11} {r['bytes'] / MiB:>6.2f} MiB {r['set_aside_granted'] / MiB:>8.2f} MiB "
                     f"{'(' + r['label'] + ')':<22} {r['median_ms']:9.3f} {r['busbw_gbps']:11.2f} {r['ratio']:6.3f}x")
    if s["all_reduce_ratio_at_default"] is not None:
        lines.append(f"all-reduce at the driver's default limit ({s['default_limit'] / MiB:.2f} MiB): busbw ratio "
                     f"{s['all_reduce_ratio_at_default']:.3f} (worst size)")
    if s["worst_at_max"] is not None:
        w = s["worst_at_max"]
        lines.append(f"at the max ({s['max_set_aside'] / MiB:.2f} MiB): worst ratio {w['ratio']:.3f} "
                     f"({w['op']}, {w['bytes'] / MiB:.2f} MiB)")
    lines.append("set-aside limit restored on every rank: " + ", ".join(
        f"rank {x['rank']} {x['before']} -> {x['after']} B" for x in s["limits"]))
    return lines
