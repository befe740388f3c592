"""Lazy device memory: allocations described by segments of content, never by their bytes.

Every allocation is a sorted list of segments ``[start, end) -> content`` covering it; a content is one of

- ``Fill(byte)``: every byte is ``byte`` (what cudaMemset writes; a new allocation is ``Fill(0)``, so
  unwritten memory reads as zeros, where real cudaMalloc memory holds whatever was there);
- ``Bytes(data, start)``: explicit bytes ``data[start:]`` (host copies, and the outputs of kernels
  whose results are irregular: partial sums, float results);
- ``Pattern(data, phase)``: byte ``i`` is ``data[(phase + i) % len(data)]``, a buffer repeated (what
  reset_data writes: the LUT repeated into the output);
- ``Index(first, bphase)``: the little-endian 32-bit words ``first, first + 1, ...`` (mod 2^32) starting
  ``bphase`` bytes into the first word (what write_index writes).

Writes split and replace segments; reads materialize only the requested range; copies re-base the
source's segments into the destination. A 100 GiB allocation is one segment and takes no host memory.

Kernels see memory as *word runs* (``word_runs``): consecutive 32-bit words, a ``Run`` of a content that
starts at a word, so reductions can use closed forms per run where its content has one (a fill, words that
count up, a pattern of whole words: ``count_differences``) and materialize chunks only where none applies.
Contents are immutable: arrays inside them are read-only and shared.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterator, Optional, TypeGuard, cast

import numpy as np

__all__ = ["Content", "Fill", "Bytes", "Pattern", "Index", "Run", "Allocation", "Memory", "MemoryFault", "Misaligned",
           "OutOfMemory", "count_differences", "counts_up", "index_runs", "CHUNK_WORDS"]

U8 = np.uint8
U32 = np.uint32
WRAP = 1 << 32
#: Words materialized at once where no closed form applies (16 MiB).
CHUNK_WORDS = 1 << 22

Array = np.ndarray[Any, Any]


class MemoryFault(ValueError):
    """An access outside every live allocation (CUDA: an illegal address, or cudaErrorInvalidValue)."""


class Misaligned(MemoryFault):
    """A kernel's access at an address not aligned to its element (CUDA: a misaligned address)."""


class OutOfMemory(MemoryError):
    """An allocation beyond the device's free memory."""


def _frozen(array: Array) -> Array:
    array.flags.writeable = False
    return array


def _cyclic(data: Array, start: int, n: int) -> Array:
    """n elements of ``data`` repeated, from ``start`` (a view of ``data`` where they do not wrap)."""
    s = start % len(data)
    if s + n <= len(data):
        return data[s:s + n]
    return np.tile(data, -(-(s + n) // len(data)))[s:s + n]


# ---- contents ------------------------------------------------------------------------------------


class Content:
    """What a segment holds, from its first byte (immutable); as 32-bit words, from a word starting there."""

    def slice(self, offset: int) -> "Content":
        """The same content seen from ``offset`` bytes later."""
        raise NotImplementedError

    def materialize(self, offset: int, n: int) -> Array:
        """Bytes [offset, offset + n) as a uint8 array (possibly a read-only view)."""
        raise NotImplementedError

    def values(self, k0: int, k1: int) -> Array:
        """Words [k0, k1) as uint32."""
        return np.ascontiguousarray(self.materialize(4 * k0, 4 * (k1 - k0))).view(U32)

    def gather(self, idx: Array) -> Array:
        """Words at the (int64) positions ``idx``, a chunk of them materialized at a time."""
        out = np.empty(len(idx), dtype=U32)
        for start in range(0, len(idx), CHUNK_WORDS):
            part = idx[start:start + CHUNK_WORDS]
            lo, hi = int(part.min()), int(part.max()) + 1
            out[start:start + len(part)] = self.values(lo, hi)[part - lo]
        return out


@dataclass(frozen=True, eq=False)
class Fill(Content):
    byte: int

    @property
    def word(self) -> int:
        return self.byte * 0x01010101

    def slice(self, offset: int) -> Content:
        return self

    def materialize(self, offset: int, n: int) -> Array:
        return np.full(n, self.byte, dtype=U8)


@dataclass(frozen=True, eq=False)
class Bytes(Content):
    data: Array  # uint8, read-only
    start: int = 0

    def slice(self, offset: int) -> Content:
        return Bytes(self.data, self.start + offset)

    def materialize(self, offset: int, n: int) -> Array:
        a = self.start + offset
        return self.data[a:a + n]


class Pattern(Content):
    """Byte i is data[(phase + i) % len(data)]."""

    __slots__ = ("data", "phase", "_words")

    def __init__(self, data: Array, phase: int = 0, words: Optional[Array] = None) -> None:
        self.data = data
        self.phase = phase % len(data)
        self._words = words

    @property
    def words(self) -> Optional[Array]:
        """The pattern as uint32 words (None when its length is not a multiple of 4)."""
        if self._words is None and len(self.data) % 4 == 0:
            self._words = _frozen(self.data.view(U32))
        return self._words

    @property
    def word_phase(self) -> Optional[int]:
        """Word k is words[(word_phase + k) % len(words)] where the pattern is whole words and starts at one."""
        return self.phase // 4 if self.words is not None and self.phase % 4 == 0 else None

    def slice(self, offset: int) -> Content:
        return Pattern(self.data, self.phase + offset, self._words)

    def materialize(self, offset: int, n: int) -> Array:
        return _cyclic(self.data, self.phase + offset, n)

    def gather(self, idx: Array) -> Array:
        phase = self.word_phase
        if phase is None:
            return super().gather(idx)
        words = cast(Array, self.words)
        return cast(Array, words[(idx + phase) % len(words)])


@dataclass(frozen=True, eq=False)
class Index(Content):
    """Words first, first + 1, ... (mod 2^32), starting bphase bytes into the first word."""

    first: int
    bphase: int = 0

    def slice(self, offset: int) -> Content:
        p = self.bphase + offset
        return Index((self.first + p // 4) % WRAP, p % 4)

    def materialize(self, offset: int, n: int) -> Array:
        p0 = self.bphase + offset
        w0, w1 = p0 // 4, (p0 + n + 3) // 4
        words = ((self.first + np.arange(w0, w1, dtype=np.uint64)) & 0xFFFFFFFF).astype(U32)
        return words.view(U8)[p0 % 4:p0 % 4 + n]


# ---- word runs -----------------------------------------------------------------------------------


@dataclass(eq=False)
class Run:
    """``count`` consecutive 32-bit words: those of ``content``. An ``Index`` run whose words start at a word
    (``bphase`` 0) never wraps (first + count <= 2^32; see index_runs)."""

    count: int
    content: Content

    def sub(self, k0: int, k1: int) -> "Run":
        """Words [k0, k1) as a run of their own."""
        return Run(k1 - k0, self.content.slice(4 * k0))


def index_runs(first: int, count: int) -> Iterator[Run]:
    """first, first + 1, ... (mod 2^32) for count words, split where the values wrap."""
    first %= WRAP
    while count > 0:
        n = min(count, WRAP - first)
        yield Run(n, Index(first))
        count -= n
        first = 0


def _pattern_equal(a: Pattern, b: Pattern) -> bool:
    """Whether two patterns (of words, at their word phases) give the same words."""
    aw, bw = cast(Array, a.words), cast(Array, b.words)
    if len(aw) != len(bw) or a.word_phase != b.word_phase:
        return False
    same_memory = aw.__array_interface__["data"][0] == bw.__array_interface__["data"][0] and aw.strides == bw.strides
    if aw is bw or same_memory:
        return True  # the same (immutable) memory
    return bool(np.array_equal(aw, bw))


def counts_up(c: Content) -> TypeGuard[Index]:
    """An Index whose words start at a word: a closed form (see Run)."""
    return isinstance(c, Index) and c.bphase == 0


def _occurrences(run: Run, value: int) -> Optional[int]:
    """How many words of ``run`` equal ``value``, where a closed form exists."""
    c = run.content  # never a fill: two fills are compared before
    if counts_up(c):
        return 1 if c.first <= value < c.first + run.count else 0
    phase = c.word_phase if isinstance(c, Pattern) else None
    if phase is not None:
        words = cast(Array, cast(Pattern, c).words)
        size = len(words)
        hits = np.flatnonzero(words == np.uint32(value))
        full, rest = divmod(run.count, size)
        total = full * len(hits)
        if rest:  # positions phase .. phase + rest - 1, cyclically
            end = phase + rest
            total += int(np.count_nonzero((hits >= phase) & (hits < min(end, size))))
            if end > size:
                total += int(np.count_nonzero(hits < end - size))
        return total
    return None


def _differences(a: Run, b: Run) -> int:
    """Words where two runs of equal length differ."""
    n, ca, cb = a.count, a.content, b.content
    if isinstance(ca, Fill) and isinstance(cb, Fill):
        return 0 if ca.word == cb.word else n
    if counts_up(ca) and counts_up(cb):
        return 0 if ca.first == cb.first else n  # a constant, non-zero difference otherwise
    if (isinstance(ca, Pattern) and isinstance(cb, Pattern) and ca.word_phase is not None
            and cb.word_phase is not None and _pattern_equal(ca, cb)):
        return 0
    for fill, other in ((a, b), (b, a)):
        if isinstance(fill.content, Fill):
            same = _occurrences(other, fill.content.word)
            if same is not None:
                return n - same
    bad = 0
    for k in range(0, n, CHUNK_WORDS):
        k1 = min(n, k + CHUNK_WORDS)
        bad += int(np.count_nonzero(ca.values(k, k1) != cb.values(k, k1)))
    return bad


def _aligned(runs_a: list[Run], runs_b: list[Run]) -> Iterator[tuple[Run, Run]]:
    """Pieces of two run lists of the same total length, cut at the union of their boundaries."""
    ia = ib = 0
    oa = ob = 0  # offset into the current runs
    while ia < len(runs_a) and ib < len(runs_b):
        ra, rb = runs_a[ia], runs_b[ib]
        n = min(ra.count - oa, rb.count - ob)
        if n > 0:
            pa = ra if (oa == 0 and n == ra.count) else ra.sub(oa, oa + n)
            pb = rb if (ob == 0 and n == rb.count) else rb.sub(ob, ob + n)
            yield pa, pb
        oa += n
        ob += n
        if oa >= ra.count:
            ia, oa = ia + 1, 0
        if ob >= rb.count:
            ib, ob = ib + 1, 0


def count_differences(runs_a: list[Run], runs_b: list[Run]) -> int:
    """Words where two equally long run lists differ, by closed forms where they exist."""
    return sum(_differences(a, b) for a, b in _aligned(runs_a, runs_b))


# ---- allocations ---------------------------------------------------------------------------------


class Allocation:
    """One cudaMalloc'ed range: [base, base + size) on ``device``, as segments of content."""

    def __init__(self, base: int, size: int, device: int) -> None:
        self.base, self.size, self.device = base, size, device
        self.starts: list[int] = [0]
        self.segments: list[tuple[int, int, Content]] = [(0, size, Fill(0))]

    def __repr__(self) -> str:
        return f"<Allocation 0x{self.base:x} {self.size} B device {self.device}, {len(self.segments)} segments>"

    def pieces(self, a: int, b: int) -> Iterator[tuple[int, int, Content]]:
        """(start, end, content from start) for the parts of [a, b) in each overlapping segment."""
        i = bisect.bisect_right(self.starts, a) - 1
        while i < len(self.segments):
            s, e, c = self.segments[i]
            if s >= b:
                break
            lo, hi = max(s, a), min(e, b)
            if lo < hi:
                yield lo, hi, (c if lo == s else c.slice(lo - s))
            i += 1

    def write(self, a: int, b: int, content: Content) -> None:
        """Bytes [a, b) become ``content`` (whose first byte lands at a)."""
        if a >= b:
            return
        segs, starts = self.segments, self.starts
        i = bisect.bisect_right(starts, a) - 1
        j = bisect.bisect_left(starts, b)
        new: list[tuple[int, int, Content]] = []
        s0, _, c0 = segs[i]
        if s0 < a:
            new.append((s0, a, c0))
        new.append((a, b, content))
        s1, e1, c1 = segs[j - 1]
        if e1 > b:
            new.append((b, e1, c1.slice(b - s1)))
        # merge equal fills with the neighbours, so repeated memsets keep the list short
        if i > 0 and isinstance(content, Fill) and new[0][0] == a:
            ps, _, pc = segs[i - 1]
            if isinstance(pc, Fill) and pc.byte == content.byte:
                i -= 1
                new[0] = (ps, b, content)
        new_starts = [s for s, _, _ in new]
        segs[i:j] = new  # together, with no call between (an interrupt lands before both or after both)
        starts[i:j] = new_starts


class Memory:
    """Every allocation of one simulated machine, by address; capacity enforced per device."""

    def __init__(self, address_base: int, capacities: list[int]) -> None:
        self._next = address_base
        self._bases: list[int] = []
        self._allocs: dict[int, Allocation] = {}
        self.capacities = list(capacities)
        self.used = [0] * len(capacities)

    # allocation -------------------------------------------------------------------------------------
    def reserve(self, nbytes: int) -> int:
        """The address of an allocation of ``nbytes`` to come (2 MiB aligned, a gap after it), never given again: an
        owner that keeps it before ``allocate`` frees the allocation whatever interrupts it."""
        base = self._next
        self._next = base + -(-max(nbytes, 1) // (2 << 20)) * (2 << 20) + (2 << 20)
        return base

    def allocate(self, device: int, nbytes: int, base: Optional[int] = None) -> Allocation:
        """An allocation at ``base`` (reserved), or at the next address."""
        if self.used[device] + nbytes > self.capacities[device]:
            raise OutOfMemory(f"device {device}: {nbytes} bytes requested, "
                              f"{self.capacities[device] - self.used[device]} free")
        base = self.reserve(nbytes) if base is None else base
        alloc = Allocation(base, nbytes, device)
        bases = list(self._bases)
        bisect.insort(bases, base)
        used = self.used[device] + nbytes
        # The change in one step (the dict's insert, the one that may allocate, first), with no call among its
        # stores, so that an interrupt or an allocation failure never leaves an allocation half made.
        self._allocs[base] = alloc
        self._bases = bases
        self.used[device] = used
        return alloc

    def free(self, base: int) -> None:
        alloc = self._allocs.get(base)
        if alloc is not None:  # in one step, as allocate's
            bases, used = [b for b in self._bases if b != base], self.used[alloc.device] - alloc.size
            del self._allocs[base]
            self._bases = bases
            self.used[alloc.device] = used

    def find(self, ptr: int) -> Optional[Allocation]:
        """The live allocation containing ``ptr``."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        alloc = self._allocs[self._bases[i]]
        return alloc if ptr < alloc.base + max(alloc.size, 1) else None

    def resolve(self, ptr: int, nbytes: int) -> tuple[Allocation, int]:
        """(allocation, offset) for [ptr, ptr + nbytes) inside one live allocation; MemoryFault otherwise."""
        alloc = self.find(ptr)
        if alloc is None or not 0 <= ptr - alloc.base <= alloc.size - nbytes:
            raise MemoryFault(f"[0x{ptr:x}, 0x{ptr + nbytes:x}) is not inside one live allocation")
        return alloc, ptr - alloc.base

    # access -----------------------------------------------------------------------------------------
    def write(self, ptr: int, nbytes: int, content: Content) -> None:
        alloc, off = self.resolve(ptr, nbytes)
        alloc.write(off, off + nbytes, content)

    def write_array(self, ptr: int, data: Array, *, copy: bool = True) -> None:
        """Explicit bytes: copied, so later changes to ``data`` do not reach device memory, unless
        ``copy`` is False (for arrays nobody changes any more; they are made read-only)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(U8)
        if copy:
            raw = raw.copy()
        self.write(ptr, raw.nbytes, Bytes(_frozen(raw)))

    def fill(self, ptr: int, nbytes: int, byte: int) -> None:
        self.write(ptr, nbytes, Fill(byte & 0xFF))

    def read(self, ptr: int, nbytes: int) -> Array:
        """Bytes [ptr, ptr + nbytes) as uint8 (read-only; the stored array itself where one segment of
        explicit bytes is read whole, so equal reads give the same object)."""
        alloc, off = self.resolve(ptr, nbytes)
        parts = list(alloc.pieces(off, off + nbytes))
        if len(parts) == 1:
            _, _, c = parts[0]
            if isinstance(c, Bytes) and c.start == 0 and len(c.data) == nbytes:
                return c.data
            return _frozen(np.array(c.materialize(0, nbytes), dtype=U8, copy=True))
        out = np.empty(nbytes, dtype=U8)
        for s, e, c in parts:
            out[s - off:e - off] = c.materialize(0, e - s)
        return _frozen(out)

    def read_words(self, ptr: int, nwords: int) -> Array:
        return self.read(ptr, 4 * nwords).view(U32)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy (memmove semantics): the source's segments, re-based."""
        salloc, soff = self.resolve(src, nbytes)
        dalloc, doff = self.resolve(dst, nbytes)
        for s, e, c in list(salloc.pieces(soff, soff + nbytes)):  # a list: the source may be the destination
            dalloc.write(doff + s - soff, doff + e - soff, c)

    def word_runs(self, ptr: int, nwords: int) -> list[Run]:
        """Words [0, nwords) from ``ptr`` as runs; words cut by a segment boundary come materialized."""
        alloc, off = self.resolve(ptr, 4 * nwords)
        runs: list[Run] = []
        k = 0
        for s, e, c in alloc.pieces(off, off + 4 * nwords):
            a, b = s - off, e - off
            first, last = -(-a // 4), b // 4
            if first >= last:
                continue
            runs.extend(Run(1, Bytes(self.read(ptr + 4 * w, 4))) for w in range(k, first))  # straddling
            words = c.slice(4 * first - a)
            runs.extend(index_runs(words.first, last - first) if counts_up(words)
                        else [Run(last - first, words)])
            k = last
        runs.extend(Run(1, Bytes(self.read(ptr + 4 * w, 4))) for w in range(k, nwords))
        return runs

    def segment_count(self) -> int:
        return sum(len(a.segments) for a in self._allocs.values())

