"""Sparse matrix x dense vector with cuSPARSE (through CuPy): the matrix streams once, the vector ``x`` is
gathered at random column indices, so it is the buffer one would persist. Its gathers are latency-bound:
persisting ``x`` buys little (measured: docs/results.md)."""

from __future__ import annotations

from typing import Any, Optional

from ._base import GalleryWorkload, check_fraction
from ._frameworks import on_cupy_stream, require_cupy

__all__ = ["SpMV"]


class SpMV(GalleryWorkload):
    """``y = A @ x`` with A square, CSR, ``nnz_per_row`` non-zeros per row at random (sorted) columns, and
    ``x`` of ``vector_bytes`` float32 (default 0.32 x L2). Entries and ``x`` are small integers, so ``y``
    is exact and checked in full against a reference computed another way (a dense row sum)."""

    name = "spmv"
    framework = "cupy"
    hot = "x"

    def __init__(self, device: object = None, *, vector_bytes: Optional[int] = None, nnz_per_row: int = 16,
                 seed: int = 0) -> None:
        super().__init__(device)
        cupy = require_cupy()
        import cupyx.scipy.sparse as sparse

        n = max(1, check_fraction(vector_bytes, 0.32, self.device, "vector_bytes") // 4)
        with cupy.cuda.Device(self.device):
            rng = cupy.random.default_rng(seed)
            cols = rng.integers(0, n, size=(n, nnz_per_row), dtype=cupy.int32)
            cols.sort(axis=1)
            self.col_indices = cols.ravel()
            self.values = rng.integers(1, 4, size=n * nnz_per_row, dtype=cupy.int32).astype(cupy.float32)
            self.indptr = cupy.arange(0, n * nnz_per_row + 1, nnz_per_row, dtype=cupy.int32)
            self.x = rng.integers(0, 8, size=n, dtype=cupy.int32).astype(cupy.float32)
            self.matrix = sparse.csr_matrix((self.values, self.col_indices, self.indptr), shape=(n, n))
            self.expected = (self.values * self.x[self.col_indices]).reshape(n, nnz_per_row).sum(axis=1)
        self.nnz_per_row = nnz_per_row
        self.y: Any = None
        self._tensors = {"x": self.x, "values": self.values, "col_indices": self.col_indices}

    def shape(self) -> dict[str, Any]:
        return {"rows": int(self.x.size), "nnz": int(self.values.size), "nnz_per_row": self.nnz_per_row}

    def enqueue(self, stream: object) -> None:
        with on_cupy_stream(stream):
            self.y = self.matrix.dot(self.x)

    def poison(self, stream: object) -> None:
        with on_cupy_stream(stream):
            if self.y is not None:
                self.y.fill(float("nan"))

    def verify(self, stream: object) -> bool:
        cupy = require_cupy()
        if self.y is None:
            return False
        with on_cupy_stream(stream):
            return bool(cupy.array_equal(self.y, self.expected))
