"""On the GPU: every setting read back through CUDA's getters, restoration, kernels' correctness, interop."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, AccessProperty, kernels

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def info():
    return l2ctl.device_info()


def test_device_info_is_consistent(info):
    assert info.l2_cache_size > 0
    assert 0 < info.persisting_l2_cache_max_size <= info.l2_cache_size
    assert info.access_policy_max_window_size > 0
    assert 0 <= info.persisting_l2_cache_size <= info.persisting_l2_cache_max_size
    assert info.compute_capability >= (8, 0)
    assert info.supports_persistence and info.unsupported_reason is None


def test_granularity_probe_leaves_limit(gpu_state, info):
    before = l2ctl.get_set_aside()
    g = l2ctl.set_aside_granularity()
    assert l2ctl.get_set_aside() == before
    assert 1 <= g <= info.persisting_l2_cache_max_size
    assert l2ctl.device_info().set_aside_granularity == g


def test_set_aside_reads_back_and_restores(gpu_state, info):
    before = l2ctl.get_set_aside()
    g = l2ctl.set_aside_granularity()
    with l2ctl.set_aside("max") as granted:
        assert granted == info.persisting_l2_cache_max_size == l2ctl.get_set_aside()
        assert granted.previous == before
    assert l2ctl.get_set_aside() == before
    odd = 3 * MiB + 12345
    with l2ctl.set_aside(odd) as granted:
        assert granted == l2ctl.get_set_aside()
        assert granted % g == 0 and abs(odd - granted) < g
        assert (granted >= odd) == (l2ctl.set_aside_rounding() == "up")
    with l2ctl.set_aside(0.5) as granted:
        assert granted == l2ctl.get_set_aside() <= info.persisting_l2_cache_max_size // 2
    assert l2ctl.get_set_aside() == before


def test_set_aside_restores_when_body_raises(gpu_state):
    before = l2ctl.get_set_aside()
    with pytest.raises(KeyError):
        with l2ctl.set_aside("max"):
            raise KeyError("boom")
    assert l2ctl.get_set_aside() == before


def test_set_aside_over_max_is_refused_without_change(gpu_state, info):
    before = l2ctl.get_set_aside()
    with pytest.raises(ValueError, match="persistingL2CacheMaxSize"):
        l2ctl.set_aside(info.persisting_l2_cache_max_size + 1)
    assert l2ctl.get_set_aside() == before


def test_window_round_trip_and_clear(stream):
    with l2ctl.DeviceBuffer(4 * MiB) as buf:
        w = AccessPolicyWindow(buf.ptr, buf.nbytes, 0.6, AccessProperty.PERSISTING, AccessProperty.STREAMING)
        l2ctl.set_window(stream, w)
        got = l2ctl.get_window(stream)
        assert got.base_ptr == buf.ptr and got.num_bytes == buf.nbytes
        assert got.hit_ratio == pytest.approx(0.6, abs=1e-7)
        assert got.hit_prop == AccessProperty.PERSISTING and got.miss_prop == AccessProperty.STREAMING
        l2ctl.clear_window(stream)
        assert l2ctl.get_window(stream).empty


def test_cuda_rejects_what_l2ctl_refuses_first(stream):
    """The raw call (CUDA's own, through cuda.bindings) really fails for a float32 hit ratio above 1, which is why
    l2ctl normalises it."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    ids = rt.cudaStreamAttrID  # cuda-python 13 names the stream attribute by the launch attribute's name
    attribute = getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None) or ids.cudaStreamAttributeAccessPolicyWindow
    value = (getattr(rt, "cudaStreamAttrValue", None) or rt.cudaLaunchAttributeValue)()

    with l2ctl.DeviceBuffer(MiB) as buf:
        value.accessPolicyWindow.base_ptr = buf.ptr
        value.accessPolicyWindow.num_bytes = buf.nbytes
        value.accessPolicyWindow.hitRatio = 1.0000001
        value.accessPolicyWindow.hitProp = rt.cudaAccessProperty.cudaAccessPropertyPersisting
        value.accessPolicyWindow.missProp = rt.cudaAccessProperty.cudaAccessPropertyStreaming
        (err,) = rt.cudaStreamSetAttribute(rt.cudaStream_t(stream.handle), attribute, value)
        rt.cudaGetLastError()
        assert err == rt.cudaError_t.cudaErrorInvalidValue
        w = AccessPolicyWindow.for_buffer(buf, hit_ratio=np.float32(0.1) * 10 + np.float32(1e-7))
        assert w.hit_ratio == 1.0
        l2ctl.set_window(stream, w)
        l2ctl.clear_window(stream)


def test_persist_applies_and_restores(stream, info):
    before = l2ctl.get_set_aside()
    g = l2ctl.set_aside_granularity()
    cap = l2ctl.auto_set_aside_cap()
    size = max(MiB, (cap // 2) // MiB * MiB)  # 0.75 of it fits under the cap: "auto" grants it silently
    with l2ctl.DeviceBuffer(size) as lut:
        with l2ctl.persist(stream, lut, hit_ratio=0.75) as p:
            w = l2ctl.get_window(stream)
            assert w == p.window and w.base_ptr == lut.ptr and w.num_bytes == lut.nbytes
            assert w.hit_ratio == pytest.approx(0.75)
            limit = l2ctl.get_set_aside()
            assert limit == p.set_aside >= 0.75 * lut.nbytes
            assert limit == max(before, -(-int(0.75 * lut.nbytes) // g) * g)
        assert l2ctl.get_window(stream).empty
        assert l2ctl.get_set_aside() == before


def test_auto_stops_at_the_cap_and_says_so(stream, info):
    before = l2ctl.get_set_aside()
    cap = l2ctl.auto_set_aside_cap()
    assert cap <= info.persisting_l2_cache_max_size
    with l2ctl.DeviceBuffer(2 * cap) as lut:
        with pytest.warns(l2ctl.SetAsideTaxWarning, match="default"):
            with l2ctl.persist(stream, lut) as p:
                assert p.set_aside == max(before, cap) == l2ctl.get_set_aside()
                assert (p.window.num_bytes, p.window.hit_ratio) == (p.set_aside // 256 * 256, 1.0)
                assert l2ctl.get_window(stream) == p.window
        assert l2ctl.get_set_aside() == before


def test_persist_default_hit_ratio_uses_granted(stream, info):
    big = info.persisting_l2_cache_max_size * 2
    with l2ctl.DeviceBuffer(big) as buf:
        with l2ctl.persist(stream, buf, set_aside="max") as p:
            assert p.set_aside == info.persisting_l2_cache_max_size
            assert (p.window.num_bytes, p.window.hit_ratio) == (p.set_aside // 256 * 256, 1.0)


def test_persist_restores_after_exception_and_nesting(stream):
    before = l2ctl.get_set_aside()
    with l2ctl.DeviceBuffer(8 * MiB) as a, l2ctl.DeviceBuffer(2 * MiB) as b:
        with pytest.raises(RuntimeError):
            with l2ctl.persist(stream, a, 1.0):
                raise RuntimeError("body failed")
        assert l2ctl.get_window(stream).empty and l2ctl.get_set_aside() == before
        with l2ctl.persist(stream, a, 0.5) as outer:
            with l2ctl.persist(stream, b, 1.0):
                assert l2ctl.get_window(stream).base_ptr == b.ptr
            assert l2ctl.get_window(stream) == outer.window
        assert l2ctl.get_window(stream).empty and l2ctl.get_set_aside() == before


def test_window_over_max_is_clipped(stream, info):
    with l2ctl.DeviceBuffer(info.access_policy_max_window_size + MiB) as buf:
        with pytest.warns(l2ctl.WindowClippedWarning):
            with l2ctl.persist(stream, buf, 0.05) as p:  # 0.05 x 128 MiB stays under the auto cap
                assert p.clipped and l2ctl.get_window(stream).num_bytes == info.access_policy_max_window_size


def test_host_memory_is_refused(stream):
    host = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(ValueError, match="host memory"):
        l2ctl.persist(stream, host)
    with pytest.raises(ValueError, match="host memory"):
        with l2ctl.persist(stream, (host.ctypes.data, host.nbytes)):
            pass
    assert l2ctl.get_window(stream).empty


def test_device_buffer_round_trip(stream):
    data = np.random.default_rng(1).integers(-(2**31), 2**31 - 1, size=(37, 11), dtype=np.int32)
    with l2ctl.DeviceBuffer.from_numpy(data, stream=stream) as buf:
        assert buf.shape == data.shape and buf.dtype == data.dtype
        np.testing.assert_array_equal(buf.to_numpy(stream), data)
    assert buf.freed
    with pytest.raises(ValueError, match="freed"):
        buf.ptr


def _expected(lut: np.ndarray, n: int) -> np.ndarray:
    return np.resize(lut, n)


@pytest.mark.parametrize("variant", list(kernels.ResetVariant))
@pytest.mark.parametrize("out_len,lut_len", [(1, 1), (7, 3), (4096, 4), (10_001, 997), (1 << 20, 1000), (65_539, 1 << 14)])
def test_reset_data_matches_numpy(stream, variant, out_len, lut_len):
    rng = np.random.default_rng(out_len * 31 + lut_len)
    lut = rng.integers(0, 2**31 - 1, size=lut_len, dtype=np.int32)
    with l2ctl.DeviceBuffer(4 * out_len, dtype=np.int32) as out, l2ctl.DeviceBuffer.from_numpy(lut) as d_lut:
        out.fill_bytes(0xFF, stream)
        kernels.reset_data(out, d_lut, stream, variant=variant)
        np.testing.assert_array_equal(out.to_numpy(stream), _expected(lut, out_len))
        assert kernels.verify_reset_data(out, d_lut, stream) == 0


def test_reset_data_unaligned_output_and_verifier_catches_errors(stream):
    lut = np.arange(5, 105, dtype=np.int32)
    with l2ctl.DeviceBuffer(4 * 10_000) as raw, l2ctl.DeviceBuffer.from_numpy(lut) as d_lut:
        raw.fill_bytes(0xFF, stream)  # the 4 bytes at each end are read back but never written by the kernel
        out = (raw.ptr + 4, raw.nbytes - 8)  # not 16-byte aligned: the scalar path
        shape = kernels.reset_data(out, d_lut, stream, variant="hinted")
        assert not shape.vector_out
        host = raw.to_numpy(stream).view(np.int32)[1:-1]
        np.testing.assert_array_equal(host, _expected(lut, host.size))
        assert kernels.verify_reset_data(out, d_lut, stream) == 0
        raw.copy_from(np.full(raw.nbytes // 4, 7, dtype=np.int32))
        assert kernels.verify_reset_data(out, d_lut, stream) == host.size - np.count_nonzero(_expected(lut, host.size) == 7)


def test_ceiling_kernels_and_checksums(stream):
    n = (3 << 20) + 3
    with l2ctl.DeviceBuffer(4 * n + 12) as a, l2ctl.DeviceBuffer(4 * n + 12) as b:
        a.fill_bytes(0, stream)  # the 12 bytes past the n words are copied back too
        a_ = (a.ptr, 4 * n)
        kernels.write_index(a_, stream)
        np.testing.assert_array_equal(a.to_numpy(stream).view(np.uint32)[:n], np.arange(n, dtype=np.uint32))
        assert kernels.count_index_mismatches(a_, stream) == 0
        kernels.copy_words((b.ptr, 4 * n), a_, stream)
        assert kernels.count_mismatches(a_, (b.ptr, 4 * n), stream) == 0
        with l2ctl.DeviceBuffer(8 * kernels.max_read_partials(a.device)) as partials:
            blocks = kernels.read_sum(a_, partials, stream)
            assert kernels.sum_u64(partials, blocks, stream) == n * (n - 1) // 2


@pytest.mark.parametrize("stride", [4, 8, 16, 32, 64, 128])
def test_stride_read_checksum(stream, stride):
    threads = 100_003
    with l2ctl.DeviceBuffer(threads * 128) as buf, l2ctl.DeviceBuffer(8 * 1024) as partials:
        kernels.write_index(buf, stream)
        blocks = kernels.stride_read(buf, stride, partials, stream, threads=threads)
        sw = stride // 4
        assert kernels.sum_u64(partials, blocks, stream) == sw * threads * (threads - 1) // 2


def test_cache_streaming_kernels_match_reference(stream):
    rng = np.random.default_rng(3)
    n = 100_001
    values = rng.random(n, dtype=np.float32)
    idx = rng.integers(0, 1 << 20, size=n, dtype=np.int32)
    dense = rng.random(1024, dtype=np.float32)
    data = rng.random(8 * n, dtype=np.float32)
    cats = rng.integers(0, 1000, size=8 * n, dtype=np.int32)
    weights = rng.random(32, dtype=np.float32)
    ref_s = values * dense[idx % 1024].astype(np.float64) + np.sin(values.astype(np.float64) * 0.1)
    x = data.astype(np.float64).reshape(n, 8)
    ref_a = (x * weights[cats.reshape(n, 8) % 32] + np.cos(x * 0.01)).sum(axis=1)
    bufs = [l2ctl.DeviceBuffer.from_numpy(a) for a in (values, idx, dense, data, cats, weights)]
    outs = [l2ctl.DeviceBuffer(4 * n, dtype=np.float32) for _ in range(4)]
    try:
        for i, cs in enumerate((False, True)):
            kernels.sparse_vector(bufs[0], bufs[1], bufs[2], outs[i], stream, streaming=cs)
            kernels.stream_analysis(bufs[3], bufs[4], bufs[5], outs[2 + i], stream, streaming=cs)
        got = [o.to_numpy(stream) for o in outs]
        np.testing.assert_allclose(got[0], ref_s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], ref_a, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[0], got[1])
        np.testing.assert_array_equal(got[2], got[3])
    finally:
        for b in bufs + outs:
            b.free()


def test_timer_measures_gpu_work(stream):
    with l2ctl.DeviceBuffer(256 * MiB) as buf:
        with l2ctl.Timer(stream) as t:
            kernels.write_index(buf, stream)
        assert 0.0 < t.elapsed_ms < 1000.0


@pytest.mark.filterwarnings("ignore::l2ctl.L2BudgetWarning")
def test_threads_with_separate_streams(gpu_state, run_threads):
    before = l2ctl.get_set_aside()
    lut_host = np.arange(1, 1 + (1 << 18), dtype=np.int32)
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        with l2ctl.Stream() as s, l2ctl.DeviceBuffer.from_numpy(lut_host) as lut, \
                l2ctl.DeviceBuffer(4 * (1 << 22) + 4 * i) as out:
            barrier.wait()
            with l2ctl.persist(s, lut, 0.5):
                for _ in range(5):
                    kernels.reset_data(out, lut, s)
                assert kernels.verify_reset_data(out, lut, s) == 0
            assert l2ctl.get_window(s).empty

    run_threads(worker, [(i,) for i in range(8)])
    assert l2ctl.get_set_aside() == before
    assert l2ctl.budget().scopes == ()


def test_small_benchmarks_verify_and_restore(gpu_state):
    from l2ctl import bench

    before = l2ctl.get_set_aside()
    r = bench.bench_reset_data([MiB, 3 * MiB + 16], out_bytes=64 * MiB, repeat=3, warmup=1, progress=False)
    assert len(r.records) == 2 * len(bench.RESET_COLUMNS)
    assert all(rec.verified and rec.metrics["mismatches"] == 0 for rec in r.records)
    assert "verdict" in r.summary
    s = bench.bench_stride([4, 32], threads=1 << 16, repeat=3, warmup=1, progress=False)
    assert [rec.metrics["sectors_per_request_model"] for rec in s.records] == [4, 32]
    c = bench.bench_cache_streaming(50_000, repeat=3, warmup=1, progress=False)
    assert len(c.records) == 4
    assert l2ctl.get_set_aside() == before


def test_torch_interop(gpu_state):
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    gpu_state.watch(s)
    lut = torch.arange(1, 1025, dtype=torch.int32, device="cuda")
    out = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
    with l2ctl.persist(s, lut, 1.0) as p:
        assert l2ctl.get_window(s).base_ptr == lut.data_ptr() == p.window.base_ptr
        kernels.reset_data(out, lut, s)
    s.synchronize()
    assert torch.equal(out, lut.repeat(1024))
    with pytest.raises(ValueError, match="not contiguous"):
        l2ctl.persist(s, out.view(1024, 1024).t(), 1.0)
    with pytest.raises(ValueError, match="host memory"):
        l2ctl.persist(s, torch.zeros(4))


def test_cupy_interop(gpu_state):
    cupy = pytest.importorskip("cupy")
    s = cupy.cuda.Stream(non_blocking=True)
    gpu_state.watch(s)
    lut = cupy.arange(3, 3 + 999, dtype=cupy.int32)
    out = cupy.empty(12345, dtype=cupy.int32)
    with l2ctl.persist(s, lut, 0.5):
        assert l2ctl.get_window(s).num_bytes == lut.nbytes
        kernels.reset_data(out, lut, s)
    s.synchronize()
    assert bool((out == cupy.resize(lut, out.size)).all())


def test_long_calls_release_the_gil(stream):
    """While one thread waits in Stream.synchronize, Python code in another thread keeps running."""
    with l2ctl.DeviceBuffer(1 << 30) as buf:
        for _ in range(40):  # ~15 ms of queued GPU work
            kernels.write_index(buf, stream)
        ticks = 0
        done = threading.Event()

        def spin():
            nonlocal ticks
            while not done.is_set():
                ticks += 1

        t = threading.Thread(target=spin)
        t.start()
        stream.synchronize()  # holds no GIL while it waits
        done.set()
        t.join()
        assert ticks > 1000
