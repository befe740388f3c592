"""The compiled layer's one tie to Python: ``Host``, what ``_core`` calls of l2ctl's Python, made and registered
once when l2ctl is imported (``_core._planner.register_host`` checks it field by field and keeps it in one C++
struct, ``src/host.cpp``). The compiled layer imports no module of l2ctl's by name; what it needs is here, typed.
docs/DESIGN.md ("The tie to Python") draws it; tests/package/test_layers.py holds it to what src/ reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import _backend, _core, _device, _errors, _interop, _memory, _persist, _registry, _targets, _window


@dataclass(frozen=True)
class Host:
    # The persist scope's Python (l2ctl._persist): argument forms the fast path leaves, and the entry's warnings.
    prepare: Callable[..., tuple[Any, ...]]  # _prepare(13 arguments) -> the normalised tuple
    announce: Callable[..., None]  # _announce(scope, clip, limit, demand, capped, clamped, asked)
    unavailable: Callable[[Any], None]  # _unavailable(scope): a best-effort scope that changes nothing, said once
    # Devices (l2ctl._device): first-time checks of a foreign stream or pointer, and the properties a scope needs.
    stream_device: Callable[[_interop.StreamRef], int]
    check_stream_context: Callable[[_interop.StreamRef, int], None]
    check_owned_pointer: Callable[[int, int, int, Any, str], None]
    properties: Callable[[int], _device.DeviceProperties]
    require_persistence: Callable[[int], _device.DeviceProperties]  # raises NotSupportedError, saying why
    # Targets (l2ctl._targets): a graph-like target resolved at entry, and what to call after its slots change.
    resolve_target: Callable[[object], _registry.Target]
    # (the window is None for a target without `admit`, which never reads it)
    after_changes: Callable[[_registry.Target, _window.AccessPolicyWindow], Optional[Callable[[_registry.Scope], None]]]
    # The backend in use and its planner (l2ctl._backend, l2ctl._registry); this thread's current streams.
    active_backend: Callable[[], Any]
    planner_of: Callable[[Any], Any]
    current_streams: Callable[[], list[Any]]
    # Types the compiled layer recognises or makes.
    stream_type: type  # l2ctl.Stream: taken without Python by the fast path
    buffer_type: type  # l2ctl.DeviceBuffer
    window_type: type  # AccessPolicyWindow: the windows handed back
    property_type: type  # AccessProperty: their hit and miss properties
    # The exceptions a C++ error stands for.
    cuda_error: type[BaseException]
    cupti_error: type[BaseException]
    not_supported: type[BaseException]
    kernels_unavailable: type[BaseException]


def make() -> Host:
    return Host(
        prepare=_persist._prepare, announce=_persist._announce, unavailable=_persist._unavailable,
        stream_device=_device.stream_device, check_stream_context=_device.check_stream_context,
        check_owned_pointer=_device.check_owned_pointer, properties=_device.properties,
        require_persistence=_device.require_persistence, resolve_target=_targets.resolve_target,
        after_changes=_targets.after_changes, active_backend=_backend.current, planner_of=_registry._planner,
        current_streams=_interop.current_streams_compiled, stream_type=_memory.Stream, buffer_type=_memory.DeviceBuffer,
        window_type=_window.AccessPolicyWindow, property_type=_window.AccessProperty, cuda_error=_errors.CudaError,
        cupti_error=_errors.CuptiError, not_supported=_errors.NotSupportedError,
        kernels_unavailable=_errors.KernelsUnavailableError)


#: The Host in force, registered once per process: at ``import l2ctl`` (l2ctl/__init__ imports this module).
host = make()
getattr(_core, "_planner").register_host(host)
