"""On two GPUs: the DDP example (examples/ddp_step.py) and bench_collectives under torchrun, NCCL, one process per GPU;
every rank's limit and stream window read through cuda.bindings before, inside the policy's scope and after.
Skipped, with the reason, without two CUDA GPUs, PyTorch or cuda-python."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs PyTorch (pip install torch)"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return f"needs two CUDA GPUs; torch sees {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError:
        return "needs cuda-python (pip install cuda-bindings) to read each rank's state past l2ctl"
    return None


@pytest.fixture(autouse=True)
def _two_gpus():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)


def torchrun(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "L2CTL_SIMULATE"}
    environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on shared hosts
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args],
                          cwd=cwd, env=environ, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def test_ddp_example_on_two_gpus(tmp_path):
    record = tmp_path / "ddp.json"
    done = torchrun([str(ROOT / "examples" / "ddp_step.py"), "--update-bytes", "384M", "--rounds", "3", "--repeat", "3",
                     "--tune-rounds", "3", "--steps", "5", "--json", str(record)], tmp_path)
    assert "rank 0 " in done.stdout and "rank 1 " in done.stdout and "SIMULATED" not in done.stdout
    ranks = json.loads(record.read_text())["summary"]["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["device"]["uuid"] != ranks[1]["device"]["uuid"]  # one GPU per rank
    for r in ranks:
        before, during, after = r["before"], r["during"], r["after"]
        for seen in (before, during, after):  # l2ctl and cuda.bindings agree
            assert seen["raw"]["via"] == "cuda.bindings"
            assert (seen["raw"]["limit"], seen["raw"]["window"][:2]) == (seen["limit"], seen["window"][:2])
        assert r["restored"] and before == after
        if r["persists"]:  # the choice was in force in the training loop
            assert during["limit"] >= r["set_aside"] and during["window"][1] == r["window_bytes"] > 0
        else:
            assert during == before
        assert r["single_gain"] > 0 and r["ddp_gain"] > 0


RUNNER = """
import json, os
import torch
from cuda.bindings import runtime as rt
from l2ctl import bench
def limit():  # past l2ctl
    (err,) = rt.cudaSetDevice(torch.cuda.current_device())
    err, value = rt.cudaDeviceGetLimit(rt.cudaLimit.cudaLimitPersistingL2CacheSize)
    assert err == rt.cudaError_t.cudaSuccess, err
    return int(value)
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
before = limit()
report = bench.bench_collectives([8 << 20, 32 << 20], rounds=2, warmup=1, repeat=3, progress=False)
rank = report.environment["distributed"]["rank"]
json.dump({"before": before, "after": limit()}, open(f"rank{rank}.json", "w"))
if rank == 0:
    report.to_json("collectives.json")
"""


def test_collectives_on_two_gpus(tmp_path):
    (tmp_path / "runner.py").write_text(RUNNER)
    torchrun(["runner.py"], tmp_path)
    for rank in (0, 1):
        state = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert state["after"] == state["before"]
    report = json.loads((tmp_path / "collectives.json").read_text())
    d, s = report["environment"]["distributed"], report["summary"]
    assert (d["ranks"], d["backend"], d["timing"]) == (2, "nccl", "CUDA events") and not s["simulated"]
    assert [x["before"] for x in s["limits"]] == [x["after"] for x in s["limits"]]
    assert min(s["set_asides"]) == 0 and s["max_set_aside"] == report["environment"]["device"]["persisting_l2_cache_max_size"]
    assert all(r["busbw_gbps"] > 0 and (r["ratio"] == 1.0 or r["set_aside"] > 0) for r in s["table"])
    assert {r["bytes"] for r in s["table"]} == {8 * MiB, 32 * MiB}
