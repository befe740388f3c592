"""A multi-op step that mixes the gallery's patterns on separate buffers: an embedding gather from a table,
a broadcast add of a bias over a streaming activation, and a scatter-add into an accumulator. Offered
all four tensors, the tuner has to find the one whose persistence pays most (and not the textbook's
choice, the big embedding table)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import GiB, TorchWorkload, check_fraction
from ._frameworks import on_torch_stream, require_torch
from .gathers import ROW_FLOATS, SAMPLES

__all__ = ["TrainingStep"]


class TrainingStep(TorchWorkload):
    """Per step: ``e = F.embedding(lookup, table)`` (128 MiB out), ``h = x + bias`` (x of 512 MiB) and
    ``acc.zero_(); acc.index_add_(0, index, values)`` (768 MiB of updates). Default sizes: bias 0.16,
    table 0.64 and acc 0.64 of the L2 (the sizes where, alone, the gather gains nothing and the
    scatter-add gains most: docs/results.md)."""

    name = "step"
    hot = "table"
    outputs = ("h", "acc", "e")

    def __init__(self, device: object = None, *, bias_bytes: Optional[int] = None, table_bytes: Optional[int] = None,
                 acc_bytes: Optional[int] = None, seed: int = 0) -> None:
        super().__init__(device)
        torch, dev, g = self._torch(seed)
        cols = max(1, check_fraction(bias_bytes, 0.16, self.device, "bias_bytes") // 4)
        self.bias = torch.randn(cols, device=dev, generator=g)
        self.x = torch.randn(max(1, (GiB // 2) // (4 * cols)), cols, device=dev, generator=g)
        self.h = torch.empty_like(self.x)
        rows = max(1, check_fraction(table_bytes, 0.64, self.device, "table_bytes") // (4 * ROW_FLOATS))
        self.table = torch.randn(rows, ROW_FLOATS, device=dev, generator=g)
        self.lookup = torch.randint(0, rows, ((128 << 20) // (4 * ROW_FLOATS),), device=dev, generator=g)
        self.samples = torch.randint(0, self.lookup.numel(), (SAMPLES,), device=dev, generator=g)
        slots = max(1, check_fraction(acc_bytes, 0.64, self.device, "acc_bytes") // 4)
        updates = (768 << 20) // 12
        self.acc = torch.zeros(slots, device=dev)
        self.index = torch.randint(0, slots, (updates,), device=dev, generator=g)
        self.values = torch.randint(1, 5, (updates,), device=dev, generator=g).to(torch.float32)
        self.expected = torch.zeros(slots, dtype=torch.float64, device=dev).index_add_(
            0, self.index, self.values.to(torch.float64))
        self.e: Any = None
        self._tensors = {"x": self.x, "bias": self.bias, "table": self.table, "acc": self.acc}

    def shape(self) -> dict[str, Any]:
        return {"x_rows": int(self.x.shape[0]), "lookups": int(self.lookup.numel()), "updates": int(self.index.numel())}

    def enqueue(self, stream: object) -> None:
        torch = require_torch()
        with on_torch_stream(stream):
            self.e = torch.nn.functional.embedding(self.lookup, self.table)
            torch.add(self.x, self.bias, out=self.h)
            self.acc.zero_()
            self.acc.index_add_(0, self.index, self.values)

    def verify(self, stream: object) -> bool:
        torch = require_torch()
        if self.e is None:
            return False
        with on_torch_stream(stream):
            last = self.x.shape[0] - 1
            return (bool(torch.equal(self.e[self.samples], self.table[self.lookup[self.samples]]))
                    and not bool(torch.isnan(self.h).any())
                    and bool(torch.equal(self.h[last], self.x[last] + self.bias))
                    and bool(torch.equal(self.acc.to(torch.float64), self.expected)))
