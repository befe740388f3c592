"""l2ctl: NVIDIA L2 cache persistence controls for Python, and honest measurements of what they buy.

    import l2ctl
    info = l2ctl.device_info()                       # L2 size, persisting max, max window, limit
    with l2ctl.Stream() as s, l2ctl.persist(s, lut, hit_ratio=0.75):
        run_my_kernels(s)                            # window on s; limit, window, lines restored after

Importing l2ctl loads the control core only (devices, windows, the registry, persist, graphs, memory,
interop, kernels) and never touches the GPU or the driver; calls that need a device raise
NoDeviceError when there is none. The measurement harness (``l2ctl.bench``, ``l2ctl.sweep``,
``l2ctl.tune``, ``l2ctl.workloads``, ``l2ctl.plot``) is imported on first use.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING, Any

from . import _core, graph, kernels
from ._counters import DEFAULT_METRICS, SECTOR_METRICS, KernelCounters, collect, counters
from ._device import device_count, minimum_driver, versions
from ._limit import (
    DeviceInfo,
    SetAside,
    auto_set_aside_cap,
    device_info,
    get_set_aside,
    reset_persisting_lines,
    set_aside,
    set_aside_granularity,
    set_aside_rounding,
)
from ._errors import (
    CountersUnavailableError,
    CudaError,
    L2BudgetWarning,
    L2ctlError,
    NoDeviceError,
    NotSupportedError,
    PersistenceUnavailableWarning,
    SetAsideClampedWarning,
    SetAsideTaxWarning,
    WindowClippedWarning,
)
from ._memory import DeviceBuffer, Event, Stream
from ._persist import Budget, Persist, Policy, budget, persist
from ._plan import HIT_RATIO_TOLERANCE, hit_ratio_grid, shared_hit_ratios
from ._targets import ScopedWindow as scoped_window
from ._stream_window import clear_window, get_window, set_window
from ._window import AccessPolicyWindow, AccessProperty

if TYPE_CHECKING:  # the harness, imported lazily at run time (see __getattr__)
    from . import bench as bench
    from . import benchmark_gallery as benchmark_gallery
    from . import candidates as candidates
    from . import plot as plot
    from . import sweep as sweep
    from . import tuner as tuner
    from . import workloads as workloads
    from .bench.timing import Timer as Timer
    from .tuner import TunedPolicy as TunedPolicy
    from .tuner import tune as tune

__version__ = _core.__version__

# name -> (module, attribute or None for the module itself)
_LAZY = {
    "bench": ("l2ctl.bench", None),
    "benchmark_gallery": ("l2ctl.benchmark_gallery", None),
    "candidates": ("l2ctl.candidates", None),
    "plot": ("l2ctl.plot", None),
    "sweep": ("l2ctl.sweep", None),
    "tuner": ("l2ctl.tuner", None),
    "workloads": ("l2ctl.workloads", None),
    "Timer": ("l2ctl.bench.timing", "Timer"),
    "TunedPolicy": ("l2ctl.tuner", "TunedPolicy"),
    "tune": ("l2ctl.tuner", "tune"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attribute is None else getattr(module, attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'l2ctl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def get_include() -> str:
    """Directory to add to nvcc's include path for ``#include <l2ctl/cache_hints.cuh>``."""
    installed = _os.path.join(_os.path.dirname(__file__), "include")
    if _os.path.isfile(_os.path.join(installed, "l2ctl", "cache_hints.cuh")):
        return installed
    return _os.path.normpath(_os.path.join(_os.path.dirname(__file__), "..", "..", "src"))


__all__ = [
    "AccessPolicyWindow",
    "AccessProperty",
    "Budget",
    "CountersUnavailableError",
    "CudaError",
    "DEFAULT_METRICS",
    "DeviceBuffer",
    "DeviceInfo",
    "Event",
    "HIT_RATIO_TOLERANCE",
    "KernelCounters",
    "L2BudgetWarning",
    "L2ctlError",
    "NoDeviceError",
    "NotSupportedError",
    "Persist",
    "PersistenceUnavailableWarning",
    "Policy",
    "SECTOR_METRICS",
    "SetAside",
    "SetAsideClampedWarning",
    "SetAsideTaxWarning",
    "Stream",
    "Timer",
    "TunedPolicy",
    "WindowClippedWarning",
    "bench",
    "budget",
    "clear_window",
    "collect",
    "counters",
    "device_count",
    "device_info",
    "get_include",
    "get_set_aside",
    "get_window",
    "graph",
    "hit_ratio_grid",
    "kernels",
    "persist",
    "plot",
    "reset_persisting_lines",
    "scoped_window",
    "set_aside",
    "set_aside_granularity",
    "set_aside_rounding",
    "auto_set_aside_cap",
    "set_window",
    "shared_hit_ratios",
    "sweep",
    "candidates",
    "tune",
    "tuner",
    "minimum_driver",
    "versions",
    "workloads",
]

#: Values of L2CTL_SIMULATE that mean "off", as a shell user writes it (unset and empty mean off too).
_SIMULATE_OFF = ("", "0", "false", "off", "no")

if _os.environ.get("L2CTL_SIMULATE", "").strip().lower() not in _SIMULATE_OFF:
    # The GPU-less try-out: simulated GPUs in place of the real ones for this process (docs/reference.md).
    import sys as _sys

    from . import _backend as _backend_module
    from .testing import simulate as _simulate

    _simulate(_os.environ["L2CTL_SIMULATE"])
    # Once per process, on stderr: a simulated number must never be taken for a measured one.
    _sys.stderr.write(f"l2ctl: L2CTL_SIMULATE is set: {_backend_module.simulated()}\n")
