"""On the GPU: the framework gallery's workloads run on any stream form, check their outputs, and tune; small
sizes (the benchmark runs the real ones). Skipped with the reason where PyTorch or CuPy is missing."""

from __future__ import annotations

import warnings

import pytest

import l2ctl
from l2ctl import benchmark_gallery
from l2ctl.workloads import BroadcastAdd, Embedding, EmbeddingBag, IndexSelect, ScatterAdd, SpMV, TrainingStep
from l2ctl.workloads._frameworks import cupy_missing, torch_missing

pytestmark = pytest.mark.gpu
MiB = 1 << 20

SMALL = {
    "broadcast": lambda: BroadcastAdd(operand_bytes=MiB, stream_bytes=32 * MiB),
    "scatter-add": lambda: ScatterAdd(acc_bytes=MiB, update_bytes=24 * MiB),
    "index_select": lambda: IndexSelect(table_bytes=2 * MiB, out_bytes=16 * MiB),
    "embedding": lambda: Embedding(table_bytes=2 * MiB, out_bytes=16 * MiB),
    "embedding_bag": lambda: EmbeddingBag(table_bytes=2 * MiB, gathered_bytes=16 * MiB),
    "spmv": lambda: SpMV(vector_bytes=MiB),
    "step": lambda: TrainingStep(bias_bytes=MiB, table_bytes=MiB, acc_bytes=MiB),
}


def _skip_reason(name: str):
    return cupy_missing() if name == "spmv" else torch_missing()


@pytest.mark.parametrize("name", list(SMALL))
def test_runs_verifies_and_catches_a_missed_run(name, gpu_state):
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    with SMALL[name]() as w, l2ctl.Stream() as s:
        gpu_state.watch(s)
        assert w.candidates() and w.hot in w.candidates()
        w.poison(s)
        w.enqueue(s)
        assert w.verify(s)
        w.poison(s)  # a run that did not happen is caught
        assert not w.verify(s)
        w.enqueue(s)
        window = min(w.sizes()[w.hot], l2ctl.device_info().access_policy_max_window_size)
        with l2ctl.persist(s, w.candidates()[w.hot], 1.0, set_aside=4 * MiB, num_bytes=window):
            w.enqueue(s)
        assert w.verify(s)
        assert w.describe()["workload"] == name


def test_framework_streams_work_too(gpu_state):
    if torch_missing():
        pytest.skip(torch_missing())
    import torch

    ts = torch.cuda.Stream()
    gpu_state.watch(ts)
    with SMALL["broadcast"]() as w:
        w.poison(ts)
        w.enqueue(ts)
        assert w.verify(ts)
        w.poison(ts)
        w.enqueue(ts.cuda_stream)  # a raw handle
        assert w.verify(ts.cuda_stream)


def test_tuning_torch_tensors_gives_a_policy_that_applies_cleanly(gpu_state):
    if torch_missing():
        pytest.skip(torch_missing())
    import torch

    ts = torch.cuda.Stream()
    gpu_state.watch(ts)
    with SMALL["step"]() as w:
        tuned = l2ctl.tune(w, ts, w.candidates(), rounds=3, repeat=2)
        assert set(tuned.candidates) == set(w.candidates()) and tuned.seconds < 60
        assert all(p.point.hit_ratio * p.point.num_bytes <= p.point.set_aside * (1 + 1e-9)
                   for c in tuned.candidates.values() for p in c.points)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with tuned.persist(ts):
                w.enqueue(ts)
        assert w.verify(ts)


def test_gallery_benchmark_one_small_row(gpu_state, tmp_path):
    if torch_missing():
        pytest.skip(torch_missing())
    report = benchmark_gallery.bench_workloads(names=["broadcast"], runs=1, rounds=3, repeat=2, progress=False,
                                   factories={"broadcast": lambda d: BroadcastAdd(d, operand_bytes=2 * MiB,
                                                                                  stream_bytes=64 * MiB)})
    (row,) = report.summary["rows"]
    assert row["workload"] == "broadcast" and row["baseline_ms"] > 0 and len(row["tuned_speedups"]) == 1
    assert all(r.verified for r in report.records)
    report.to_json(str(tmp_path / "w.json"))


@pytest.mark.parametrize("mode", ["graphed", "compiled"])
def test_gallery_rows_that_replay_graphs(mode, gpu_state):
    if torch_missing():
        pytest.skip(torch_missing())
    import torch

    from l2ctl.workloads import Compiled, Graphed

    wrap = Graphed if mode == "graphed" else Compiled
    small = {f"scatter-add-{mode}": lambda d: wrap(ScatterAdd(d, acc_bytes=2 * MiB, update_bytes=48 * MiB))}
    try:
        report = benchmark_gallery.bench_workloads(runs=1, rounds=3, repeat=2, progress=False, factories=small)
    finally:
        torch.compiler.reset()
    (row,) = report.summary["rows"]
    assert row["mode"] == mode and row["baseline_ms"] > 0 and all(r.verified for r in report.records)
