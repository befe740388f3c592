"""Stream and buffer resolution with stand-in objects for each protocol: no GPU needed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import l2ctl
from l2ctl._interop import parse_cuda_array_interface, parse_dlpack_capsule, resolve_buffer, resolve_stream

MiB = 1 << 20


class CudaStreamProtocol:
    def __init__(self, handle, version=0):
        self.value = (version, handle)

    def __cuda_stream__(self):
        return self.value


class FakeTorchStream:
    __module__ = "torch.cuda.streams"

    def __init__(self, handle, index):
        self.cuda_stream = handle
        self.device = type("device", (), {"index": index, "type": "cuda"})()


class FakeCupyStream:
    __module__ = "cupy.cuda.stream"

    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id


def test_streams_from_each_protocol():
    assert resolve_stream(None).handle == 0 and resolve_stream(None).is_default
    assert resolve_stream(0x1234).handle == 0x1234
    assert resolve_stream(CudaStreamProtocol(0xABC)).handle == 0xABC
    t = resolve_stream(FakeTorchStream(0x55, 1))
    assert (t.handle, t.device, t.source) == (0x55, 1, "torch.cuda.Stream")
    c = resolve_stream(FakeCupyStream(0x77, 0))
    assert (c.handle, c.device) == (0x77, 0)


@pytest.mark.parametrize("bad,error", [(True, TypeError), (-1, ValueError), ("0", TypeError), (1.5, TypeError),
                                       (CudaStreamProtocol(5, version=1), TypeError),
                                       (CudaStreamProtocol(-5), ValueError), (object(), TypeError)])
def test_bad_streams(bad, error):
    with pytest.raises(error):
        resolve_stream(bad)


def test_cuda_stream_protocol_must_return_pair():
    class Bad:
        def __cuda_stream__(self):
            return 5

    with pytest.raises(TypeError, match="version, handle"):
        resolve_stream(Bad())


class CAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


def cai(ptr=0x7000_0000, shape=(16,), typestr="<f4", strides=None, version=3, **extra):
    return dict(data=(ptr, False), shape=shape, typestr=typestr, strides=strides, version=version, **extra)


def test_cuda_array_interface_versions():
    for v in range(4):
        ref = resolve_buffer(CAI(**cai(version=v)))
        assert (ref.ptr, ref.nbytes, ref.device) == (0x7000_0000, 64, None)


def test_cuda_array_interface_layouts():
    assert resolve_buffer(CAI(**cai(shape=(4, 5), typestr="<f8"))).nbytes == 160
    assert resolve_buffer(CAI(**cai(shape=(4, 5), typestr="<f8", strides=(8, 32)))).nbytes == 160  # Fortran
    with pytest.raises(ValueError, match="not contiguous"):
        resolve_buffer(CAI(**cai(shape=(4, 5), typestr="<f8", strides=(80, 8))))
    with pytest.raises(ValueError, match="not contiguous"):
        resolve_buffer(CAI(**cai(shape=(4,), strides=(-4,))))
    with pytest.raises(ValueError, match="empty"):
        resolve_buffer(CAI(**cai(shape=(0, 3))))
    with pytest.raises(ValueError, match="masked"):
        resolve_buffer(CAI(**cai(mask=object())))
    with pytest.raises(ValueError, match="NULL"):
        resolve_buffer(CAI(**cai(ptr=0)))
    for ptr in (-16, 1 << 64):  # not "0x-10 is host memory" later on
        with pytest.raises(ValueError, match=f"data pointer {ptr} is not an address: a pointer is an unsigned 64-bit"):
            resolve_buffer(CAI(**cai(ptr=ptr)))
    with pytest.raises(ValueError, match="version"):
        resolve_buffer(CAI(**cai(version=9)))
    with pytest.raises(ValueError, match="required key"):
        parse_cuda_array_interface({"shape": (1,), "typestr": "<f4"})


@given(shape=st.lists(st.integers(min_value=1, max_value=6), min_size=0, max_size=4),
       typestr=st.sampled_from(["<f4", "<f8", "|u1", "<i2", "<c16", "|b1"]),
       order=st.sampled_from(["C", "F", None]), version=st.integers(min_value=0, max_value=3))
def test_cuda_array_interface_property(shape, typestr, order, version):
    itemsize = np.dtype(typestr).itemsize
    strides = None
    if order is not None and shape:
        strides = np.empty(shape, dtype=typestr, order=order).strides
    ref = parse_cuda_array_interface(cai(shape=tuple(shape), typestr=typestr, strides=strides, version=version))
    assert ref.nbytes == int(np.prod(shape)) * itemsize


def test_host_memory_is_refused_with_a_hint():
    for host in (np.zeros(8), bytearray(8), memoryview(b"abcd")):
        with pytest.raises(ValueError, match="host memory.*DeviceBuffer.from_numpy"):
            resolve_buffer(host)


def test_raw_pointer_pairs():
    assert resolve_buffer((0x1000, 256)).nbytes == 256
    for bad, error in [((0, 256), ValueError), ((0x1000, 0), ValueError), ((0x1000,), TypeError),
                       ((0x1000, 1.5), TypeError), (0x1000, TypeError), (None, TypeError), ("x", TypeError)]:
        with pytest.raises(error):
            resolve_buffer(bad)


class FakeTorchTensor:
    __module__ = "torch"

    def __init__(self, cuda=True, contiguous=True, numel=10):
        self.is_cuda, self._contiguous, self._numel = cuda, contiguous, numel
        self.device = type("device", (), {"index": 0, "type": "cuda" if cuda else "cpu"})()

    def data_ptr(self):
        return 0x9000

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def is_contiguous(self):
        return self._contiguous

    def numel(self):
        return self._numel

    def element_size(self):
        return 4


def test_torch_like_tensors():
    ref = resolve_buffer(FakeTorchTensor())
    assert (ref.ptr, ref.nbytes, ref.device) == (0x9000, 40, 0)
    with pytest.raises(ValueError, match="host memory"):
        resolve_buffer(FakeTorchTensor(cuda=False))
    with pytest.raises(ValueError, match="not contiguous"):
        resolve_buffer(FakeTorchTensor(contiguous=False))
    with pytest.raises(ValueError, match="empty"):
        resolve_buffer(FakeTorchTensor(numel=0))


# A hand-made DLPack capsule, as a CUDA producer would hand out.
class _Dev(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Dev), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackProducer:
    def __init__(self, device_type=2, device_id=1, shape=(3, 4), strides=None, bits=32, offset=64):
        self.device_type, self.device_id = device_type, device_id
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        t = _Tensor(0xD000_0000, _Dev(device_type, device_id), len(shape), _DType(2, bits, 1),
                    ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                    ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides else None, offset)
        self._managed = _Managed(t, None, None)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._capsule = new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None):
        return self._capsule


def test_dlpack_cuda_tensor():
    ref = resolve_buffer(DLPackProducer())
    assert (ref.ptr, ref.nbytes, ref.device) == (0xD000_0000 + 64, 48, 1)
    assert parse_dlpack_capsule(DLPackProducer(shape=(5,), bits=64)._capsule).nbytes == 40
    with pytest.raises(ValueError, match="not contiguous"):
        resolve_buffer(DLPackProducer(shape=(3, 4), strides=(8, 1)))
    with pytest.raises(ValueError, match="host memory"):
        resolve_buffer(DLPackProducer(device_type=1))
    with pytest.raises(ValueError, match="host memory"):
        resolve_buffer(DLPackProducer(device_type=3))
    with pytest.raises(TypeError, match="not a CUDA device"):
        resolve_buffer(DLPackProducer(device_type=4))


def test_numpy_dlpack_is_host():
    with pytest.raises(ValueError, match="host memory"):
        parse_dlpack_capsule(np.arange(4).__dlpack__())


# ---- DLPack 1.x and l2ctl's own export -------------------------------------------------------------------


class VersionedOnly:
    """A producer that hands out what l2ctl.DeviceBuffer exports, and records the arguments it got."""

    def __init__(self, buf):
        self.buf, self.calls = buf, []

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None):
        self.calls.append((stream, max_version))
        return self.buf.__dlpack__(stream=stream, max_version=max_version)


class OldProducer:
    """Knows neither stream= nor max_version= (DLPack before the array API)."""

    def __init__(self, buf):
        self.buf = buf

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()

    def __dlpack__(self):
        return self.buf.__dlpack__()


# The names consumed capsules get: a capsule keeps only a pointer to its name, so the bytes must outlive it.
_USED_NAMES = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}


def _consume(capsule, name: bytes):
    """What a consumer does: take the tensor (rename the capsule), later call its deleter."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    set_name = ctypes.pythonapi.PyCapsule_SetName
    set_name.restype, set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, name)
    assert set_name(capsule, _USED_NAMES[name]) == 0
    from l2ctl import _dlpack

    struct = _dlpack._DLManagedTensorVersioned if name == b"dltensor_versioned" else _dlpack._DLManagedTensor
    managed = struct.from_address(address)
    return lambda: managed.deleter(address)


def test_device_buffer_exports_dlpack_both_versions(fake):
    import gc

    from l2ctl import _dlpack

    buf = l2ctl.DeviceBuffer(4096, dtype=np.float32, shape=(32, 32))
    assert buf.__dlpack_device__() == (2, 0)
    producer = VersionedOnly(buf)
    ref = resolve_buffer(producer)  # l2ctl asks for a versioned capsule, no synchronisation
    assert producer.calls == [(-1, (1, 0))] and (ref.ptr, ref.nbytes, ref.device) == (buf.ptr, 4096, 0)
    assert resolve_buffer(OldProducer(buf)).nbytes == 4096
    gc.collect()
    assert len(_dlpack._live) == 0 and buf._exports == 0  # unconsumed capsules released what they held
    info = _dlpack.read_capsule(buf.__dlpack__(max_version=(1, 2)))
    assert info.shape == (32, 32) and info.itemsize == 4 and info.strides is None
    legacy = buf.__dlpack__(max_version=(0, 8))
    assert ctypes.pythonapi.PyCapsule_IsValid(ctypes.py_object(legacy), b"dltensor")


def test_a_consumed_export_keeps_the_memory_until_its_deleter(fake):
    import gc

    from l2ctl import _dlpack

    buf = l2ctl.DeviceBuffer(MiB)
    capsule = buf.__dlpack__(max_version=(1, 0))
    release = _consume(capsule, b"dltensor_versioned")
    del capsule
    gc.collect()
    assert len(_dlpack._live) == 1  # consumed: the consumer owns it now
    buf.free()
    assert buf.freed is False  # l2ctl refuses it; the memory waits for the consumer
    with pytest.raises(ValueError, match="freed"):
        resolve_buffer(buf)
    release()
    assert buf.freed and len(_dlpack._live) == 0
    legacy = l2ctl.DeviceBuffer(MiB)
    release = _consume(legacy.__dlpack__(), b"dltensor")
    legacy.free()
    release()
    assert legacy.freed


def test_dlpack_export_refusals(fake):
    buf = l2ctl.DeviceBuffer(MiB)
    with pytest.raises(BufferError, match="copy"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not"):
        buf.__dlpack__(dl_device=(1, 0))
    with pytest.raises(TypeError):
        buf.__dlpack__(stream="s")
    odd = l2ctl.DeviceBuffer(16, dtype=np.dtype([("a", np.int32), ("b", np.int32)]))
    with pytest.raises(BufferError, match="no DLPack"):
        odd.__dlpack__()
    odd.free()
    assert odd.freed  # the refused export holds nothing back
    buf.free()
    with pytest.raises(BufferError, match="freed"):
        buf.__dlpack__()


def test_cuda_core_like_objects():
    """cuda.core's Device (device_id), Stream (__cuda_stream__ and .device) and Buffer (DLPack)."""

    class Device:
        device_id = 1

    class Stream:
        device = Device()

        def __cuda_stream__(self):
            return (0, 0xABC)

    ref = resolve_stream(Stream())
    assert (ref.handle, ref.device) == (0xABC, 1)
    from l2ctl._device import _index_of

    assert _index_of(Device()) == 1
