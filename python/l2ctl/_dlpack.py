"""DLPack both ways, with ctypes: reading the capsule a producer's ``__dlpack__`` returns (legacy
``dltensor`` and DLPack 1.x ``dltensor_versioned``), and exporting an l2ctl.DeviceBuffer as one.

Written with ctypes rather than in the extension so that it needs no GPU and the simulator exercises
the same code. The structures follow dlpack.h (DLPack 1.0): a DLTensor inside a DLManagedTensor, or
inside a DLManagedTensorVersioned with a version and flags in front of it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

__all__ = ["DLPACK_VERSION", "DL_CUDA", "DLTensorInfo", "read_capsule", "export_capsule", "request_capsule",
           "check_dlpack_device", "HOST_HINT"]

DLPACK_VERSION = (1, 0)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
HOST_HINT = (
    "l2ctl needs device memory (an access-policy window covers device addresses); copy the data to the "
    "GPU first, e.g. l2ctl.DeviceBuffer.from_numpy(array), torch.as_tensor(array, device='cuda') or "
    "cupy.asarray(array)"
)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_capsule_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"


class DLTensorInfo(NamedTuple):
    """What l2ctl reads from a DLPack tensor."""

    ptr: int
    device_id: int
    shape: tuple[int, ...]
    itemsize: int
    strides: Optional[tuple[int, ...]]  # in bytes; None: C-contiguous


def check_dlpack_device(device_type: int, what: str) -> None:
    """Host memory is refused with the hint; other non-CUDA devices with a TypeError."""
    if device_type in (DL_CPU, DL_CUDA_HOST):
        raise ValueError(f"{what} is in host memory (DLPack device type {device_type}); {HOST_HINT}")
    if device_type not in (DL_CUDA, DL_CUDA_MANAGED):
        raise TypeError(f"{what} lives on DLPack device type {device_type}, not a CUDA device")


def read_capsule(capsule: object) -> DLTensorInfo:
    """Read an unconsumed ``dltensor`` or ``dltensor_versioned`` capsule. It is not consumed: its own
    destructor frees it when the caller drops it."""
    if _api.PyCapsule_IsValid(capsule, _VERSIONED):
        managed_v = _DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, _VERSIONED))
        if managed_v.version.major != DLPACK_VERSION[0]:
            raise TypeError(f"DLPack {managed_v.version.major}.{managed_v.version.minor} is not supported "
                            f"(l2ctl reads {DLPACK_VERSION[0]}.x)")
        t = managed_v.dl_tensor
    elif _api.PyCapsule_IsValid(capsule, _LEGACY):
        t = _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY)).dl_tensor
    else:
        raise TypeError("expected a DLPack capsule named 'dltensor' or 'dltensor_versioned' (an unconsumed "
                        "__dlpack__() result)")
    check_dlpack_device(t.device.device_type, "the DLPack tensor")
    if t.ndim < 0:
        raise ValueError(f"DLPack tensor has ndim {t.ndim}")
    bits = t.dtype.bits * t.dtype.lanes
    if bits % 8:
        raise ValueError(f"DLPack element of {bits} bits is not a whole number of bytes")
    itemsize = bits // 8
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = tuple(int(t.strides[i]) * itemsize for i in range(t.ndim)) if t.strides else None
    return DLTensorInfo(int(t.data or 0) + int(t.byte_offset), int(t.device.device_id), shape, itemsize, strides)


def request_capsule(producer: Any) -> object:
    """``producer.__dlpack__`` as the array API asks: no synchronisation (stream=-1: l2ctl reads only the
    address, never the data) and the newest DLPack l2ctl reads, falling back for older producers."""
    for kwargs in ({"stream": -1, "max_version": DLPACK_VERSION}, {"stream": -1}, {"stream": None}, {}):
        try:
            return producer.__dlpack__(**kwargs)
        except TypeError:
            continue
    raise TypeError(f"{type(producer).__name__}.__dlpack__ accepts none of the standard signatures")


# ---- export ---------------------------------------------------------------------------------------------

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool


class _Export:
    """The C structures of one exported tensor and what keeps its memory alive until the consumer's deleter."""

    def __init__(self, managed: ctypes.Structure, shape: Any, owner: Any, release: Callable[[], None]) -> None:
        self.managed, self.shape, self.owner, self.release = managed, shape, owner, release


_live: dict[int, _Export] = {}  # address of the managed struct -> its export
_live_lock = threading.Lock()


def _delete(address: Optional[int]) -> None:  # also the consumer's deleter: any thread (ctypes takes the GIL)
    if address:
        with _live_lock:
            export = _live.pop(address, None)
        if export is not None:
            export.release()


def _on_capsule_destroyed(capsule: Optional[int]) -> None:
    # An unconsumed capsule owns its tensor; a consumed one was renamed "used_..." and the consumer
    # calls the deleter itself.
    for name in (_VERSIONED, _LEGACY) if capsule else ():
        if _capsule_is_valid_raw(capsule, name):
            _delete(_capsule_pointer_raw(capsule, name))
            return


# The C function pointers handed out; module globals, so they outlive every capsule.
_deleter: Any = _Deleter(_delete)
_capsule_destructor: Any = _CapsuleDestructor(_on_capsule_destroyed)


def export_capsule(ptr: int, nbytes: int, device: int, dtype: np.dtype, shape: tuple[int, ...], owner: Any,
                   release: Callable[[], None], *, versioned: bool) -> object:
    """A DLPack capsule over ``nbytes`` of device memory at ``ptr`` (C-contiguous ``shape`` of ``dtype``).
    ``owner`` stays referenced and ``release()`` runs once, when the consumer (or the unconsumed
    capsule) lets go."""
    code = _DTYPE_CODES.get(dtype.kind)
    if code is None or dtype.fields is not None or dtype.itemsize * 8 > 255:
        raise BufferError(f"dtype {dtype} has no DLPack equivalent")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != nbytes:
        raise BufferError(f"shape {shape} of {dtype} does not hold exactly {nbytes} bytes")
    c_shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    tensor = _DLTensor(ctypes.c_void_p(ptr), _DLDevice(DL_CUDA, device), len(shape),
                       _DLDataType(code, dtype.itemsize * 8, 1), ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64)),
                       None, 0)
    managed: ctypes.Structure = (_DLManagedTensorVersioned(_DLPackVersion(*DLPACK_VERSION), None, _deleter, 0, tensor)
                                 if versioned else _DLManagedTensor(tensor, None, _deleter))
    address = ctypes.addressof(managed)
    with _live_lock:
        _live[address] = _Export(managed, c_shape, owner, release)
    try:
        return _api.PyCapsule_New(address, _VERSIONED if versioned else _LEGACY, _capsule_destructor)
    except BaseException:
        _delete(address)
        raise
