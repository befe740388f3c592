"""The exceptions l2ctl raises. Defined in Python so they exist without the extension or a GPU."""

from __future__ import annotations

__all__ = ["L2ctlError", "CudaError", "NotSupportedError", "NoDeviceError", "CountersUnavailableError", "CuptiError",
           "KernelsUnavailableError", "VerificationError", "check",
           "L2BudgetWarning", "SetAsideTaxWarning", "SetAsideClampedWarning", "WindowClippedWarning",
           "PersistenceUnavailableWarning"]


class L2ctlError(Exception):
    """Base class of l2ctl's own exceptions."""


class CudaError(L2ctlError, RuntimeError):
    """A CUDA runtime call failed.

    Attributes: ``call`` (the call, as written in the C++ core), ``code`` (the ``cudaError_t`` value),
    ``name`` (e.g. ``"cudaErrorInvalidValue"``), ``description`` (CUDA's message) and ``details`` (the
    device, pointers and byte counts involved).
    """

    def __init__(self, call: str, code: int, name: str, description: str, details: str = "") -> None:
        self.call = call
        self.code = int(code)
        self.name = name
        self.description = description
        self.details = details
        text = f"{call} failed: {name} ({code}): {description}"
        if details:
            text += f" [{details}]"
        super().__init__(text)

    def __reduce__(self) -> tuple[type[CudaError], tuple[str, int, str, str, str]]:  # pickling (multiprocessing)
        return (type(self), (self.call, self.code, self.name, self.description, self.details))


class NotSupportedError(L2ctlError, RuntimeError):
    """The device or the process cannot do what was asked (compute capability below 8.0, MIG, MPS)."""


class NoDeviceError(NotSupportedError):
    """No CUDA device is visible (no GPU, or no usable NVIDIA driver)."""


class CountersUnavailableError(NotSupportedError):
    """CUPTI cannot do what was asked here: read hardware counters, or record the kernels' arguments for eager
    discovery (no CUPTI, no permission, unsupported GPU, a profiler already attached); the message says which
    and what to do."""


class KernelsUnavailableError(NotSupportedError):
    """l2ctl's own kernels (``l2ctl.kernels``) cannot run here: no NVRTC to compile them, NVRTC failed, or the code
    it made is newer than the driver. The message says which and what to install; everything else works."""


class CuptiError(CountersUnavailableError):
    """A CUPTI call failed: ``call``, ``code`` (CUptiResult; -1 when libcupti could not be loaded)."""

    def __init__(self, call: str, code: int, message: str) -> None:
        self.call, self.code = call, int(code)
        super().__init__(message)

    def __reduce__(self) -> tuple[type[CuptiError], tuple[str, int, str]]:
        return (type(self), (self.call, self.code, str(self)))


class VerificationError(L2ctlError, AssertionError):
    """A benchmark's output was wrong; its timing is discarded (``l2ctl.bench``: a number is kept only when the
    output it timed was right)."""


def check(ok: bool, what: str) -> None:
    """Raise VerificationError naming ``what`` unless ``ok``."""
    if not ok:
        raise VerificationError(f"verification failed: {what}; the timing was discarded")


class L2BudgetWarning(UserWarning):
    """The live persisting windows on a device ask for more L2 than its set-aside holds."""


class SetAsideTaxWarning(UserWarning):
    """``set_aside="auto"`` kept the limit at the driver's default although the windows ask for more: beyond it
    the set-aside slows every other kernel on the GPU. Ask for more explicitly (an int, or "max") after
    measuring what it costs (l2ctl.tune reports the tax)."""


class WindowClippedWarning(UserWarning):
    """A window was larger than ``accessPolicyMaxWindowSize`` and was clipped to it."""


class SetAsideClampedWarning(UserWarning):
    """An exact set-aside above the device's ``persistingL2CacheMaxSize`` was granted the max (``clamp=True``);
    the message names the bytes asked and granted."""


class PersistenceUnavailableWarning(UserWarning):
    """A best-effort scope (``persist(..., strict=False)``) found a device that cannot persist (no device,
    compute capability below 8.0, a MIG instance, a limit refused under MPS) and changes nothing; its
    ``reason`` says why. Warned once per device and reason."""
