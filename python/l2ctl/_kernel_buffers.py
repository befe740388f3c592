"""The memory a graph's kernels are given: every argument word of every kernel node that points into device
memory, mapped to the range that holds it, so the tuner can offer ranges nobody named (a compiled graph's
temporaries) and a person can see which kernels touch what.

A pointer is mapped, first match wins, to:

1. a tensor the caller named (``names``: name -> buffer): that tensor's bytes, under its name ("yours");
2. a block of PyTorch's caching allocator (its snapshot, read only where torch is already imported): the
   block, "a temporary of a captured graph" when it lies in a graph's private pool, else "torch's cache"
   (a tensor nobody named);
3. the device allocation that holds it (cuMemGetAddressRange): the whole allocation ("an allocation").

Words that point nowhere (sizes, strides, flags) are dropped. Nothing here changes the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Optional

from . import _backend, _torch_graphs
from ._interop import resolve_buffer

__all__ = ["GraphBuffer", "YOURS", "GRAPH_POOL", "TORCH_CACHE", "ALLOCATION", "map_pointers"]

YOURS, GRAPH_POOL, TORCH_CACHE, ALLOCATION = ("yours", "a temporary of a captured graph", "torch's cache",
                                              "an allocation")


@dataclass(frozen=True)
class GraphBuffer:
    """A range of device memory that kernel nodes are given: where it is, what it is (``owner``: yours, a
    temporary of a captured graph, torch's cache, an allocation), its name (yours) or a label from the
    kernels that touch it, and those kernels' names."""

    ptr: int
    nbytes: int
    owner: str
    name: str
    kernels: tuple[str, ...]

    def describe(self) -> str:
        return (f"{self.name}: {self.nbytes / (1 << 20):.2f} MiB at 0x{self.ptr:x}, {self.owner}; given to "
                + ", ".join(self.kernels))


def _range_of(ptr: int, named: list[tuple[str, int, int]], blocks: list[tuple[int, int, bool]]
              ) -> Optional[tuple[int, int, str, str]]:
    """(base, nbytes, owner, name) of the range holding ``ptr``, or None."""
    for name, base, nbytes in named:
        if base <= ptr < base + nbytes:
            return base, nbytes, YOURS, name
    for base, nbytes, private in blocks:
        if base <= ptr < base + nbytes:
            return base, nbytes, GRAPH_POOL if private else TORCH_CACHE, ""
    base, nbytes = _backend.current().address_range(ptr)
    if nbytes:
        return int(base), int(nbytes), ALLOCATION, ""
    return None


def map_pointers(device: int, nodes: Iterable[tuple[int, str]], names: Optional[Mapping[str, object]] = None
                 ) -> tuple[list[GraphBuffer], dict[int, list[GraphBuffer]]]:
    """For kernel ``nodes`` ((handle, kernel name)) of ``device``: every range their arguments point into
    (ordered by size, largest first), and per node the ranges it is given."""
    named = []
    for name, obj in (names or {}).items():
        ref = resolve_buffer(obj)
        named.append((str(name), ref.ptr, ref.nbytes))
    blocks = _torch_graphs.allocator_blocks(device)
    backend = _backend.current()
    found: dict[tuple[int, int], tuple[str, str, list[str]]] = {}
    per_node: dict[int, list[tuple[int, int]]] = {}
    for node, function in nodes:
        seen: list[tuple[int, int]] = []
        for _param, _offset, value in backend.kernel_node_words(node):
            where = _range_of(int(value), named, blocks)
            if where is None:
                continue
            base, nbytes, owner, name = where
            key = (base, nbytes)
            if key not in found:
                found[key] = (owner, name, [])
            if function not in found[key][2]:
                found[key][2].append(function)
            if key not in seen:
                seen.append(key)
        per_node[node] = seen
    labels = {key: name or _label(kernels) for key, (_owner, name, kernels) in found.items()}
    taken = [label for label in labels.values()]
    for key, label in labels.items():  # two ranges given to the same kernels: each its own name
        if taken.count(label) > 1:
            labels[key] = f"{label} @0x{key[0]:x}"
    buffers = {key: GraphBuffer(key[0], key[1], owner, labels[key], tuple(kernels))
               for key, (owner, _name, kernels) in found.items()}
    ordered = sorted(buffers.values(), key=lambda b: (-b.nbytes, b.ptr))
    return ordered, {node: [buffers[k] for k in keys] for node, keys in per_node.items()}


def _label(kernels: list[str]) -> str:
    """A name for memory nobody named: the kernels given it (the first two, and how many more)."""
    short = [k if len(k) <= 40 else k[:37] + "..." for k in kernels[:2]]
    return "memory of " + ", ".join(short) + (f" (+{len(kernels) - 2})" if len(kernels) > 2 else "")
