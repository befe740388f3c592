"""Bandwidth ceilings of the device, measured with l2ctl's own 16-byte kernels, each output verified."""

from __future__ import annotations

from dataclasses import dataclass

from .. import kernels
from .._interop import resolve_stream
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_nbytes, round_up
from .._device import stream_device
from .._errors import check
from .timing import Timing, check_repeats, time_gpu

__all__ = ["Ceilings", "measure_ceilings", "time_read"]


@dataclass
class Ceilings:
    """Bandwidth ceilings (GB/s = 1e9 B/s; copy counts read + write) and the times they came from."""

    nbytes: int
    write_gbps: float
    copy_gbps: float
    read_gbps: float
    write_ms: float
    copy_ms: float
    read_ms: float


def measure_ceilings(stream: StreamLike = None, nbytes: int = 1 << 30, *, warmup: int = 3, repeat: int = 15) -> Ceilings:
    """Write-only, copy and read bandwidth of ``nbytes`` buffers with l2ctl's 16-byte kernels, each verified.
    Run inside clean_state() to measure with a given set-aside (the set-aside lowers these)."""
    warmup, repeat = check_repeats(warmup, repeat)
    nbytes = round_up(check_nbytes(nbytes, "nbytes"), 16)
    device = stream_device(resolve_stream(stream))
    with DeviceBuffer(nbytes, device) as a, DeviceBuffer(nbytes, device) as b, \
            DeviceBuffer(8 * kernels.max_read_partials(device), device) as partials:
        write = time_gpu(lambda s: kernels.write_index(a, s), stream, warmup=warmup, repeat=repeat)
        check(kernels.count_index_mismatches(a, stream) == 0, "write_index left wrong words")
        b.fill_bytes(0xFF, stream)
        copy = time_gpu(lambda s: kernels.copy_words(b, a, s), stream, warmup=warmup, repeat=repeat)
        check(kernels.count_mismatches(a, b, stream) == 0, "copy_words left wrong words")
        rd = time_read(a, partials, stream, warmup, repeat)
    return Ceilings(nbytes, nbytes / write.median_ms / 1e6, 2 * nbytes / copy.median_ms / 1e6,
                    nbytes / rd.median_ms / 1e6, write.median_ms, copy.median_ms, rd.median_ms)


def time_read(buf: DeviceBuffer, partials: DeviceBuffer, stream: StreamLike, warmup: int, repeat: int) -> Timing:
    """read_sum over ``buf`` (write_index's words: 0, 1, 2, ...) timed, its checksum verified: the read ceiling."""
    blocks = [0]

    def read(s: StreamLike) -> None:
        blocks[0] = kernels.read_sum(buf, partials, s)

    timing = time_gpu(read, stream, warmup=warmup, repeat=repeat)
    words = buf.nbytes // 4
    check(kernels.sum_u64(partials, blocks[0], stream) == words * (words - 1) // 2 % (1 << 64), "read_sum checksum")
    return timing
