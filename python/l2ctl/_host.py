"""The compiled layer's one tie to Python: ``Host``, what ``_core`` calls of l2ctl's Python, made and registered
once when l2ctl is imported (``_core._planner.register_host`` checks it field by field and keeps it in one C++
struct, ``src/host.cpp``), with ``Names``, every private attribute of l2ctl's objects the compiled layer reads or
writes. The compiled layer imports no module of l2ctl's by name; what it needs is here, typed. docs/DESIGN.md ("The
tie to Python") draws it; tests/package/test_layers.py holds it to what src/ reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import _backend, _core, _device, _errors, _interop, _limit, _memory, _persist, _registry, _targets, _window
from .graph import Capture, Graph, GraphNodes, TorchCaptures


def _carried(name: str, *carriers: type) -> str:
    """``name``, once each of ``carriers`` is checked to declare it (a class attribute, a slot or an annotation, on
    the class or a base): a rename there fails here, at import, not in a scope's entry."""
    for carrier in carriers:
        if not any(name in vars(k) or name in vars(k).get("__annotations__", {}) for k in carrier.__mro__):
            raise TypeError(f"l2ctl._host.Names: {carrier.__qualname__} declares no {name}")
    return name


class Names:
    """The private attributes the compiled layer reads or writes, declared here once with the classes that carry
    each (checked at import). src/host.hpp lists the same keys (L2CTL_HOST_NAMES); ``register_host`` takes every
    name from here (a TypeError names a key missing), so no file of src/ spells one."""

    # l2ctl.Stream's StreamRef, DeviceBuffer's BufferRef; None once closed or freed (persist's fast path).
    ref = _carried("_ref", _memory.Stream, _memory.DeviceBuffer)
    # What makes an object a graph-like target of persist, resolved at entry.
    l2ctl_target = _carried("_l2ctl_target", Graph, GraphNodes, TorchCaptures)
    # A holder's live scope: the registry sets it at entry and clears it when the scope leaves.
    scope = _carried("_scope", _targets.ScopedWindow, _limit.SetAside, _persist.Persist)
    # The scoped window's entry (the scope to enter) and what its end calls and marks stale.
    prepare_entry = _carried("_prepare_entry", _targets.ScopedWindow)
    changed = _carried("_changed", _targets.ScopedWindow)
    executables = _carried("_executables", _targets.ScopedWindow)
    # graph.capture's compiled entry and end.
    capturing = _carried("_capturing", Capture)
    backend = _carried("_backend", Capture)
    stream = _carried("_stream", Capture)
    mode = _carried("_mode", Capture)
    graph = _carried("_graph", Capture)
    # An l2ctl Graph's handle object and its executable's staleness (marked by a scope's compiled end).
    impl = _carried("_impl", Graph)
    dirty = _carried("_dirty", Graph)


@dataclass(frozen=True)
class Host:
    # The persist scope's Python (l2ctl._persist): argument forms the fast path leaves, and the entry's warnings.
    prepare: Callable[..., _persist.Request]  # _prepare(persist's arguments, as given) -> the normalised record
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
    policy_type: type  # l2ctl.Policy: its fields taken as they are (this class exactly; they were checked)
    # Records the compiled layer reads by field name (src/persist_type.hpp and host.hpp list the names each needs;
    # the registration checks them): persist's normalised arguments, a resolved stream, buffer and target.
    request_type: type  # _persist.Request (a TypedDict)
    stream_ref_type: type  # _interop.StreamRef (a NamedTuple)
    buffer_ref_type: type  # _interop.BufferRef
    target_type: type  # _registry.Target
    names: type  # Names: the private attributes it reads or writes
    # The exceptions a C++ error stands for.
    cuda_error: type[BaseException]
    cupti_error: type[BaseException]
    not_supported: type[BaseException]
    kernels_unavailable: type[BaseException]


#: The Host in force, registered once per process: at ``import l2ctl`` (l2ctl/__init__ imports this module).
host = Host(
    prepare=_persist._prepare, announce=_persist._announce, unavailable=_persist._unavailable,
    stream_device=_device.stream_device, check_stream_context=_device.check_stream_context,
    check_owned_pointer=_device.check_owned_pointer, properties=_device.properties,
    require_persistence=_device.require_persistence, resolve_target=_targets.resolve_target,
    after_changes=_targets.after_changes, active_backend=_backend.current, planner_of=_registry._planner,
    current_streams=_interop.current_streams, stream_type=_memory.Stream, buffer_type=_memory.DeviceBuffer,
    window_type=_window.AccessPolicyWindow, property_type=_window.AccessProperty, policy_type=_persist.Policy,
    request_type=_persist.Request, stream_ref_type=_interop.StreamRef, buffer_ref_type=_interop.BufferRef,
    target_type=_registry.Target, names=Names, cuda_error=_errors.CudaError, cupti_error=_errors.CuptiError,
    not_supported=_errors.NotSupportedError, kernels_unavailable=_errors.KernelsUnavailableError)
getattr(_core, "_planner").register_host(host)
