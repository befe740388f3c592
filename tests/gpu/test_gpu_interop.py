"""On the GPU: l2ctl with the real objects of torch, CuPy, JAX, Numba and cuda.core (each skipped with the
reason where it is not installed or sees no GPU): their streams, buffers and devices accepted everywhere,
and l2ctl.DeviceBuffer handed to them through DLPack without a copy."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import l2ctl
from l2ctl import _dlpack, kernels

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_torch_reads_a_device_buffer_without_a_copy(gpu_state):
    torch = pytest.importorskip("torch")
    with l2ctl.Stream() as s:
        buf = l2ctl.DeviceBuffer(MiB, dtype=np.int32)
        kernels.write_index(buf, s)
        s.synchronize()
        t = torch.from_dlpack(buf)
        assert t.data_ptr() == buf.ptr and t.dtype == torch.int32 and t.device.type == "cuda"
        assert int(t[12345]) == 12345
        t.add_(1)  # written through torch, read back through l2ctl: the same memory
        torch.cuda.synchronize()
        assert buf.to_numpy(s)[12345] == 12346
        buf.free()  # the tensor still holds the memory
        torch.cuda.synchronize()
        assert int(t[7]) == 8
        del t
        gc.collect()
        assert buf.freed and len(_dlpack._live) == 0


def test_cupy_reads_a_device_buffer_and_cupy_arrays_persist(gpu_state):
    cupy = pytest.importorskip("cupy")
    with l2ctl.Stream() as s:
        gpu_state.watch(s)
        buf = l2ctl.DeviceBuffer(MiB, dtype=np.float32)
        kernels.write_index(buf, s)
        s.synchronize()
        a = cupy.from_dlpack(buf)
        assert a.data.ptr == buf.ptr and a.dtype == cupy.float32 and a.shape == buf.shape
        arr = cupy.arange(1 << 20, dtype=cupy.int32)
        with l2ctl.persist(s, arr, 1.0):
            assert l2ctl.get_window(s).base_ptr == arr.data.ptr
        cs = cupy.cuda.Stream(non_blocking=True)
        with l2ctl.persist(cs, arr, 1.0):
            assert l2ctl.get_window(cs).base_ptr == arr.data.ptr
        del a
        buf.free()


def test_jax_arrays_persist_and_read_device_buffers(gpu_state):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would take 75% of the GPU
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as exc:
        pytest.skip(f"JAX has no GPU backend here: {exc}")
    import jax.numpy as jnp

    x = jax.device_put(jnp.arange(1 << 20, dtype=jnp.int32), gpu)
    x.block_until_ready()
    ref = l2ctl._interop.resolve_buffer(x)
    assert ref.nbytes == 4 << 20 and ref.ptr == x.unsafe_buffer_pointer()
    with l2ctl.Stream(device=gpu.id) as s:
        gpu_state.watch(s)
        with l2ctl.persist(s, x, 1.0):
            assert l2ctl.get_window(s).base_ptr == ref.ptr
        buf = l2ctl.DeviceBuffer(MiB, dtype=np.int32)
        kernels.write_index(buf, s)
        s.synchronize()
        y = jax.dlpack.from_dlpack(buf)
        assert int(y[999]) == 999
        del y
        buf.free()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numba-cuda's own modules trip NumPy deprecations
def test_numba_arrays_and_streams(gpu_state):
    pytest.importorskip("numba")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("Numba sees no CUDA GPU")
    a = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
    ns = cuda.stream()
    ref = l2ctl._interop.resolve_buffer(a)
    assert ref.ptr == a.__cuda_array_interface__["data"][0] and ref.nbytes == 4 << 20
    handle = int(ns.handle.value) if hasattr(ns.handle, "value") else int(ns.handle)
    with l2ctl.persist(handle, a, 1.0):
        assert l2ctl.get_window(handle).base_ptr == ref.ptr
    if hasattr(type(ns), "__cuda_stream__"):
        with l2ctl.persist(ns, a, 1.0):
            assert l2ctl.get_window(ns).base_ptr == ref.ptr


def test_cuda_core_devices_streams_and_buffers(gpu_state):
    core = pytest.importorskip("cuda.core")
    Device = getattr(core, "Device", None) or pytest.importorskip("cuda.core.experimental").Device
    dev = Device(0)
    dev.set_current()
    cs = dev.create_stream()
    try:
        assert l2ctl.device_info(dev).index == 0
        with l2ctl.Stream(device=dev) as s:
            assert s.device == 0
        b = dev.allocate(MiB, stream=cs)
        ref = l2ctl._interop.resolve_buffer(b)
        assert ref.ptr == int(b.handle) and ref.nbytes == MiB
        with l2ctl.persist(cs, b, 1.0) as p:
            assert p.device == 0 and l2ctl.get_window(cs).base_ptr == int(b.handle)
        b.close(cs)
    finally:
        cs.sync()
        cs.close()
