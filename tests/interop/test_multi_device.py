"""Two devices: per-device limits and registries, buffers and streams on different devices, ``device=``
everywhere, graphs captured on device 1, tuning on device 1. Each test runs on a simulated pair of H200s
(always) and on two real GPUs (where the machine has them; skipped with the reason otherwise)."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import l2ctl
from l2ctl import _backend, _core, graph, kernels
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


def _real_pair_reason() -> str | None:
    if _core.device_count() < 2:
        return f"needs two CUDA GPUs; this machine has {_core.device_count()}"
    for d in (0, 1):
        info = l2ctl.device_info(d)
        if not info.supports_persistence:
            return f"device {d} ({info.name}): {info.unsupported_reason}"
    return None


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.gpu)])
def pair(request):
    """Two devices; yields the backend in use (a FakeBackend or the extension). Both limits must end as
    they started."""
    if request.param == "simulated":
        with FakeBackend.installed(FakeDevice.h200(), FakeDevice.h200()) as fake:
            yield fake
            assert [d.limit for d in fake.devices] == [d.initial_limit for d in fake.devices]
            assert not fake.windows
        return
    reason = _real_pair_reason()
    if reason:
        pytest.skip(reason)
    assert _backend.current() is _core
    before = [l2ctl.get_set_aside(d) for d in (0, 1)]
    yield _core
    assert [l2ctl.get_set_aside(d) for d in (0, 1)] == before, "a test left a limit changed"


def _limits() -> list[int]:
    return [l2ctl.get_set_aside(d) for d in (0, 1)]


def test_device_everywhere(pair):
    infos = [l2ctl.device_info(d) for d in (0, 1)]
    assert [i.index for i in infos] == [0, 1]
    for d in (0, 1):
        assert l2ctl.set_aside_granularity(d) >= 1
        assert 0 < l2ctl.auto_set_aside_cap(d) <= infos[d].persisting_l2_cache_max_size
        assert l2ctl.budget(d).device == d and l2ctl.budget(d).scopes == ()
    with l2ctl.Stream(device=1) as s, l2ctl.DeviceBuffer(MiB, device=1) as buf:
        assert l2ctl.DeviceBuffer(MiB, device=np.int64(1)).device == 1
        assert buf.device == 1 and l2ctl.get_window(s).empty
    with pytest.raises(ValueError, match="does not exist"):
        l2ctl.device_info(2)


def test_limits_are_per_device(pair):
    before = _limits()
    g1 = l2ctl.set_aside_granularity(1)
    with l2ctl.set_aside(2 * g1, device=1) as granted:
        assert l2ctl.get_set_aside(1) == granted == 2 * g1 and l2ctl.get_set_aside(0) == before[0]
        with l2ctl.set_aside(0, device=0):
            assert _limits() == [0, 2 * g1]
        assert _limits() == [before[0], 2 * g1]
    assert _limits() == before


def test_persist_on_device_1_touches_only_device_1(pair):
    before = _limits()
    g1 = l2ctl.set_aside_granularity(1)
    with l2ctl.Stream(device=1) as s1, l2ctl.DeviceBuffer(MiB, device=1) as lut, \
            l2ctl.Stream(device=0) as s0, l2ctl.DeviceBuffer(MiB, device=0) as lut0:
        with l2ctl.set_aside(0, device=1):
            with l2ctl.persist(s1, lut, 1.0) as p:  # "auto" on device 1
                assert p.device == 1 and l2ctl.get_set_aside(1) == g1 and l2ctl.get_set_aside(0) == before[0]
                assert l2ctl.get_window(s1).base_ptr == lut.ptr and l2ctl.get_window(s0).empty
                with l2ctl.persist(s0, lut0, 0.5, set_aside=None):  # a scope on each device at once
                    assert l2ctl.budget(0).scopes and l2ctl.budget(1).scopes
                assert l2ctl.budget(0).scopes == ()
            assert l2ctl.get_window(s1).empty and l2ctl.get_set_aside(1) == 0
    assert _limits() == before


def test_buffer_and_stream_on_different_devices_are_refused(pair):
    before = _limits()
    with l2ctl.Stream(device=1) as s1, l2ctl.DeviceBuffer(MiB, device=0) as buf0:
        with pytest.raises(ValueError, match="device 0.*device 1|device 1.*device 0"):
            with l2ctl.persist(s1, buf0, 1.0):
                pass
        with pytest.raises(ValueError):
            kernels.reset_data(l2ctl.DeviceBuffer(MiB, device=1), buf0, s1)
        assert l2ctl.get_window(s1).empty and _limits() == before


def test_kernels_run_on_device_1_while_device_0_is_current(pair):
    lut_host = np.arange(1, 1 + (1 << 16), dtype=np.int32)
    with l2ctl.Stream(device=1) as s1, l2ctl.DeviceBuffer.from_numpy(lut_host, device=1, stream=s1) as lut, \
            l2ctl.DeviceBuffer(16 * MiB, device=1) as out:
        with l2ctl.persist(s1, lut, 1.0):
            kernels.reset_data(out, lut, s1)
        assert kernels.verify_reset_data(out, lut, s1) == 0
        assert np.array_equal(out.to_numpy(s1).view(np.int32)[: lut_host.size], lut_host)


def test_graph_captured_on_device_1(pair):
    before = _limits()
    lut_host = np.arange(7, 7 + (1 << 16), dtype=np.int32)
    with l2ctl.Stream(device=1) as s1, l2ctl.DeviceBuffer.from_numpy(lut_host, device=1, stream=s1) as lut, \
            l2ctl.DeviceBuffer(8 * MiB, device=1) as out:
        with graph.capture(s1) as g:
            kernels.reset_data(out, lut, s1)
        with g:
            with l2ctl.persist(g, lut, 1.0) as p:
                assert p.device == 1 and all(k.window.base_ptr == lut.ptr for k in g.kernel_nodes())
                out.fill_bytes(0xFF, s1)
                g.launch(s1)
                assert kernels.verify_reset_data(out, lut, s1) == 0
            assert all(k.window.empty for k in g.kernel_nodes())
    assert _limits() == before


@pytest.mark.filterwarnings("ignore::l2ctl.L2BudgetWarning")
def test_threads_on_both_devices(pair, run_threads):
    before = _limits()
    barrier = threading.Barrier(4)

    def worker(device: int) -> None:
        with l2ctl.Stream(device=device) as s, l2ctl.DeviceBuffer(2 * MiB, device=device) as lut, \
                l2ctl.DeviceBuffer(8 * MiB, device=device) as out:
            lut.fill_bytes(1, s)
            barrier.wait()
            for _ in range(10):
                with l2ctl.persist(s, lut, 0.5):
                    kernels.reset_data(out, lut, s)
                assert kernels.verify_reset_data(out, lut, s) == 0

    run_threads(worker, [(d,) for d in (0, 1, 0, 1)], timeout=120)
    assert _limits() == before and l2ctl.budget(0).scopes == () and l2ctl.budget(1).scopes == ()


def test_tuning_on_device_1(pair):
    from l2ctl.workloads import ResetDataWorkload

    before = _limits()
    with l2ctl.Stream(device=1) as s, ResetDataWorkload(2 * MiB, 64 * MiB, device=1) as w:
        tuned = l2ctl.tune(w, s, w.buf, rounds=3, repeat=2)
        assert tuned.environment["device"]["index"] == 1
        with tuned.persist(s) as p:
            assert not p.active or p.device == 1
    assert _limits() == before


@pytest.mark.gpu
def test_torch_on_the_second_gpu():
    if _real_pair_reason():
        pytest.skip(_real_pair_reason())
    torch = pytest.importorskip("torch")
    before = _limits()
    with torch.cuda.device(1):
        s = torch.cuda.Stream()
        t = torch.arange(1 << 20, dtype=torch.int32, device="cuda:1")
    with l2ctl.persist(s, t, 1.0) as p:
        assert p.device == 1 and l2ctl.get_window(s).base_ptr == t.data_ptr()
    with pytest.raises(ValueError):
        l2ctl.persist(s, torch.zeros(16, device="cuda:0"), 1.0).__enter__()
    assert _limits() == before


@pytest.mark.gpu
def test_cli_sees_both_gpus():
    if _real_pair_reason():
        pytest.skip(_real_pair_reason())
    r = subprocess.run([sys.executable, "-m", "l2ctl", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "device 0:" in r.stdout and "device 1:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "l2ctl", "bench", "reset-data", "--device", "1", "--lut-sizes", "1M",
                        "--out-bytes", "64M", "--columns", "baseline,right_sized", "--repeat", "3", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_events_belong_to_their_device():
    """An event made on one device cannot be recorded on another's stream (CUDA: invalid resource handle);
    the simulator refuses it as CUDA does, and l2ctl's timers make their events on the stream's device."""
    with FakeBackend.installed(FakeDevice.h200(), FakeDevice.h200()) as fake, l2ctl.Stream(device=1) as s1:
        with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidResourceHandle"):
            fake.Event().record(s1.handle)  # made on the current device, 0
        fake.Event(1).record(s1.handle)
        with l2ctl.Timer(s1) as t:
            fake.launch_fake_kernel(s1.handle)
        assert t.elapsed_ms >= 0
        from l2ctl import bench

        assert bench.time_gpu(lambda st: fake.launch_fake_kernel(s1.handle), s1, warmup=0, repeat=2).median_ms >= 0
