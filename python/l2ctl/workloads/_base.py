"""What the gallery's workloads share: sizes from the device, the buffers offered to the tuner."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional

from .._device import properties
from .._plan import check_nbytes
from .._units import GiB, MiB
from . import Closing
from ._frameworks import on_torch_stream, require_torch

__all__ = ["GalleryWorkload", "TorchWorkload", "fraction_of_l2", "MiB", "GiB"]


def fraction_of_l2(fraction: float, device: object = None, *, multiple: int = MiB) -> int:
    """``fraction`` of the device's L2 size, rounded down to ``multiple`` bytes (at least one multiple):
    gallery sizes follow the GPU at hand, never one GPU's constants."""
    return max(multiple, int(fraction * properties(device).l2_cache_size) // multiple * multiple)


class GalleryWorkload(Closing):
    """A framework workload: ``enqueue(stream)`` runs one step on ``stream``; ``poison``/``verify`` make the
    output wrong before a measurement and check it after; ``candidates()`` names the buffers worth
    trying to persist; ``hot`` is the one the textbook recipe would persist."""

    name: ClassVar[str] = ""
    framework: ClassVar[str] = ""
    hot: ClassVar[str] = ""

    def __init__(self, device: object = None) -> None:
        self.device = properties(device).index
        self._tensors: dict[str, Any] = {}

    def candidates(self) -> dict[str, Any]:
        return dict(self._tensors)

    def sizes(self) -> dict[str, int]:
        return {name: int(t.nbytes) for name, t in self._tensors.items()}

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name, "framework": self.framework, "hot": self.hot,
                **{f"{name}_bytes": nbytes for name, nbytes in self.sizes().items()}, **self.shape()}

    def shape(self) -> dict[str, Any]:
        """The workload's own parameters for records (rows, lookups, ...)."""
        return {}

    def enqueue(self, stream: object) -> None:
        raise NotImplementedError

    def poison(self, stream: object) -> None:
        raise NotImplementedError

    def verify(self, stream: object) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the tensors (the framework's allocator frees them)."""
        self._tensors.clear()
        for name in list(vars(self)):
            if name not in ("device", "_tensors"):
                setattr(self, name, None)


class TorchWorkload(GalleryWorkload):
    """A PyTorch workload. One that defines ``prepare()`` (eager work) and ``step()`` (what a graph captures
    or torch.compile compiles), both on the current torch stream, runs them in ``enqueue``; others
    override it. ``poison`` fills the tensors named in ``outputs`` with NaN (those not made yet skipped)."""

    framework: ClassVar[str] = "torch"
    outputs: ClassVar[tuple[str, ...]] = ()
    prepare: Callable[[], None]
    step: Callable[[], None]

    def _torch(self, seed: int) -> tuple[Any, Any, Any]:
        """torch, this workload's CUDA device and a generator on it seeded with ``seed``."""
        torch = require_torch()
        dev = torch.device("cuda", self.device)
        return torch, dev, torch.Generator(device=dev).manual_seed(seed)

    def enqueue(self, stream: object) -> None:
        with on_torch_stream(stream):
            self.prepare()
            self.step()

    def poison(self, stream: object) -> None:
        with on_torch_stream(stream):
            for tensor in (getattr(self, name) for name in self.outputs):
                if tensor is not None:
                    tensor.fill_(float("nan"))


def check_fraction(value: Optional[int], default_fraction: float, device: object, name: str) -> int:
    """A size argument: the value given (bytes) or the default fraction of the L2."""
    return fraction_of_l2(default_fraction, device) if value is None else check_nbytes(value, name)
