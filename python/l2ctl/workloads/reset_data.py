"""reset-data as a workload: a random LUT repeated into a large output; the LUT is the buffer to persist."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernels
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_nbytes, round_up
from . import Closing

__all__ = ["ResetDataWorkload"]


class ResetDataWorkload(Closing):
    """A random LUT of ``lut_bytes`` (``.buf``, the buffer to persist) repeated into ``out_bytes``."""

    def __init__(self, lut_bytes: int, out_bytes: int = 1 << 30, *, variant: str = "plain", device: object = None,
                 seed: int = 0) -> None:
        if check_nbytes(lut_bytes, "lut_bytes") % 4:
            raise ValueError(f"lut_bytes must be a positive multiple of 4, got {lut_bytes}")
        out_bytes = check_nbytes(out_bytes, "out_bytes")
        kernels.check_variant(variant)
        rng = np.random.default_rng(seed)
        self.lut_bytes, self.variant = lut_bytes, variant
        self.buf = DeviceBuffer.from_numpy(rng.integers(0, 2**31 - 1, size=lut_bytes // 4, dtype=np.int32), device)
        self.out = DeviceBuffer(round_up(out_bytes, 16), self.buf.device)

    def enqueue(self, stream: StreamLike) -> None:
        kernels.reset_data(self.out, self.buf, stream, variant=self.variant)

    def poison(self, stream: StreamLike) -> None:
        self.out.fill_bytes(0xFF, stream)

    def verify(self, stream: StreamLike) -> bool:
        return kernels.verify_reset_data(self.out, self.buf, stream) == 0

    def describe(self) -> dict[str, Any]:
        return {"workload": "reset-data", "lut_bytes": self.lut_bytes, "out_bytes": self.out.nbytes,
                "kernel_variant": self.variant}

    def close(self) -> None:
        self.buf.free()
        self.out.free()
