"""Fakes the registry's tests share: torch-like tensors and streams over simulator memory (`torch_like`)."""

from __future__ import annotations

import types

import pytest

import l2ctl


class TorchLikeTensor:
    """What l2ctl reads of a torch tensor, over simulator memory; counts its full resolutions."""

    __module__ = "torch"
    is_cuda = True

    def __init__(self, buf: l2ctl.DeviceBuffer) -> None:
        self.resolved = 0
        self.point_at(buf)

    def point_at(self, buf: l2ctl.DeviceBuffer) -> None:  # what set_() or .data = does to a real tensor
        self.ptr, self.size = buf.ptr, buf.nbytes

    def is_contiguous(self) -> bool:
        self.resolved += 1  # read by a full resolution only
        return True

    def data_ptr(self) -> int:
        return self.ptr

    @property
    def nbytes(self) -> int:
        return self.size

    def numel(self) -> int:
        return self.size // 4

    def element_size(self) -> int:
        return 4

    def get_device(self) -> int:
        return 0


class TorchLikeStream:
    __module__ = "torch.cuda.streams"

    def __init__(self, stream: l2ctl.Stream) -> None:
        self.reads = 0
        self._handle = stream.handle
        self.device = type("device", (), {"index": 0, "type": "cuda"})()

    @property
    def cuda_stream(self) -> int:
        self.reads += 1
        return self._handle


@pytest.fixture
def torch_like() -> types.SimpleNamespace:
    """``torch_like.Tensor(buf)`` and ``torch_like.Stream(stream)``: what l2ctl reads of a torch tensor and stream."""
    return types.SimpleNamespace(Tensor=TorchLikeTensor, Stream=TorchLikeStream)
