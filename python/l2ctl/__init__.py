"""l2ctl: NVIDIA L2 cache persistence controls for Python, and honest measurements of what they buy.

    import l2ctl
    info = l2ctl.device_info()                       # L2 size, persisting max, max window, limit
    with l2ctl.Stream() as s, l2ctl.persist(s, lut, hit_ratio=0.75):
        run_my_kernels(s)                            # window on s; limit, window, lines restored after

Importing l2ctl never touches the GPU or the driver; calls that need a device raise NoDeviceError
when there is none.
"""

from __future__ import annotations

import os as _os

from . import _core, graph
from ._counters import DEFAULT_METRICS, SECTOR_METRICS, KernelCounters, collect, counters
from ._device import (
    DeviceInfo,
    SetAside,
    device_count,
    device_info,
    get_set_aside,
    reset_persisting_lines,
    set_aside,
    set_aside_granularity,
    set_aside_rounding,
    versions,
)
from ._errors import (
    CountersUnavailableError,
    CudaError,
    L2BudgetWarning,
    L2ctlError,
    NoDeviceError,
    NotSupportedError,
    WindowClippedWarning,
)
from ._memory import DeviceBuffer, Stream, Timer
from ._persist import Budget, Persist, Policy, budget, persist
from ._plan import HIT_RATIO_TOLERANCE, hit_ratio_grid, shared_hit_ratios
from ._window import AccessPolicyWindow, AccessProperty, clear_window, get_window, set_window

from .sweep import TunedPolicy, tune  # noqa: E402  (after the names sweep itself imports)

__version__ = _core.__version__

__all__ = [
    "AccessPolicyWindow",
    "AccessProperty",
    "Budget",
    "CountersUnavailableError",
    "DEFAULT_METRICS",
    "KernelCounters",
    "SECTOR_METRICS",
    "counters",
    "CudaError",
    "DeviceBuffer",
    "DeviceInfo",
    "HIT_RATIO_TOLERANCE",
    "L2BudgetWarning",
    "L2ctlError",
    "NoDeviceError",
    "NotSupportedError",
    "Persist",
    "Policy",
    "SetAside",
    "Stream",
    "Timer",
    "TunedPolicy",
    "WindowClippedWarning",
    "budget",
    "clear_window",
    "collect",
    "device_count",
    "device_info",
    "get_include",
    "graph",
    "get_set_aside",
    "get_window",
    "hit_ratio_grid",
    "persist",
    "reset_persisting_lines",
    "set_aside",
    "set_aside_granularity",
    "set_aside_rounding",
    "set_window",
    "shared_hit_ratios",
    "tune",
    "versions",
]


def get_include() -> str:
    """Directory to add to nvcc's include path for ``#include <l2ctl/cache_hints.cuh>``."""
    installed = _os.path.join(_os.path.dirname(__file__), "include")
    if _os.path.isfile(_os.path.join(installed, "l2ctl", "cache_hints.cuh")):
        return installed
    source = _os.path.normpath(_os.path.join(_os.path.dirname(__file__), "..", "..", "src"))
    return source
