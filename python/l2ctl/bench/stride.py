"""Strided 4-byte loads: sectors per warp request and what DRAM moves, against the read ceiling."""

from __future__ import annotations

from typing import Any, Sequence

from .. import kernels
from .._device import resolve_device
from .._memory import DeviceBuffer, StreamLike
from .._plan import check_count, round_up
from .._errors import check
from .progress import Progress
from .records import Record, Report, environment
from .state import clean_state, owned_stream
from .ceilings import time_read
from .timing import check_repeats, time_gpu

__all__ = ["bench_stride"]

GB = 1e9


def check_strides(strides: Sequence[int]) -> list[int]:
    out = [check_count(s, "stride", minimum=4, maximum=1 << 20) for s in strides]
    for st in out:
        if st % 4:
            raise ValueError(f"strides must be positive multiples of 4 bytes, got {st}")
    if not out:
        raise ValueError("at least one stride is needed")
    return out


def bench_stride(
    strides: Sequence[int] = (4, 8, 16, 32, 64, 128),
    *,
    threads: int = 1 << 25,
    stream: StreamLike = None,
    device: object = None,
    warmup: int = 3,
    repeat: int = 15,
    progress: bool = True,
) -> Report:
    """One 4-byte load per thread at each stride, no set-aside; sector and DRAM throughput from l2ctl's
    sector model, compared with the read ceiling measured on the same buffer."""
    warmup, repeat = check_repeats(warmup, repeat)
    strides = check_strides(strides)
    threads = check_count(threads, "threads", minimum=32, maximum=1 << 31)
    index = resolve_device(device)
    max_words = max(strides) // 4
    nbytes = round_up(((threads - 1) * max_words + 1) * 4, 16)
    records: list[Record] = []
    blocks_max = -(-threads // 256)
    with Progress(len(strides) + 1, "stride", progress) as bar, owned_stream(stream, index) as s, \
            clean_state(s, set_aside=0), DeviceBuffer(nbytes, index) as buf, \
            DeviceBuffer(8 * max(blocks_max, kernels.max_read_partials(index)), index) as partials:
        kernels.write_index(buf, s)
        check(kernels.count_index_mismatches(buf, s) == 0, "stride buffer fill")
        rd = time_read(buf, partials, s, warmup, repeat)
        nblocks = [0]
        read_gbps = nbytes / rd.median_ms / 1e6
        bar.step("read ceiling")
        for stride in strides:
            sw = stride // 4

            def run(st_: StreamLike, sw: int = sw) -> None:
                nblocks[0] = kernels.stride_read(buf, sw * 4, partials, st_, threads=threads)

            timing = time_gpu(run, s, warmup=warmup, repeat=repeat)
            total = kernels.sum_u64(partials, nblocks[0], s)
            check(total == sw * threads * (threads - 1) // 2 % (1 << 64), f"stride {stride} B checksum")
            requests = threads / 32
            spr = kernels.sectors_per_request(stride)
            dram = kernels.dram_bytes_per_request(stride)
            t = timing.median_ms / 1e3
            sector_gbps, dram_gbps = requests * spr * 32 / t / GB, requests * dram / t / GB
            metrics: dict[str, Any] = {
                "useful_gbps": threads * 4 / t / GB, "sectors_per_request_model": spr, "sector_gbps": sector_gbps,
                "dram_bytes_per_request_model": dram, "dram_model_gbps": dram_gbps, "read_ceiling_gbps": read_gbps,
                "sector_fraction_of_read_ceiling": sector_gbps / read_gbps,
                "dram_fraction_of_read_ceiling": dram_gbps / read_gbps}
            config = {"stride_bytes": stride, "threads": threads, "buffer_bytes": nbytes}
            records.append(Record.from_timing("stride", f"{stride}B", config, timing, metrics))
            bar.step(f"stride {stride} B")
    return Report("stride", environment(index), records,
                  summary={"read_ceiling_gbps": read_gbps, "read_ceiling_ms": rd.median_ms})
