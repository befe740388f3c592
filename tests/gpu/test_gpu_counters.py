"""On the GPU: in-process counters, checked against l2ctl's models and against Nsight Compute."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

import l2ctl
from l2ctl import bench, kernels

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def _counters_or_skip():
    try:
        with l2ctl.counters(metrics=["gpu__time_duration.sum"]):
            pass
    except l2ctl.CountersUnavailableError as exc:
        pytest.skip(str(exc))


def test_window_cuts_dram_reads(gpu_state):
    _counters_or_skip()
    info = l2ctl.device_info()
    lut_bytes = max(MiB, int(0.64 * info.l2_cache_size) // MiB * MiB)  # 32 MiB on an H100: past the L2 beside 1 GiB
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(lut_bytes) as lut, l2ctl.DeviceBuffer(1 << 30) as out:
        gpu_state.watch(s)
        lut.fill_bytes(3, s)
        reads = {}
        fit = min(1.0, info.persisting_l2_cache_max_size / lut.nbytes)
        for name, size, ratio in (("none", 0, None), ("window", info.persisting_l2_cache_max_size, fit)):
            with bench.clean_state(s, set_aside=size):
                window = l2ctl.persist(s, lut, ratio, set_aside=None) if ratio is not None else contextlib.nullcontext()
                with window, l2ctl.counters() as c:
                    kernels.reset_data(out, lut, s, variant="streaming")  # warm, inside: the start disturbs L2
                    kernels.reset_data(out, lut, s)
            assert len(c.results) == 2 and all("reset_data" in k.name for k in c.results)
            k = c.results[-1]
            assert 0 <= k["lts__t_sector_hit_rate.pct"] <= 100.5  # CUPTI rounding can pass 100 slightly
            assert k["dram__bytes_write.sum"] == pytest.approx(out.nbytes, rel=0.05)
            assert k.units["dram__bytes_read.sum"] == "byte" and c.passes >= 1
            reads[name] = k["dram__bytes_read.sum"]
        assert reads["window"] < reads["none"]


def test_stride_sectors_per_request_match_the_model(gpu_state):
    _counters_or_skip()
    threads = 1 << 22
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(threads * 32) as buf, l2ctl.DeviceBuffer(8 * (threads // 256)) as p:
        kernels.write_index(buf, s)
        for stride in (4, 8, 16, 32):
            with l2ctl.counters(metrics=l2ctl.SECTOR_METRICS) as c:
                kernels.stride_read(buf, stride, p, s, threads=threads)
            assert c.results[0].sectors_per_request == kernels.sectors_per_request(stride)


def test_collect_repeats_the_work_per_pass(gpu_state):
    _counters_or_skip()
    threads = 1 << 20
    calls = {"setup": 0, "run": 0}
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(threads * 16) as buf, l2ctl.DeviceBuffer(8 * (threads // 256)) as p:
        def setup():
            calls["setup"] += 1
            kernels.write_index(buf, s)  # not profiled: launched before the pass starts

        def run():
            calls["run"] += 1
            kernels.stride_read(buf, 16, p, s, threads=threads)

        results, passes = l2ctl.collect(run, setup=setup, metrics=list(l2ctl.SECTOR_METRICS) +
                                        ["dram__bytes_read.sum"])
    assert passes >= 1 and calls == {"setup": passes, "run": passes}
    assert len(results) == 1 and "stride_read" in results[0].name
    assert results[0].sectors_per_request == 16


def test_collect_keeps_the_state_setup_made(gpu_state):
    """Starting a CUPTI pass demotes persisting lines and dirties L2 (measured on the H100); with the setup
    inside the pass (collect's default) a persisted 2 MiB LUT costs almost no DRAM reads and a read-only
    kernel writes almost nothing. (2 MiB in a set-aside of at least 4 MiB: a 4 MiB LUT in 6.25 MiB was
    re-read 5 times at some physical placements on the H100, with or without counters.)"""
    _counters_or_skip()
    info = l2ctl.device_info()
    metrics = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
    size = -(-4 * MiB // l2ctl.set_aside_granularity()) * l2ctl.set_aside_granularity()
    if size > info.persisting_l2_cache_max_size:
        pytest.skip("the set-aside cannot be 4 MiB on this GPU")
    seen = {}
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(2 * MiB) as lut, l2ctl.DeviceBuffer(256 * MiB) as out:
        gpu_state.watch(s)
        lut.fill_bytes(5, s)
        with bench.clean_state(s, set_aside=size), l2ctl.persist(s, lut, 1.0, set_aside=None):
            def setup():
                kernels.reset_data(out, lut, s, variant="streaming")  # brings the LUT in as persisting lines
                bench.flush_l2(s, persisting=False)  # evicts the rest, leaves nothing dirty
                s.synchronize()

            for inside in (True, False):
                results, _ = l2ctl.collect(lambda: kernels.reset_data(out, lut, s), setup=setup, metrics=metrics,
                                           setup_in_pass=inside)
                assert len(results) == 1 and "reset_data" in results[0].name
                seen[inside] = results[0].values
        threads = 1 << 22  # a read-only kernel (its partials aside): its DRAM writes are someone else's
        with l2ctl.DeviceBuffer(threads * 4) as buf, l2ctl.DeviceBuffer(8 * (threads // 256)) as partials:
            kernels.write_index(buf, s)
            writes = {}
            for inside in (True, False):
                results, _ = l2ctl.collect(lambda: kernels.stride_read(buf, 4, partials, s, threads=threads),
                                           setup=lambda: bench.flush_l2(s, persisting=False), metrics=metrics,
                                           setup_in_pass=inside)
                writes[inside] = results[0]["dram__bytes_write.sum"]
    # Before the fix (setup before the pass start) these were 4.4 MB and 12.5 MB on the H100; printed for the log.
    print("LUT reads in pass / before start:", seen[True]["dram__bytes_read.sum"], seen[False]["dram__bytes_read.sum"])
    print("read-only kernel's writes in pass / before start:", writes[True], writes[False])
    assert seen[True]["dram__bytes_read.sum"] < 0.25 * MiB
    assert writes[True] < 1 * MiB


@pytest.mark.slow
def test_agrees_with_nsight_compute(tmp_path):
    _counters_or_skip()
    if not (shutil.which("ncu") or os.path.exists("/usr/local/cuda/bin/ncu")):
        pytest.skip("Nsight Compute (ncu) is not installed")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compare_ncu.py")
    out_json = os.environ.get("L2CTL_NCU_JSON", str(tmp_path / "ncu.json"))
    r = subprocess.run([sys.executable, script, "--json", out_json], capture_output=True, text=True, timeout=900)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]  # the counts agree (see compare_ncu.py)
    with open(out_json) as f:
        record = json.load(f)
    # Durations are reported, not judged by the verdict: in-process the short (34-47 us) stride_read
    # launches ran 1.5-5.0% longer than under ncu on the H100, at every placement, in every run; more than
    # 10% would be a new offset like the profiler-start one (+9 us, 20-25% on these launches).
    assert abs(record["durations"]["largest"]) < 0.10, record["durations"]
