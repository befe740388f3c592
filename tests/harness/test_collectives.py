"""Multi-process logic on CPU: the DDP example (examples/ddp_step.py) and bench_collectives, each run by torchrun
in two processes with gloo and a simulator per process; and bench_collectives in this process with one rank.
Checked: every rank tunes and reports, rank 0 lists both, every rank's simulated device ends as it started
(the limit and the window, read past l2ctl), and the collectives ran at each set-aside of the grid."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import l2ctl
from l2ctl import bench
from l2ctl.bench.collectives import bus_factor, collective_set_asides, collectives_table

try:
    import torch
    import torch.distributed as dist
except ImportError:
    pytest.skip("needs PyTorch (pip install torch): the collectives and the DDP example run through "
                "torch.distributed", allow_module_level=True)
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip(f"PyTorch {torch.__version__} has no gloo backend for torch.distributed", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_step.py"
KiB = 1 << 10


def torchrun(args: list[str], tmp_path: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS`` (a free port on localhost)."""
    environ = {k: v for k, v in os.environ.items() if k != "L2CTL_SIMULATE"}  # simulated only where asked
    environ.update(OMP_NUM_THREADS="1", **env)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.mark.slow
def test_ddp_example_tunes_each_rank_and_leaves_each_device_as_found(tmp_path):
    record = tmp_path / "ddp.json"
    done = torchrun([str(EXAMPLE), "--simulate", "h100", "--rounds", "2", "--repeat", "2", "--steps", "3",
                     "--json", str(record)], tmp_path)
    assert "SIMULATED" in done.stdout
    assert "rank 0 " in done.stdout and "rank 1 " in done.stdout  # rank 0 printed both
    report = json.loads(record.read_text())
    ranks = report["summary"]["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len(report["records"]) == 2 * 4 and all(r["repeat"] == 2 * 2 for r in report["records"])
    for r in ranks:
        before, during, after = r["before"], r["during"], r["after"]
        assert before["raw"]["via"] == "simulator"
        assert r["restored"]
        assert (before["limit"], before["window"]) == (after["limit"], after["window"])
        assert before["raw"] == after["raw"] and before["raw"]["limit"] == before["limit"]
        # each rank tuned its own step on its own simulator and applied the choice in the training loop
        assert r["persists"] and r["buffer"] in ("acc", "index", "values")
        assert during["window"][1] == r["window_bytes"] > 0 and during["window"] != before["window"]
        assert during["raw"]["window"] == during["window"] and during["raw"]["limit"] == during["limit"]
        assert during["limit"] >= r["set_aside"]
        assert r["median_ms"]["single/on"] < r["median_ms"]["single/off"]  # the model's gain, not a constant
        assert r["ddp_fraction_of_single_gain"] == pytest.approx((r["ddp_gain"] - 1) / (r["single_gain"] - 1))
    assert "target, DDP gain >= 90% of the single-GPU gain" in done.stdout


RUNNER = """
import json, sys
import l2ctl
from l2ctl import _backend, bench
machine = _backend.current()                  # this process's own simulator (L2CTL_SIMULATE)
before = machine.device(0).limit
seen = []
real = l2ctl.bench.collectives.set_aside
def spy(n, device=None):                      # the limit each block ran under, read from the simulator
    granted = real(n, device)
    seen.append((n, machine.device(0).limit))
    return granted
l2ctl.bench.collectives.set_aside = spy
report = bench.bench_collectives([64 << 10, 96 << 10], rounds=2, warmup=1, repeat=2, progress=False)
rank = report.environment["distributed"]["rank"]
json.dump({"before": before, "after": machine.device(0).limit, "seen": seen}, open(f"rank{rank}.json", "w"))
if rank == 0:
    report.to_json("collectives.json")
    print("\\n".join(bench.collectives.collectives_table(report)))
"""


@pytest.mark.slow
def test_collectives_run_in_every_rank_at_each_set_aside_and_restore_the_limit(tmp_path, fake):
    (tmp_path / "runner.py").write_text(RUNNER)
    done = torchrun(["runner.py"], tmp_path, L2CTL_SIMULATE="h100")
    grid = sorted(collective_set_asides())  # the same simulated H100, here
    for rank in (0, 1):
        state = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert state["after"] == state["before"] == fake.device(0).initial_limit
        blocks = 2 * 2 * 2  # ops x sizes x rounds, each visiting every set-aside once
        assert sorted(n for n, _ in state["seen"]) == sorted(grid * blocks)
        assert all(limit == n for n, limit in state["seen"])  # the grid is in granules: granted as asked
    report = json.loads((tmp_path / "collectives.json").read_text())
    s = report["summary"]
    assert report["environment"]["distributed"]["ranks"] == 2 and len(report["environment"]["distributed"]["devices"]) == 2
    assert s["simulated"] and "SIMULATED" in s["note"] and "SIMULATED" in done.stdout
    assert [(r["op"], r["set_aside"]) for r in s["table"]] == [(op, n) for op in ("all_reduce", "all_gather")
                                                               for _ in range(2) for n in grid]
    for r in s["table"]:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["op"], 2))
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["median_ms"] / 1e6)
        assert (r["ratio"] == 1.0) if r["set_aside"] == 0 else r["ratio"] > 0
    assert {r["bytes"] for r in s["table"]} == {64 * KiB, 96 * KiB}  # 96 KiB: divisible by 4 x 2 ranks
    assert s["worst_ratio_at_max"] == min(r["ratio"] for r in s["table"] if r["set_aside"] == max(grid))
    assert s["all_reduce_ratio_at_default"] == min(r["ratio"] for r in s["table"]
                                                   if r["op"] == "all_reduce" and r["set_aside"] == s["default_limit"])
    assert [x["rank"] for x in s["limits"]] == [0, 1]


@pytest.fixture
def one_rank(fake):
    """torch.distributed with one gloo rank in this process, on the simulated H100."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield fake
    finally:
        dist.destroy_process_group()


def test_one_rank_in_process(one_rank, monkeypatch):
    limits = []
    real = dist.all_gather_into_tensor
    monkeypatch.setattr(dist, "all_gather_into_tensor",
                        lambda out, part: (limits.append(one_rank.device(0).limit), real(out, part))[1])
    report = bench.bench_collectives([4 * KiB], ops=["all_gather"], set_asides=[one_rank.device(0).persisting_l2_cache_max_size],
                                     rounds=3, warmup=0, repeat=2, progress=False)
    assert dist.is_initialized()  # the caller's group is left as it was
    grid = [0, one_rank.device(0).persisting_l2_cache_max_size]
    assert sorted(set(limits)) == grid and len(limits) == 3 * 2 * 2
    assert one_rank.device(0).limit == one_rank.device(0).initial_limit
    assert [r.config["set_aside"] for r in report.records] == grid
    assert report.records[1].metrics["busbw_gbps"] == 0.0  # one rank moves nothing over a link: (n-1)/n = 0
    assert "all_reduce_ratio_at_default" in report.summary and "worst_at_max" in report.summary
    assert any("SIMULATED" in line for line in collectives_table(report))


def test_a_wrong_result_fails_every_rank(one_rank, monkeypatch):
    monkeypatch.setattr(dist, "all_gather_into_tensor", lambda out, part: None)  # gathers nothing
    with pytest.raises(bench.VerificationError, match="all_gather"):
        bench.bench_collectives([4 * KiB], ops=["all_gather"], rounds=1, warmup=0, repeat=1, progress=False)
    assert one_rank.device(0).limit == one_rank.device(0).initial_limit


def test_arguments_are_checked_before_anything_starts(fake, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="op must be one of"):
        bench.bench_collectives(ops=["broadcast"])
    with pytest.raises(TypeError):
        bench.bench_collectives([1.5])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="torchrun"):
        bench.bench_collectives()
    assert not dist.is_initialized()


def test_the_grid_and_bus_factors(fake):
    info = l2ctl.device_info()
    g, top = l2ctl.set_aside_granularity(), info.persisting_l2_cache_max_size
    grid = collective_set_asides()
    assert min(grid) == 0 and max(grid) == top and l2ctl.auto_set_aside_cap() in grid
    assert all(n % g == 0 or n == top for n in grid)
    assert "default" in grid[l2ctl.auto_set_aside_cap()] and grid[top].endswith("100% of max")
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8 and bus_factor("all_gather", 8) == 7 / 8
