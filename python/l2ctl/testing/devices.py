"""Simulated GPUs: what CUDA reports about them, and the measured numbers the timing model uses.

A ``FakeDevice`` holds the properties ``cudaGetDeviceProperties`` returns, the set-aside limit the
simulated driver keeps (``limit``, starting at ``initial_limit``), how often persisting lines were reset
(``resets``), and the calibration of the timing model (see ``l2ctl.testing.model``): the measured
bandwidth ceilings of 1 GiB write-only, copy and read kernels, the L2 bandwidth, the set-aside tax
(bandwidth multipliers against the limit as a fraction of ``persisting_l2_cache_max_size``) and the
relative noise of a kernel's duration. ``provenance`` says where the numbers come from.

The H100 and H200 presets use the measurements in the repository's reference notes
(``h100-findings.md``, ``h200-findings.md``) and records. The A100, L40S (Ada) and RTX 5090 (Blackwell)
presets take their properties from public specs, deviceQuery outputs and public reports (the RTX 5090's
persisting max and default limit); what no source gives (the others' persisting max, window limit, default
limit) is assumed as stated, and their timing model is Hopper's, scaled to their DRAM's peak: no such GPU was
measured here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional, Tuple

from .._units import GiB, MiB

__all__ = ["FakeDevice", "TaxCurve", "H100_TAX_WRITE", "H100_TAX_COPY"]

#: (limit as a fraction of persistingL2CacheMaxSize, bandwidth multiplier), increasing fractions.
TaxCurve = Tuple[Tuple[float, float], ...]

# Write-only and copy bandwidth of plain kernels (no window anywhere) against the set-aside on an H100,
# over the same bandwidth at no set-aside (README "The set-aside tax": 3,150 / 2,808 GB/s at 0-9.38 MiB).
H100_TAX_WRITE: TaxCurve = ((0.0, 1.0), (0.3, 1.0), (0.4, 0.957), (0.5, 0.723), (0.6, 0.737), (0.7, 0.734),
                            (0.8, 0.727), (0.9, 0.426), (1.0, 0.396))
H100_TAX_COPY: TaxCurve = ((0.0, 1.0), (0.3, 1.0), (0.4, 0.962), (0.5, 0.863), (0.6, 0.819), (0.7, 0.777),
                           (0.8, 0.742), (0.9, 0.495), (1.0, 0.431))


_PUBLIC = "properties from public specs; timing model calibrated on Hopper"


def _step(maximum: int) -> int:
    """The driver's limit granularity: max / 10 as measured on H100 and H200 (where it divides exactly),
    assumed elsewhere; rounded up, so that 30% of the max is whole granules as l2ctl computes it."""
    return max(1, -(-maximum // 10))


def _default(maximum: int) -> int:
    """The default limit driver 580 gives on Hopper, assumed elsewhere: 30% of the max, rounded up to the
    granularity."""
    step = _step(maximum)
    return -(-(3 * maximum // 10) // step) * step


@dataclass
class FakeDevice:
    """One simulated GPU. The defaults are an H100 80GB HBM3 (see ``h100()``)."""

    name: str = "NVIDIA H100 80GB HBM3 (simulated)"
    major: int = 9
    minor: int = 0
    multiprocessor_count: int = 132
    l2_cache_size: int = 50 * MiB
    persisting_l2_cache_max_size: int = 32_768_000
    access_policy_max_window_size: int = 128 * MiB
    initial_limit: int = 9_830_400
    mps: bool = False
    provenance: str = "properties and timing measured on an H100 (driver 580, CUDA 13.0)"
    total_global_memory: int = 85_017_493_504  # totalGlobalMem, as benchmarks/results/h100 record it
    memory_bus_width: int = 5120
    max_threads_per_multiprocessor: int = 2048
    # ---- timing model calibration (GB/s = 1e9 B/s; measured with 1 GiB buffers, no set-aside) ----
    write_gbps: float = 3168.0
    copy_gbps: float = 2819.0  # read + write bytes
    read_gbps: float = 3077.0
    l2_gbps: float = 7000.0  # L2 <-> SM bytes for streaming accesses
    pcie_gbps: float = 25.0  # host <-> device copies
    tax_write: TaxCurve = H100_TAX_WRITE
    tax_copy: TaxCurve = H100_TAX_COPY
    noise: float = 0.003  # relative standard deviation of a kernel's duration
    limit: int = field(init=False)
    resets: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.limit = self.initial_limit

    @property
    def granularity(self) -> int:
        """The step the simulated driver rounds limits up to (see ``_step``)."""
        return _step(self.persisting_l2_cache_max_size)

    @property
    def supports_persistence(self) -> bool:
        return self.major >= 8 and self.persisting_l2_cache_max_size > 0

    def uuid(self, index: int) -> str:
        """A stable UUID derived from the properties (two identical presets share it, others never do)."""
        key = repr((self.name, self.major, self.minor, self.multiprocessor_count, self.l2_cache_size,
                    self.persisting_l2_cache_max_size, self.access_policy_max_window_size, self.mps,
                    self.total_global_memory, index))
        h = hashlib.sha1(key.encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    # ---- presets --------------------------------------------------------------------------------------
    @classmethod
    def h100(cls) -> "FakeDevice":
        """An H100 80GB HBM3 (132 SMs) as measured with driver 580 / CUDA 13.0."""
        return cls()

    @classmethod
    def h200(cls) -> "FakeDevice":
        """An H200 (132 SMs, 141 GB HBM3e) as measured with driver 580 / CUDA 13.0."""
        return cls(name="NVIDIA H200 (simulated)", l2_cache_size=62_914_560, persisting_l2_cache_max_size=39_321_600,
                   access_policy_max_window_size=128 * MiB, initial_limit=11_796_480,
                   total_global_memory=150_109_880_320, memory_bus_width=6144, write_gbps=4346.0,
                   copy_gbps=3927.0, read_gbps=4350.0, l2_gbps=8500.0,
                   provenance="properties and timing measured on an H200 (driver 580, CUDA 13.0)")

    @classmethod
    def a100(cls) -> "FakeDevice":
        """An A100 80GB SXM (108 SMs, 40 MiB L2, 2,039 GB/s HBM2e; persisting max 30 MiB and window 128 MiB
        - 4 KiB as an A100's cudaGetDeviceProperties, quoted on NVIDIA's developer forum, gives them).
        Assumed: the granularity (max / 10) and default limit (30% of the max) driver 580 gives on Hopper;
        DRAM bandwidths are Hopper's efficiencies at its peak; the L2 and PCIe rates are rough guesses."""
        return cls(name="NVIDIA A100-SXM4-80GB (simulated)", major=8, minor=0, multiprocessor_count=108,
                   l2_cache_size=40 * MiB, persisting_l2_cache_max_size=30 * MiB,
                   access_policy_max_window_size=128 * MiB - 4096, initial_limit=9 * MiB,
                   total_global_memory=85_100_068_864, write_gbps=1928.0, copy_gbps=1716.0, read_gbps=1873.0,
                   l2_gbps=5000.0, pcie_gbps=20.0, provenance=_PUBLIC)

    @classmethod
    def l40s(cls) -> "FakeDevice":
        """An L40S (Ada, compute capability 8.9, 142 SMs, 96 MiB L2, 48 GB GDDR6 at 864 GB/s), as
        deviceQuery reports it. No source gives its persisting max or window limit: assumed 75% of the
        L2 (the A100's ratio) and 128 MiB; the granularity (max / 10, rounded up) and default limit (30% of
        the max) as on Hopper. DRAM bandwidths are Hopper's efficiencies at its peak; the L2 and PCIe rates
        are rough guesses."""
        return cls(name="NVIDIA L40S (simulated)", major=8, minor=9, multiprocessor_count=142,
                   l2_cache_size=96 * MiB, persisting_l2_cache_max_size=72 * MiB, initial_limit=_default(72 * MiB),
                   total_global_memory=47_576_711_168, memory_bus_width=384, max_threads_per_multiprocessor=1536,
                   write_gbps=817.0, copy_gbps=727.0, read_gbps=793.0, l2_gbps=4000.0, pcie_gbps=25.0,
                   provenance=_PUBLIC)

    @classmethod
    def rtx5090(cls) -> "FakeDevice":
        """A GeForce RTX 5090 (Blackwell, compute capability 12.0, 170 SMs, 96 MiB L2, 32 GB GDDR7 at
        1,792 GB/s), as deviceQuery reports it. Its persisting max (60 MiB, 62.5% of the L2) and default limit
        (18 MiB: 30% of that max, as on Hopper) as a public report read them on the card; the window limit
        (128 MiB) and the granularity (max / 10) are assumed as on Hopper. DRAM bandwidths are Hopper's
        efficiencies at its peak; the L2 and PCIe rates are rough guesses."""
        return cls(name="NVIDIA GeForce RTX 5090 (simulated)", major=12, minor=0, multiprocessor_count=170,
                   l2_cache_size=96 * MiB, persisting_l2_cache_max_size=60 * MiB, initial_limit=18 * MiB,
                   total_global_memory=33_668_857_856, memory_bus_width=512, max_threads_per_multiprocessor=1536,
                   write_gbps=1695.0, copy_gbps=1509.0, read_gbps=1645.0, l2_gbps=8000.0, pcie_gbps=50.0,
                   provenance=_PUBLIC)

    #: The presets ``L2CTL_SIMULATE`` and ``--simulate`` name, and what each is.
    PROFILES = ("h100", "h200", "a100", "l40s", "rtx5090")

    @classmethod
    def named(cls, name: str) -> "FakeDevice":
        """The preset called ``name`` (one of PROFILES, any case)."""
        key = name.strip().lower().replace("-", "").replace("_", "")
        if key not in cls.PROFILES:
            raise ValueError(f"no simulated GPU {name!r}; choose from {', '.join(cls.PROFILES)}")
        device: FakeDevice = getattr(cls, key)()
        return device

    @classmethod
    def turing(cls) -> "FakeDevice":
        """A T4: compute capability 7.5, no persisting L2."""
        return cls(name="Tesla T4 (simulated)", major=7, minor=5, multiprocessor_count=40, l2_cache_size=4 * MiB,
                   persisting_l2_cache_max_size=0, access_policy_max_window_size=0, initial_limit=0,
                   total_global_memory=15 * GiB, memory_bus_width=256, max_threads_per_multiprocessor=1024,
                   write_gbps=280.0, copy_gbps=250.0, read_gbps=280.0, l2_gbps=1000.0, pcie_gbps=12.0)

    @classmethod
    def mig(cls) -> "FakeDevice":
        """An H100 MIG instance: persistingL2CacheMaxSize is 0."""
        return cls(name="NVIDIA H100 MIG 1g.10gb (simulated)", multiprocessor_count=16, persisting_l2_cache_max_size=0,
                   initial_limit=0, total_global_memory=10 * GiB, write_gbps=400.0, copy_gbps=350.0,
                   read_gbps=390.0, l2_gbps=900.0)

    @classmethod
    def mps_client(cls, percentage: Optional[int] = None) -> "FakeDevice":
        """An H100 seen from an MPS client: setting the limit fails with cudaErrorNotSupported (the CUDA
        Programming Guide, "L2 cache set-aside for persisting accesses": under MPS the set-aside cannot be changed
        by cudaDeviceSetLimit, only chosen when the MPS server starts, through
        CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT). ``percentage``: that variable's value, the
        limit the clients see as a percentage of the max (rounded up to the granularity); None: unset, the
        driver's default limit."""
        device = cls(name="NVIDIA H100 80GB HBM3, MPS client (simulated)", mps=True)
        if percentage is not None:
            if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
                raise ValueError(f"percentage must be an int in [0, 100], got {percentage!r}")
            step = device.granularity
            wanted = percentage * device.persisting_l2_cache_max_size // 100
            device.initial_limit = device.limit = min(device.persisting_l2_cache_max_size, -(-wanted // step) * step)
        return device
