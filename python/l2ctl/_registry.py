"""The registry's Python face: the one owner of every change l2ctl makes to a device's L2 state, and the one copy
of its rules, is the planner in C++ (``src/l2ctl/planner.cpp``; docs/DESIGN.md, "The registry"). This module picks
the planner of the backend in use (one per backend: the CUDA extension, or a simulator reached through a
trampoline) and names its calls; it holds no rule (tests/registry/test_one_planner.py checks that it stays so).
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Optional, Union

from . import _backend, _core
from ._window import AccessPolicyWindow

_native: Any = getattr(_core, "_planner")  # the planner's bindings (src/planner_bindings.cpp)

__all__ = ["lock", "STREAM", "NODE", "Slot", "Target", "Scope", "stream_slot", "node_slots", "enter", "exit",
           "add_slots", "set_base_window", "forget_slots", "known_limit", "observed_limit", "snapshot", "reset_lines",
           "granularity", "known_granularity", "live_scopes", "restore_all", "slot_epoch"]

STREAM, NODE = 0, 1
#: (holder kind, handle, generation): the generation changes when l2ctl learns a handle died (a closed
#: stream, a destroyed graph), so a later object that gets the same handle is a different slot.
Slot = tuple[int, int, int]
#: The registry's lock (one for every backend): ``with lock:`` holds every l2ctl change out; l2ctl's own calls
#: on the thread that holds it are refused (a finalizer or signal handler inside l2ctl) with the planner's REENTRY_HINT.
lock = _native.registry_lock
#: Called as an l2ctl Stream is closed or a DeviceBuffer freed (after its ``_ref`` went): compiled scopes made
#: before then look at their stream and buffer again at entry (they skip that look while nothing was released).
own_released: Callable[[], None] = _native.own_released
LimitRequest = Union[int, str, None]  # bytes, "auto", or None (leave the limit alone)

if TYPE_CHECKING:
    class Scope:
        """What one live scope asks of its device (the planner's record, a compiled type): ``window`` on every
        slot in ``slots`` (None: a limit-only scope); ``limit``: bytes, "auto" or None; ``standing``: a plain
        ``set_aside(n)``, live until restored; ``orphaned``: its SetAside is gone; ``ending``: its end began (set
        first). Only the planner reads ``share``, ``reset_on_exit`` and ``fit_hit_ratio`` (the hit ratio resolved
        at entry to what the set-aside holds)."""

        device: int
        slots: tuple[Slot, ...]
        window: Optional[AccessPolicyWindow]
        limit: LimitRequest
        standing: bool
        orphaned: bool
        ending: bool
        owner: Any
        id: int

        def __init__(self, device: int, slots: tuple[Slot, ...] = (), window: Optional[AccessPolicyWindow] = None,
                     limit: LimitRequest = None, share: bool = False, reset_on_exit: bool = False,
                     fit_hit_ratio: bool = False, standing: bool = False, orphaned: bool = False,
                     owner: Any = None) -> None: ...
else:
    Scope = _native.Scope
#: ``exit(scope)``: end ``scope`` (idempotent) on the backend it was entered with; marked ending first.
exit: Callable[[Scope], None] = _native.exit_scope
#: ``add_slots(scope, slots, owner=None) -> bool``: more slots for a live scope, its window planned there too (a
#: stream made current inside a ``graph.torch_captures()`` scope, where eager kernels then launch); its demand on
#: the limit is unchanged (one window, more holders). ``owner`` is kept alive with the scope. False when the scope
#: is no longer live (nothing changes).
add_slots: Callable[..., bool] = _native.add_slots
#: ``__exit__`` of persist's scope, the scoped window and the set_aside scope, and of ``with l2ctl.Stream()``:
#: compiled instance methods (src/scope_entries.cpp; persist's own in src/persist_scope.cpp), so every with block l2ctl gives ends in compiled code.
scope_exit: Any = _native.scope_exit
stream_exit: Any = _native.stream_exit
#: ``__enter__`` of the scoped window (after its ``_prepare_entry``), the set_aside scope and ``with Stream()``:
#: compiled too (src/scope_entries.cpp).
holder_enter: Any = _native.holder_enter
set_aside_enter: Any = _native.set_aside_enter
stream_enter: Any = _native.stream_enter
#: ``__enter__``/``__exit__`` of ``graph.capture``: the capture begins and ends in compiled code.
capture_enter: Any = _native.capture_enter
capture_exit: Any = _native.capture_exit


class Target(NamedTuple):
    """Where a scope's window goes: the device, its slots (a stream, or graph kernel nodes), the object to
    keep alive, and what to call (outside the lock) after the slots' windows changed, at entry and at end.
    ``admit(window)``, when given, is called before anything changes with the window the scope asks for:
    it raises to refuse the scope (its window would not reach what launches) and returns one more thing to
    call, with the scope, after each change."""

    device: int
    slots: tuple[Slot, ...]
    owner: Any = None
    changed: Optional[Callable[[], None]] = None
    admit: Optional[Callable[[AccessPolicyWindow], Callable[["Scope"], None]]] = None
    #: An l2ctl Graph whose executable a change of these slots makes stale: the compiled end marks it (its
    #: ``_dirty``) before ``changed`` runs, so an interrupt inside ``changed`` cannot leave it replaying the old
    #: windows.
    executables: Any = None


# One planner per backend, weakly: a simulator's states go with it. The last one looked up is kept at hand (a
# process uses one backend, the extension, almost always).
_planners: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_last: tuple[Any, Any] = (None, None)


def _planner(backend: Any) -> Any:
    global _last
    last = _last
    if backend is last[0]:
        return last[1]
    planner = _planners.get(backend)
    if planner is None:
        planner = _planners[backend] = _native.Registry(backend)
    _last = (backend, planner)
    return planner


def _after_fork_in_child() -> None:
    # A forked child cannot use its parent's CUDA context: it starts with no planner (the C++ side gave it a
    # free lock and made the parent's planners unreachable to scopes entered before the fork).
    global _planners, _last
    _planners = weakref.WeakKeyDictionary()
    _last = (None, None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def stream_slot(handle: int) -> Slot:
    return _planner(_backend._active).stream_slot(handle)  # type: ignore[no-any-return]


def node_slots(handles: Iterable[int]) -> tuple[Slot, ...]:
    """Slots of many kernel nodes at once (a graph of N nodes is N slots)."""
    return _planner(_backend._active).node_slots(handles)  # type: ignore[no-any-return]


def slot_epoch() -> int:
    """Changes whenever a handle dies for the registry (forget_slots, a holder found destroyed): slots made
    before it changed may name a generation that is no longer written, so they are made again."""
    return _planner(_backend._active).slot_epoch  # type: ignore[no-any-return]


def enter(scope: Scope, maximum: int, holder: Any = None) -> tuple[int, float, bool]:
    """Register ``scope`` and make the device match (atomic: on any exception nothing stays registered).
    ``holder``: the object whose ``_scope`` names the live scope; entering it while it holds one is refused.
    Returns the limit in force, the demand of the windows in force, and whether an "auto" request was kept at
    the tax-free limit: what the caller's warnings need."""
    backend = _backend._active
    return _planner(backend).enter(scope, maximum, holder, backend)  # type: ignore[no-any-return]


def set_base_window(slots: Iterable[Slot], device: int, maximum: int, window: AccessPolicyWindow) -> None:
    """A window set outside any scope (``l2ctl.set_window``, ``Graph.set_window``): applied at once on
    idle slots; on a slot a live scope covers, it becomes what the slot returns to when the scopes end."""
    _planner(_backend._active).set_base_window(slots, device, maximum, window)


def forget_slots(kind: int, handles: Iterable[int]) -> None:
    """The handles died (a stream closed, a graph destroyed): scopes keep living but never write there again."""
    _planner(_backend._active).forget_slots(kind, handles)


def known_limit(device: int) -> Optional[int]:
    """The limit in force when the registry owns it (a live scope needed it); None otherwise."""
    return _planner(_backend._active).known_limit(device)  # type: ignore[no-any-return]


def observed_limit(device: int, maximum: int) -> int:
    """The limit in force as l2ctl last saw it (read once when it never has): for warnings and reports."""
    return _planner(_backend._active).observed_limit(device, maximum)  # type: ignore[no-any-return]


def snapshot(device: int, maximum: int) -> tuple[int, list[tuple[Scope, AccessPolicyWindow]], float]:
    """The limit in force on ``device`` (read when l2ctl does not own it), the windows in force (one per scope that
    is the latest on at least one of its slots) and their demand (hit ratio x bytes of PERSISTING hits)."""
    return _planner(_backend._active).snapshot(device, maximum)  # type: ignore[no-any-return]


def live_scopes(device: int) -> list[Scope]:
    return _planner(_backend._active).live_scopes(device)  # type: ignore[no-any-return]


def reset_lines(device: int) -> None:
    """cudaCtxResetPersistingL2Cache, ordered with every other change."""
    _planner(_backend._active).reset_lines(device)


def granularity(device: int, maximum: int) -> tuple[int, str]:
    """(step, direction) of the driver's rounding of limit requests, probed once per backend and device:
    the probe sets the limit a few times and puts back what was there, under the lock."""
    return _planner(_backend._active).granularity(device, maximum)  # type: ignore[no-any-return]


def known_granularity(device: int) -> Optional[int]:
    return _planner(_backend._active).known_granularity(device)  # type: ignore[no-any-return]


def restore_all() -> None:
    """End every live scope on every device, each with the backend it was made with."""
    for planner in list(_planners.values()):
        planner.restore_all()


def _restore_at_exit() -> None:
    """At interpreter exit: the registry closed for good (this thread keeps its lock: a daemon thread still running
    enters no scope the restore would miss, and waits without the GIL, where finalization never ends it inside
    l2ctl), then every device restored."""
    lock.close_for_exit()
    restore_all()


atexit.register(_restore_at_exit)
