"""The simulator's timing model: how long a kernel takes, from the bytes it moves and an L2 model.

A launch is described by its ``Traffic``: bytes read or written once (``stream_read`` /
``stream_write``, S: they go to DRAM); a *hot* buffer ``hot = (ptr, H bytes)`` re-read ``hot_reads``
(R) bytes in total (reset-data: the LUT, read once per output word); a kernel *profile* (how it issues
its accesses: 16-byte vectors, 4-byte scalars, the blog's 32x1024 shape, one load per thread, ...),
with the bytes or threads its issue rate applies to; cache hints (``evict_last`` or ``annotated`` LUT
loads, ``.cs`` stores).

**The hot buffer in L2.** A window on the stream (or graph node) that covers the hot buffer with hit
ratio h and hitProp PERSISTING asks for D = h x (covered bytes) of persisting L2. If D (plus the demand
of persisting windows of kernels running at the same time on other streams) fits the limit, it stays
resident, but as D approaches the limit part of it is served as slowly as a normal-L2 hit (none below
60% of the limit, up to 30% at the limit: the H100's counters show a 12-16 MiB LUT in a right-sized
set-aside staying in L2 while the kernel loses a good part of its gain); above the limit the
persisting lines thrash and a part is lost. The rest of the hot buffer competes in the *normal* L2
(L2 size minus the limit) with the streaming traffic: with x = (hot bytes there + streamed bytes
between two reuses of a line) / (normal L2), a fraction m(x) = x^p / (x0^p + x^p) of its reads miss
(p, x0 fitted to the H100's counters: 4 MiB LUT 4%, 16 MiB 27%, 32 MiB 53% of LUT reads from DRAM).
``.cs`` stores pollute less; lines given STREAMING by the window's misses are evicted first;
``evict_last``/``annotated`` loads protect part of the normal L2 without a set-aside. Persisted lines
survive from launch to launch until ``cudaCtxResetPersistingL2Cache``, a limit change, or the start of
a profiler pass; every other hot line must be loaded once per launch.

**Time.** DRAM bytes = S + missed hot reads + first loads. With x_r the read fraction, a byte takes
x_r / B_read + (1 - x_r) / B_write + k 4 x_r (1 - x_r) (k: bus turnaround, from the copy ceiling), all
divided by the *tax*: the measured slowdown of streaming traffic as the set-aside grows (none up to 30%
of the persisting max, the measured curve up to the max), interpolated between the write-only and the copy curve
by the read fraction. L2 traffic (streams + hot reads) runs at the device's L2 bandwidth, taxed more
steeply (tax^1.3: what makes the textbook recipe 2.5-3x slower although its LUT stays in L2). Then

    time = launch overhead + max(issue floor, DRAM time, L2 time) + latency of unprotected hot reads

The issue floor is the kernel profile's rate (the 16-byte kernel at the write ceiling, the 4-byte one
at 87% of it, one-load-per-thread kernels per thread and SM). The last term charges each hot read that
hit the normal L2 instead of a persisted line a profile-dependent cost (growing with the hot buffer's
size up to a few percent of the L2), small for 16-byte vectors and large for 4-byte scalars: why the
scalar kernel gains 1.6-1.7x from a right-sized set-aside and the vectorized one 1.2-1.3x, and (with
a cost per miss) why the blog's latency-bound 32x1024 kernel gets 2-3x slower as its LUT grows.
Durations get a multiplicative noise (``FakeDevice.noise``, 0.3% by default) drawn from the backend's seed.

Calibration, H100 preset against the README's table (``bench reset-data``, 1 GiB output, ms;
simulated / measured; the recipe is set-aside = max with hit ratio set-aside / LUT):

    LUT       baseline       recipe         right-sized    hints only     seed shape
    1 MiB     0.356 / 0.356  1.03 / 0.97    0.339 / 0.355  0.339 / 0.344  1.60 / 1.64
    4 MiB     0.414 / 0.416  1.03 / 1.08    0.339 / 0.347  0.340 / 0.346  1.80 / 2.01
    8 MiB     0.456 / 0.457  1.02 / 1.08    0.346 / 0.354  0.366 / 0.423  2.16 / 2.46
    12 MiB    0.491 / 0.485  1.02 / 1.09    0.368 / 0.429  0.403 / 0.433  2.55 / 2.58
    16 MiB    0.523 / 0.502  1.02 / 1.07    0.467 / 0.453  0.434 / 0.461  2.91 / 3.27
    24 MiB    0.574 / 0.561  1.03 / 1.05    0.482 / 0.515  0.485 / 0.526  3.52 / 4.21
    32 MiB    0.611 / 0.587  1.04 / 0.95    1.04 / 0.96    0.525 / 0.544  4.01 / 4.25
    48 MiB    0.659 / 0.648  1.16 / 1.32    1.17 / 1.32    0.585 / 0.629  4.66 / 4.23

The ceilings (3,168 / 2,819 / 3,077 GB/s write / copy / read), the tax at every granule, the stride
table (0.120, 0.120, 0.179, 0.350, 0.690, 0.754 ms against 0.120, 0.126, 0.176, 0.341, 0.678, 0.741)
and the cache-streaming kernels (stream analysis with ``.cs`` loads 3.7x slower, sparse vector equal)
are within a few percent. ``tune()`` finds 1.05-1.33x on the vectorized kernel and 1.16-1.74x on the
scalar one at 1-16 MiB, 1.05-1.13x at 32-48 MiB (measured: 1.04-1.27x, 1.11-1.73x, 1.02-1.08x).

**Limits.** Concurrent kernels share bandwidth only as the backend's clocks model it (processor
sharing of two overlapping launches at a time); their persisting windows compete for the set-aside
while they overlap. Only the hot buffer's residency is modelled; streaming data never hits in L2
across launches, and there is no placement effect (the measured run-to-run differences that depend
on where buffers land). The numbers are fitted to one H100 run (and scaled by bandwidth and L2 size
to the other presets): use them for the shape of results and to exercise code, not as predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .._units import GiB, MiB
from .devices import FakeDevice

__all__ = ["Traffic", "Profile", "PROFILES", "Estimate", "DeviceModel", "hill_miss", "METRIC_NAMES", "GiB"]

PERSISTING, STREAMING, NORMAL = 2, 1, 0

#: Calibration shared by every device (fitted to the H100 reference tables; see the module docstring).
LAUNCH_US = 3.0  # per-launch overhead
RAMP_US = 5.0  # pipeline ramp of a memory-bound kernel, scaled by min(1, DRAM bytes / 16 MiB)
HILL_P, HILL_X0 = 1.45, 1.19  # miss fraction of the normal L2: x^p / (x0^p + x^p)
STREAMING_MISS_X = 1.6  # window misses marked STREAMING are evicted first: their x grows by this factor
CS_STORE_POLLUTION = 0.35  # a .cs (evict-first) store occupies normal L2 this much of a plain one
EVICT_LAST_SHARE = 0.12  # evict_last loads keep up to this fraction of the normal L2 for the hot buffer
ANNOTATED_SHARE = 0.025  # cuda::annotated_ptr<persisting> without a set-aside
FILL_START, FILL_LOSS = 0.6, 0.3  # demand above 60% of the limit: up to 30% of it is slow (quadratically)
THRASH_LOSS = 0.15  # demand above the limit: a part is lost, up to 15% at twice the limit
L2_TAX_POWER = 1.3  # L2 bandwidth under the set-aside: tax ** this
LATENCY_KNEE = 0.04  # the latency cost of unprotected hot reads grows like H^2 / (H^2 + (4% of L2)^2)


@dataclass(frozen=True)
class Profile:
    """How a kernel issues its accesses; latencies are in units of the time the write ceiling takes for a byte."""

    issue: float = 1.0  # its issue floor streams ``work_bytes`` at this fraction of the write-ceiling bandwidth
    thread_ns: float = 0.0  # plus this many ns x SM per thread (one-load-per-thread kernels)
    hit_latency: float = 0.0  # charged per unprotected hot byte read
    miss_latency: float = 0.0  # charged per missed hot byte read
    l2_efficiency: float = 1.0  # fraction of the L2 bandwidth its access pattern reaches


PROFILES: dict[str, Profile] = {
    "vector": Profile(issue=0.985, hit_latency=0.19),  # reset-data: 16-byte stores and LUT loads
    # 16-byte stores, four 4-byte LUT loads (LUT not 16-byte aligned or its length not a multiple of 4)
    "vector_out": Profile(issue=0.94, hit_latency=0.35),
    "scalar": Profile(issue=0.875, hit_latency=0.96),  # 4-byte loads and stores only
    # the blog's 32 x 1024 kernel with a 64-bit modulo per element: latency-bound
    "seed": Profile(issue=0.212, miss_latency=14.0),
    "stream": Profile(issue=1.0),  # plain 16-byte streaming kernels (write_index, copy, read_sum)
    "reduce": Profile(issue=0.8, hit_latency=0.3),  # grid-stride 4-byte reductions (verification, counting)
    "stride": Profile(issue=0.0, thread_ns=0.46),  # one 4-byte load per thread (stride_read)
    "sparse": Profile(issue=0.72),  # one element per thread: sparse_vector
    # 8 consecutive elements per thread: stream_analysis (normal loads hit L1 for 7 of 8)
    "analysis": Profile(issue=0.74, l2_efficiency=0.7),
    "modeled": Profile(issue=1.0, hit_latency=0.19),  # launch_modeled_kernel
}


@dataclass(frozen=True)
class Traffic:
    """What one launch moves; see the module docstring."""

    name: str
    profile: str = "stream"
    stream_read: float = 0.0
    stream_write: float = 0.0
    hot: Optional[tuple[int, int]] = None  # (ptr, nbytes)
    hot_reads: float = 0.0
    hot_hint: str = "normal"  # "normal", "evict_last", "annotated"
    store_hint: str = "normal"  # "normal", "streaming" (.cs stores)
    work_bytes: float = 0.0  # bytes the profile's issue rate applies to
    threads: int = 0  # for per-thread issue cost
    compute_ms: float = 0.0  # an explicit floor (launch_modeled_kernel)
    l2_bytes: Optional[float] = None  # L2 <-> SM bytes when not stream + hot reads
    dram_read_bytes: Optional[float] = None  # DRAM reads when not S + misses (sector over-fetch)
    dram_efficiency: float = 1.0
    load_sectors: float = 0.0  # global-load sectors and requests, for the counters
    load_requests: float = 0.0


@dataclass
class Estimate:
    """The model's account of one launch (what the simulated counters report)."""

    name: str
    duration_ms: float
    dram_read: float
    dram_write: float
    l2_bytes: float
    l2_read_bytes: float
    l2_read_misses: float
    l2_write_bytes: float
    persisted: float  # hot bytes resident as persisting lines
    t_dram_ms: float
    t_l2_ms: float
    load_sectors: float
    load_requests: float
    dram_peak_gbps: float
    l2_peak_gbps: float
    hot_hit_fraction: float = 1.0
    utilization: float = 1.0  # fraction of its duration the kernel keeps DRAM or L2 busy

    def metrics(self) -> dict[str, float]:
        """Values for the metric names of l2ctl._counters.METRIC_UNITS."""
        seconds = self.duration_ms * 1e-3
        sectors = self.l2_bytes / 32
        read_sectors = self.l2_read_bytes / 32
        misses = min(read_sectors, self.l2_read_misses / 32)
        write_misses = 0.03 * self.l2_write_bytes / 32  # writes that miss (partial sectors)
        hit = 100.0 * (1 - (misses + write_misses) / sectors) if sectors else 0.0
        read_hit = 100.0 * (1 - misses / read_sectors) if read_sectors else 0.0
        dram = self.dram_read + self.dram_write
        return {
            "lts__t_sector_hit_rate.pct": max(0.0, hit),
            "lts__t_sector_op_read_hit_rate.pct": max(0.0, read_hit),
            "dram__bytes_read.sum": self.dram_read,
            "dram__bytes_write.sum": self.dram_write,
            "lts__t_bytes.sum.per_second": self.l2_bytes / seconds if seconds else 0.0,
            "dram__bytes.sum.per_second": dram / seconds if seconds else 0.0,
            "lts__throughput.avg.pct_of_peak_sustained_elapsed":
                100.0 * min(1.0, self.l2_bytes / seconds / (self.l2_peak_gbps * 1e9)) if seconds else 0.0,
            "dram__throughput.avg.pct_of_peak_sustained_elapsed":
                100.0 * min(1.0, dram / seconds / (self.dram_peak_gbps * 1e9)) if seconds else 0.0,
            "gpu__time_duration.sum": self.duration_ms * 1e6,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": self.load_sectors,
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": self.load_requests,
            "lts__t_sectors_srcunit_tex_op_read.sum": read_sectors,
        }


#: The counters the model reports (Nsight Compute's names): the keys of Estimate.metrics, in order.
METRIC_NAMES: tuple[str, ...] = tuple(Estimate("", *[0.0] * 14).metrics())


def hill_miss(x: float) -> float:
    """Fraction of reads of data competing in the normal L2 that miss, at occupancy x."""
    if x <= 0:
        return 0.0
    a = math.pow(x, HILL_P)
    return a / (math.pow(HILL_X0, HILL_P) + a)


@dataclass
class _Recent:
    end: float
    demand: float


@dataclass
class DeviceModel:
    """The model for one device, with the L2 state it keeps between launches."""

    device: FakeDevice
    seed: int = 0
    index: int = 0
    persisted: dict[tuple[int, int], float] = field(default_factory=dict)  # hot range -> resident bytes
    dirty: float = 0.0  # bytes to write back before the next kernel's own traffic (profiler start)
    recent: dict[object, _Recent] = field(default_factory=dict)  # stream -> its last persisting launch
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng([self.seed, self.index])
        d = self.device
        overhead_s = (LAUNCH_US + RAMP_US) * 1e-6
        # raw bandwidths (bytes/s) such that 1 GiB kernels reach the measured ceilings with the overhead
        self.bw_write = GiB / (GiB / (d.write_gbps * 1e9) - overhead_s)
        self.bw_read = GiB / (GiB / (d.read_gbps * 1e9) - overhead_s)
        copy_spb = (2 * GiB / (d.copy_gbps * 1e9) - overhead_s) / (2 * GiB)
        self.turnaround = max(0.0, copy_spb - 0.5 / self.bw_read - 0.5 / self.bw_write)

    # ---- state changes ----------------------------------------------------------------------------------
    def reset_persisting(self) -> None:
        self.persisted.clear()

    def persisted_within(self, limit: int) -> dict[tuple[int, int], float]:
        """The persisting lines that a limit of ``limit`` bytes leaves (a new dict; this one when all stay)."""
        total = sum(self.persisted.values())
        if total <= limit:
            return self.persisted
        scale = limit / total if total else 0.0
        return {key: resident * scale for key, resident in self.persisted.items()}

    def profiler_started(self, max_ranges: int) -> None:
        """Starting a range profiler pass evicts persisting lines and leaves its own data dirty in L2
        (measured: 12.5 MB with room for 64 ranges, 2.4 MB with 2)."""
        self.persisted.clear()
        r = min(max(max_ranges, 1), 64)
        self.dirty = (2.4e6 + (12.5e6 - 2.4e6) * (r - 2) / 62) * self.device.l2_cache_size / (50 * MiB)

    # ---- helpers ----------------------------------------------------------------------------------------
    def tax(self, read_fraction: float) -> float:
        d = self.device
        if d.persisting_l2_cache_max_size <= 0:
            return 1.0
        f = d.limit / d.persisting_l2_cache_max_size
        w, c = (float(np.interp(f, *np.transpose(curve))) for curve in (d.tax_write, d.tax_copy))
        return w + (c - w) * min(1.0, 2 * read_fraction)

    def seconds_per_byte(self, read_fraction: float) -> float:
        x = read_fraction
        return x / self.bw_read + (1 - x) / self.bw_write + self.turnaround * 4 * x * (1 - x)

    def noise(self) -> float:
        sigma = self.device.noise
        return float(math.exp(sigma * self.rng.standard_normal())) if sigma > 0 else 1.0

    # ---- the model ----------------------------------------------------------------------------------------
    def evaluate(self, t: Traffic, window: Optional[tuple[int, int, float, int, int]] = None, *,
                 stream: object = None, start_ms: float = 0.0, commit: bool = True, noise: bool = True) -> Estimate:
        """The duration and counters of one launch of ``t`` with ``window`` in force, starting at
        ``start_ms`` on ``stream``'s clock. ``commit`` updates the L2 state (persisted lines)."""
        d = self.device
        prof = PROFILES[t.profile]
        limit = d.limit if d.supports_persistence else 0
        normal = max(d.l2_cache_size - limit, d.l2_cache_size * 0.05)
        R = t.hot_reads if t.hot is not None else 0.0
        H = float(t.hot[1]) if t.hot is not None else 0.0
        P = E = miss = misses = first = 0.0
        unprot_reads = slow_reads = demand = 0.0
        key: Optional[tuple[int, int]] = None
        if t.hot is not None and H > 0 and R > 0:
            key = (t.hot[0], t.hot[1])
            h0, h1 = t.hot[0], t.hot[0] + t.hot[1]
            covered = streaming_cov = 0.0
            if window is not None and window[1] > 0:
                base, nbytes, ratio, hit_prop, miss_prop = window
                cov = max(0, min(h1, base + nbytes) - max(h0, base))
                if hit_prop == PERSISTING:
                    covered = ratio * cov
                if miss_prop == STREAMING:
                    streaming_cov = (1 - ratio) * cov
                if hit_prop == STREAMING:
                    streaming_cov += ratio * cov
            if covered > 0 and limit > 0:
                demand = covered
                others = sum(r.demand for s, r in self.recent.items()
                             if s is not stream and r.end > start_ms and r.demand > 0)
                total = covered + others
                u = total / limit
                share = min(total, limit) * covered / total
                if u <= 1:  # resident, but part of it as slowly as a normal-L2 hit
                    slow = FILL_LOSS * min(1.0, max(0.0, (u - FILL_START) / (1 - FILL_START))) ** 2
                    P = share
                else:  # thrashing: a part is not resident at all
                    slow = FILL_LOSS
                    P = share * (1 - THRASH_LOSS * min(1.0, u - 1))
                slow_reads = R * P * slow / H
            U = H - P
            if t.hot_hint in ("evict_last", "annotated"):
                share_el = EVICT_LAST_SHARE if t.hot_hint == "evict_last" else ANNOTATED_SHARE
                E = min(U, share_el * normal)
            Uu = U - E
            pollution_w = CS_STORE_POLLUTION if t.store_hint == "streaming" else 1.0
            between = (t.stream_write * pollution_w + t.stream_read) * H / R
            x = (U + between) / normal
            miss = hill_miss(x)
            if streaming_cov > 0 and Uu > 0:  # the part of the unprotected lines marked evict-first
                frac = min(1.0, streaming_cov / H) * Uu / U if U > 0 else 0.0
                miss = (1 - frac) * miss + frac * hill_miss(x * STREAMING_MISS_X)
            unprot_reads = R * Uu / H
            misses = unprot_reads * miss
            first = min(max(0.0, P - self.persisted.get(key, 0.0)) + E + Uu * (1 - miss), H)
        dram_read = (t.dram_read_bytes if t.dram_read_bytes is not None else t.stream_read) + misses + first
        dram_write = t.stream_write + self.dirty
        dram = dram_read + dram_write
        xr = dram_read / dram if dram else 0.0
        tax = self.tax(xr)
        t_dram = dram * self.seconds_per_byte(xr) / (tax * t.dram_efficiency) * 1e3
        l2 = t.l2_bytes if t.l2_bytes is not None else t.stream_read + t.stream_write + R
        t_l2 = l2 / (d.l2_gbps * 1e9 * prof.l2_efficiency * tax ** L2_TAX_POWER) * 1e3
        issue = t.compute_ms
        if prof.issue > 0 and t.work_bytes > 0:
            issue = max(issue, t.work_bytes / (self.bw_write * prof.issue) * 1e3)
        if prof.thread_ns > 0 and t.threads > 0:
            issue = max(issue, t.threads * prof.thread_ns / d.multiprocessor_count * 1e-6)
        knee = H * H / (H * H + (LATENCY_KNEE * d.l2_cache_size) ** 2) if H > 0 else 0.0
        t_lat = (prof.hit_latency * knee * (unprot_reads - misses + slow_reads) + prof.miss_latency * misses) \
            / self.bw_write * 1e3
        ramp = RAMP_US * 1e-3 * min(1.0, dram / (16 * MiB))
        core = max(issue, t_dram + ramp, t_l2) + t_lat
        duration = LAUNCH_US * 1e-3 + core
        utilization = min(1.0, max(t_dram + ramp, t_l2) / core) if core > 0 else 0.0
        if noise:
            duration *= self.noise()
        if commit:
            self.dirty = 0.0
            if key is not None:
                if P > 0:
                    self.persisted[key] = P
                else:
                    self.persisted.pop(key, None)
                self.persisted = self.persisted_within(limit)
            if stream is not None:
                self.recent[stream] = _Recent(start_ms + duration, demand)
        return Estimate(
            name=t.name, duration_ms=duration, dram_read=dram_read, dram_write=dram_write, l2_bytes=l2,
            l2_read_bytes=t.stream_read + R if t.l2_bytes is None else max(0.0, l2 - t.stream_write),
            l2_read_misses=dram_read, l2_write_bytes=t.stream_write, persisted=P, t_dram_ms=t_dram,
            t_l2_ms=t_l2, load_sectors=t.load_sectors, load_requests=t.load_requests,
            dram_peak_gbps=max(d.read_gbps, d.write_gbps) * 1.05, l2_peak_gbps=d.l2_gbps,
            hot_hit_fraction=1 - (misses / R if R else 0.0), utilization=utilization)

    def transfer_ms(self, nbytes: int, *, write_only: bool = False, host: bool = False) -> float:
        """Duration of a memset (write_only), device copy or host copy of ``nbytes``."""
        if host:
            return 10e-3 + nbytes / (self.device.pcie_gbps * 1e9) * 1e3
        if write_only:
            return LAUNCH_US * 1e-3 + nbytes * self.seconds_per_byte(0.0) / self.tax(0.0) * 1e3
        return LAUNCH_US * 1e-3 + 2 * nbytes * self.seconds_per_byte(0.5) / self.tax(0.5) * 1e3
