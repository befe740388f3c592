"""Workloads: what the sweeps and the tuner measure.

A workload is a plain callable ``f(stream)`` that queues its work on ``stream``, or an object with
``enqueue(stream)`` and, optionally, ``verify(stream) -> bool`` (the last run's output is right),
``poison(stream)`` (make the output wrong before a measurement, so a run that wrote nothing fails
verification) and ``describe() -> dict`` (its configuration, for records). Measurements of a workload
without ``verify`` are recorded as unverified.

Built in: ``ResetDataWorkload`` (l2ctl's own kernel), ``CopyWorkload`` (the bystander of the tax), and the
gallery of framework workloads (``gallery.GALLERY``: PyTorch broadcast, scatter-add, index_select,
embedding, embedding_bag, a mixed step; CuPy/cuSPARSE SpMV), each with ``candidates()``, the buffers
worth offering to l2ctl.tune. Importing this package loads the protocol only (each workload is imported on
first use), and never a framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar, runtime_checkable

from .. import _lazy_attributes

if TYPE_CHECKING:  # what __getattr__ imports at run time
    from . import gallery as gallery
    from .broadcast import BroadcastAdd as BroadcastAdd
    from .copy import CopyWorkload as CopyWorkload
    from .gathers import Embedding as Embedding, EmbeddingBag as EmbeddingBag, IndexSelect as IndexSelect
    from .graphed import Compiled as Compiled, Graphed as Graphed
    from .reset_data import ResetDataWorkload as ResetDataWorkload
    from .scatter_add import ScatterAdd as ScatterAdd
    from .spmv import SpMV as SpMV
    from .step import TrainingStep as TrainingStep

#: submodule -> the names it gives ("": submodules themselves); the protocol, below, is this module's own
_LAZY = {"reset_data": ("ResetDataWorkload",), "copy": ("CopyWorkload",), "": ("gallery",),
         "broadcast": ("BroadcastAdd",), "scatter_add": ("ScatterAdd",),
         "gathers": ("IndexSelect", "Embedding", "EmbeddingBag"), "spmv": ("SpMV",), "step": ("TrainingStep",),
         "graphed": ("Graphed", "Compiled")}
__getattr__ = _lazy_attributes(__name__, _LAZY)
__all__ = ["Workload", "VerifiedWorkload", "enqueue_of", "verifier_of", "describe",
           *(name for names in _LAZY.values() for name in names)]

_Self = TypeVar("_Self", bound="Closing")


@runtime_checkable
class Workload(Protocol):
    def enqueue(self, stream: Any) -> Any: ...


@runtime_checkable
class VerifiedWorkload(Workload, Protocol):
    def verify(self, stream: Any) -> bool: ...


def enqueue_of(workload: object) -> Callable[[Any], Any]:
    """The callable that queues one run of ``workload`` on a stream."""
    if isinstance(workload, Workload):
        return workload.enqueue
    if callable(workload):
        return workload
    raise TypeError(f"a workload is a callable f(stream) or an object with enqueue(stream), not "
                    f"{type(workload).__name__}")


def verifier_of(workload: object) -> Optional[Callable[[Any], bool]]:
    """The workload's ``verify(stream)``, or None when it cannot check its output (then unverified)."""
    method = getattr(workload, "verify", None)
    return method if callable(method) else None


def describe(workload: object) -> dict[str, Any]:
    """The workload's own description for records ({} when it has none)."""
    method = getattr(workload, "describe", None)
    return dict(method()) if callable(method) else {}


class Closing:
    """A workload closed at the end of its ``with`` block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
