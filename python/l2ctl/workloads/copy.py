"""A plain streaming copy: the bystander that pays the set-aside's tax (it never touches a window)."""

from __future__ import annotations

from typing import Any

from .. import kernels
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_nbytes, round_up
from . import Closing

__all__ = ["CopyWorkload"]


class CopyWorkload(Closing):
    """``dst <- src`` over ``nbytes`` with l2ctl's 16-byte kernel; ``src`` holds the word index."""

    def __init__(self, nbytes: int, device: object = None) -> None:
        nbytes = round_up(check_nbytes(nbytes, "nbytes"), 16)
        self.src = DeviceBuffer(nbytes, device)
        self.dst = DeviceBuffer(nbytes, self.src.device)
        self._filled = False

    def enqueue(self, stream: StreamLike) -> None:
        if not self._filled:
            kernels.write_index(self.src, stream)
            self._filled = True
        kernels.copy_words(self.dst, self.src, stream)

    def poison(self, stream: StreamLike) -> None:
        self.dst.fill_bytes(0xFF, stream)

    def verify(self, stream: StreamLike) -> bool:
        return kernels.count_index_mismatches(self.dst, stream) == 0

    def describe(self) -> dict[str, Any]:
        return {"workload": "copy", "nbytes": self.src.nbytes}

    def close(self) -> None:
        self.src.free()
        self.dst.free()
