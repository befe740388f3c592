"""PyTorch and CuPy for the gallery: importing them (with the reason when they cannot be used) and running
framework operations on the stream the harness gives (an l2ctl stream, a framework stream, a handle)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator, Optional

from .._interop import resolve_stream

__all__ = ["torch_missing", "cupy_missing", "require_torch", "require_cupy", "on_torch_stream", "on_cupy_stream"]


def torch_missing() -> Optional[str]:
    """Why the PyTorch workloads cannot run here (None: they can)."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch (pip install torch)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver)"
    return None


def cupy_missing() -> Optional[str]:
    """Why the CuPy workloads cannot run here (None: they can)."""
    try:
        import cupy
        import cupyx.scipy.sparse  # noqa: F401  (cuSPARSE)
    except ImportError:
        return "needs CuPy (pip install cupy-cuda12x or cupy-cuda13x)"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # CUDARuntimeError and driver errors: the reason is the message
        return f"CuPy cannot reach a GPU: {exc}"
    return None


def require_torch() -> Any:
    return _require(torch_missing(), "torch")


def require_cupy() -> Any:
    return _require(cupy_missing(), "cupy")


def _require(reason: Optional[str], module: str) -> Any:
    """The framework's module, or a RuntimeError with the reason it cannot be used."""
    if reason is not None:
        raise RuntimeError(reason)
    return importlib.import_module(module)


# Framework stream objects for raw handles, made once per handle (they are cheap but not free).
_torch_streams: dict[int, Any] = {}
_cupy_streams: dict[int, Any] = {}


@contextlib.contextmanager
def on_torch_stream(stream: object) -> Iterator[Any]:
    """Make ``stream`` PyTorch's current stream inside the block (a torch stream is used as it is)."""
    import torch

    if isinstance(stream, torch.cuda.Stream):
        with torch.cuda.stream(stream):
            yield stream
        return
    ref = resolve_stream(stream)
    ts = _torch_streams.get(ref.handle)
    if ts is None:
        ts = _torch_streams[ref.handle] = torch.cuda.ExternalStream(ref.handle, device=ref.device)
    with torch.cuda.stream(ts):
        yield ts


@contextlib.contextmanager
def on_cupy_stream(stream: object) -> Iterator[Any]:
    """Make ``stream`` CuPy's current stream inside the block (a CuPy stream is used as it is)."""
    import cupy

    if isinstance(stream, cupy.cuda.Stream):
        with stream:
            yield stream
        return
    ref = resolve_stream(stream)
    cs = _cupy_streams.get(ref.handle)
    if cs is None:
        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        if from_external is not None:  # CuPy 14: through the __cuda_stream__ protocol
            cs = from_external(_Handle(ref.handle))
        else:
            device = ref.device if ref.device is not None else cupy.cuda.runtime.getDevice()
            cs = cupy.cuda.ExternalStream(ref.handle, device)
        _cupy_streams[ref.handle] = cs
    with cs:
        yield cs


class _Handle:
    """A raw stream handle as the CUDA stream protocol presents it."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)
