"""The measurement harness (l2ctl.bench, sweep, tune) end to end on the simulated H100: every benchmark
scenario runs, verifies its outputs, writes records (JSON and CSV) that carry their environment, and
leaves the device as it found it."""

from __future__ import annotations

import json

import pytest

import l2ctl
from l2ctl import bench
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


@pytest.fixture
def sim(fake):
    return fake


def test_bench_reset_data_end_to_end(sim):
    from l2ctl import bench

    before = sim.state()
    report = bench.bench_reset_data([1 << 20, 4 << 20], out_bytes=64 << 20, repeat=3, warmup=1, progress=False)
    assert len(report.records) == 2 * len(bench.RESET_COLUMNS)
    assert all(r.metrics["mismatches"] == 0 for r in report.records)
    assert "verdict" in report.summary and sim.state() == before


def test_sweep_and_tune_end_to_end(sim):
    from l2ctl import sweep
    from l2ctl.workloads import ResetDataWorkload

    before = sim.state()
    with l2ctl.Stream() as s, ResetDataWorkload(4 << 20, 256 << 20) as w:
        result = sweep.sweep_hit_ratio(w, s, w.buf, repeat=3, warmup=1, progress=False)
        assert len(result.records) == 11 and all(r.verified for r in result.records)
        speedups = result.speedups()
        assert speedups[-1] > 1.1 and speedups[-1] == max(speedups)  # hit ratio 1.0 is best
        tuned = l2ctl.tune(w, s, w.buf)
        assert tuned.persists and 1.1 < tuned.speedup < 1.4 and tuned.seconds < 5
        assert all(r.verified for r in tuned.table)
        with l2ctl.persist(s, w.buf, policy=tuned.policy):
            w.enqueue(s)
        assert w.verify(s)
    assert sim.state() == before and sim.device(0).limit == sim.device(0).initial_limit


def test_every_scenario_verifies_records_and_restores(sim, tmp_path):
    before = sim.state()
    reports = [
        bench.bench_stride([4, 32], threads=1 << 20, repeat=2, warmup=1, progress=False),
        bench.bench_cache_streaming(100_000, repeat=2, warmup=1, progress=False),
        bench.bench_graph(MiB, out_bytes=32 * MiB, kernels_per_graph=2, repeat=2, warmup=1, progress=False),
        bench.bench_concurrent(repeat=2, warmup=1, progress=False),
        bench.bench_overhead(rounds=2, iterations=50, progress=False),
    ]
    for report in reports:  # (the overhead variants that need torch or cuda-python say why they were skipped)
        assert report.records and all(r.verified or r.config.get("skipped") for r in report.records), report.benchmark
        env = report.environment
        assert env["device"]["name"] == sim.device(0).name and "commit" in env and env["runtime_version"]
        path = tmp_path / f"{report.benchmark}.json"
        report.to_json(str(path))
        assert json.loads(path.read_text())["records"]
        report.to_csv(str(tmp_path / f"{report.benchmark}.csv"))
    graph = reports[2].summary  # the record that shows an exec update carries no window
    assert graph["replay_window_update"] == pytest.approx(1.0, abs=0.02)
    assert graph["replay_window_reinstantiate"] > graph["replay_window_update"] + 0.03
    assert sim.state() == before


def test_timing_a_block_and_a_clean_state(sim):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as buf:
        with bench.Timer(s) as t:
            l2ctl.kernels.write_index(buf, s)
        assert t.elapsed_ms > 0
        with pytest.raises(RuntimeError, match="still running"):
            bench.Timer(s).elapsed_ms
        l2ctl.set_window(s, l2ctl.AccessPolicyWindow.for_buffer(buf, 0.5))
        with bench.clean_state(s, set_aside=3_276_800) as granted:
            assert granted == 3_276_800 and l2ctl.get_window(s).empty
        assert l2ctl.get_window(s).hit_ratio == 0.5  # the stream's own window is back
        l2ctl.clear_window(s)
        timing = bench.time_gpu(lambda st: l2ctl.kernels.write_index(buf, st), s, warmup=1, repeat=3)
        assert len(timing.times_ms) == 3 and timing.median_ms > 0 and timing.spread >= 0


def test_bench_reset_data_refuses_a_repeated_size_or_column_and_says_nothing_without_a_verdict(sim):
    before = sim.state()
    with pytest.raises(ValueError, match="LUT sizes: each at most once"):
        bench.bench_reset_data([4 * MiB, MiB, 4 * MiB], out_bytes=32 * MiB, progress=False)
    with pytest.raises(ValueError, match="columns: each at most once"):
        bench.bench_reset_data([MiB], out_bytes=32 * MiB, columns=["hints", "hints"], progress=False)
    assert sim.state() == before and not sim.kernel_log  # refused before any work
    report = bench.bench_reset_data([MiB], out_bytes=32 * MiB, columns=["baseline"], repeat=1, warmup=0,
                                    progress=False)
    assert "verdict" not in report.summary  # the baseline alone: nothing to compare it with


@pytest.mark.parametrize("size", [6, 65538])
def test_bench_collectives_refuses_a_size_it_would_round_before_starting(sim, monkeypatch, size):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # refused before torch is needed
    with pytest.raises(ValueError, match=f"{size} B is not a multiple of the 4-byte float32 element"):
        bench.bench_collectives([64 << 10, size])


@pytest.mark.parametrize("device", [FakeDevice.h100, FakeDevice.h200], ids=lambda d: d.__name__)
def test_each_collectives_label_names_the_share_of_the_max_it_is(device):
    """bench collectives' set-asides: a quarter of the max rounds to whole granules, on an H100 and an H200 the
    default limit (30%), and the label says 30%, not 25%."""
    from l2ctl.bench.collectives import collective_set_asides

    with FakeBackend.installed(device()):
        top = l2ctl.device_info().persisting_l2_cache_max_size
        grid = collective_set_asides()
        assert grid[l2ctl.auto_set_aside_cap()] == "default, 30% of max" and grid[top] == "100% of max"
        for nbytes, label in grid.items():
            if nbytes:
                assert label.endswith(f"{nbytes / top:.0%} of max"), (nbytes, label)
