"""Functional versions of l2ctl's CUDA kernels (src/l2ctl/kernels.cu), on lazy device memory.

Each function checks its arguments like the C++ launcher (``ValueError`` where it throws
``std::invalid_argument``) and returns a ``KernelLaunch`` whose ``run`` performs the kernel's effect on
memory (returning the count, for the kernels that read one back): at launch, or at every replay of the
graph kernel node the launch became. Its ``Traffic`` is what the timing model needs.

Results equal the CUDA versions: reset_data writes the LUT repeated, read_sum and stride_read write the
same per-block uint64 partials (sums mod 2^64), the float kernels compute in float32 in the kernel's
order (``a * b + c`` contracted to a fused multiply-add, emulated in float64, where the product is
exact, so only rare ties round differently; ``sinf``/``cosf`` are NumPy's float32 functions, within an
ulp or two of CUDA's). Reductions use closed forms per run of memory (memory.py) and materialize chunks
only where none applies; the float kernels remember their last result for unchanged inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..kernels import dram_bytes_per_request, sectors_per_request
from .devices import FakeDevice
from .memory import (CHUNK_WORDS, Fill, Index, Memory, Misaligned, Pattern, Run, count_differences, counts_up,
                     index_runs)
from .model import Traffic

__all__ = ["KernelLaunch", "Kernels", "THREADS", "RESET_KERNELS", "read_sum_partials", "stride_partials"]

THREADS = 256
U64 = np.uint64
Array = np.ndarray[Any, Any]

#: ResetVariant value -> (kernel name, LUT load hint, store hint)
RESET_KERNELS: dict[int, tuple[str, str, str]] = {
    0: ("reset_data_plain_kernel", "normal", "normal"),
    1: ("reset_data_streaming_kernel", "normal", "streaming"),
    2: ("reset_data_evict_last_kernel", "evict_last", "normal"),
    3: ("reset_data_hinted_kernel", "evict_last", "streaming"),
    4: ("reset_data_annotated_kernel", "annotated", "normal"),
    5: ("reset_data_seed_kernel", "normal", "normal"),
    6: ("reset_data_plain_kernel", "normal", "normal"),  # scalar: the plain kernel, 4-byte accesses
}


@dataclass
class KernelLaunch:
    """One kernel launch, ready to run (now, or at every replay of the graph node it became): ``blocks`` of
    ``threads``, named as its traffic."""

    traffic: Traffic
    run: Callable[[], Any]
    blocks: int
    threads: int = THREADS
    result: Any = None
    synchronous: bool = False  # reads a result back and waits (cannot be captured)
    args: tuple[int, ...] = ()  # the pointer arguments it is given, in order (what the driver shows of a node)

    @property
    def name(self) -> str:
        return self.traffic.name


def _require_aligned(alignment: int, *ptrs: int) -> None:
    """The kernel dereferences these as ``alignment``-byte elements: misaligned ones fault on the GPU."""
    for ptr in ptrs:
        if ptr % alignment:
            raise Misaligned(f"0x{ptr:x} is not aligned to {alignment} bytes")


def _fma32(a: Array, b: Array, c: Array) -> Array:
    """fmaf(a, b, c) for float32 arrays: the product is exact in float64, one rounding to float32 after
    the sum (a double rounding through float64 that differs from a true fma only in rare ties)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


# ---- per-block sums -------------------------------------------------------------------------------


def _residue_stats(x: int, period: int, lo: Array, width: int) -> tuple[Array, Array]:
    """(count, sum) of the words w < x with w mod period in [lo, lo + width), for each lo (int64)."""
    q, r = divmod(x, period)
    c = np.clip(r - lo, 0, width)
    count = q * width + c
    total = (width * period * (q * (q - 1) // 2) + q * (lo * width + width * (width - 1) // 2)
             + c * (q * period) + lo * c + c * (c - 1) // 2)
    return count.astype(np.int64), total.astype(np.int64)


def _add_groups(partials: Array, values: Array, first_word: int, group: int, groups_per_period: int) -> None:
    """partials[(w // group) % groups_per_period] += value of word w, for words first_word, ..."""
    n = len(values)
    if n == 0:
        return
    starts = [0, *range((-first_word) % group or group, n, group)]  # where each group's words begin
    sums = np.add.reduceat(values.astype(U64), np.asarray(starts, dtype=np.int64))
    ids = ((first_word + np.asarray(starts, dtype=np.int64)) // group) % groups_per_period
    np.add.at(partials, ids, sums)


def read_sum_partials(runs: list[Run], n: int, blocks: int) -> Array:
    """The per-block partials of read_sum_kernel over n words: block b sums the 16-byte vectors v with
    v mod (blocks * 256) in [256 b, 256 b + 256), and block 0 the last n % 4 words."""
    partials = np.zeros(blocks, dtype=U64)
    period = 4 * THREADS * blocks  # words per grid-stride step
    group = 4 * THREADS
    main = 4 * (n // 4)
    lo = np.arange(blocks, dtype=np.int64) * group
    w = 0
    for run in runs:
        a, b = w, w + run.count
        w = b
        m0, m1 = a, min(b, main)
        if m0 < m1:
            sub = run if (m0 == a and m1 == b) else run.sub(m0 - a, m1 - a)
            words = sub.content
            if isinstance(words, Fill) or counts_up(words):
                (c1, s1), (c0, s0) = _residue_stats(m1, period, lo, group), _residue_stats(m0, period, lo, group)
                if isinstance(words, Fill):
                    partials += (c1 - c0).astype(U64) * U64(words.word)
                else:  # value at word w is (first - m0) + w
                    partials += (c1 - c0).astype(U64) * U64((words.first - m0) % (1 << 64)) + (s1 - s0).astype(U64)
            else:
                for k in range(0, sub.count, CHUNK_WORDS):
                    k1 = min(sub.count, k + CHUNK_WORDS)
                    _add_groups(partials, words.values(k, k1), m0 + k, group, blocks)
        t0, t1 = max(a, main), b
        if t0 < t1:  # the tail words: threads 0..2 of block 0
            partials[0] += U64(int(run.content.values(t0 - a, t1 - a).astype(U64).sum()))
    return partials


def stride_partials(runs: list[Run], threads: int, stride: int, block_threads: int) -> Array:
    """The per-block partials of stride_read_kernel: thread t loads word t * stride."""
    blocks = -(-threads // block_threads)
    partials = np.zeros(blocks, dtype=U64)
    if stride == 0:
        v0 = int(runs[0].content.values(0, 1)[0])
        counts = np.minimum(block_threads, threads - np.arange(blocks, dtype=np.int64) * block_threads)
        partials[:] = counts.astype(U64) * U64(v0)
        return partials
    w = 0
    for run in runs:
        a, b = w, w + run.count
        w = b
        t_lo, t_hi = -(-a // stride), min(threads, -(-b // stride))
        if t_lo >= t_hi:
            continue
        b0, b1 = t_lo // block_threads, (t_hi - 1) // block_threads + 1
        bs = np.arange(b0, b1, dtype=np.int64)
        lo = np.maximum(bs * block_threads, t_lo)
        hi = np.minimum((bs + 1) * block_threads, t_hi)
        cnt = hi - lo
        words = run.content
        if isinstance(words, Fill):
            partials[b0:b1] += cnt.astype(U64) * U64(words.word)
        elif counts_up(words):  # value(t) = first + t * stride - a
            tsum = ((lo + hi - 1) * cnt // 2).astype(U64)
            offset = U64((words.first - a) % (1 << 64))
            partials[b0:b1] += cnt.astype(U64) * offset + tsum * U64(stride)
        else:
            step = max(block_threads, (CHUNK_WORDS // block_threads) * block_threads)
            t = t_lo
            while t < t_hi:
                t1 = min(t_hi, (t // block_threads) * block_threads + step)
                ts = np.arange(t, t1, dtype=np.int64)
                vals = words.gather(ts * stride - a).astype(U64)
                starts = np.unique(np.concatenate(([0], np.flatnonzero(np.diff(ts // block_threads)) + 1)))
                sums = np.add.reduceat(vals, starts)
                np.add.at(partials, ts[starts] // block_threads, sums)
                t = t1
    return partials


# ---- the kernels ----------------------------------------------------------------------------------


class Kernels:
    """The kernels of one simulated device, on ``memory``."""

    def __init__(self, memory: Memory, device: FakeDevice) -> None:
        self.memory = memory
        self.device = device
        self._memo: dict[str, tuple[Any, Array]] = {}

    # launch shapes
    @property
    def blocks_per_sm(self) -> int:
        return max(1, self.device.max_threads_per_multiprocessor // THREADS)

    def grid_for(self, work_items: int, blocks_per_sm: int = 0, threads: int = THREADS) -> int:
        """Blocks for ``work_items``: one per ``threads`` of them, at most a full wave of the device."""
        full = self.device.multiprocessor_count * (blocks_per_sm or self.blocks_per_sm)
        return max(1, min(full, -(-work_items // threads)))

    def max_read_partials(self) -> int:
        return self.grid_for((1 << 63) // 2)

    def _float_kernel(self, traffic: Traffic, inputs: tuple[tuple[int, int], ...], out: int, n: int,
                      compute: Callable[[], Array]) -> KernelLaunch:
        """A kernel writing ``compute()``, n float32 words, to ``out``; the result is remembered with the
        segments (immutable contents) its input ranges (ptr, nbytes) consist of, and reused while they last."""
        mem = self.memory

        def run() -> None:
            _require_aligned(4, *(ptr for ptr, _ in inputs), out)
            mem.resolve(out, 4 * n)
            if n == 0:
                return
            key = []
            for ptr, nbytes in inputs:
                alloc, off = mem.resolve(ptr, nbytes)
                key.append((ptr, nbytes, tuple(alloc.pieces(off, off + nbytes))))
            hit = self._memo.get(traffic.name)
            if hit is None or hit[0] != key:
                hit = self._memo[traffic.name] = (key, compute())
                hit[1].flags.writeable = False
            mem.write_array(out, hit[1], copy=False)

        return KernelLaunch(traffic, run, max(1, -(-n // THREADS)))

    # reset data -------------------------------------------------------------------------------------
    def reset_data(self, out: int, out_len: int, lut: int, lut_len: int, variant: int,
                   blocks_per_sm: int = 0) -> KernelLaunch:
        if lut_len == 0 or lut_len > 0x7FFFFFFF:
            raise ValueError("lut length must be in [1, 2^31)")
        if variant not in RESET_KERNELS:
            raise ValueError(f"unknown reset-data variant {variant}")
        name, lut_hint, store_hint = RESET_KERNELS[variant]
        if variant == 5:
            blocks, threads, vector_out, vector_lut = 32, 1024, False, False
            profile = "seed"
        else:
            vector_out = variant != 6 and out % 16 == 0
            vector_lut = vector_out and lut % 16 == 0 and lut_len % 4 == 0
            work = out_len // 4 + 1 if vector_out else out_len
            blocks, threads = self.grid_for(work, blocks_per_sm), THREADS
            profile = "vector" if vector_lut else "vector_out" if vector_out else "scalar"
        nbytes = 4 * out_len
        if vector_lut:
            requests, sectors = nbytes / 512, nbytes / 32
        else:
            requests, sectors = nbytes / 128, nbytes / 128 * (16 if vector_out else 4)
        # the fraction of the threads needed to reach full streaming rate (4 blocks of 256 per SM)
        occupancy = 1.0 if profile == "seed" else min(1.0, blocks * threads / (self.device.multiprocessor_count * 1024))
        traffic = Traffic(name, profile=profile, stream_write=nbytes, hot=(lut, 4 * lut_len), hot_reads=nbytes,
                          hot_hint=lut_hint, store_hint=store_hint, work_bytes=nbytes / occupancy,
                          load_sectors=sectors, load_requests=requests)

        def run() -> None:
            _require_aligned(4, out, lut)
            self.memory.write(out, nbytes, Pattern(self.memory.read(lut, 4 * lut_len), 0))  # the LUT repeated

        return KernelLaunch(traffic, run, blocks, threads, (blocks, threads, vector_out, vector_lut), args=(out, lut))

    def reset_data_verify(self, out: int, out_len: int, lut: int, lut_len: int) -> KernelLaunch:
        if lut_len == 0:
            raise ValueError("lut length must be positive")
        mem = self.memory
        blocks = self.grid_for(out_len)
        traffic = Traffic("reset_data_verify_kernel", profile="reduce", stream_read=4 * out_len,
                          hot=(lut, 4 * lut_len), hot_reads=4 * out_len, work_bytes=8 * out_len,
                          load_sectors=out_len / 4, load_requests=out_len / 16)

        def run() -> int:
            _require_aligned(4, out, lut)
            repeated = Pattern(mem.read(lut, 4 * lut_len))
            return count_differences(mem.word_runs(out, out_len), [Run(out_len, repeated)] if out_len else [])

        return KernelLaunch(traffic, run, blocks, synchronous=True)

    # ceilings ---------------------------------------------------------------------------------------
    def write_index(self, buf: int, n: int) -> KernelLaunch:
        if buf % 16:
            raise ValueError("write_index needs a 16-byte aligned buffer")
        traffic = Traffic("write_index_kernel", stream_write=4 * n, work_bytes=4 * n)
        return KernelLaunch(traffic, lambda: self.memory.write(buf, 4 * n, Index(0)), self.grid_for(n // 4 + 1))

    def count_index_mismatches(self, buf: int, n: int) -> KernelLaunch:
        traffic = Traffic("count_index_mismatch_kernel", profile="reduce", stream_read=4 * n, work_bytes=4 * n,
                          load_sectors=n / 8, load_requests=n / 32)

        def run() -> int:
            _require_aligned(4, buf)
            return count_differences(self.memory.word_runs(buf, n), list(index_runs(0, n)))

        return KernelLaunch(traffic, run, self.grid_for(n), synchronous=True)

    def copy_words(self, dst: int, src: int, n: int) -> KernelLaunch:
        if dst % 16 or src % 16:
            raise ValueError("copy_words needs 16-byte aligned buffers")
        traffic = Traffic("copy_kernel", stream_read=4 * n, stream_write=4 * n, work_bytes=4 * n,
                          load_sectors=n / 8, load_requests=n / 128)
        return KernelLaunch(traffic, lambda: self.memory.copy(dst, src, 4 * n), self.grid_for(n // 4 + 1))

    def count_mismatches(self, a: int, b: int, n: int) -> KernelLaunch:
        traffic = Traffic("count_mismatch_kernel", profile="reduce", stream_read=8 * n, work_bytes=8 * n,
                          load_sectors=n / 4, load_requests=n / 16)

        def run() -> int:
            _require_aligned(4, a, b)
            return count_differences(self.memory.word_runs(a, n), self.memory.word_runs(b, n))

        return KernelLaunch(traffic, run, self.grid_for(n), synchronous=True)

    def read_sum(self, buf: int, n: int, partials: int) -> KernelLaunch:
        if buf % 16:
            raise ValueError("read_sum needs a 16-byte aligned buffer")
        mem = self.memory
        blocks = self.grid_for(n // 4 + 1)
        traffic = Traffic("read_sum_kernel", stream_read=4 * n, stream_write=8 * blocks, work_bytes=4 * n,
                          load_sectors=n / 8, load_requests=n / 128)

        def run() -> None:
            _require_aligned(8, partials)
            mem.resolve(partials, 8 * blocks)
            mem.write_array(partials, read_sum_partials(mem.word_runs(buf, n), n, blocks), copy=False)

        return KernelLaunch(traffic, run, blocks, result=blocks)

    def stride_read(self, buf: int, threads: int, stride_words: int, partials: int,
                    block_threads: int = 256) -> KernelLaunch:
        if block_threads == 0 or block_threads % 32 != 0 or block_threads > 1024:
            raise ValueError("block_threads must be a multiple of 32 in [32, 1024]")
        blocks = -(-threads // block_threads)
        if blocks == 0 or blocks > 0x7FFFFFFF:
            raise ValueError("thread count out of range")
        mem = self.memory
        stride_bytes = 4 * stride_words
        requests = -(-threads // 32)
        # l2ctl's sector model: sectors a warp's request touches, and DRAM at 64-byte granularity
        spr = sectors_per_request(stride_bytes) if stride_words else 1
        dram = dram_bytes_per_request(stride_bytes) if stride_words else 64
        traffic = Traffic("stride_read_kernel", profile="stride", l2_bytes=requests * spr * 32.0, threads=threads,
                          dram_read_bytes=float(requests * dram), stream_read=requests * spr * 32.0,
                          stream_write=8 * blocks, dram_efficiency=0.915 if stride_bytes >= 128 else 1.0,
                          load_sectors=float(requests * spr), load_requests=float(requests))
        words = (threads - 1) * stride_words + 1

        def run() -> None:
            _require_aligned(4, buf)
            _require_aligned(8, partials)
            mem.resolve(partials, 8 * blocks)
            sums = stride_partials(mem.word_runs(buf, words), threads, stride_words, block_threads)
            mem.write_array(partials, sums, copy=False)

        return KernelLaunch(traffic, run, blocks, block_threads, blocks)

    def sum_u64(self, values: int, count: int) -> KernelLaunch:
        traffic = Traffic("sum_u64_kernel", profile="reduce", stream_read=8 * count, work_bytes=8 * count,
                          load_sectors=count / 4, load_requests=count / 32)

        def run() -> int:
            _require_aligned(8, values)
            total = U64(0)
            step = CHUNK_WORDS // 2
            for k in range(0, count, step):
                n = min(step, count - k)
                chunk = np.ascontiguousarray(self.memory.read(values + 8 * k, 8 * n)).view(U64)
                total = U64(total + chunk.sum(dtype=U64))
            return int(total)

        return KernelLaunch(traffic, run, self.grid_for(count), synchronous=True)

    # cache-streaming scenarios ----------------------------------------------------------------------
    def sparse_vector(self, values: int, indices: int, dense: int, dense_len: int, result: int, n: int,
                      streaming: bool) -> KernelLaunch:
        if dense_len == 0 or dense_len > 0xFFFFFFFF:
            raise ValueError("dense length out of range")
        mem = self.memory
        gathered = min(32.0, max(1.0, dense_len / 8))
        traffic = Traffic("sparse_vector_kernel", profile="sparse", stream_read=8 * n, stream_write=4 * n,
                          hot=(dense, 4 * dense_len), hot_reads=4 * n, work_bytes=12 * n,
                          dram_efficiency=0.99 if streaming else 1.0, load_sectors=n / 32 * (8 + gathered),
                          load_requests=3 * n / 32)

        def compute() -> Array:
            v = mem.read_words(values, n).view(np.float32)
            idx = mem.read_words(indices, n)
            d = mem.read_words(dense, dense_len).view(np.float32)
            out = np.empty(n, dtype=np.float32)
            for k in range(0, n, CHUNK_WORDS):
                vk = v[k:k + CHUNK_WORDS]
                hot = d[idx[k:k + CHUNK_WORDS].astype(np.int64) % dense_len]
                out[k:k + CHUNK_WORDS] = _fma32(vk, hot, np.sin(vk * np.float32(0.1)))
            return out

        inputs = ((values, 4 * n), (indices, 4 * n), (dense, 4 * dense_len))
        return self._float_kernel(traffic, inputs, result, n, compute)

    def stream_analysis(self, data: int, categories: int, weights: int, weights_len: int, results: int, n: int,
                        streaming: bool) -> KernelLaunch:
        if weights_len == 0 or weights_len > 0xFFFFFFFF:
            raise ValueError("weights length out of range")
        mem = self.memory
        moved = 64 * n + 4 * n
        # normal loads: the 7 later iterations hit the L1 line the first brought; .cs loads evict it, so
        # every iteration fetches the warp's 32 sectors from L2 again
        l2 = 8 * 64.0 * n + 4 * n if streaming else float(moved)
        traffic = Traffic("stream_analysis_kernel", profile="analysis", stream_read=64 * n, stream_write=4 * n,
                          hot=(weights, 4 * weights_len), hot_reads=32 * n, work_bytes=moved, l2_bytes=l2,
                          load_sectors=n / 32 * 16 * 32 + n / 32 * 8, load_requests=n / 32 * 24)

        def compute() -> Array:
            out = np.empty(n, dtype=np.float32)
            w = mem.read_words(weights, weights_len).view(np.float32)
            rows = max(1, CHUNK_WORDS // 8)
            for t in range(0, n, rows):
                m = min(rows, n - t)
                x = np.ascontiguousarray(mem.read(data + 32 * t, 32 * m)).view(np.float32).reshape(m, 8)
                c = np.ascontiguousarray(mem.read(categories + 32 * t, 32 * m)).view(np.uint32).reshape(m, 8)
                wc = w[c.astype(np.int64) % weights_len]
                terms = _fma32(x, wc, np.cos(x * np.float32(0.01)))
                s = np.zeros(m, dtype=np.float32)
                for i in range(8):  # the kernel's order of float32 additions
                    s = s + terms[:, i]
                out[t:t + m] = s
            return out

        inputs = ((data, 32 * n), (categories, 32 * n), (weights, 4 * weights_len))
        return self._float_kernel(traffic, inputs, results, n, compute)

    # stand-ins ----------------------------------------------------------------------------------------
    def fake_kernel(self) -> KernelLaunch:
        return KernelLaunch(Traffic("fake_kernel"), lambda: None, 1, 32)

    def modeled(self, name: str, streamed_bytes: float, hot: Optional[tuple[int, int]], hot_reads: float,
                compute_ms: float, read_fraction: float, args: tuple[int, ...] = ()) -> KernelLaunch:
        if not 0.0 <= read_fraction <= 1.0:
            raise ValueError("read_fraction must be in [0, 1]")
        if streamed_bytes < 0 or hot_reads < 0 or compute_ms < 0:
            raise ValueError("byte counts and compute_ms must be >= 0")
        traffic = Traffic(name, profile="modeled", stream_read=streamed_bytes * read_fraction,
                          stream_write=streamed_bytes * (1 - read_fraction), hot=hot,
                          hot_reads=hot_reads if hot is not None else 0.0, work_bytes=streamed_bytes,
                          compute_ms=compute_ms, load_sectors=(streamed_bytes * read_fraction + hot_reads) / 32,
                          load_requests=(streamed_bytes * read_fraction + hot_reads) / 512)

        def run() -> None:
            if hot is not None:
                self.memory.resolve(hot[0], hot[1])

        blocks = self.grid_for(max(1, int(streamed_bytes) // 16))
        given = args if args else (() if hot is None else (hot[0],))
        return KernelLaunch(traffic, run, blocks, args=tuple(int(a) for a in given))

