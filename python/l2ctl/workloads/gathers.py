"""Random gathers from a table: ``index_select``, ``F.embedding`` and ``F.embedding_bag``. Each output row
is a random table row; the kernels are bound by the latency of their scattered loads more than by DRAM
bandwidth, which is why persisting the table buys little or nothing (measured: docs/results.md)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import TorchWorkload, check_fraction
from ._frameworks import on_torch_stream, require_torch

__all__ = ["IndexSelect", "Embedding", "EmbeddingBag"]

ROW_FLOATS = 64  # 256-byte rows: an embedding of dimension 64
SAMPLES = 4096  # output rows checked against the table after a run


class _Gather(TorchWorkload):
    hot = "table"
    outputs = ("result",)

    def __init__(self, device: object, table_bytes: Optional[int], lookups: int, seed: int, integer_table: bool) -> None:
        super().__init__(device)
        torch, dev, g = self._torch(seed)
        rows = max(1, check_fraction(table_bytes, 0.64, self.device, "table_bytes") // (4 * ROW_FLOATS))
        if integer_table:  # sums of small integers are exact: a bag's sum can be checked bit for bit
            self.table = torch.randint(-8, 8, (rows, ROW_FLOATS), device=dev, generator=g).to(torch.float32)
        else:
            self.table = torch.randn(rows, ROW_FLOATS, device=dev, generator=g)
        self.index = torch.randint(0, rows, (lookups,), device=dev, generator=g)
        self.samples = torch.randint(0, lookups, (SAMPLES,), device=dev, generator=g)
        self.result: Any = None
        self._tensors = {"table": self.table, "index": self.index}

    def shape(self) -> dict[str, Any]:
        return {"table_rows": int(self.table.shape[0]), "row_floats": ROW_FLOATS, "lookups": int(self.index.numel())}

    def verify(self, stream: object) -> bool:
        torch = require_torch()
        if self.result is None:
            return False
        with on_torch_stream(stream):
            return bool(torch.equal(self.result[self.samples], self._expected()))

    def _expected(self) -> Any:
        """The sampled output rows as they should be, computed from the table."""
        return self.table[self.index[self.samples]]


class IndexSelect(_Gather):
    """``torch.index_select(table, 0, index, out=out)``: a table of ``table_bytes`` (default 0.64 x L2) in
    256-byte rows, ``out_bytes`` of output."""

    name = "index_select"

    def __init__(self, device: object = None, *, table_bytes: Optional[int] = None, out_bytes: int = 512 << 20,
                 seed: int = 0) -> None:
        super().__init__(device, table_bytes, max(1, out_bytes // (4 * ROW_FLOATS)), seed, False)
        torch = require_torch()
        self.result = torch.empty(self.index.numel(), ROW_FLOATS, device=self.table.device)

    def enqueue(self, stream: object) -> None:
        torch = require_torch()
        with on_torch_stream(stream):
            torch.index_select(self.table, 0, self.index, out=self.result)


class Embedding(_Gather):
    """``F.embedding(index, table)`` (a new output tensor per call, as a model's forward makes)."""

    name = "embedding"

    def __init__(self, device: object = None, *, table_bytes: Optional[int] = None, out_bytes: int = 512 << 20,
                 seed: int = 0) -> None:
        super().__init__(device, table_bytes, max(1, out_bytes // (4 * ROW_FLOATS)), seed, False)

    def enqueue(self, stream: object) -> None:
        torch = require_torch()
        with on_torch_stream(stream):
            self.result = torch.nn.functional.embedding(self.index, self.table)


class EmbeddingBag(_Gather):
    """``F.embedding_bag(index, table, offsets, mode="sum")``: bags of ``bag`` lookups summed; the table holds
    small integers so each bag's sum is exact."""

    name = "embedding_bag"

    def __init__(self, device: object = None, *, table_bytes: Optional[int] = None, gathered_bytes: int = 512 << 20,
                 bag: int = 32, seed: int = 0) -> None:
        lookups = max(bag, gathered_bytes // (4 * ROW_FLOATS) // bag * bag)
        super().__init__(device, table_bytes, lookups, seed, True)
        torch = require_torch()
        self.bag = bag
        self.offsets = torch.arange(0, lookups, bag, device=self.table.device)
        self.samples = self.samples[: SAMPLES // bag] // bag

    def shape(self) -> dict[str, Any]:
        return {**super().shape(), "bag": self.bag}

    def enqueue(self, stream: object) -> None:
        torch = require_torch()
        with on_torch_stream(stream):
            self.result = torch.nn.functional.embedding_bag(self.index, self.table, self.offsets, mode="sum")

    def _expected(self) -> Any:
        return self.table[self.index.view(-1, self.bag)[self.samples]].sum(dim=1)
