"""l2ctl: NVIDIA L2 cache persistence controls for Python, and honest measurements of what they buy.

For example::

    import l2ctl
    info = l2ctl.device_info()                       # L2 size, persisting max, max window, limit
    with l2ctl.Stream() as s, l2ctl.persist(s, lut, hit_ratio=0.75):
        run_my_kernels(s)                            # window on s; limit, window, lines restored after

Importing l2ctl loads the control core only (devices, windows, the registry, persist, graphs, memory,
interop, kernels) and never touches the GPU or the driver; calls that need a device raise
NoDeviceError when there is none. The measurement harness (``l2ctl.bench``, ``l2ctl.sweep``,
``l2ctl.tune``, ``l2ctl.workloads``, ``l2ctl.plot``) is imported on first use.
"""

import os as _os
import sys as _sys

if (_sys.argv[:1] == ["-m"] and _sys.orig_argv[-len(_sys.argv) - 1:][:2] == ["-m", "l2ctl"]) or (
        _os.path.basename(_sys.argv[0] if _sys.argv else "") == "l2ctl"):
    # The command line (`python -m l2ctl`, the `l2ctl` script) is importing its package: a Ctrl-C before its own
    # handling begins (the imports take a few tenths of a second) exits as an interrupted command does, with no
    # traceback. At once: an exception raised here may land in an extension's import, which turns it into an
    # ImportError (numpy's does), and nothing has touched a device or printed yet. l2ctl.cli.main puts Python's
    # handler back before any command runs.
    import signal as _signal

    def _interrupted_while_starting(signum: int, frame: object) -> None:
        _os.write(2, b"l2ctl: interrupted\n")
        _os._exit(130)

    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing
from typing import Any as _Any

from . import _core, graph, kernels
from ._counters import DEFAULT_METRICS, SECTOR_METRICS, KernelCounters, collect, counters
from ._device import device_count, minimum_driver, versions
from ._limit import (DeviceInfo, SetAside, auto_set_aside_cap, device_info, get_set_aside, reset_persisting_lines,
                     set_aside, set_aside_granularity, set_aside_rounding)
from ._errors import (CountersUnavailableError, CudaError, KernelsUnavailableError, L2BudgetWarning, L2ctlError,
                      NoDeviceError, NotSupportedError, PersistenceUnavailableWarning, SetAsideClampedWarning,
                      SetAsideTaxWarning, WindowClippedWarning)
from ._memory import DeviceBuffer, Event, Stream
from ._persist import Budget, Persist, Policy, budget, persist
from ._plan import HIT_RATIO_TOLERANCE, hit_ratio_grid, shared_hit_ratios
from ._targets import ScopedWindow as scoped_window
from ._stream_window import clear_window, get_window, set_window
from ._window import AccessPolicyWindow, AccessProperty
from . import _host  # registers the compiled layer's one tie to Python (docs/DESIGN.md)

if _typing.TYPE_CHECKING:  # the harness, imported lazily at run time (see __getattr__)
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
    from .autotuner import autotune as autotune

__version__ = _core.__version__


def _lazy_attributes(package: str, lazy: dict[str, tuple[str, ...]]) -> _typing.Callable[[str], _Any]:
    """A package's ``__getattr__`` (PEP 562) for names imported on first use, so that importing the package loads
    only what its user asks for; ``lazy``: submodule -> the names it gives ("" -> names of submodules themselves).
    l2ctl, bench, workloads and testing use it, and declare the same names under TYPE_CHECKING for type checkers."""
    where = {name: module for module, names in lazy.items() for name in names}
    namespace = vars(_sys.modules[package])

    def __getattr__(name: str) -> _Any:
        if name not in where:
            # any submodule, as an eagerly imported package offered it (``l2ctl.bench.collectives``)
            if name.startswith("__") or _importlib_util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            where[name] = ""
        module = where[name]
        value = _importlib.import_module(f"{package}.{module or name}")
        if module:
            value = getattr(value, name)
        namespace[name] = value  # the next use finds it without a call
        return value

    return __getattr__


#: The harness: its modules and four of its names.
_LAZY = {"": ("bench", "benchmark_gallery", "candidates", "plot", "sweep", "tuner", "workloads"),
         "bench.timing": ("Timer",), "tuner": ("TunedPolicy", "tune"), "autotuner": ("autotune",)}
__getattr__ = _lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    """The public names (those of ``__all__``, the submodules in use, the lazy harness) and the module's own
    dunders; not the private helpers and submodules (``_os``, ``_core``)."""
    return sorted(n for n in set(globals()) | {n for names in _LAZY.values() for n in names} if not n.startswith("_") or n.endswith("__"))


def get_include() -> str:
    """Directory to add to nvcc's include path for ``#include <l2ctl/cache_hints.cuh>``."""
    installed = _os.path.join(_os.path.dirname(__file__), "include")
    if _os.path.isfile(_os.path.join(installed, "l2ctl", "cache_hints.cuh")):
        return installed
    return _os.path.normpath(_os.path.join(_os.path.dirname(__file__), "..", "..", "src"))


__all__ = ["AccessPolicyWindow", "AccessProperty", "autotune", "Budget", "CountersUnavailableError", "CudaError", "DEFAULT_METRICS",
           "DeviceBuffer", "DeviceInfo", "Event", "HIT_RATIO_TOLERANCE", "KernelCounters", "KernelsUnavailableError",
           "L2BudgetWarning", "L2ctlError", "NoDeviceError", "NotSupportedError", "Persist",
           "PersistenceUnavailableWarning", "Policy", "SECTOR_METRICS", "SetAside", "SetAsideClampedWarning",
           "SetAsideTaxWarning", "Stream", "Timer", "TunedPolicy", "WindowClippedWarning", "bench", "budget",
           "clear_window", "collect", "counters", "device_count", "device_info", "get_include", "get_set_aside",
           "get_window", "graph", "hit_ratio_grid", "kernels", "persist", "plot", "reset_persisting_lines",
           "scoped_window", "set_aside", "set_aside_granularity", "set_aside_rounding", "auto_set_aside_cap",
           "set_window", "shared_hit_ratios", "sweep", "candidates", "tune", "tuner", "minimum_driver",
           "versions", "workloads"]

#: Values of L2CTL_SIMULATE that mean "off", as a shell user writes it (unset and empty mean off too).
_SIMULATE_OFF = ("", "0", "false", "off", "no")

if _os.environ.get("L2CTL_SIMULATE", "").strip().lower() not in _SIMULATE_OFF:
    # The GPU-less try-out: simulated GPUs in place of the real ones for this process (docs/reference.md). The
    # simulator says so on stderr when first used, so that a --simulate given later (the command line wins)
    # is the one named; a value that names no simulated GPU never fails the import: the first device call
    # says what is wrong.
    from .testing import simulate_from_environment as _simulate_from_environment

    _simulate_from_environment(_os.environ["L2CTL_SIMULATE"])
