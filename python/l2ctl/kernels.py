"""Kernels that show the hardware, callable on any accepted stream and buffer.

All launches are asynchronous on ``stream`` (None: the legacy default stream). Buffers are checked
(device memory, on the stream's device, sizes) before anything is launched.

The kernels are compiled at run time by NVRTC for the GPU in use, on their first use on a device, and cached on
disk (``compile_info()`` says what happened; ``l2ctl._nvrtc`` where NVRTC and the cache are looked for). Without
NVRTC they raise ``KernelsUnavailableError``, which says what to install; nothing else in l2ctl needs NVRTC.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _backend, _nvrtc
from ._device import check_pointer, resolve_device, stream_device
from ._interop import BufferRef, StreamRef, resolve_buffer, resolve_stream
from ._memory import BufferLike, StreamLike
from ._plan import check_count, check_nbytes, is_integer

__all__ = ["ResetVariant", "check_variant", "LaunchShape", "reset_data", "verify_reset_data", "write_index",
           "count_index_mismatches", "copy_words", "count_mismatches", "read_sum", "stride_read", "sum_u64",
           "sparse_vector", "stream_analysis", "sectors_per_request", "dram_bytes_per_request", "SECTOR_BYTES",
           "compile_info"]

SECTOR_BYTES = 32
WARP_SIZE = 32


class ResetVariant(enum.IntEnum):
    """How reset_data moves its data (see src/l2ctl/kernels.hpp)."""

    PLAIN = 0  #: plain loads and stores, grid sized to the device
    STREAMING = 1  #: st.global.cs stores for the output
    EVICT_LAST = 2  #: LUT loads with an L2 evict_last policy (createpolicy + .L2::cache_hint)
    HINTED = 3  #: evict_last LUT loads and .cs stores
    ANNOTATED = 4  #: LUT with the access property of cuda::annotated_ptr<const int, access_property::persisting>
    SEED = 5  #: the source blog's shape: 32 blocks x 1024 threads, 64-bit i % n (reference only)
    SCALAR = 6  #: plain, with 4-byte loads and stores only (the shape of the reference H100 measurements)


@dataclass(frozen=True)
class LaunchShape:
    blocks: int
    threads: int
    vector_out: bool
    vector_lut: bool


def check_variant(value: object) -> ResetVariant:
    """A ResetVariant from itself, its value or its name ("plain", "hinted", ...); ValueError otherwise."""
    if isinstance(value, str):
        try:
            return ResetVariant[value.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown variant {value!r}; one of {[v.name.lower() for v in ResetVariant]}") from None
    if not is_integer(value):
        raise TypeError(f"variant must be a ResetVariant or its name, not {type(value).__name__}")
    try:
        return ResetVariant(int(value))
    except ValueError:
        raise ValueError(f"unknown variant {value!r}") from None


def _buffer(buf: BufferLike, name: str, unit: int = 4) -> BufferRef:
    """A resolved buffer whose size is a whole number of ``unit``-byte elements (no device query)."""
    ref = resolve_buffer(buf)
    if ref.nbytes % unit:
        raise ValueError(f"{name} holds {ref.nbytes} bytes, not a whole number of {unit}-byte elements")
    return ref


# What load_kernels reported for each device of the backend in use (the first of the pair).
_loaded: tuple[object, dict[int, dict[str, Any]]] = (None, {})
_load_lock = threading.Lock()


def _kernels_ready(device: int) -> None:
    """Compiles (or reads from the cache) and loads the kernels on ``device``, once per process and backend."""
    global _loaded
    backend = _backend.current()
    if _loaded[0] is backend and device in _loaded[1]:
        return
    with _load_lock:
        if _loaded[0] is not backend:
            _loaded = (backend, {})
        if device not in _loaded[1]:
            candidates = _nvrtc.search_paths(int(backend.runtime_version()) // 1000, int(backend.driver_version()))
            cache, why_none = _nvrtc.cache_location()
            info = dict(backend.load_kernels(device, candidates, cache))
            if why_none and info.get("cache_note") == "no cache directory":
                info["cache_note"] += f": {why_none}"
            _loaded[1][device] = info


def compile_info() -> list[dict[str, Any]]:
    """How the kernels were made ready on each device used so far in this process: ``device``, ``arch``,
    ``image`` ("cubin" for that arch, "ptx" the driver compiles), ``source`` ("compiled" or "cache"), ``seconds``
    (compiling, or reading the cache), ``cache_file``, ``cache_note`` (why the cache was not used, if it was not),
    ``nvrtc`` (the library) and ``nvrtc_version``. Empty before the first kernel."""
    return [{"device": device, **info} for device, info in sorted(_loaded[1].items())]


def _on_device(stream: StreamRef, *buffers: tuple[BufferRef, str, int]) -> int:
    """The stream's device, after checking every buffer: device memory of that device, inside its
    allocation, aligned to its element size; the kernels are then ready there. Called once the arguments
    themselves are known good."""
    device = stream_device(stream)
    for ref, name, align in buffers:
        if ref.device is not None and ref.device != device:
            raise ValueError(f"{name} is on device {ref.device} but the stream is on device {device}")
        check_pointer(ref.ptr, ref.nbytes, device, name, align=align)
    _kernels_ready(device)
    return device


def reset_data(
    out: BufferLike, lut: BufferLike, stream: StreamLike = None, *, variant: Union[ResetVariant, str, int] = "plain",
    blocks_per_sm: int = 0,
) -> LaunchShape:
    """Fill ``out`` with ``lut`` repeated (32-bit words): out[i] = lut[i % len(lut)].

    The LUT need not divide the output; any lengths work. 16-byte stores are used when ``out`` is
    16-byte aligned, 16-byte LUT loads when the LUT is too and its length is a multiple of 4.
    """
    kind = check_variant(variant)
    per_sm = check_count(blocks_per_sm, "blocks_per_sm", minimum=0, maximum=64)
    s = resolve_stream(stream)
    o, l = _buffer(out, "out"), _buffer(lut, "lut")
    if l.nbytes // 4 >= 1 << 31:
        raise ValueError(f"the LUT has {l.nbytes // 4} words; at most 2^31 - 1 are supported")
    device = _on_device(s, (o, "out", 4), (l, "lut", 4))
    raw = _backend.current().reset_data(device, s.handle, o.ptr, o.nbytes // 4, l.ptr, l.nbytes // 4, int(kind), per_sm)
    return LaunchShape(int(raw[0]), int(raw[1]), bool(raw[2]), bool(raw[3]))


def verify_reset_data(out: BufferLike, lut: BufferLike, stream: StreamLike = None) -> int:
    """Number of words of ``out`` that differ from ``lut`` repeated (checked on the device; waits)."""
    s = resolve_stream(stream)
    o, l = _buffer(out, "out"), _buffer(lut, "lut")
    device = _on_device(s, (o, "out", 4), (l, "lut", 4))
    return int(_backend.current().reset_data_verify(device, s.handle, o.ptr, o.nbytes // 4, l.ptr, l.nbytes // 4))


def write_index(buf: BufferLike, stream: StreamLike = None) -> None:
    """buf[i] = i for every 32-bit word (16-byte stores): the write-only bandwidth kernel."""
    s, b = resolve_stream(stream), _buffer(buf, "buf")
    device = _on_device(s, (b, "buf", 16))
    _backend.current().write_index(device, s.handle, b.ptr, b.nbytes // 4)


def count_index_mismatches(buf: BufferLike, stream: StreamLike = None) -> int:
    s, b = resolve_stream(stream), _buffer(buf, "buf")
    device = _on_device(s, (b, "buf", 4))
    return int(_backend.current().count_index_mismatches(device, s.handle, b.ptr, b.nbytes // 4))


def copy_words(dst: BufferLike, src: BufferLike, stream: StreamLike = None) -> None:
    """16-byte copy of src into dst (equal sizes): the copy bandwidth kernel."""
    s, d, r = resolve_stream(stream), _buffer(dst, "dst"), _buffer(src, "src")
    if d.nbytes != r.nbytes:
        raise ValueError(f"dst has {d.nbytes} bytes, src {r.nbytes}")
    device = _on_device(s, (d, "dst", 16), (r, "src", 16))
    _backend.current().copy_words(device, s.handle, d.ptr, r.ptr, d.nbytes // 4)


def count_mismatches(a: BufferLike, b: BufferLike, stream: StreamLike = None) -> int:
    s, x, y = resolve_stream(stream), _buffer(a, "a"), _buffer(b, "b")
    if x.nbytes != y.nbytes:
        raise ValueError(f"a has {x.nbytes} bytes, b {y.nbytes}")
    device = _on_device(s, (x, "a", 4), (y, "b", 4))
    return int(_backend.current().count_mismatches(device, s.handle, x.ptr, y.ptr, x.nbytes // 4))


def read_sum(buf: BufferLike, partials: BufferLike, stream: StreamLike = None) -> int:
    """Sum every 32-bit word of ``buf`` (16-byte loads) into per-block uint64 partials; returns how many
    partials were written. ``partials`` must hold max_read_partials() uint64 values."""
    s, b, p = resolve_stream(stream), _buffer(buf, "buf"), _buffer(partials, "partials", 8)
    device = _on_device(s, (b, "buf", 16), (p, "partials", 8))
    needed = int(_backend.current().max_read_partials(device)) * 8
    if p.nbytes < needed:
        raise ValueError(f"partials needs {needed} bytes, has {p.nbytes}")
    return int(_backend.current().read_sum(device, s.handle, b.ptr, b.nbytes // 4, p.ptr))


def max_read_partials(device: object = None) -> int:
    """How many uint64 partials read_sum writes at most on ``device``."""
    index = resolve_device(device)
    _kernels_ready(index)
    return int(_backend.current().max_read_partials(index))


def stride_read(
    buf: BufferLike, stride_bytes: int, partials: BufferLike, stream: StreamLike = None, *,
    threads: Optional[int] = None, block_threads: int = 256,
) -> int:
    """Thread t loads the 4-byte word at byte t * stride_bytes (one load per thread); each block writes
    the sum of its loads to ``partials`` (uint64). ``threads`` defaults to as many as ``buf`` allows.
    Returns the number of blocks (partials written)."""
    stride_bytes = check_nbytes(stride_bytes, "stride_bytes")
    if stride_bytes % 4 or stride_bytes >= 1 << 34:
        raise ValueError(f"stride_bytes must be a multiple of 4 (the load size) below 2**34, got {stride_bytes}")
    block_threads = check_count(block_threads, "block_threads", minimum=32, maximum=1024)
    if block_threads % 32:
        raise ValueError(f"block_threads must be a multiple of 32 (a warp), got {block_threads}")
    s, b, p = resolve_stream(stream), _buffer(buf, "buf"), _buffer(partials, "partials", 8)
    stride_words = stride_bytes // 4
    capacity = (b.nbytes // 4 - 1) // stride_words + 1
    n = capacity if threads is None else check_count(threads, "threads", minimum=1)
    if n > capacity:
        raise ValueError(f"{n} threads at stride {stride_bytes} B need {((n - 1) * stride_words + 1) * 4} bytes; "
                         f"the buffer has {b.nbytes}")
    blocks = -(-n // block_threads)
    if blocks >= 1 << 31:
        raise ValueError(f"{n} threads need {blocks} blocks of {block_threads}; at most 2**31 - 1 blocks")
    if p.nbytes < blocks * 8:
        raise ValueError(f"partials needs {blocks * 8} bytes for {blocks} blocks, has {p.nbytes}")
    device = _on_device(s, (b, "buf", 4), (p, "partials", 8))
    return int(_backend.current().stride_read(device, s.handle, b.ptr, n, stride_words, p.ptr, block_threads))


def sum_u64(values: BufferLike, count: int, stream: StreamLike = None) -> int:
    """Sum of the first ``count`` uint64 values (on the device; waits)."""
    count = check_count(count, "count", minimum=0)
    s, v = resolve_stream(stream), _buffer(values, "values", 8)
    if count * 8 > v.nbytes:
        raise ValueError(f"{count} uint64 values need {count * 8} bytes, the buffer has {v.nbytes}")
    device = _on_device(s, (v, "values", 8))
    return int(_backend.current().sum_u64(device, s.handle, v.ptr, count))


def _streaming(streaming: object, stream: StreamLike, **buffers: BufferLike) -> tuple[StreamRef, list[BufferRef]]:
    """The stream and buffers of a cache-streaming kernel (4-byte elements), after checking ``streaming``."""
    if not isinstance(streaming, bool):
        raise TypeError("streaming must be a bool")
    return resolve_stream(stream), [_buffer(b, name) for name, b in buffers.items()]


def sparse_vector(values: BufferLike, indices: BufferLike, dense: BufferLike, result: BufferLike,
                  stream: StreamLike = None, *, streaming: bool = False) -> None:
    """result[t] = values[t] * dense[indices[t] % len(dense)] + sin(0.1 values[t]) (float32; int32 indices).
    ``streaming=True`` reads values and indices with ld.global.cs."""
    s, (v, i, d, r) = _streaming(streaming, stream, values=values, indices=indices, dense=dense, result=result)
    n = v.nbytes // 4
    if i.nbytes // 4 != n or r.nbytes // 4 != n:
        raise ValueError("values, indices and result must have the same number of elements")
    device = _on_device(s, (v, "values", 4), (i, "indices", 4), (d, "dense", 4), (r, "result", 4))
    _backend.current().sparse_vector(device, s.handle, v.ptr, i.ptr, d.ptr, d.nbytes // 4, r.ptr, n, streaming)


def stream_analysis(data: BufferLike, categories: BufferLike, weights: BufferLike, results: BufferLike,
                    stream: StreamLike = None, *, streaming: bool = False) -> None:
    """results[t] = sum over k < 8 of x * weights[c % len(weights)] + cos(0.01 x), with x = data[8t + k] and
    c = categories[8t + k]. ``streaming=True`` reads data and categories with ld.global.cs."""
    s, (x, c, w, r) = _streaming(streaming, stream, data=data, categories=categories, weights=weights,
                                 results=results)
    n = r.nbytes // 4
    if x.nbytes // 4 != 8 * n or c.nbytes // 4 != 8 * n:
        raise ValueError("data and categories must hold 8 elements per result")
    device = _on_device(s, (x, "data", 4), (c, "categories", 4), (w, "weights", 4), (r, "results", 4))
    _backend.current().stream_analysis(device, s.handle, x.ptr, c.ptr, w.ptr, w.nbytes // 4, r.ptr, n, streaming)


def _granules(stride_bytes: int, element_bytes: int, warp: int, granularity: int) -> int:
    """How many ``granularity``-byte chunks one warp request touches when thread t reads ``element_bytes``
    at t * stride_bytes (aligned base)."""
    stride_bytes = check_nbytes(stride_bytes, "stride_bytes")
    return len({c for first in (t * stride_bytes for t in range(warp))
                for c in range(first // granularity, (first + element_bytes - 1) // granularity + 1)})


def sectors_per_request(stride_bytes: int, element_bytes: int = 4, warp: int = WARP_SIZE,
                        sector_bytes: int = SECTOR_BYTES) -> int:
    """32-byte sectors one warp request touches when thread t reads ``element_bytes`` at t * stride_bytes
    (aligned base): 4 at 4 B, 8 at 8 B, 16 at 16 B, 32 at 32 B and above."""
    return _granules(stride_bytes, element_bytes, warp, sector_bytes)


def dram_bytes_per_request(stride_bytes: int, element_bytes: int = 4, warp: int = WARP_SIZE,
                           dram_granularity: int = 64) -> int:
    """Bytes DRAM delivers for one warp request when it reads whole ``dram_granularity`` chunks
    (64 B, two sectors, as measured on an H100: at 64 B strides half of what DRAM moves is unused)."""
    return _granules(stride_bytes, element_bytes, warp, dram_granularity) * dram_granularity
