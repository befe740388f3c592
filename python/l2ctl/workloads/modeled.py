"""Modeled workloads, for the simulator (l2ctl.testing): stand-ins for the gallery (l2ctl.workloads.gallery) whose
kernels only take time, so the tuner's logic and the gallery benchmark run without a GPU or a framework.

Each kernel streams some bytes and re-reads one of the workload's buffers (its *hot* buffer); the model
(l2ctl.testing.model) decides how much persistence of that buffer saves. A kernel with a compute floor
longer than its memory time gains nothing from persistence (the gathers' case). Sizes follow the
device's L2 size, like the real gallery's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import _backend
from .._device import resolve_device
from .._interop import resolve_stream
from .._memory import DeviceBuffer
from . import Closing
from ._base import GiB, MiB, fraction_of_l2

__all__ = ["ModeledKernel", "ModeledWorkload"]


@dataclass(frozen=True)
class ModeledKernel:
    """One launch: ``streamed_bytes`` read and written once (``read_fraction`` of them reads), the buffer
    named ``hot`` re-read ``hot_reads`` bytes in total, at least ``compute_ms`` long."""

    name: str
    streamed_bytes: float
    hot: Optional[str] = None
    hot_reads: float = 0.0
    compute_ms: float = 0.0
    read_fraction: float = 0.5
    given: tuple[str, ...] = ()  # the buffers passed to it (the hot one when empty): what its node's arguments show


class ModeledWorkload(Closing):
    """Buffers (name -> bytes, allocated lazily on the simulated device) and the kernels one run launches.
    ``candidates()`` offers every buffer to the tuner; ``verify`` checks that the last run launched all
    its kernels on the stream it was given."""

    def __init__(self, name: str, buffers: dict[str, int], kernels: Sequence[ModeledKernel], *,
                 hot: Optional[str] = None, device: object = None) -> None:
        if not hasattr(_backend.current(), "launch_modeled_kernel"):
            raise RuntimeError("modeled workloads run on the simulator only (l2ctl.testing.FakeBackend)")
        for k in kernels:
            for used in ((k.hot,) if k.hot is not None else ()) + k.given:
                if used not in buffers:
                    raise ValueError(f"kernel {k.name}: no buffer named {used!r}")
        self.name, self.kernels, self.hot = name, tuple(kernels), hot or next(iter(buffers))
        self.device = resolve_device(device)
        self.buffers = {n: DeviceBuffer(nbytes, device) for n, nbytes in buffers.items()}
        self._launched = 0

    # ---- the presets, sized from the device ------------------------------------------------------------

    @classmethod
    def broadcast(cls, device: object = None) -> "ModeledWorkload":
        """x + bias: a bias of 0.32 x L2 re-read once per row while 1 GiB streams in and out."""
        bias = fraction_of_l2(0.32, device)
        return cls("broadcast", {"bias": bias, "x": GiB, "out": GiB},
                   [ModeledKernel("add", 2 * GiB, "bias", GiB)], hot="bias", device=device)

    @classmethod
    def scatter_add(cls, device: object = None) -> "ModeledWorkload":
        """acc.index_add_: an accumulator of 0.64 x L2 updated at random while 1.5 GiB of updates stream."""
        acc = fraction_of_l2(0.64, device)
        # each update is an atomic read-modify-write of a 32-byte sector of the accumulator
        return cls("scatter-add", {"acc": acc, "index": GiB, "values": GiB // 2},
                   [ModeledKernel("index_add", 1.5 * GiB, "acc", 32 * (1.5 * GiB / 12), read_fraction=0.98)],
                   hot="acc", device=device)

    @classmethod
    def gather(cls, device: object = None) -> "ModeledWorkload":
        """index_select from a table of 0.64 x L2: bound by its gathers' latency, not by DRAM."""
        table = fraction_of_l2(0.64, device)
        return cls("gather", {"table": table, "index": 64 * MiB, "out": 512 * MiB},
                   [ModeledKernel("index_select", 576 * MiB, "table", 512 * MiB, compute_ms=1.0)], hot="table",
                   device=device)

    @classmethod
    def mixed_step(cls, device: object = None) -> "ModeledWorkload":
        """A step mixing the three: a gather, a broadcast and a scatter-add, each on its own buffer."""
        bias, table, acc = (fraction_of_l2(f, device) for f in (0.16, 0.64, 0.64))
        return cls("step", {"x": GiB // 2, "bias": bias, "table": table, "acc": acc},
                   [ModeledKernel("embedding", 160 * MiB, "table", 128 * MiB, compute_ms=0.3),
                    ModeledKernel("add", GiB, "bias", GiB // 2),
                    ModeledKernel("index_add", 768 * MiB, "acc", 32 * (768 * MiB / 12), read_fraction=0.98)],
                   hot="table", device=device)

    # ---- the workload protocol -------------------------------------------------------------------------

    def enqueue(self, stream: object) -> None:
        handle = resolve_stream(stream).handle
        backend: Any = _backend.current()
        for k in self.kernels:
            hot = None if k.hot is None else (self.buffers[k.hot].ptr, self.buffers[k.hot].nbytes)
            backend.launch_modeled_kernel(handle, k.name, streamed_bytes=k.streamed_bytes, hot=hot,
                                          hot_reads=k.hot_reads, compute_ms=k.compute_ms,
                                          read_fraction=k.read_fraction,
                                          args=tuple(self.buffers[n].ptr for n in k.given))
        self._launched += len(self.kernels)

    def poison(self, stream: object) -> None:
        self._launched = 0

    def verify(self, stream: object) -> bool:
        return self._launched >= len(self.kernels)

    def candidates(self) -> dict[str, DeviceBuffer]:
        return dict(self.buffers)

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name, "modeled": True,
                **{f"{n}_bytes": b.nbytes for n, b in self.buffers.items()}}

    def close(self) -> None:
        for b in self.buffers.values():
            b.free()
