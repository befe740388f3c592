"""The gallery: real framework workloads, by name, with what each needs and why it cannot run here.

    from l2ctl.workloads import gallery
    for entry in gallery.GALLERY:
        reason = entry.missing()
        ...
        with entry.make(device) as w:
            tuned = l2ctl.tune(w, stream, w.candidates())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .._device import properties
from ._base import GiB
from ._frameworks import cupy_missing, torch_missing
from .broadcast import BroadcastAdd
from .gathers import Embedding, EmbeddingBag, IndexSelect
from .graphed import Compiled, Graphed
from .scatter_add import ScatterAdd
from .spmv import SpMV
from .step import TrainingStep

__all__ = ["GalleryEntry", "GALLERY", "entry", "names"]


@dataclass(frozen=True)
class GalleryEntry:
    """A gallery workload: its name, what it shows, its framework, the device memory it needs, and how to make it."""

    name: str
    pattern: str
    framework: str
    memory_bytes: int
    make: Callable[..., Any]

    def missing(self, device: object = None) -> Optional[str]:
        """Why this workload cannot run on ``device`` here (None: it can)."""
        reason = torch_missing() if self.framework == "torch" else cupy_missing()
        if reason is not None:
            return reason
        total = properties(device).total_memory
        if total < self.memory_bytes:
            return (f"needs about {self.memory_bytes / GiB:.1f} GiB of device memory; device {properties(device).index} "
                    f"has {total / GiB:.1f} GiB")
        return None


GALLERY: tuple[GalleryEntry, ...] = (
    GalleryEntry("broadcast", "x + bias: a bias re-read once per row while 1 GiB streams", "torch", 3 * GiB, BroadcastAdd),
    GalleryEntry("scatter-add", "acc.index_add_: random updates into an accumulator, 1.5 GiB of updates stream",
                 "torch", 4 * GiB, ScatterAdd),
    GalleryEntry("index_select", "torch.index_select: random 256-byte rows of a table", "torch", 2 * GiB, IndexSelect),
    GalleryEntry("embedding", "F.embedding: random 256-byte rows of a table", "torch", 2 * GiB, Embedding),
    GalleryEntry("embedding_bag", "F.embedding_bag(mode='sum'): bags of 32 random rows summed", "torch", 2 * GiB,
                 EmbeddingBag),
    GalleryEntry("spmv", "cuSPARSE SpMV (CuPy): a random sparse matrix times a vector", "cupy", 3 * GiB, SpMV),
    GalleryEntry("step", "a step mixing an embedding gather, a broadcast add and a scatter-add", "torch", 4 * GiB,
                 TrainingStep),
    GalleryEntry("broadcast-graphed", "the broadcast captured in a torch.cuda.CUDAGraph(keep_graph=True), replayed",
                 "torch", 3 * GiB, lambda device=None: Graphed(BroadcastAdd(device))),
    GalleryEntry("broadcast-compiled", "the broadcast compiled with torch.compile(mode='reduce-overhead')", "torch",
                 3 * GiB, lambda device=None: Compiled(BroadcastAdd(device))),
    GalleryEntry("scatter-add-graphed", "the scatter-add captured in a torch.cuda.CUDAGraph(keep_graph=True), replayed",
                 "torch", 4 * GiB, lambda device=None: Graphed(ScatterAdd(device))),
    GalleryEntry("scatter-add-compiled", "the scatter-add compiled with torch.compile(mode='reduce-overhead')", "torch",
                 4 * GiB, lambda device=None: Compiled(ScatterAdd(device))),
    GalleryEntry("scatter-add-compiled-eager", "the scatter-add compiled, its accumulator not marked static (a tensor "
                 "the step reads from an object: whether torch graphs it is in the record)", "torch", 4 * GiB,
                 lambda device=None: Compiled(ScatterAdd(device), static_inputs=False,
                                              name="scatter-add-compiled-eager")),
    GalleryEntry("scatter-add-compiled-temp", "the scatter-add compiled with its zeroing, accumulator static: Inductor "
                 "scatters into a temporary of its own and copies it into acc", "torch", 4 * GiB,
                 lambda device=None: Compiled(ScatterAdd(device, zero_in_step=True), name="scatter-add-compiled-temp")),
)


def names() -> list[str]:
    return [e.name for e in GALLERY]


def entry(name: str) -> GalleryEntry:
    for e in GALLERY:
        if e.name == name:
            return e
    raise ValueError(f"no gallery workload {name!r}; choose from {', '.join(names())}")
