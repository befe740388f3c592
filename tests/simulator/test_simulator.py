"""The simulator (l2ctl.testing): kernels against NumPy, lazy memory, errors, state, graphs, events, the
profiler, the timing model's shape on the H100 and H200 presets, its documented example and presets."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, kernels
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20
GiB = 1 << 30
PERSIST = (2, 1)  # hitProp PERSISTING, missProp STREAMING


@pytest.fixture
def sim():
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        yield fake


def _keep(fake: FakeBackend, obj):
    """Keep a simulator object alive for the test (streams and memory are destroyed when collected)."""
    fake._kept = getattr(fake, "_kept", []) + [obj]  # type: ignore[attr-defined]
    return obj


def _stream(fake: FakeBackend) -> int:
    return _keep(fake, fake.Stream(0)).handle


def _buffer(fake: FakeBackend, data: np.ndarray, stream: int = 0) -> int:
    mem = _keep(fake, fake.DeviceMemory(0, data.nbytes))
    fake.copy_host_to_device(mem.ptr, data, stream)
    return mem.ptr


def _read(fake: FakeBackend, ptr: int, count: int, dtype=np.uint32) -> np.ndarray:
    out = np.empty(count, dtype=dtype)
    fake.copy_device_to_host(out, ptr, 0)
    return out


def _poisoned(fake: FakeBackend, nbytes: int) -> int:
    mem = _keep(fake, fake.DeviceMemory(0, nbytes))
    fake.memset_device(mem.ptr, 0xFF, nbytes, 0)
    return mem.ptr


# ---- kernels against NumPy -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", range(7))
@pytest.mark.parametrize("out_len,lut_len,out_offset", [(1000, 7, 0), (4099, 64, 4), (3, 5, 0), (0, 1, 0)])
def test_reset_data_matches_numpy(variant, out_len, lut_len, out_offset):
    fake = FakeBackend()
    rng = np.random.default_rng(variant)
    lut = rng.integers(0, 2**31 - 1, size=lut_len, dtype=np.int32)
    lut_ptr = _buffer(fake, lut)
    out = _poisoned(fake, 4 * out_len + 32)
    shape = fake.reset_data(0, 0, out + out_offset, out_len, lut_ptr, lut_len, variant)
    got = _read(fake, out, out_len + 8, np.int32)
    expected = np.full(out_len + 8, -1, dtype=np.int32)
    expected[out_offset // 4:out_offset // 4 + out_len] = np.resize(lut, out_len) if out_len else []
    np.testing.assert_array_equal(got, expected)
    blocks, threads, vector_out, vector_lut = shape
    if variant == 5:
        assert (blocks, threads, vector_out, vector_lut) == (32, 1024, False, False)
    else:
        assert threads == 256 and vector_out == (variant != 6 and out_offset % 16 == 0)
        assert vector_lut == (vector_out and lut_len % 4 == 0)
        work = out_len // 4 + 1 if vector_out else out_len
        assert blocks == max(1, min(132 * 8, -(-work // 256)))
    mismatches = fake.reset_data_verify(0, 0, out + out_offset, out_len, lut_ptr, lut_len)
    assert mismatches == 0
    if out_len > 2:
        fake.copy_host_to_device(out + out_offset + 4, np.array([lut[1] ^ 1, lut[2 % lut_len] ^ 2], np.int32), 0)
        assert fake.reset_data_verify(0, 0, out + out_offset, out_len, lut_ptr, lut_len) == 2


def test_reset_data_argument_checks_and_shape(sim):
    with pytest.raises(ValueError, match="lut length"):
        sim.reset_data(0, 0, 0, 16, 0, 0, 0)
    with pytest.raises(ValueError, match="variant"):
        sim.reset_data(0, 0, 0, 16, 0, 4, 9)
    with pytest.raises(ValueError, match="positive"):
        sim.reset_data_verify(0, 0, 0, 16, 0, 0)
    out, lut = l2ctl.DeviceBuffer(4 << 20), l2ctl.DeviceBuffer(1024)
    shape = kernels.reset_data(out, lut, blocks_per_sm=2)
    assert (shape.blocks, shape.threads, shape.vector_out, shape.vector_lut) == (264, 256, True, True)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidDevice"):
        sim.reset_data(3, 0, out.ptr, 16, lut.ptr, 4, 0)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorIllegalAddress"):
        sim.reset_data(0, 0, out.ptr, (1 << 20) + 1, lut.ptr, 4, 0)  # one word past the end
    with pytest.raises(l2ctl.CudaError, match="cudaErrorMisalignedAddress"):
        sim.reset_data(0, 0, out.ptr + 2, 16, lut.ptr, 4, 0)


def test_write_index_copy_and_counts(sim):
    n = 10_003
    a, b = l2ctl.DeviceBuffer(4 * n), l2ctl.DeviceBuffer(4 * n)
    a.fill_bytes(0x11)
    kernels.write_index(a)
    np.testing.assert_array_equal(a.to_numpy().view(np.uint32), np.arange(n, dtype=np.uint32))
    assert kernels.count_index_mismatches(a) == 0
    b.fill_bytes(0xFF)
    assert kernels.count_mismatches(a, b) == n
    kernels.copy_words(b, a)
    assert kernels.count_mismatches(a, b) == 0
    bad = np.arange(n, dtype=np.uint32)
    bad[[5, 77, n - 1]] = 3
    b.copy_from(bad.view(np.uint8))
    assert kernels.count_index_mismatches(b) == 3 and kernels.count_mismatches(a, b) == 3
    b.fill_bytes(0)
    assert kernels.count_index_mismatches(b) == n - 1  # word 0 is 0 either way
    with pytest.raises(ValueError, match="16-byte aligned"):
        sim.write_index(0, 0, a.ptr + 4, 4)
    with pytest.raises(ValueError, match="16-byte aligned"):
        sim.copy_words(0, 0, a.ptr, b.ptr + 4, 4)


def _read_sum_reference(words: np.ndarray, blocks: int) -> np.ndarray:
    n = len(words)
    nvec = n // 4
    partials = np.zeros(blocks, dtype=np.uint64)
    v = np.arange(nvec)
    np.add.at(partials, (v % (blocks * 256)) // 256, words[:4 * nvec].reshape(-1, 4).astype(np.uint64).sum(axis=1))
    partials[0] += words[4 * nvec:].astype(np.uint64).sum()
    return partials


def _mixed_buffer(fake: FakeBackend, n: int, seed: int) -> tuple[int, np.ndarray]:
    """A buffer whose segments are of every kind (index, fill, bytes at odd offsets, pattern), with
    its expected words built independently with NumPy."""
    rng = np.random.default_rng(seed)
    ptr = _keep(fake, fake.DeviceMemory(0, 4 * n + 64)).ptr
    expect = np.zeros(4 * n + 64, dtype=np.uint8)
    fake.write_index(0, 0, ptr, n)
    expect[:4 * n] = np.arange(n, dtype=np.uint32).view(np.uint8)
    a, b = sorted(rng.integers(0, 4 * n, size=2))
    fake.memset_device(ptr + a, 0x5A, b - a, 0)
    expect[a:b] = 0x5A
    c = int(rng.integers(1, max(2, 4 * n - 100)))
    blob = rng.integers(0, 256, size=min(97, 4 * n + 64 - c), dtype=np.uint8)
    fake.copy_host_to_device(ptr + c, blob, 0)
    expect[c:c + len(blob)] = blob
    lut = rng.integers(0, 2**32, size=13, dtype=np.uint32)
    lut_ptr = _buffer(fake, lut)
    d = 4 * int(rng.integers(0, max(1, n // 8)))
    fake.reset_data(0, 0, ptr + d, n // 8, lut_ptr, 13, 6)
    expect[d:d + 4 * (n // 8)] = np.resize(lut, n // 8).view(np.uint8)
    return ptr, expect[:4 * n].view(np.uint32)


@pytest.mark.parametrize("n,seed", [(1, 0), (1027, 1), (300_001, 2)])
def test_read_sum_partials_per_block(sim, n, seed):
    ptr, words = _mixed_buffer(sim, n, seed)
    np.testing.assert_array_equal(_read(sim, ptr, n), words)
    partials = sim.DeviceMemory(0, 8 * sim.max_read_partials(0))
    blocks = sim.read_sum(0, 0, ptr, n, partials.ptr)
    assert blocks == max(1, min(1056, -(-(n // 4 + 1) // 256))) and sim.max_read_partials(0) == 1056
    got = _read(sim, partials.ptr, blocks, np.uint64)
    np.testing.assert_array_equal(got, _read_sum_reference(words, blocks))
    assert sim.sum_u64(0, 0, partials.ptr, blocks) == int(words.astype(np.uint64).sum())


@pytest.mark.parametrize("stride,block_threads", [(0, 256), (1, 64), (3, 256), (16, 1024), (33, 96)])
def test_stride_read_partials(sim, stride, block_threads):
    n = 50_000
    ptr, words = _mixed_buffer(sim, n, stride)
    threads = (n - 1) // max(stride, 1) + 1 if stride else 777
    partials = sim.DeviceMemory(0, 8 * (threads // 32 + 1))
    blocks = sim.stride_read(0, 0, ptr, threads, stride, partials.ptr, block_threads)
    assert blocks == -(-threads // block_threads)
    loaded = words[np.arange(threads) * stride].astype(np.uint64)
    expected = np.add.reduceat(loaded, np.arange(0, threads, block_threads))
    np.testing.assert_array_equal(_read(sim, partials.ptr, blocks, np.uint64), expected)
    with pytest.raises(ValueError, match="block_threads"):
        sim.stride_read(0, 0, ptr, threads, stride, partials.ptr, 100)
    with pytest.raises(ValueError, match="thread count"):
        sim.stride_read(0, 0, ptr, 0, stride, partials.ptr, 256)


def test_stride_read_through_l2ctl_matches_the_sum(sim):
    n, sw = 1 << 20, 8
    buf, partials = l2ctl.DeviceBuffer(4 * n), l2ctl.DeviceBuffer(8 * 4096)
    kernels.write_index(buf)
    threads = (n - 1) // sw + 1
    blocks = kernels.stride_read(buf, 4 * sw, partials)
    assert kernels.sum_u64(partials, blocks) == sw * threads * (threads - 1) // 2


def test_float_kernels_match_a_float32_computation(sim):
    rng = np.random.default_rng(3)
    n = 5000
    values = rng.random(n, dtype=np.float32) * 10
    indices = rng.integers(-50, 5000, size=n, dtype=np.int32)
    dense = rng.random(1000, dtype=np.float32)
    data = rng.random(8 * n, dtype=np.float32)
    cats = rng.integers(-9, 100, size=8 * n, dtype=np.int32)
    weights = rng.random(33, dtype=np.float32)
    dv, di, dd, dx, dc, dw = (l2ctl.DeviceBuffer.from_numpy(a) for a in (values, indices, dense, data, cats, weights))
    hot = dense[indices.view(np.uint32).astype(np.int64) % 1000]
    ref = (values.astype(np.float64) * hot + np.sin(values * np.float32(0.1)).astype(np.float64)).astype(np.float32)
    x = data.reshape(n, 8)
    w = weights[cats.view(np.uint32).astype(np.int64).reshape(n, 8) % 33]
    terms = (x.astype(np.float64) * w + np.cos(x * np.float32(0.01)).astype(np.float64)).astype(np.float32)
    ref2 = np.zeros(n, dtype=np.float32)
    for i in range(8):
        ref2 = ref2 + terms[:, i]
    for streaming in (False, True):
        out, out2 = l2ctl.DeviceBuffer(4 * n, dtype=np.float32), l2ctl.DeviceBuffer(4 * n, dtype=np.float32)
        out.fill_bytes(0xFF)
        out2.fill_bytes(0xFF)
        kernels.sparse_vector(dv, di, dd, out, streaming=streaming)
        kernels.stream_analysis(dx, dc, dw, out2, streaming=streaming)
        np.testing.assert_array_equal(out.to_numpy(), ref)
        np.testing.assert_array_equal(out2.to_numpy(), ref2)
    exact = values * dense[indices.view(np.uint32) % 1000].astype(np.float64) + np.sin(values.astype(np.float64) * 0.1)
    assert np.max(np.abs(ref - exact) / np.maximum(1, np.abs(exact))) < 1e-5
    with pytest.raises(ValueError, match="dense length"):
        sim.sparse_vector(0, 0, dv.ptr, di.ptr, dd.ptr, 0, out.ptr, n, False)
    with pytest.raises(ValueError, match="weights length"):
        sim.stream_analysis(0, 0, dx.ptr, dc.ptr, dw.ptr, 0, out2.ptr, n, False)


# ---- lazy memory ---------------------------------------------------------------------------------


def test_a_100_gib_allocation_takes_no_host_memory():
    fake = FakeBackend(FakeDevice.h200())
    tracemalloc.start()
    try:
        big = fake.DeviceMemory(0, 100 * GiB)
        s = _stream(fake)
        fake.memset_device(big.ptr + 7, 0xAB, 60 * GiB, s)
        fake.write_index(0, s, big.ptr + 64 * GiB, 2 * GiB)  # 8 GiB of words
        fake.copy_host_to_device(big.ptr + 99 * GiB + 3, np.arange(1000, dtype=np.uint16), s)
        fake.memory.copy(big.ptr + 90 * GiB + 1, big.ptr + 56 * GiB, 9 * GiB)  # fill, zeros, index
        partials = fake.DeviceMemory(0, 8 * 1056)
        blocks = fake.read_sum(0, s, big.ptr + 64 * GiB, 2 * GiB, partials.ptr)
        total = fake.sum_u64(0, s, partials.ptr, blocks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB, peak
    n = 2 * GiB  # words k = 0 .. 2^31 - 1
    assert total == n * (n - 1) // 2 % (1 << 64)
    assert fake.count_index_mismatches(0, s, big.ptr + 64 * GiB, 1 << 20) == 0
    probe = np.empty(16, dtype=np.uint8)
    fake.copy_device_to_host(probe, big.ptr, s)
    assert probe.tolist() == [0] * 7 + [0xAB] * 9
    fake.copy_device_to_host(probe, big.ptr + 99 * GiB + 2, s)
    assert probe.tolist() == [0] + list(np.arange(1000, dtype=np.uint16).view(np.uint8)[:15])
    fake.copy_device_to_host(probe, big.ptr + 90 * GiB + 1 + 4 * GiB + 4, s)  # from 60 GiB + 4
    assert probe.tolist() == [0xAB] * 3 + [0] * 13
    fake.copy_device_to_host(probe, big.ptr + 90 * GiB + 1 + 8 * GiB, s)  # from 64 GiB: the index words
    assert probe.tolist() == list(np.arange(4, dtype=np.uint32).view(np.uint8))
    assert fake.memory.segment_count() < 20
    with pytest.raises(l2ctl.CudaError, match="cudaErrorMemoryAllocation"):
        fake.DeviceMemory(0, 50 * GiB)  # 100 + 50 GiB > 141 GB
    big.free()
    fake.DeviceMemory(0, 50 * GiB).free()


def test_copies_across_segment_boundaries_match_numpy():
    fake = FakeBackend()
    rng = np.random.default_rng(5)
    size = 1 << 16
    a, b = fake.DeviceMemory(0, size), fake.DeviceMemory(0, size)
    model = {a.ptr: np.zeros(size, np.uint8), b.ptr: np.zeros(size, np.uint8)}
    lut = np.arange(1, 12, dtype=np.uint32)
    lut_ptr = _buffer(fake, lut)
    for step in range(200):
        dst = a.ptr if step % 2 else b.ptr
        src = b.ptr if step % 2 else a.ptr
        off, n = int(rng.integers(0, size - 1)), int(rng.integers(1, 4000))
        n = min(n, size - off)
        kind = step % 5
        if kind == 0:
            fake.memset_device(dst + off, step, n, 0)
            model[dst][off:off + n] = step & 0xFF
        elif kind == 1:
            data = rng.integers(0, 256, n, dtype=np.uint8)
            fake.copy_host_to_device(dst + off, data, 0)
            model[dst][off:off + n] = data
        elif kind == 2:
            off2 = int(rng.integers(0, size - n + 1))
            fake.memory.copy(dst + off, src + off2, n)
            model[dst][off:off + n] = model[src][off2:off2 + n]
        elif kind == 3 and off % 16 == 0 and n >= 4:
            fake.write_index(0, 0, dst + off, n // 4)
            model[dst][off:off + 4 * (n // 4)] = np.arange(n // 4, dtype=np.uint32).view(np.uint8)
        elif kind == 4 and off % 4 == 0 and n >= 4:
            fake.reset_data(0, 0, dst + off, n // 4, lut_ptr, 11, 0)
            model[dst][off:off + 4 * (n // 4)] = np.resize(lut, n // 4).view(np.uint8)
        for ptr in (a.ptr, b.ptr):
            np.testing.assert_array_equal(_read(fake, ptr, size, np.uint8), model[ptr])
        x = int(rng.integers(0, size // 4 - 100))
        assert fake.count_mismatches(0, 0, a.ptr + 4 * x, b.ptr + 4 * x, 100) == int(np.count_nonzero(
            model[a.ptr][4 * x:4 * x + 400].view(np.uint32) != model[b.ptr][4 * x:4 * x + 400].view(np.uint32)))


def test_large_reset_data_and_verify_are_fast(sim):
    lut = l2ctl.DeviceBuffer.from_numpy(np.random.default_rng(0).integers(0, 2**31 - 1, 12 * MiB, dtype=np.int32))
    out = l2ctl.DeviceBuffer(GiB)
    with l2ctl.Stream() as s:
        t0 = time.perf_counter()
        for _ in range(10):
            kernels.reset_data(out, lut, s)
        assert kernels.verify_reset_data(out, lut, s) == 0
        out.fill_bytes(0xFF, s)
        assert kernels.verify_reset_data(out, lut, s) == GiB // 4
        kernels.reset_data(out, lut, s, variant="scalar")
        sim.copy_host_to_device(out.ptr + 4 * 12345, np.array([-5], np.int32), s.handle)
        assert kernels.verify_reset_data(out, lut, s) == 1
        partials = l2ctl.DeviceBuffer(8 * 1056)
        blocks = kernels.read_sum(lut, partials, s)
        assert kernels.sum_u64(partials, blocks, s) == int(lut.to_numpy().astype(np.int64).sum())
        assert time.perf_counter() - t0 < 1.5


def test_pointer_info_and_freed_memory(sim):
    buf = l2ctl.DeviceBuffer(4096)
    ptr = buf.ptr
    assert sim.pointer_info(ptr + 100) == (2, 0, ptr, 4096)
    assert sim.pointer_info(ptr + 4096) == (0, -2, 0, 0)
    assert sim.pointer_info(0x1234_0000) == (0, -2, 0, 0)
    buf.free()
    assert sim.pointer_info(ptr) == (0, -2, 0, 0)
    with pytest.raises(ValueError, match="freed"):
        _ = buf.ptr
    with pytest.raises(l2ctl.CudaError, match="cudaErrorIllegalAddress"):
        sim.write_index(0, 0, ptr, 16)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        sim.memset_device(ptr, 0, 16, 0)
    gone = sim.DeviceMemory(0, 1024)
    address = gone.ptr
    del gone  # garbage collection frees it, as the extension's destructor does
    sim.device_count()
    assert sim.pointer_info(address) == (0, -2, 0, 0)


# ---- errors and state ----------------------------------------------------------------------------


def test_limit_rounding_and_errors(sim):
    d = sim.device(0)
    assert sim.set_persisting_limit(0, 3 * MiB + 12345) == 3_276_800 == d.limit
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue") as info:
        sim.set_persisting_limit(0, d.persisting_l2_cache_max_size + 1)
    assert info.value.code == 1 and d.limit == 3_276_800
    assert sim.set_persisting_limit(0, d.persisting_l2_cache_max_size) == 32_768_000
    with FakeBackend.installed(FakeDevice.turing()) as t:
        with pytest.raises(l2ctl.CudaError, match="cudaErrorUnsupportedLimit"):
            t.set_persisting_limit(0, 0)
        with pytest.raises(l2ctl.CudaError, match="cudaErrorUnsupportedLimit"):
            t.get_persisting_limit(0)
    mps = FakeBackend(FakeDevice.mps_client())
    with pytest.raises(l2ctl.CudaError, match="cudaErrorNotSupported"):
        mps.set_persisting_limit(0, 0)


def _set_stream_window(fake: FakeBackend, stream: int, *window: float) -> None:
    """One window set as the planner sets it: the simulator's batch, the one call of it that changes a window."""
    fake.apply_batch(0, -1, False, False, False, [(0, stream, window)])


@pytest.mark.parametrize("ratio", [1.5, -0.1, 1.0000001, float("nan")])
def test_bad_windows_are_refused(sim, ratio):
    s = _stream(sim)
    buf = sim.DeviceMemory(0, MiB)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        _set_stream_window(sim, s, buf.ptr, MiB, ratio, *PERSIST)
    assert s not in sim.windows and sim.calls[-1] == "cudaStreamSetAttribute"


def test_window_limits(sim):
    s = _stream(sim)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        _set_stream_window(sim, s, 1 << 40, 128 * MiB + 1, 0.5, *PERSIST)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        _set_stream_window(sim, s, 1 << 40, MiB, 0.5, 2, 2)  # missProp PERSISTING
    _set_stream_window(sim, s, 1 << 40, MiB, 0.1, *PERSIST)
    assert sim.get_stream_window(s) == (1 << 40, MiB, float(np.float32(0.1)), 2, 1)
    _set_stream_window(sim, 0, 1 << 40, MiB, 1.0, *PERSIST)  # the legacy default stream works too
    assert sim.windows[0][2] == 1.0
    _set_stream_window(sim, 0, 0, 0, 0.0, 0, 0)
    assert 0 not in sim.windows


def test_closed_streams_and_unknown_handles(sim):
    st = sim.Stream(0)
    handle = st.handle
    st.close()
    assert st.closed and sim.calls[-1] == "cudaStreamDestroy"
    with pytest.raises(ValueError, match="closed"):
        _ = st.handle
    for call in (lambda: sim.stream_device(handle), lambda: sim.get_stream_window(handle),
                 lambda: _set_stream_window(sim, handle, 0, 0, 0.0, 0, 0), lambda: sim.stream_synchronize(handle),
                 lambda: sim.write_index(0, handle, 0, 0)):
        with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidResourceHandle"):
            call()
    other = FakeBackend()
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidResourceHandle"):
        other.stream_device(sim.Stream(0).handle)  # handles of one machine are unknown to another


def test_a_machine_without_devices():
    fake = FakeBackend.without_devices()
    assert fake.device_count() == 0 and "cudaErrorNoDevice" in fake.device_count_error()
    for call in (fake.current_device, lambda: fake.device_properties(0), lambda: fake.Stream(0),
                 lambda: fake.DeviceMemory(0, 16), lambda: fake.get_persisting_limit(0), fake.Event,
                 lambda: fake.set_persisting_limit(0, 0), lambda: fake.pointer_info(1 << 40),
                 lambda: fake.stream_device(0), lambda: fake.write_index(0, 0, 0, 0)):
        with pytest.raises(l2ctl.CudaError) as info:
            call()
        assert info.value.name == "cudaErrorNoDevice" and info.value.code == 100
    with fake.install():
        assert l2ctl.device_count() == 0
        with pytest.raises(l2ctl.NoDeviceError, match="no CUDA-capable device"):
            l2ctl.device_info()
        with pytest.raises(l2ctl.NoDeviceError):
            l2ctl.Stream()


def test_apply_batch_order_and_failures(sim):
    s1, s2 = _stream(sim), _stream(sim)
    g = _stream(sim)
    sim.begin_capture(g, 1)
    sim.launch_fake_kernel(g)
    graph = sim.end_capture(g)
    (node, name, _, _), = sim.graph_kernel_nodes(graph)
    assert name == "fake_kernel"
    w = (1 << 40, MiB, 1.0, 2, 1)
    sim.calls.clear()
    before_limit = sim.device(0).limit
    result = sim.apply_batch(0, 3 * MiB, False, True, True, [(0, s1, w), (0, s2, w), (1, node, w)])
    assert result == (before_limit, 3_276_800, [(0, 0, 0.0, 0, 0)] * 3)  # the previous windows, in order
    assert 3_276_800 == sim.device(0).limit and sim.device(0).resets == 1
    assert [c for c in sim.calls if "Get" not in c] == [
        "cudaDeviceSetLimit", "cudaStreamSetAttribute", "cudaStreamSetAttribute", "cudaGraphKernelNodeSetAttribute",
        "cudaCtxResetPersistingL2Cache"]
    assert sim.windows[s1] == sim.windows[s2] == sim.node_windows[node] == w
    assert sim.apply_batch(0, -1, False, False, False, [(0, s1, (0, 0, 0.0, 0, 0))]) == (-1, -1, [])
    assert s1 not in sim.windows and sim.device(0).limit == 3_276_800
    # at_least raises the limit only when it is below
    assert sim.apply_batch(0, 2 * MiB, True, False, False, []) == (3_276_800, 3_276_800, [])
    assert sim.apply_batch(0, 5 * MiB, True, False, False, []) == (3_276_800, 6_553_600, [])
    before = sim.state()
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        sim.apply_batch(0, 0, False, True, False, [(0, s1, w), (0, s2, (1 << 40, MiB, 2.0, 2, 1))])
    assert sim.windows[s1] == w  # a window changed without read_previous stays changed
    assert sim.device(0).limit == 6_553_600 and sim.device(0).resets == 1 and sim.state() != before  # limit back
    sim.apply_batch(0, -1, False, False, False, [(0, s1, (0, 0, 0.0, 0, 0))])
    before = sim.state()
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):  # with read_previous: all put back
        sim.apply_batch(0, 0, False, True, True, [(0, s1, w), (0, s2, (1 << 40, MiB, 2.0, 2, 1))])
    assert sim.state() == before
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        sim.apply_batch(0, 64 * MiB, False, False, False, [])


def test_persist_restores_everything(sim):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(8 * MiB)
    before = sim.state()
    with l2ctl.persist(s, lut, 1.0):
        assert sim.device(0).limit == 9_830_400 and sim.windows[s.handle][1] == 8 * MiB
    assert sim.state() == before


# ---- graphs ----------------------------------------------------------------------------------------


def test_capture_real_kernels_and_replay(sim):
    from l2ctl import graph

    rng = np.random.default_rng(9)
    host = rng.integers(0, 2**31 - 1, size=MiB, dtype=np.int32)
    lut, out = l2ctl.DeviceBuffer.from_numpy(host), l2ctl.DeviceBuffer(64 * MiB)
    with l2ctl.Stream() as s:
        l2ctl.set_window(s, AccessPolicyWindow.for_buffer(lut, 0.5))
        with graph.capture(s) as g:
            kernels.reset_data(out, lut, s)
            kernels.reset_data(out, lut, s, variant="hinted")
            sim.launch_modeled_kernel(s.handle, "my_kernel", streamed_bytes=GiB)
        l2ctl.clear_window(s)
        nodes = g.kernel_nodes()
        assert [k.function for k in nodes] == ["reset_data_plain_kernel", "reset_data_hinted_kernel", "my_kernel"]
        assert all(k.window.hit_ratio == 0.5 for k in nodes) and nodes[0].grid == (1056, 1, 1)
        assert kernels.verify_reset_data(out, lut, s) == 16 * MiB  # captured, not run
        out.fill_bytes(0xFF, s)
        g.launch(s)
        assert kernels.verify_reset_data(out, lut, s) == 0
        half = [r.duration_ms for r in list(sim.kernel_log)[-4:-1]]
        with l2ctl.persist(g.select(lambda k: "reset_data" in k.function), lut, 1.0) as p:
            assert sim.launched[-1][1][0][2] == 0.5  # launched before the scope
            g.launch(s)
            assert sim.launched[-1][1][0] == p.window.as_tuple()
        full = [r.duration_ms for r in list(sim.kernel_log)[-3:]]
        assert full[0] < half[0] / 1.05 and full[2] == pytest.approx(half[2], rel=0.02)
        assert [k.window.hit_ratio for k in g.kernel_nodes()] == [0.5, 0.5, 0.5]
        assert sim.kernel_log[-1].name == "my_kernel"
        g.destroy()
        assert not sim.node_windows


def test_capture_rules(sim):
    s = _stream(sim)
    out = sim.DeviceMemory(0, 4096)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorStreamCaptureUnsupported"):
        sim.begin_capture(0, 1)
    sim.begin_capture(s, 1)
    assert sim.is_capturing(s)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorIllegalState"):
        sim.begin_capture(s, 1)
    sim.memset_device(out.ptr, 1, 4096, s)
    sim.write_index(0, s, out.ptr, 1024)
    graph = sim.end_capture(s)
    assert sim.graph_node_count(graph) == 2 and len(sim.graph_kernel_nodes(graph)) == 1
    assert _read(sim, out.ptr, 4).tolist() == [0] * 4  # nothing ran yet
    exe = sim.GraphExec(graph)
    exe.launch(s)
    assert _read(sim, out.ptr, 4).tolist() == [0, 1, 2, 3]
    sim.begin_capture(s, 1)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorStreamCaptureUnsupported"):
        sim.count_index_mismatches(0, s, out.ptr, 1024)  # reads a count back: not capturable
    with pytest.raises(l2ctl.CudaError, match="cudaErrorStreamCaptureInvalidated"):
        sim.end_capture(s)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorIllegalState"):
        sim.end_capture(s)
    sim.begin_capture(s, 2)  # relaxed mode: a device synchronize elsewhere is allowed
    sim.device_synchronize(0)
    sim.end_capture(s)
    sim.begin_capture(s, 1)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorStreamCaptureUnsupported"):
        sim.device_synchronize(0)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorStreamCaptureInvalidated"):
        sim.end_capture(s)
    other = _stream(sim)
    sim.begin_capture(other, 1)
    sim.write_index(0, other, out.ptr, 16)
    changed = sim.end_capture(other)
    assert exe.update(changed) is False  # a different kernel: the topology changed
    exe.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        exe.launch(s)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        sim.GraphExec(12345)


# ---- events and clocks ------------------------------------------------------------------------------


def test_events_follow_the_stream_clock(sim):
    s1, s2 = _stream(sim), _stream(sim)
    lut, out = sim.DeviceMemory(0, 4 * MiB), sim.DeviceMemory(0, GiB)
    e0, e1, e2, e3 = (sim.Event() for _ in range(4))
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidResourceHandle"):
        e1.elapsed_since(e0)  # never recorded
    e0.record(s1)
    sim.reset_data(0, s1, out.ptr, GiB // 4, lut.ptr, MiB, 0)
    e1.record(s1)
    alone = e1.elapsed_since(e0)
    assert alone == pytest.approx(sim.kernel_log[-1].duration_ms, rel=1e-6) and 0.3 < alone < 0.6
    assert sim.clock(s1) == pytest.approx(sim.kernel_log[-1].start_ms + alone, rel=1e-6)
    # two memory-bound kernels at once on two streams share the bandwidth
    e0.record(s1)
    e0.wait_on(s2)
    sim.reset_data(0, s1, out.ptr, GiB // 4, lut.ptr, MiB, 0)
    other = sim.DeviceMemory(0, GiB)
    sim.reset_data(0, s2, other.ptr, GiB // 4, lut.ptr, MiB, 0)
    e1.record(s1)
    e2.record(s2)
    both = max(e1.elapsed_since(e0), e2.elapsed_since(e0))
    assert 1.7 * alone < both < 2.3 * alone
    # the host waits: later launches on an idle stream start after what the host has seen
    e3.record(s1)
    sim.stream_synchronize(s2)
    s3 = _stream(sim)
    e0.record(s3)
    assert e0.time >= e2.time


def test_noise_is_small_and_seeded():
    def times(seed):
        fake = FakeBackend(seed=seed)
        s = _stream(fake)
        lut, out = fake.DeviceMemory(0, MiB), fake.DeviceMemory(0, 256 * MiB)
        for _ in range(20):
            fake.reset_data(0, s, out.ptr, 64 * MiB, lut.ptr, MiB // 4, 0)
        return [r.duration_ms for r in fake.kernel_log]

    a, b, c = times(0), times(0), times(1)
    assert a == b and a != c
    spread = np.std(a[1:]) / np.mean(a[1:])
    assert 0.0005 < spread < 0.01
    quiet = FakeDevice.h100()
    quiet.noise = 0.0
    fake = FakeBackend(quiet)
    s = _stream(fake)
    for _ in range(3):
        fake.launch_modeled_kernel(s, streamed_bytes=GiB, read_fraction=0.0)
    assert len({r.duration_ms for r in fake.kernel_log}) == 1


def test_modeled_kernels(sim):
    s = _stream(sim)
    hot = sim.DeviceMemory(0, 8 * MiB)
    sim.launch_modeled_kernel(s, "plain", streamed_bytes=GiB, hot=(hot.ptr, 8 * MiB), hot_reads=GiB)
    sim.set_persisting_limit(0, 9 * MiB)
    _set_stream_window(sim, s, hot.ptr, 8 * MiB, 1.0, *PERSIST)
    for _ in range(2):
        sim.launch_modeled_kernel(s, "persisted", streamed_bytes=GiB, hot=(hot.ptr, 8 * MiB), hot_reads=GiB,
                                  read_fraction=0.0)
    sim.launch_modeled_kernel(s, "compute", streamed_bytes=MiB, compute_ms=2.0)
    plain, first, steady, compute = list(sim.kernel_log)[-4:]
    assert plain.name == "plain" and steady.window == sim.windows[s]
    assert steady.duration_ms < plain.duration_ms / 1.1
    assert steady.estimate.dram_read < 1.5 * MiB and first.estimate.dram_read > 7 * MiB  # persisted lines stay
    assert compute.duration_ms == pytest.approx(2.003, rel=0.02)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorIllegalAddress"):
        sim.launch_modeled_kernel(s, streamed_bytes=1, hot=(hot.ptr, 16 * MiB), hot_reads=1)


@pytest.mark.filterwarnings("ignore::l2ctl.L2BudgetWarning")
def test_threads_launch_concurrently(sim, run_threads):
    lut = l2ctl.DeviceBuffer.from_numpy(np.arange(MiB // 4, dtype=np.int32))

    def worker():
        out = l2ctl.DeviceBuffer(4 * MiB)
        with l2ctl.Stream() as s:
            for _ in range(20):
                with l2ctl.persist(s, lut, 0.5):
                    kernels.reset_data(out, lut, s)
            assert kernels.verify_reset_data(out, lut, s) == 0

    run_threads(worker, [()] * 8)
    assert sim.device(0).limit == 9_830_400 and not sim.windows


# ---- the profiler ---------------------------------------------------------------------------------


def _reset_workload(lut_bytes=4 * MiB, out_bytes=256 * MiB):
    from l2ctl.workloads import ResetDataWorkload

    return ResetDataWorkload(lut_bytes, out_bytes)


def test_collect_user_replay(sim):
    with _reset_workload() as w, l2ctl.Stream() as s:
        run = lambda: w.enqueue(s)  # noqa: E731
        results, passes = l2ctl.collect(run, setup=run)
        assert passes == 2 and len(results) == 1 and results[0].name == "reset_data_plain_kernel"
        plain = results[0]
        with l2ctl.persist(s, w.buf, 1.0):
            (persisted,), _ = l2ctl.collect(run, setup=run)
        lut = 4 * MiB
        assert plain["dram__bytes_read.sum"] > lut and persisted["dram__bytes_read.sum"] < 0.05 * lut
        assert plain["dram__bytes_write.sum"] == pytest.approx(256 * MiB, rel=0.01)
        assert persisted["gpu__time_duration.sum"] < plain["gpu__time_duration.sum"]
        assert 90 < persisted["lts__t_sector_hit_rate.pct"] <= 100
        assert w.verify(s)
        # without setup inside the pass, the profiler's start has evicted the persisting lines
        with l2ctl.persist(s, w.buf, 1.0):
            (cold,), _ = l2ctl.collect(run)
        assert cold["dram__bytes_read.sum"] >= lut


def test_counters_kernel_replay_and_sector_model(sim):
    buf, partials = l2ctl.DeviceBuffer(64 * MiB), l2ctl.DeviceBuffer(8 * 65536)
    kernels.write_index(buf)
    with l2ctl.Stream() as s:
        with l2ctl.counters(metrics=l2ctl.SECTOR_METRICS + ("dram__bytes_read.sum",)) as c:
            for stride in (4, 8, 16, 32, 64):
                kernels.stride_read(buf, stride, partials, s, threads=1 << 18)
        assert c.passes == 1 and [k.name for k in c.results] == ["stride_read_kernel"] * 5
        assert [k.sectors_per_request for k in c.results] == [4, 8, 16, 32, 32]
        assert [k["dram__bytes_read.sum"] / (1 << 13) for k in c.results] == [128, 256, 512, 1024, 2048]
        with l2ctl.Timer(s) as t:
            with l2ctl.counters(metrics=l2ctl.DEFAULT_METRICS):
                kernels.write_index(buf, s)
        with l2ctl.Timer(s) as t2:
            kernels.write_index(buf, s)
        assert t.elapsed_ms > 1.5 * t2.elapsed_ms  # replayed: serialized and slower


def test_the_model_reports_every_metric_l2ctl_knows():
    from l2ctl._counters import METRIC_UNITS
    from l2ctl.testing.model import METRIC_NAMES, DeviceModel, Traffic

    assert set(METRIC_UNITS) <= set(METRIC_NAMES)
    values = DeviceModel(FakeDevice.h100()).evaluate(Traffic("k", stream_write=MiB, work_bytes=MiB)).metrics()
    assert set(values) == set(METRIC_NAMES)


def test_profiler_errors():
    from l2ctl._errors import CuptiError

    with FakeBackend.installed(cupti=False):
        with pytest.raises(l2ctl.CountersUnavailableError, match="L2CTL_CUPTI"):
            with l2ctl.counters():
                pass
    fake = FakeBackend()
    with pytest.raises(CuptiError, match="not loaded"):
        fake.RangeProfiler(0, ["gpu__time_duration.sum"], 4)
    with pytest.raises(CuptiError):
        fake.cupti_load("/nonexistent/libcupti.so")
    fake.cupti_load("libcupti.so.13")
    assert fake.cupti_loaded()
    with pytest.raises(CuptiError, match="unknown metric") as info:
        fake.RangeProfiler(0, ["sm__nonsense.sum"], 4)
    assert info.value.code == 1
    with pytest.raises(ValueError):
        fake.RangeProfiler(0, [], 4)
    p = fake.RangeProfiler(0, list(l2ctl.DEFAULT_METRICS), 4, True)
    assert p.passes == 2 and p.chip == "GH100"
    with pytest.raises(CuptiError, match="already enabled"):
        fake.RangeProfiler(0, ["gpu__time_duration.sum"], 4)
    with pytest.raises(RuntimeError, match="not running"):
        p.end_pass()
    p.start()
    with pytest.raises(RuntimeError, match="already running"):
        p.start()
    assert p.end_pass() is False
    with pytest.raises(RuntimeError, match="not every pass"):
        p.stop()
    del p
    fake.RangeProfiler(0, ["gpu__time_duration.sum"], 4)  # the first one was released
    with FakeBackend.installed():
        with pytest.raises(l2ctl.CountersUnavailableError, match="unknown metric"):
            l2ctl.collect(lambda: None, metrics=["sm__nonsense.sum"])


# ---- the timing model's shape ----------------------------------------------------------------------

H100_BASELINE = {1: 0.356, 4: 0.416, 8: 0.457, 12: 0.485, 16: 0.502, 24: 0.561, 32: 0.587, 48: 0.648}
# README "The set-aside tax" (sweep tax on the H100): granules of 3,276,800 B -> (write-only, copy) GB/s
H100_TAX = {0: (3173, 2824), 1: (3154, 2792), 2: (3109, 2824), 3: (3154, 2793), 4: (3015, 2700), 5: (2278, 2424),
            6: (2322, 2300), 7: (2313, 2181), 8: (2290, 2083), 9: (1341, 1390), 10: (1248, 1209)}


def _reset_table(device: FakeDevice, sizes, columns):
    from l2ctl import bench

    with FakeBackend.installed(device):
        report = bench.bench_reset_data(sizes, columns=columns, repeat=3, warmup=1, progress=False)
    return report


def test_h100_tax_table():
    with FakeBackend.installed(FakeDevice.h100()), l2ctl.Stream() as s:
        from l2ctl import sweep

        report = sweep.sweep_tax(s, repeat=3, warmup=1, progress=False)
    for rec in report.records:
        write, copy = H100_TAX[round(rec.config["set_aside_granted"] / 3_276_800)]
        assert rec.metrics["write_gbps"] == pytest.approx(write, rel=0.1)
        assert rec.metrics["copy_gbps"] == pytest.approx(copy, rel=0.1)


def test_h100_reset_data_shape():
    report = _reset_table(FakeDevice.h100(), None, ["baseline", "recipe_hr1", "recipe_fit", "right_sized", "hints"])
    assert report.ceilings.write_ms == pytest.approx(0.339, rel=0.03)
    assert report.ceilings.copy_gbps == pytest.approx(2819, rel=0.03)
    assert report.ceilings.read_gbps == pytest.approx(3077, rel=0.03)
    for row in report.summary["table_ms"]:
        mib = row["lut_bytes"] // MiB
        assert row["baseline"] == pytest.approx(H100_BASELINE[mib], rel=0.2)
        if 4 <= mib <= 12:
            assert row["right_sized"] < row["baseline"] / 1.1
        for recipe in ("recipe_hr1", "recipe_fit"):
            assert 1.5 < row[recipe] / row["baseline"] < 3.05
        assert row["hints"] < row["baseline"]  # eviction hints need no set-aside
    scalar = _reset_table(FakeDevice.h100(), [4 * MiB, 8 * MiB], ["baseline", "right_sized"])
    for row in scalar.summary["table_ms"]:
        assert 1.15 < row["baseline"] / row["right_sized"] < 1.45  # the vectorized kernel gains less...
    from l2ctl import sweep

    with FakeBackend.installed(FakeDevice.h100()), l2ctl.Stream() as s:
        for lut in (4 * MiB, 8 * MiB):
            with sweep.ResetDataWorkload(lut, variant="scalar") as w:
                base = sweep.measure_point(w, s, w.buf, 0, None, repeat=3, warmup=1)
                right = sweep.measure_point(w, s, w.buf, round(lut * 1.1 / 3_276_800 + 0.5) * 3_276_800, 1.0,
                                            repeat=3, warmup=1)
                assert 1.5 < base.median_ms / right.median_ms < 1.9  # ...than the scalar one


def test_h200_reset_data_shape():
    report = _reset_table(FakeDevice.h200(), None, ["baseline", "recipe_fit", "right_sized", "hints"])
    assert report.ceilings.write_gbps == pytest.approx(4346, rel=0.03)
    rows = report.summary["table_ms"]
    assert [round(r["lut_bytes"] / MiB, 1) for r in rows] == [1.2, 4.8, 9.6, 14.4, 19.2, 28.8, 38.4, 57.6]
    assert rows[0]["baseline"] == pytest.approx(0.259, rel=0.2)
    assert rows[-1]["baseline"] == pytest.approx(0.501, rel=0.2)
    for row in rows:
        assert row["recipe_fit"] > 1.5 * row["baseline"]
        assert row["hints"] <= row["baseline"] * 1.01
    assert all(r["right_sized"] < r["baseline"] / 1.1 for r in rows[1:3])


def test_stride_and_cache_streaming_shape(sim):
    from l2ctl import bench

    report = bench.bench_stride(threads=1 << 25, repeat=3, warmup=1, progress=False)
    readme = {4: 0.120, 8: 0.126, 16: 0.176, 32: 0.341, 64: 0.678, 128: 0.741}
    for rec in report.records:
        assert rec.median_ms == pytest.approx(readme[rec.config["stride_bytes"]], rel=0.15)
    cs = bench.bench_cache_streaming(1_000_000, repeat=3, warmup=1, progress=False)
    assert 0.9 < cs.summary["sparse_vector_speedup_cs"] < 1.1
    assert 1 / 4.5 < cs.summary["stream_analysis_speedup_cs"] < 1 / 2.8


# ---- its example and presets -----------------------------------------------------------------------


def test_the_package_docstring_example_runs(capsys):
    import textwrap

    import l2ctl.testing

    doc = l2ctl.testing.__doc__
    code = textwrap.dedent(doc[doc.index("::") + 2:doc.index("Presets:")])
    exec(compile(code, "l2ctl.testing.__doc__", "exec"), {})
    assert 0.3 < float(capsys.readouterr().out.split()[0]) < 0.4


def test_other_presets_and_cached_buffers():
    from l2ctl import bench

    for device in (FakeDevice.a100(), FakeDevice.h200()):
        with FakeBackend.installed(device) as fake:
            report = bench.bench_reset_data([MiB], out_bytes=64 * MiB, columns=["baseline", "right_sized"], repeat=2,
                                            warmup=1, progress=False)
            assert report.environment["device"]["name"] == device.name and fake.device(0).limit == device.initial_limit
        # the harness keeps its scratch buffers per machine: the next one gets its own
        assert fake in bench.state._scratch
    assert FakeDevice.h200().granularity == 3_932_160 and FakeDevice.a100().supports_persistence
