"""A broadcast elementwise op: ``out = x + bias``, a (rows, n) tensor streaming past a bias of n floats that
every row re-reads. Persisting the bias pays when it is a good part of the L2 (measured: docs/results.md)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import GiB, TorchWorkload, check_fraction
from ._frameworks import on_torch_stream, require_torch

__all__ = ["BroadcastAdd"]


class BroadcastAdd(TorchWorkload):
    """``torch.add(x, bias, out=out)`` with ``bias`` of ``operand_bytes`` (default 0.32 x L2: 16 MiB on a
    50 MiB L2) and ``x`` of about ``stream_bytes`` (whole rows)."""

    name = "broadcast"
    hot = "bias"
    outputs = ("out",)

    def __init__(self, device: object = None, *, operand_bytes: Optional[int] = None, stream_bytes: int = GiB,
                 seed: int = 0) -> None:
        super().__init__(device)
        torch, dev, g = self._torch(seed)
        cols = max(1, check_fraction(operand_bytes, 0.32, self.device, "operand_bytes") // 4)
        rows = max(1, stream_bytes // (4 * cols))
        self.x = torch.randn(rows, cols, device=dev, generator=g)
        self.bias = torch.randn(cols, device=dev, generator=g)
        self.out = torch.empty_like(self.x)
        self._tensors = {"bias": self.bias, "x": self.x}
        self._check_rows = sorted({0, rows // 2, rows - 1})

    def shape(self) -> dict[str, Any]:
        return {"rows": int(self.x.shape[0]), "cols": int(self.x.shape[1])}

    def prepare(self) -> None:
        """Nothing to do eagerly before a step."""

    def step(self) -> None:
        """One step on the current torch stream (what a graph captures or torch.compile compiles)."""
        require_torch().add(self.x, self.bias, out=self.out)

    def verify(self, stream: object) -> bool:
        torch = require_torch()
        with on_torch_stream(stream):
            if bool(torch.isnan(self.out).any()):
                return False
            return all(bool(torch.equal(self.out[r], self.x[r] + self.bias)) for r in self._check_rows)
