"""A simulated CUDA machine for running code that uses l2ctl without a GPU.

``FakeBackend`` implements the whole backend contract (declared in ``l2ctl/_core.pyi``: the same names and
signatures as the compiled ``l2ctl._core``): devices and the set-aside limit, streams and windows,
events, lazy device memory, graphs, a CUPTI range profiler, and every kernel, executed functionally
with NumPy and timed by a model of DRAM, L2 and persistence calibrated to an H100 and an H200::

    import numpy as np
    import l2ctl
    from l2ctl.testing import FakeBackend, FakeDevice

    with FakeBackend.installed(FakeDevice.h100()) as fake:
        lut = l2ctl.DeviceBuffer.from_numpy(np.arange(1 << 20, dtype=np.int32))   # 4 MiB
        out = l2ctl.DeviceBuffer(1 << 30)                                          # lazy: no host RAM
        with l2ctl.Stream() as s:
            with l2ctl.persist(s, lut, hit_ratio=1.0), l2ctl.Timer(s) as t:
                l2ctl.kernels.reset_data(out, lut, s)
            assert l2ctl.kernels.verify_reset_data(out, lut, s) == 0
            print(f"{t.elapsed_ms:.3f} ms")                                         # about 0.34 ms
        assert fake.device(0).limit == fake.device(0).initial_limit                 # restored

Presets: ``FakeDevice.h100()``, ``.h200()``, ``.a100()`` (approximate), ``.turing()`` (no persistence),
``.mig()`` (persisting max 0), ``.mps_client()`` (setting the limit fails); ``FakeBackend.without_devices()``
is a machine with no GPU. Tests read the state through ``fake.device(i).limit``, ``fake.state()``,
``fake.calls``, ``fake.windows``, ``fake.node_windows``, ``fake.launched`` and ``fake.kernel_log``;
``fake.launch_fake_kernel(stream)`` and ``fake.launch_modeled_kernel(stream, ...)`` launch stand-in
kernels. Modules: devices (presets), memory (lazy memory), kernels (functional kernels), model (timing),
profiler (CUPTI), backend (the contract). Importing the package loads the presets only (the command line's
--simulate lists them); the machine's modules load when one is made or named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _backend, _lazy_attributes
from .devices import FakeDevice

if TYPE_CHECKING:  # what __getattr__ imports at run time
    from .backend import (FakeBackend as FakeBackend, FakeDeviceMemory as FakeDeviceMemory, FakeEvent as FakeEvent,
                          FakeGraph as FakeGraph, FakeGraphExec as FakeGraphExec, FakeStream as FakeStream,
                          LaunchRecord as LaunchRecord)
    from .model import DeviceModel as DeviceModel, Estimate as Estimate, Traffic as Traffic
    from .profiler import FakeRangeProfiler as FakeRangeProfiler

__getattr__ = _lazy_attributes(__name__, {
    "backend": ("FakeBackend", "FakeStream", "FakeEvent", "FakeDeviceMemory", "FakeGraph", "FakeGraphExec",
                "LaunchRecord"), "model": ("DeviceModel", "Estimate", "Traffic"), "profiler": ("FakeRangeProfiler",)})

__all__ = ["FakeBackend", "FakeDevice", "FakeStream", "FakeEvent", "FakeDeviceMemory", "FakeGraph", "FakeGraphExec",
           "FakeRangeProfiler", "LaunchRecord", "DeviceModel", "Estimate", "Traffic", "simulate", "simulate_from_environment",
           "SIMULATE_HELP"]

SIMULATE_HELP = (f"a simulated GPU instead of the real one ({', '.join(FakeDevice.PROFILES)}; several: "
                 "h100,h200); every output says it is simulated")


def simulate(gpus: str = "h100") -> FakeBackend:
    """Make l2ctl use simulated GPUs from now on, process-wide (``L2CTL_SIMULATE=h100`` or ``python -m l2ctl
    --simulate h100`` do this): the GPU-less try-out. ``gpus``: a preset name, or several, comma-separated;
    "1" or "yes" mean the H100. Returns the machine (its state is readable as in tests)."""
    from .backend import FakeBackend  # the machine's modules, loaded when one is made

    names = [n for n in gpus.split(",") if n.strip()]
    if not names or all(n.strip().lower() in ("1", "yes", "true", "on") for n in names):
        names = ["h100"]
    machine = FakeBackend(*(FakeDevice.named(n) for n in names))
    _backend.install(machine)
    return machine


def simulate_from_environment(value: str) -> FakeBackend:
    """``L2CTL_SIMULATE=value`` put into effect (``import l2ctl`` calls this; it never raises): the simulator,
    which names itself on stderr at the first device query, or, for a value that names no simulated GPU, a
    machine without devices whose every device call says what is wrong (NoDeviceError)."""
    from .backend import FakeBackend

    try:
        machine = simulate(value)
    except ValueError as exc:
        machine = FakeBackend.without_devices(
            reason=f"L2CTL_SIMULATE={value!r}: {exc}; set it to one of them, or unset it for the real GPUs",
            refuse_count=True)
        _backend.install(machine)
        return machine
    # Once per process, on stderr: a simulated number must never be taken for a measured one.
    machine.announce(f"l2ctl: L2CTL_SIMULATE is set: {machine.provenance}")
    return machine
