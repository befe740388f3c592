"""Hardware counters for the kernels launched inside a block, read in-process through CUPTI.

    with l2ctl.counters() as c:
        run_my_kernels(stream)
    for k in c.results:
        print(k.name, k["dram__bytes_read.sum"], k["lts__t_sector_hit_rate.pct"])

The metric names are Nsight Compute's. CUPTI's range profiler collects one range per kernel launch
(auto ranges) and replays each kernel as many times as the metrics need (kernel replay, saving and
restoring the memory it writes), like ``ncu --replay-mode kernel --cache-control none
--clock-control none``: launches inside the block are serialized and several times slower, so keep
timing out of it. libcupti is loaded on first use; ``import l2ctl`` never needs it.

Starting the profiler disturbs L2 (measured on an H100 with CUPTI 13.0): persisting lines are lost and
megabytes of the profiler's own data are left dirty, to be written back during the first kernels (about
12 MB with 64 ranges, less with fewer). Make the state a measurement depends on *inside* the block (a
warm-up launch, an L2 flush) and read the last results, or use ``collect(run, setup=...)``, which runs
``setup`` inside every pass and drops its kernels.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from . import _backend, _core, _nvrtc
from ._device import resolve_device
from ._errors import CountersUnavailableError, CuptiError

__all__ = ["DEFAULT_METRICS", "SECTOR_METRICS", "METRIC_UNITS", "KernelCounters", "counters", "collect",
           "find_cupti", "load_cupti"]

#: name -> unit. The defaults: L2 sector hit rate (all and reads), DRAM bytes read and written, L2 and DRAM
#: throughput, and the kernel's duration.
METRIC_UNITS = {
    "lts__t_sector_hit_rate.pct": "%",
    "lts__t_sector_op_read_hit_rate.pct": "%",
    "dram__bytes_read.sum": "byte",
    "dram__bytes_write.sum": "byte",
    "lts__t_bytes.sum.per_second": "byte/second",
    "dram__bytes.sum.per_second": "byte/second",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__time_duration.sum": "ns",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "sector",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "request",
    "lts__t_sectors_srcunit_tex_op_read.sum": "sector",
}
DEFAULT_METRICS: tuple[str, ...] = (
    "lts__t_sector_hit_rate.pct",
    "lts__t_sector_op_read_hit_rate.pct",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum.per_second",
    "dram__bytes.sum.per_second",
    "gpu__time_duration.sum",
)
#: Global-load sectors and requests of the L1: their ratio is sectors per request.
SECTOR_METRICS: tuple[str, ...] = (
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
)

_HINTS = {
    -2: "reinstall l2ctl from source on a machine with the CUDA toolkit's CUPTI headers",
    -1: "libcupti could not be loaded: install the CUDA toolkit (it ships CUPTI) or the nvidia-cuda-cupti wheel, or "
        "set L2CTL_CUPTI=/path/to/libcupti.so",
    35: "this process may not read GPU performance counters: run as root, or load the NVIDIA driver with "
        "NVreg_RestrictProfilingToAdminUsers=0",
    39: "another profiler is already attached (Nsight Compute, Nsight Systems or another CUPTI user); run without it",
    27: "this GPU or configuration does not support the range profiler (CUPTI_ERROR_NOT_SUPPORTED)",
    14: "the CUPTI library does not match the driver; use the CUPTI of a toolkit the driver supports",
    33: "profiling is not supported on this virtualized GPU",
    42: "profiling is not supported on CMP GPUs",
}


def find_cupti() -> list[str]:
    """Candidate paths of libcupti, most specific first."""
    explicit = [os.environ["L2CTL_CUPTI"]] if os.environ.get("L2CTL_CUPTI") else []
    found: list[str] = []
    for root in _nvrtc.toolkits(os.environ):  # where NVRTC is looked for too
        for sub in (*_nvrtc.LIBRARY_DIRS, "extras/CUPTI/lib64"):
            found += sorted(glob.glob(os.path.join(root, sub, "libcupti.so*")), reverse=True)
    for entry in sys.path:  # pip wheels: nvidia/cu13/lib, nvidia/cuda_cupti/lib
        for pattern in ("nvidia/cu*/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*"):
            found += sorted(glob.glob(os.path.join(entry, pattern)), reverse=True)
    # After L2CTL_CUPTI, the CUPTI of the CUDA major the profiler must serve: the build's own (a CUDA 12 build
    # beside a CUDA 13 toolkit takes the nvidia-cuda-cupti-cu12 wheel's), unless the driver is of a newer major:
    # CUPTI 12.9's range profiler read no counters under a CUDA 13 driver (H200, driver 580), so there the
    # driver's is tried first. Then the others, each group in the order found (the sort is stable).
    own = f"libcupti.so.{max(_core.runtime_version(), _core.driver_version()) // 1000}"  # no driver: 0
    found.sort(key=lambda path: own not in os.path.basename(path))
    return list(dict.fromkeys(explicit + found + [own, "libcupti.so.13", "libcupti.so.12", "libcupti.so"]))


def _unavailable(error: CuptiError, context: str = "") -> CountersUnavailableError:
    hint = f"; {_HINTS[error.code]}" if error.code in _HINTS else ""
    context = f" ({context})" if context else ""
    return CountersUnavailableError(f"hardware counters are unavailable: {error}{context}{hint}")


def load_cupti(path: Optional[str] = None) -> str:
    """Load libcupti (once per process) from ``path`` or the first candidate that loads; returns it."""
    if _backend.current().cupti_loaded():
        return "loaded"
    errors = []
    for candidate in [path] if path else find_cupti():
        try:
            _backend.current().cupti_load(candidate)
            return candidate
        except CuptiError as exc:
            if exc.code == -2:  # built without CUPTI: no library will help
                raise _unavailable(exc) from exc
            errors.append(f"{candidate}: {exc}")
    raise _unavailable(CuptiError("dlopen", -1, "; ".join(errors[-3:]) or "no candidate"))


@dataclass
class KernelCounters:
    """The metrics of one kernel launch (or range): ``k[metric]`` is the value, ``k.units[metric]`` its unit."""

    name: str
    values: dict[str, float]
    units: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, metric: str) -> float:
        return self.values[metric]

    @property
    def sectors_per_request(self) -> Optional[float]:
        s, r = (self.values.get(m) for m in SECTOR_METRICS)
        return None if s is None or not r else s / r


def _check_positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_metrics(metrics: Sequence[str]) -> list[str]:
    names = list(metrics)
    if not names or not all(isinstance(m, str) and m for m in names):
        raise ValueError("metrics must be a non-empty sequence of metric names (Nsight Compute's)")
    return names


def _results(metrics: list[str], ranges: Iterable[tuple[str, list[float]]]) -> list[KernelCounters]:
    units = {m: METRIC_UNITS.get(m, "") for m in metrics}
    return [KernelCounters(name, dict(zip(metrics, values)), units) for name, values in ranges]


class counters:
    """Collect ``metrics`` for every kernel launched on ``device`` inside the block.

    After the block, ``results`` holds one KernelCounters per launch, in launch order; ``passes`` says
    how many times each kernel was replayed. Raises CountersUnavailableError (with what to do) where
    counters cannot be read. Not reentrant: one collection per process at a time.
    """

    def __init__(self, device: object = None, metrics: Sequence[str] = DEFAULT_METRICS, *, max_ranges: int = 64,
                 cupti_path: Optional[str] = None) -> None:
        self.metrics = _check_metrics(metrics)
        self.max_ranges = _check_positive(max_ranges, "max_ranges")
        self._device_arg = device
        self._cupti_path = cupti_path
        self._profiler: Optional[_core.RangeProfiler] = None
        self.results: list[KernelCounters] = []
        self.passes = 0
        self.chip = ""

    def __enter__(self) -> "counters":
        device = resolve_device(self._device_arg)
        load_cupti(self._cupti_path)
        try:
            profiler = _backend.current().RangeProfiler(device, self.metrics, self.max_ranges)
            self.passes, self.chip = int(profiler.passes), str(profiler.chip)
            profiler.start()
            self._profiler = profiler
        except CuptiError as exc:
            self._profiler = None
            raise _unavailable(exc, f"device {device}, metrics {self.metrics}") from exc
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        try:
            ranges = profiler.stop()
        except CuptiError as error:
            if exc is None:
                raise _unavailable(error) from error
            return
        finally:
            del profiler  # disables the profiler and releases CUPTI
        self.results = _results(self.metrics, ranges)

    def by_kernel(self, text: str) -> list[KernelCounters]:
        """Results whose kernel name contains ``text``."""
        return [k for k in self.results if text in k.name]

    def total(self, metric: str, kernels: Optional[Iterable[KernelCounters]] = None) -> float:
        return float(sum(k.values[metric] for k in (self.results if kernels is None else kernels)))


def collect(run: Callable[[], object], *, setup: Optional[Callable[[], object]] = None, device: object = None,
            metrics: Sequence[str] = DEFAULT_METRICS, max_ranges: int = 64, max_passes: int = 64,
            setup_in_pass: bool = True, cupti_path: Optional[str] = None) -> tuple[list[KernelCounters], int]:
    """Counters for the kernels ``run()`` launches, by *user replay*: ``run`` is called once per pass
    the metrics need, each time after ``setup()`` and a device synchronize, and must launch the same
    kernels every time.

    Unlike ``counters`` (kernel replay: CUPTI saves and restores memory between its passes, which
    disturbs L2 state such as persisting lines), every pass starts from the state ``setup`` makes, so
    measurements that depend on L2 contents are repeatable. With ``setup_in_pass`` (the default),
    ``setup`` runs after the pass has started, since starting one disturbs L2 (the README's "Counters
    against Nsight Compute"), and its kernels' ranges are dropped; it must then launch the same kernels
    every pass. Returns (results of ``run``'s kernels, number of passes).
    """
    if not callable(run) or (setup is not None and not callable(setup)):
        raise TypeError("run (and setup, when given) must be callables taking no arguments")
    names = _check_metrics(metrics)
    max_ranges = _check_positive(max_ranges, "max_ranges")
    max_passes = _check_positive(max_passes, "max_passes")
    index = resolve_device(device)
    load_cupti(cupti_path)
    try:
        profiler = _backend.current().RangeProfiler(index, names, max_ranges, True)
    except CuptiError as exc:
        raise _unavailable(exc, f"device {index}, metrics {names}") from exc
    passes = 0
    skipped: set[int] = set()
    try:
        while True:
            if setup is not None and not setup_in_pass:
                setup()
            _backend.current().device_synchronize(index)
            profiler.start()
            if setup is not None and setup_in_pass:
                setup()
                _backend.current().device_synchronize(index)
                skipped.add(profiler.launches())
            run()
            passes += 1
            if profiler.end_pass():
                break
            if passes >= max_passes:
                raise CountersUnavailableError(f"the metrics needed more than {max_passes} passes")
        launched = profiler.launches()
        ranges = profiler.stop()
    except CuptiError as exc:
        raise _unavailable(exc) from exc
    finally:
        del profiler
    if skipped and (len(skipped) != 1 or -1 in skipped or launched != len(ranges)):
        raise CountersUnavailableError(
            "collect could not tell setup's kernels from run's (setup launched a different number of kernels "
            "per pass, or the launch callbacks are held by another tool); pass setup_in_pass=False")
    return _results(names, ranges[skipped.pop() if skipped else 0:]), passes
