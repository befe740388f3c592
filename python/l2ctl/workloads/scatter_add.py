"""A scatter-add: ``acc.zero_(); acc.index_add_(0, index, values)``, random updates into an accumulator while
the indices and values stream past (an embedding gradient, a histogram). Persisting the accumulator pays
when it does not fit the L2 beside the stream (measured: docs/results.md)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import GiB, GalleryWorkload, check_fraction
from ._frameworks import on_torch_stream, require_torch

__all__ = ["ScatterAdd"]


class ScatterAdd(GalleryWorkload):
    """An accumulator of ``acc_bytes`` floats (default 0.64 x L2: 32 MiB on a 50 MiB L2) and
    ``update_bytes`` of int64 indices and float32 values (12 bytes per update). The values are small
    integers, so every sum is exact and the result can be checked bit for bit whatever the order of the
    atomic adds."""

    name = "scatter-add"
    framework = "torch"
    hot = "acc"

    def __init__(self, device: object = None, *, acc_bytes: Optional[int] = None, update_bytes: int = 3 * GiB // 2,
                 seed: int = 0) -> None:
        super().__init__(device)
        torch = require_torch()
        acc = check_fraction(acc_bytes, 0.64, self.device, "acc_bytes")
        slots = max(1, acc // 4)
        updates = max(1, update_bytes // 12)
        dev = torch.device("cuda", self.device)
        g = torch.Generator(device=dev).manual_seed(seed)
        self.acc = torch.zeros(slots, dtype=torch.float32, device=dev)
        self.index = torch.randint(0, slots, (updates,), device=dev, generator=g)
        self.values = torch.randint(1, 5, (updates,), device=dev, generator=g).to(torch.float32)
        self.expected = torch.zeros(slots, dtype=torch.float64, device=dev).index_add_(
            0, self.index, self.values.to(torch.float64))
        self._tensors = {"acc": self.acc, "index": self.index, "values": self.values}

    def shape(self) -> dict[str, Any]:
        return {"slots": int(self.acc.numel()), "updates": int(self.index.numel())}

    def enqueue(self, stream: object) -> None:
        with on_torch_stream(stream):
            self.prepare()
            self.step()

    def prepare(self) -> None:
        """The eager part of a step, on the current torch stream: the accumulator zeroed."""
        self.acc.zero_()

    def step(self) -> None:
        """The part of a step worth graphing or compiling, on the current torch stream. The zeroing stays out:
        compiled together, Inductor scatters into a temporary and copies it into ``acc`` (its kernels
        ``fused_zero``, ``fused_index_add_zero``, ``fused_copy_``), so a window on ``acc`` misses the scatter."""
        self.acc.index_add_(0, self.index, self.values)

    def poison(self, stream: object) -> None:
        with on_torch_stream(stream):
            self.acc.fill_(float("nan"))

    def verify(self, stream: object) -> bool:
        torch = require_torch()
        with on_torch_stream(stream):
            return bool(torch.equal(self.acc.to(torch.float64), self.expected))
