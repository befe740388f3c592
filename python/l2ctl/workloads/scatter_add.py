"""A scatter-add: ``acc.zero_(); acc.index_add_(0, index, values)``, random updates into an accumulator while
the indices and values stream past (an embedding gradient, a histogram). Persisting the accumulator pays
when it does not fit the L2 beside the stream (measured: docs/results.md)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import GiB, TorchWorkload, check_fraction
from ._frameworks import on_torch_stream, require_torch

__all__ = ["ScatterAdd"]


class ScatterAdd(TorchWorkload):
    """An accumulator of ``acc_bytes`` floats (default 0.64 x L2: 32 MiB on a 50 MiB L2) and
    ``update_bytes`` of int64 indices and float32 values (12 bytes per update). The values are small
    integers, so every sum is exact and the result can be checked bit for bit whatever the order of the
    atomic adds."""

    name = "scatter-add"
    hot = "acc"
    outputs = ("acc",)

    def __init__(self, device: object = None, *, acc_bytes: Optional[int] = None, update_bytes: int = 3 * GiB // 2,
                 seed: int = 0, zero_in_step: bool = False) -> None:
        super().__init__(device)
        self.zero_in_step = bool(zero_in_step)
        torch, dev, g = self._torch(seed)
        slots = max(1, check_fraction(acc_bytes, 0.64, self.device, "acc_bytes") // 4)
        updates = max(1, update_bytes // 12)
        self.acc = torch.zeros(slots, dtype=torch.float32, device=dev)
        self.index = torch.randint(0, slots, (updates,), device=dev, generator=g)
        self.values = torch.randint(1, 5, (updates,), device=dev, generator=g).to(torch.float32)
        self.expected = torch.zeros(slots, dtype=torch.float64, device=dev).index_add_(
            0, self.index, self.values.to(torch.float64))
        self._tensors = {"acc": self.acc, "index": self.index, "values": self.values}

    def shape(self) -> dict[str, Any]:
        return {"slots": int(self.acc.numel()), "updates": int(self.index.numel())}

    def prepare(self) -> None:
        """The eager part of a step, on the current torch stream: the accumulator zeroed (unless
        ``zero_in_step``)."""
        if not self.zero_in_step:
            self.acc.zero_()

    def step(self) -> None:
        """The part of a step worth graphing or compiling, on the current torch stream. The zeroing stays out
        unless ``zero_in_step``: compiled together, Inductor scatters into a temporary of its own and copies
        it into ``acc`` (kernels ``fused_zero``, ``fused_index_add_zero``, ``fused_copy_``), so a window on
        ``acc`` misses the scatter (the gallery's ``scatter-add-compiled-temp`` row measures that)."""
        if self.zero_in_step:
            self.acc.zero_()
        self.acc.index_add_(0, self.index, self.values)

    def verify(self, stream: object) -> bool:
        torch = require_torch()
        with on_torch_stream(stream):
            return bool(torch.equal(self.acc.to(torch.float64), self.expected))
