"""The registry: the one owner of every change l2ctl makes to a device's L2 state.

Every change to the set-aside limit (persist scopes and set_aside calls), to a stream's or a graph
kernel node's access-policy window, and every reset of persisting lines goes through here, under one
lock. A *scope* records what it asks for (a window on some slots, a limit request); what each slot and
the limit should be is **recomputed from the live scopes** (plus what was there before l2ctl touched
it) after every change, never restored from a snapshot taken at entry, so any exit order, any
interleaving of threads and any failure ends in the right state. docs/DESIGN.md has the rules.

The lock is a Python lock: CUDA calls made under it release the GIL, and no C++ lock is ever taken
while it is held. User callbacks (graph predicates, warning filters) never run under it.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

from . import _backend, _fastpath
from ._backend import Backend, WindowTuple
from ._errors import CudaError, NotSupportedError
from ._fastpath import DeviceState as _DeviceState
from ._plan import auto_set_aside, default_hit_ratio, round_up, shared_hit_ratios, tax_free_limit
from ._window import AccessPolicyWindow, AccessProperty

__all__ = [
    "lock",
    "STREAM",
    "NODE",
    "Slot",
    "Target",
    "Scope",
    "Snapshot",
    "stream_slot",
    "node_slot",
    "node_slots",
    "enter",
    "exit",
    "set_base_window",
    "forget_slots",
    "known_limit",
    "observed_limit",
    "snapshot",
    "reset_lines",
    "granularity",
    "rounding",
    "restore_all",
    "MPS_HINT",
]

MPS_HINT = (
    "the persisting L2 limit cannot be set from a client under MPS (or this process is not allowed to set it); "
    "start the MPS control daemon with CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT=<percent> in its "
    "environment to choose the set-aside for all clients"
)
# CUDA errors that mean "this process may not set the limit" rather than "bad value".
_REFUSED_LIMIT = {"cudaErrorNotSupported", "cudaErrorNotPermitted", "cudaErrorUnsupportedLimit"}

STREAM, NODE = 0, 1
#: (holder kind, handle, generation): the generation changes when l2ctl learns a handle died (a closed
#: stream, a destroyed graph), so a later object that gets the same handle is a different slot.
Slot = tuple[int, int, int]
LimitRequest = Union[int, str, None]  # bytes, "auto", or None (leave the limit alone)

lock = threading.RLock()
_EMPTY: WindowTuple = (0, 0, 0.0, 0, 0)


class Target(NamedTuple):
    """Where a scope's window goes: the device, its slots (a stream, or graph kernel nodes), the object to
    keep alive, and what to call (outside the lock) after the slots' windows changed, at entry and at end.
    ``admit(window)``, when given, is called before anything changes with the window the scope asks for:
    it raises to refuse the scope (its window would not reach what launches) and returns one more thing to
    call after each change."""

    device: int
    slots: tuple[Slot, ...]
    owner: Any = None
    changed: Optional[Callable[[], None]] = None
    admit: Optional[Callable[[AccessPolicyWindow], Callable[[], None]]] = None


@dataclass(eq=False, slots=True)
class Scope:
    """What one live scope asks of its device. ``window`` goes on every slot in ``slots`` (None: a
    limit-only scope); ``limit`` is an exact request in bytes, "auto" (enough for the windows in force)
    or None. ``fit_hit_ratio``: the hit ratio is resolved at entry to what the set-aside can hold.
    ``standing``: a plain ``set_aside(n)`` call (not used as a context manager): it lives until restored;
    ``orphaned``: its SetAside object is gone, so nothing can restore it any more."""

    device: int
    slots: tuple[Slot, ...] = ()
    window: Optional[AccessPolicyWindow] = None
    limit: LimitRequest = None
    share: bool = False
    reset_on_exit: bool = False
    fit_hit_ratio: bool = False
    standing: bool = False
    orphaned: bool = False
    owner: Any = None  # keeps a foreign stream or graph alive while the scope lives
    id: int = 0
    effective: Optional[AccessPolicyWindow] = None  # the window in force (hit ratio after sharing)

    @property
    def needs_limit(self) -> bool:
        """Whether planning this scope needs the device's limit."""
        return self.limit is not None or self.share or self.fit_hit_ratio


#: What the registry knows of one device, a C type (l2ctl._fastpath) so that the lone-scope path reads it
#: without the interpreter. Its fields:
#: - device, maximum (persistingL2CacheMaxSize);
#: - scopes: dict id -> Scope, in entry order;
#: - base_limit: what the limit returns to; known while the device has live scopes;
#: - applied_request, applied_limit: the last limit l2ctl asked for (or read), and what the driver granted;
#: - base_windows, applied_windows: per active slot, what it returns to and what l2ctl last applied;
#: - observed_limit: the limit as last read or set, kept while idle too: only for budget warnings and
#:   reports, never for deciding what to restore (a change made outside l2ctl may have happened since);
#: - in_force_demand: of the effective windows in force after the last change;
#: - auto_capped: the last plan kept an "auto" request at the tax-free limit;
#: - auto_bounds: (granularity, tax-free cap), known once probed;
#: - dirty: a batch failed, so the device may be off the plan (a slot or the limit left as a failed exit
#:   found them): changes go through the general plan, which writes every difference, until one succeeds;
#: - shared, autos, limited: live scopes with share=True, asking for "auto", asking for any limit.
#: (_DeviceState is l2ctl._fastpath.DeviceState, imported above.)


@dataclass(frozen=True)
class Snapshot:
    """The registry's view of one device: the limit in force, the windows in force (one per scope that
    is the latest on at least one of its slots) and their demand (hit ratio x bytes of PERSISTING hits)."""

    device: int
    limit: int
    in_force: tuple[tuple[Scope, AccessPolicyWindow], ...]

    @property
    def demand(self) -> float:
        return sum(w.demand for _, w in self.in_force)


class _Registry:
    def __init__(self) -> None:
        # Weak keys: a simulator's states go with it; values never refer to the backend (no cycle).
        self.states: "weakref.WeakKeyDictionary[Any, dict[int, _DeviceState]]" = weakref.WeakKeyDictionary()
        self.generations: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], int]]" = weakref.WeakKeyDictionary()
        self.granularity: "weakref.WeakKeyDictionary[Any, dict[int, tuple[int, str]]]" = weakref.WeakKeyDictionary()
        self.ids = itertools.count(1)
        # The last backend looked up, its states and its generations, as one tuple replaced whole (readers
        # outside the lock see one backend's pair): weak keys cost a lookup each time.
        self.last: tuple[Any, dict[int, _DeviceState], dict[tuple[int, int], int]] = (None, {}, {})


_registry = _Registry()


def _lone_failed(backend: Backend, state: _DeviceState, slots: tuple[Slot, ...], exc: BaseException,
                 entering: bool) -> BaseException:
    """The lone-scope path's batch failed (called by l2ctl._fastpath under the lock, with nothing of the scope
    registered): learn what the device holds, as the general path does, and say what to raise."""
    _resync(backend, state, list(slots))
    if entering:
        _forget_idle(backend, state)  # nothing live: nothing of this device stays known
    if isinstance(exc, CudaError):
        translated = _translate(exc, state.device)
        if translated is not exc:
            translated.__cause__ = exc
        return translated
    return exc


_fastpath.configure(lock, _registry.ids, _lone_failed)


def _after_fork_in_child() -> None:
    # A forked child cannot use its parent's CUDA context; it starts with an empty registry and a fresh lock.
    global lock, _registry
    lock = threading.RLock()
    _registry = _Registry()
    _fastpath.configure(lock, _registry.ids, _lone_failed)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _state(backend: Backend, device: int, maximum: int) -> _DeviceState:
    last = _registry.last
    if backend is last[0]:  # the common case: one backend for the whole process
        state = last[1].get(device)
        if state is not None:
            return state
    per_backend = _registry.states.setdefault(backend, {})
    _registry.last = (backend, per_backend, _registry.generations.setdefault(backend, {}))
    state = per_backend.get(device)
    if state is None:
        state = per_backend[device] = _DeviceState(device, maximum)
    return state


def _generations_of(backend: Backend) -> dict[tuple[int, int], int]:
    """(kind, handle) -> generation for ``backend`` (empty while no handle of it died)."""
    last = _registry.last
    return last[2] if backend is last[0] else _registry.generations.get(backend, {})


def stream_slot(handle: int) -> Slot:
    last = _registry.last  # _generations_of, inline: every stream scope's path
    generations = last[2] if _backend._active is last[0] else _generations_of(_backend._active)
    return (STREAM, handle, generations.get((STREAM, handle), 0)) if generations else (STREAM, handle, 0)


def node_slot(handle: int) -> Slot:
    return node_slots([handle])[0]


def node_slots(handles: Iterable[int]) -> tuple[Slot, ...]:
    """Slots of many kernel nodes at once (a graph of N nodes is N slots)."""
    generations = _generations_of(_backend.current())
    return tuple((NODE, h, generations.get((NODE, h), 0)) for h in handles)


def _live(backend: Backend, slot: Slot) -> bool:
    return slot[2] == _generations_of(backend).get((slot[0], slot[1]), 0)


def _any_live(backend: Backend, slots: tuple[Slot, ...]) -> bool:
    generations = _generations_of(backend)
    return not generations and bool(slots) or any(slot[2] == generations.get((slot[0], slot[1]), 0) for slot in slots)


# ---- planning (pure) ------------------------------------------------------------------------------


def _in_force(backend: Backend, scopes: Iterable[Scope]) -> list[Scope]:
    """The scopes whose window is the latest on at least one of their live slots, in entry order."""
    top: dict[Slot, Scope] = {}
    for scope in scopes:
        if scope.window is not None:
            for slot in scope.slots:
                if _live(backend, slot):
                    top[slot] = scope
    seen: dict[int, Scope] = {}
    for scope in top.values():
        seen[scope.id] = scope
    return [seen[i] for i in sorted(seen)]


def _requested_demand(scopes: Iterable[Scope]) -> float:
    return sum(s.window.demand for s in scopes if s.window is not None)


def _planned_limit(backend: Backend, state: _DeviceState) -> tuple[Optional[int], bool]:
    """Fold the live scopes' limit requests in entry order, from the base limit: an exact request sets the
    limit, "auto" raises it (never lowers it) to the demand of the windows in force among the scopes entered
    so far, rounded up to the driver's granularity and capped at the max.

    Returns (request, at_least). With the base unknown, a fold that depends on it is the request "at least
    X" (the device raises its limit to X only if below, and reports what it had: that is the base). None:
    nothing asks for a limit and none needs restoring."""
    exact: Optional[int] = None  # the fold's value once an exact request was seen
    floor = 0  # until then the value is max(base, floor)
    auto = False
    state.auto_capped = False
    scopes = list(state.scopes.values())
    for k, scope in enumerate(scopes):
        if isinstance(scope.limit, int):
            exact = scope.limit
        elif scope.limit == "auto":
            auto = True
            demand = _requested_demand(_in_force(backend, scopes[: k + 1]))
            if exact is None:
                floor = _auto(state, demand, floor)
            else:
                exact = _auto(state, demand, exact)
    if exact is not None:
        return exact, False
    if state.base_limit is not None:
        return max(state.base_limit, floor), False
    return (floor, True) if auto else (None, False)


def _step(state: _DeviceState) -> int:
    return granularity(state.device, state.maximum)[0]


def _auto(state: _DeviceState, demand: float, current: int) -> int:
    """An "auto" request from ``current``: the demand rounded up to the granularity, never lowering the limit,
    and never past the tax-free limit (the driver's default); notes in ``state`` when that cap bound."""
    if demand <= 0:
        return current
    bounds = state.auto_bounds
    if bounds is None:
        step = _step(state)
        bounds = state.auto_bounds = (step, tax_free_limit(state.maximum, step))
    step, cap = bounds
    limit = auto_set_aside(demand, current, step, cap)
    if limit < min(state.maximum, round_up(math.ceil(demand), step)):
        state.auto_capped = True
    return limit


def _auto_request(state: _DeviceState, demand: float) -> tuple[int, bool]:
    """The limit request (-1: none needed) and its "at least" flag for the only "auto" request on a device
    whose windows in force ask for ``demand``: with the base unknown, "at least" the demand's need (the call
    reads the base); otherwise the larger of the two, when it differs from what is applied."""
    state.auto_capped = False
    need = _auto(state, demand, 0)
    if state.base_limit is None:
        return need, True
    if max(state.base_limit, need) != state.applied_request:
        return max(state.base_limit, need), False
    return -1, False


def _share(backend: Backend, in_force: list[Scope], limit: Optional[int]) -> None:
    """Set each in-force scope's effective window: shared PERSISTING scopes scaled to fit what the
    non-shared ones leave of the limit (the source documents' rule), the others as requested."""
    for scope in in_force:
        scope.effective = scope.window
    shared = [s for s in in_force if s.share and s.window is not None and s.window.hit_prop == AccessProperty.PERSISTING]
    if not shared or limit is None:
        return
    fixed = _requested_demand(s for s in in_force if s not in shared)
    requests = [(s.window.hit_ratio, s.window.num_bytes) for s in shared if s.window is not None]
    for scope, ratio in zip(shared, shared_hit_ratios(requests, max(0, int(limit - fixed)))):
        assert scope.window is not None
        scope.effective = scope.window._replace(hit_ratio=ratio)


def _plan(backend: Backend, state: _DeviceState) -> tuple[Optional[int], bool, dict[Slot, WindowTuple], list[Scope]]:
    """What the device should hold: (limit request, at_least, window per live active slot, scopes in force)."""
    limit, at_least = _planned_limit(backend, state)
    in_force = _in_force(backend, state.scopes.values())
    _share(backend, in_force, limit if limit is not None and not at_least else state.applied_limit)
    desired: dict[Slot, WindowTuple] = {}
    for scope in state.scopes.values():  # later scopes overwrite earlier ones on shared slots
        if scope.window is not None:
            window = (scope.effective if scope in in_force and scope.effective is not None else scope.window).as_tuple()
            for slot in scope.slots:
                if _live(backend, slot):
                    desired[slot] = window
    for slot, base in state.base_windows.items():
        desired.setdefault(slot, base)
    return limit, at_least, desired, in_force


# ---- applying -------------------------------------------------------------------------------------

# Tests set this: after every fast path the general plan is computed too and must agree.
CHECK_FAST_PATHS = False


def _read_window(backend: Backend, slot: Slot) -> WindowTuple:
    if slot[0] == STREAM:
        return tuple(backend.get_stream_window(slot[1]))  # type: ignore[return-value]
    return tuple(backend.get_node_window(slot[1]))  # type: ignore[return-value]


def _activate(backend: Backend, state: _DeviceState, scope: Scope) -> None:
    """Learn the limit before planning when the plan needs its value (a hit ratio fitted to the room left,
    shared windows). Everything else l2ctl returns to (the windows of newly covered slots, the limit an
    exact or "auto" request replaces) it learns from the batch that changes it."""
    if state.base_limit is None and (scope.share or scope.fit_hit_ratio or any(s.share for s in state.scopes.values())):
        limit = int(backend.get_persisting_limit(state.device))
        state.base_limit = state.applied_limit = state.applied_request = state.observed_limit = limit


def _translate(exc: CudaError, device: int) -> BaseException:
    if exc.name in _REFUSED_LIMIT and "SetLimit" in exc.call:
        return NotSupportedError(f"device {device}: {exc}; {MPS_HINT}")
    return exc


def _apply(backend: Backend, state: _DeviceState, changes: dict[Slot, WindowTuple], limit: Optional[int],
           at_least: bool, reset: bool) -> None:
    """One batched call; afterwards the registry knows what it applied, the base of every slot it covered
    for the first time (read in the same call), and the base limit when it was unknown."""
    streams: list[tuple[int, WindowTuple]] = []
    nodes: list[tuple[int, WindowTuple]] = []
    bases = state.base_windows
    fresh = False
    for slot, window in changes.items():
        (streams if slot[0] == STREAM else nodes).append((slot[1], window))
        fresh = fresh or slot not in bases
    # The order of the previous windows returned: streams first, then nodes.
    order = [s for s in changes if s[0] == STREAM] + [s for s in changes if s[0] != STREAM] if fresh else []
    request = -1 if limit is None else int(limit)
    try:
        before, after, previous = backend.apply_state(state.device, request, at_least, streams, nodes, reset, fresh)
    except CudaError as exc:
        _resync(backend, state, list(changes))
        raise _translate(exc, state.device) from exc
    except BaseException:
        _resync(backend, state, list(changes))
        raise
    if fresh:
        for slot, old in zip(order, previous):
            if slot not in bases:
                bases[slot] = tuple(old)  # type: ignore[assignment]
    for slot, window in changes.items():
        state.applied_windows[slot] = window
    if request >= 0:
        _record_limit(state, request, at_least, before, after)


def _record_limit(state: _DeviceState, request: int, at_least: bool, before: int, after: int) -> None:
    """What a batch that asked for the limit ``request`` learnt: the limit before it and the grant."""
    if state.base_limit is None:
        state.base_limit = int(before)  # nothing of l2ctl's had changed it: what was there is the base
    state.applied_request = int(after) if at_least else request
    state.applied_limit = state.observed_limit = int(after)


def _apply_window(backend: Backend, state: _DeviceState, slots: list[Slot], window: WindowTuple, limit: int,
                  at_least: bool, reset: bool) -> None:
    """_apply for one window on slots of one kind (a scope's stream, or its graph's nodes): the cheapest
    crossing (backend.apply_window), with the same bookkeeping."""
    bases = state.base_windows
    fresh = False
    for slot in slots:
        if slot not in bases:
            fresh = True
            break
    try:
        before, after, previous = backend.apply_window(
            state.device, slots[0][0] if slots else STREAM, [slot[1] for slot in slots], window[0], window[1],
            window[2], window[3], window[4], fresh, limit, at_least, reset)
    except CudaError as exc:
        _resync(backend, state, slots)
        raise _translate(exc, state.device) from exc
    except BaseException:
        _resync(backend, state, slots)
        raise
    applied = state.applied_windows
    if fresh:
        for slot, old in zip(slots, previous):
            if slot not in bases:
                bases[slot] = old
    for slot in slots:
        applied[slot] = window
    if limit >= 0:
        _record_limit(state, limit, at_least, before, after)


def _forget_device(state: _DeviceState) -> None:
    """Nothing is live on the device: forget its slots and limit until a scope needs them again (read
    afresh then, so changes made outside l2ctl meanwhile are respected)."""
    state.base_windows.clear()
    state.applied_windows.clear()
    state.base_limit = state.applied_limit = state.applied_request = None
    state.limited = state.autos = state.shared = 0


def _forget_idle(backend: Backend, state: _DeviceState) -> None:
    """Slots no live scope covers are back to their base and forgotten (re-read when a scope next covers
    them, so changes made outside l2ctl in between are respected); so is the limit once nothing is live."""
    covered = {slot for s in state.scopes.values() for slot in s.slots}
    for slot in [s for s in state.base_windows if s not in covered or not _live(backend, s)]:
        del state.base_windows[slot]
        state.applied_windows.pop(slot, None)
    if not state.scopes:
        state.base_limit = state.applied_limit = state.applied_request = None


def _sync(backend: Backend, state: _DeviceState, *, reset: bool = False) -> None:
    """Make the device match the live scopes with one batched call: the windows that differ from what
    l2ctl last applied, the limit when its request differs, and a reset of persisting lines if asked."""
    limit, at_least, desired, in_force = _plan(backend, state)
    changes = {slot: w for slot, w in desired.items() if state.applied_windows.get(slot) != w}
    if limit is not None and not at_least and limit == state.applied_request:
        limit = None
    if changes or limit is not None or reset:
        _apply(backend, state, changes, limit, at_least, reset)
    if at_least:  # the plan depended on the base, which the batch has now read
        follow, _, _, _ = _plan(backend, state)
        if follow is not None and follow != state.applied_request:
            _apply(backend, state, {}, follow, False, False)
    state.in_force_demand = sum((s.effective or s.window).demand for s in in_force if s.window is not None)
    _forget_idle(backend, state)
    state.dirty = False  # the device matches the plan


def _add(state: _DeviceState, scope: Scope) -> None:
    scope.id = next(_registry.ids)
    state.scopes[scope.id] = scope
    state.shared += scope.share
    state.autos += scope.limit == "auto"
    state.limited += scope.limit is not None


def _remove(state: _DeviceState, scope: Scope) -> None:
    del state.scopes[scope.id]
    state.shared -= scope.share
    state.autos -= scope.limit == "auto"
    state.limited -= scope.limit is not None


def _fast_enter(backend: Backend, state: _DeviceState, scope: Scope) -> bool:
    """The common entries, with the same outcome as the general plan: a scope that shares nothing, fixes its
    hit ratio and asks for no limit, or for "auto" while no other scope asks for any, where no live scope
    shares. Its window becomes the window of its slots (it is the latest scope, so no earlier "auto" request
    depends on it); an "auto" request raises the limit to the demand of the windows in force. One crossing,
    which also reads what the device held (the base of new slots; the limit, with "at least").
    False: use the general path."""
    window = scope.window
    if (scope.share or scope.fit_hit_ratio or state.shared or state.dirty
            or not (scope.limit is None or state.limited == 1)):
        return False
    scope.effective = window
    request = -1
    at_least = False
    if scope.limit is not None:
        if scope.limit == "auto":
            assert window is not None  # an "auto" request comes with a window
            if len(state.scopes) == 1:  # in force when one of its slots is live
                demand = window.demand if _any_live(backend, scope.slots) else 0.0
            else:
                demand = _requested_demand(_in_force(backend, state.scopes.values()))
            request, at_least = _auto_request(state, demand)
        elif isinstance(scope.limit, int) and scope.limit != state.applied_request:
            request = scope.limit  # the only exact request: it is the limit (the batch reads the base)
    if window is None:  # a limit-only scope (set_aside)
        if request >= 0:
            _apply(backend, state, {}, request, at_least, False)
        return True
    applied = state.applied_windows
    generations = _generations_of(backend)
    changed = [slot for slot in scope.slots
               if applied.get(slot) != window and (not generations or slot[2] == generations.get((slot[0], slot[1]), 0))]
    if changed or request >= 0:
        _apply_window(backend, state, changed, window, request, at_least, False)
    return True


def _fast_exit(backend: Backend, state: _DeviceState, scope: Scope, reset: bool) -> bool:
    """The common exits: such a scope ending (asking for no limit, when no later scope asks for "auto",
    whose demand could have counted it; or the only one asking for a limit) where no live scope shares:
    its slots return to the latest other scope on them, or to their base; the limit, when no live scope
    asks for one any more, to its base. One crossing when the slots all return to one window."""
    if scope.share or state.shared or state.dirty:
        return False
    if scope.limit is None:
        if state.autos and any(s.limit == "auto" and s.id > scope.id for s in state.scopes.values()):
            return False
    elif state.limited:
        return False
    bases = state.base_windows
    applied = state.applied_windows
    generations = _generations_of(backend)
    limit = -1
    if not state.limited and state.base_limit is not None and state.applied_request != state.base_limit:
        limit = state.base_limit
    others = list(state.scopes.values())
    changes: dict[Slot, WindowTuple] = {}
    for slot in scope.slots:
        window = bases.get(slot)
        if window is None or generations and slot[2] != generations.get((slot[0], slot[1]), 0):
            continue
        for other in reversed(others):
            if other.window is not None and slot in other.slots:
                window = other.effective or other.window
                break
        if applied.get(slot) != window:
            changes[slot] = window
    if changes or limit >= 0 or reset:
        first = next(iter(changes.values()), _EMPTY)
        if all(w is first or w == first for w in changes.values()):  # one window for all: one cheap crossing
            _apply_window(backend, state, list(changes), first, limit, False, reset)
        else:
            _apply(backend, state, changes, None if limit < 0 else limit, False, reset)
    if others:
        _forget_idle(backend, state)
    else:
        _forget_device(state)
    return True


def _check_fast_path(backend: Backend, state: _DeviceState) -> None:
    limit, at_least, desired, _ = _plan(backend, state)
    for slot, window in desired.items():
        assert state.applied_windows.get(slot) == window, ("fast path disagrees with the plan", slot, window,
                                                           state.applied_windows.get(slot))
    if limit is not None and not at_least:
        assert limit == state.applied_request, ("fast path disagrees with the plan on the limit", limit,
                                                state.applied_request)


def _verify_fast_path(backend: Backend, state: _DeviceState) -> None:
    """CHECK_FAST_PATHS (tests): what the C lone-scope path left agrees with the general plan, checked under
    the lock (after enter/exit here, and by l2ctl._fastpath after a Persist's stream scope)."""
    with lock:
        _check_fast_path(backend, state)


def _resync(backend: Backend, state: _DeviceState, slots: list[Slot]) -> None:
    """After a failed batch, learn what the device really holds: the batch put back the limit and the
    slots it had read first (every slot l2ctl covered for the first time); the others may have changed."""
    for slot in slots:
        if slot not in state.base_windows:
            state.applied_windows.pop(slot, None)  # put back to what l2ctl never knew: nothing to track
            continue
        try:
            state.applied_windows[slot] = _read_window(backend, slot)
        except Exception:
            state.applied_windows.pop(slot, None)  # unknown: the next plan writes it again
    state.dirty = True
    if state.applied_limit is not None or state.base_limit is None:
        try:
            limit = int(backend.get_persisting_limit(state.device))
        except Exception:
            state.applied_request = None
            return
        state.observed_limit = limit
        if state.base_limit is not None:  # l2ctl owns the limit: what it holds now is what it applied
            state.applied_limit = state.applied_request = limit
        else:  # the batch put back a limit l2ctl does not own
            state.applied_limit = state.applied_request = None


# ---- entry points ---------------------------------------------------------------------------------


def enter(scope: Scope, maximum: int) -> tuple[int, float, bool]:
    """Register ``scope`` and make the device match. Atomic: on any exception nothing stays registered and
    the device is put back as it was. Returns the limit in force (as l2ctl last saw it when it does not
    own it: read once), the demand of the windows in force, and whether an "auto" request was kept at the
    tax-free limit: what the caller's warnings need."""
    backend = _backend._active  # current(), inline: every scope's path
    device = scope.device
    last = _registry.last
    if backend is last[0]:
        state = last[1].get(device)
        if state is not None:
            # The lone scope on its device, asking for no limit or for "auto": C takes the lock, applies its
            # window in one backend call (reading what the slots held; with "auto", "at least" the window's
            # demand, which reads the base limit too) and registers it; None: any other case, nothing changed.
            seen = _fastpath.enter_lone(backend, state, scope, last[2])
            if seen is not None:
                if CHECK_FAST_PATHS:
                    _verify_fast_path(backend, state)
                return seen
    with lock:
        state = _state(backend, device, maximum)
        if state.base_limit is None and (scope.share or scope.fit_hit_ratio or state.shared):
            _activate(backend, state, scope)
        _add(state, scope)
        try:
            if _fast_enter(backend, state, scope):
                if CHECK_FAST_PATHS:
                    _check_fast_path(backend, state)
                window = scope.window
                if len(state.scopes) == 1 and window is not None:
                    state.in_force_demand = window.demand if _any_live(backend, scope.slots) else 0.0
                else:
                    state.in_force_demand = _requested_demand(_in_force(backend, state.scopes.values()))
                limit = state.applied_limit if state.applied_limit is not None else _seen_limit(backend, state)
                return limit, state.in_force_demand, scope.limit == "auto" and state.auto_capped
            fit_capped = False
            if scope.fit_hit_ratio and scope.window is not None:
                # As much of the window as the set-aside can hold next to the other windows in force.
                planned, _ = _planned_limit(backend, state)
                fit_capped = state.auto_capped  # the whole window wanted more than "auto" gives
                room = max(0.0, (planned or 0) - _requested_demand(s for s in _in_force(backend, state.scopes.values())
                                                                  if s is not scope))
                scope.window = scope.window._replace(hit_ratio=default_hit_ratio(int(room), scope.window.num_bytes))
            _sync(backend, state)
            state.auto_capped = state.auto_capped or fit_capped
        except BaseException:
            _remove(state, scope)
            try:
                _sync(backend, state)
            except Exception:
                pass  # the first error is what the caller needs; the state was resynchronised
            raise
        if scope.standing:
            # A plain set_aside call whose SetAside is gone can never be restored, so it shadows every
            # earlier plain call for good: those can go (the fold restarts at the latest exact request),
            # which keeps a loop of plain calls from growing the registry.
            orphans = [s.id for s in state.scopes.values() if s.standing and s.orphaned]
            if orphans:
                for old in [s for s in state.scopes.values() if s.standing and s.id < max(orphans)]:
                    _remove(state, old)
        return _seen_limit(backend, state), state.in_force_demand, scope.limit == "auto" and state.auto_capped


def exit(scope: Scope) -> None:
    """Unregister ``scope`` (idempotent) and make the device match the scopes left. The persisting lines
    are reset when the scope asked for it and no other scope with a window is live on the device."""
    backend = _backend._active  # current(), inline: every scope's path
    device = scope.device
    last = _registry.last
    if backend is last[0]:
        state = last[1].get(device)
        if state is not None and _fastpath.exit_lone(backend, state, scope):
            # Done in C (or it had ended): the last scope on its device, its slots back to one base window,
            # the limit to its base, the lines reset when asked, in one backend call; the device forgotten.
            if CHECK_FAST_PATHS:
                _verify_fast_path(backend, state)
            return
    with lock:
        state = _registry.states.get(backend, {}).get(device)
        if state is None or state.scopes.get(scope.id) is not scope:
            return
        _remove(state, scope)
        reset = scope.reset_on_exit and (not state.scopes or not any(s.window is not None for s in state.scopes.values()))
        if _fast_exit(backend, state, scope, reset):
            if CHECK_FAST_PATHS:
                _check_fast_path(backend, state)
            return
        _sync(backend, state, reset=reset)


def set_base_window(slots: Iterable[Slot], device: int, maximum: int, window: AccessPolicyWindow) -> None:
    """A window set outside any scope (``l2ctl.set_window``, ``Graph.set_window``): applied at once on
    idle slots; on a slot a live scope covers, it becomes what the slot returns to when the scopes end."""
    backend = _backend.current()
    value = window.as_tuple()
    with lock:
        state = _state(backend, device, maximum)
        idle = []
        for slot in slots:
            if slot in state.base_windows:
                state.base_windows[slot] = value
            else:
                idle.append(slot)
        for kind in (STREAM, NODE):  # one window on each kind of holder: the cheap crossing
            handles = [s[1] for s in idle if s[0] == kind]
            if handles:
                backend.apply_window(device, kind, handles, value[0], value[1], value[2], value[3], value[4], False,
                                     -1, False, False)


def forget_slots(kind: int, handles: Iterable[int]) -> None:
    """The handles died (a stream closed, a graph destroyed): scopes keep living but never write there again."""
    backend = _backend.current()
    with lock:
        generations = _registry.generations.setdefault(backend, {})
        last = _registry.last
        if backend is last[0] and last[2] is not generations:
            _registry.last = (backend, last[1], generations)
        for handle in handles:
            key = (kind, int(handle))
            generations[key] = generations.get(key, 0) + 1
        for state in _registry.states.get(backend, {}).values():
            dead = [s for s in state.base_windows if not _live(backend, s)]
            for slot in dead:
                del state.base_windows[slot]
                state.applied_windows.pop(slot, None)
            if dead and state.scopes:
                # Windows that were in force there are no longer: the limit and shared ratios follow.
                _sync(backend, state)


def known_limit(device: int) -> Optional[int]:
    """The limit in force when the registry owns it (a live scope needed it); None otherwise."""
    with lock:
        state = _registry.states.get(_backend.current(), {}).get(device)
        return None if state is None else state.applied_limit


def _seen_limit(backend: Backend, state: _DeviceState) -> int:
    if state.applied_limit is not None:
        return state.applied_limit
    if state.observed_limit is None:
        state.observed_limit = int(backend.get_persisting_limit(state.device))
    return state.observed_limit


def observed_limit(device: int, maximum: int) -> int:
    """The limit in force as l2ctl last saw it (read once when it never has): for warnings and reports."""
    backend = _backend.current()
    with lock:
        return _seen_limit(backend, _state(backend, device, maximum))


def snapshot(device: int, maximum: int) -> Snapshot:
    """The limit and the windows in force on ``device`` (reads the limit when l2ctl does not own it)."""
    backend = _backend.current()
    with lock:
        state = _state(backend, device, maximum)
        limit = state.applied_limit if state.applied_limit is not None else int(backend.get_persisting_limit(device))
        state.observed_limit = limit
        in_force = _in_force(backend, state.scopes.values())
        return Snapshot(device, limit, tuple((s, s.effective or s.window) for s in in_force if s.window is not None))


def reset_lines(device: int) -> None:
    """cudaCtxResetPersistingL2Cache, ordered with every other change."""
    with lock:
        _backend.current().reset_persisting_lines(device)


def granularity(device: int, maximum: int) -> tuple[int, str]:
    """(step, direction) of the driver's rounding of limit requests, probed once per backend and device:
    the probe sets the limit a few times and puts back what was there, under the lock."""
    backend = _backend.current()
    with lock:
        known = _registry.granularity.get(backend, {}).get(device)
        if known is not None:
            return known
        state = _registry.states.get(backend, {}).get(device)
        previous = state.applied_limit if state is not None and state.applied_limit is not None else None
        if previous is None:
            previous = int(backend.get_persisting_limit(device))

        def ask(n: int) -> int:
            return int(backend.set_persisting_limit(device, n))

        try:
            found = probe_rounding(ask, maximum)
        except CudaError as exc:
            raise _translate(exc, device) from exc
        finally:
            try:
                if int(backend.get_persisting_limit(device)) != previous:
                    backend.set_persisting_limit(device, previous)
            except CudaError:
                pass  # a probe refused from the start (MPS) changed nothing
        _registry.granularity.setdefault(backend, {})[device] = found
        return found


def known_granularity(device: int) -> Optional[int]:
    with lock:
        known = _registry.granularity.get(_backend.current(), {}).get(device)
        return None if known is None else known[0]


def rounding(device: int, maximum: int) -> str:
    return granularity(device, maximum)[1]


def probe_rounding(ask: Callable[[int], int], maximum: int) -> tuple[int, str]:
    """(granularity, direction) from a few limit requests; ``ask(n)`` sets the limit and returns the grant."""
    if maximum <= 1:
        return 1, "exact"
    one = ask(1)
    if one == 1:
        return 1, "exact"
    if one > 1:
        return one, "up"
    below = ask(maximum - 1)
    if below < maximum:
        return max(1, maximum - below), "down"
    # Rounded to nearest: the smallest request granted non-zero is half a step (bisection).
    lo, hi = 1, maximum
    while lo < hi:
        mid = (lo + hi) // 2
        if ask(mid) > 0:
            hi = mid
        else:
            lo = mid + 1
    return max(1, ask(lo)), "nearest"


def live_scopes(device: int) -> list[Scope]:
    with lock:
        state = _registry.states.get(_backend.current(), {}).get(device)
        return [] if state is None else list(state.scopes.values())


def restore_all() -> None:
    """At interpreter exit: end every live scope on every device, each with the backend it was made with."""
    with lock:
        for backend, states in list(_registry.states.items()):
            for state in states.values():
                if not state.scopes:
                    continue
                state.scopes.clear()
                state.shared = state.autos = state.limited = 0
                try:
                    _sync(backend, state, reset=True)
                except Exception:
                    pass  # the process is ending; nothing left to tell


atexit.register(restore_all)
