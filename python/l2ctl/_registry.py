"""The registry: the one owner of every change l2ctl makes to a device's L2 state, and the one place its
rules are written.

Every change to the set-aside limit (persist scopes and set_aside calls), to a stream's or a graph kernel
node's access-policy window, and every reset of persisting lines goes through here, under one lock. A
*scope* records what it asks for (a window on some slots, a limit request); what each slot and the limit
should be is **planned from the live scopes** (``_plan``, the rules) plus what was there before l2ctl
touched it, after every change, and one batched call writes what differs (``_sync``). Never restored from
a snapshot taken at entry, so any exit order, any interleaving of threads and any failure ends in the
right state. docs/DESIGN.md has the rules.

Interrupts: a call cut short (KeyboardInterrupt, any asynchronous exception) leaves its marks: a change
under way keeps the device ``dirty``, a scope whose end began keeps ``ending``. Every call of the registry
settles those first (``_settle``): it ends what was ending and, for a dirty device, reads what the device
holds and writes the plan. So the device is back when the interrupted call returns, or at the next l2ctl
call. The lock is a reentrant lock that refuses reentry: a finalizer or callback that calls l2ctl while the
registry works on its thread gets a RuntimeError instead of a registry in the middle of a change. User code
(graph predicates, warning filters) never runs under it.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Union

from . import _backend
from ._backend import Backend, WindowTuple
from ._errors import CudaError, NotSupportedError
from ._plan import auto_set_aside, default_hit_ratio, round_up, shared_hit_ratios, tax_free_limit
from ._window import AccessPolicyWindow, AccessProperty

__all__ = ["COMPILED", "lock", "STREAM", "NODE", "Slot", "Target", "Scope", "DeviceState", "Snapshot", "stream_slot", "node_slots",
           "enter", "exit", "add_slots", "set_base_window", "forget_slots", "known_limit", "observed_limit", "snapshot",
           "reset_lines", "granularity", "known_granularity", "probe_rounding", "live_scopes", "device_state",
           "restore_all", "MPS_HINT", "REENTRY_HINT"]

MPS_HINT = (
    "the persisting L2 limit cannot be set from a client under MPS (or this process is not allowed to set it); "
    "start the MPS control daemon with CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT=<percent> in its "
    "environment to choose the set-aside for all clients"
)
REENTRY_HINT = (
    "l2ctl was called while it was changing device state on this same thread: from a finalizer (__del__, a "
    "weakref callback) or a signal handler that ran in the middle of an l2ctl call. Refused, so that the change "
    "under way completes intact; make that call outside the finalizer"
)
# CUDA errors that mean "this process may not set the limit" rather than "bad value".
_REFUSED_LIMIT = {"cudaErrorNotSupported", "cudaErrorNotPermitted", "cudaErrorUnsupportedLimit"}

STREAM, NODE = 0, 1
#: (holder kind, handle, generation): the generation changes when l2ctl learns a handle died (a closed
#: stream, a destroyed graph), so a later object that gets the same handle is a different slot.
Slot = tuple[int, int, int]
LimitRequest = Union[int, str, None]  # bytes, "auto", or None (leave the limit alone)

#: Whether this module runs compiled by Cython (CMakeLists.txt, _registry.pxd) or interpreted: the same source.
COMPILED = not __file__.endswith((".py", ".pyc"))

lock = threading.RLock()
_EMPTY: WindowTuple = (0, 0, 0.0, 0, 0)
_new_tuple = tuple.__new__
_PERSISTING = AccessProperty.PERSISTING


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


class Scope:
    """What one live scope asks of its device. ``window`` goes on every slot in ``slots`` (None: a
    limit-only scope); ``limit`` is an exact request in bytes, "auto" (enough for the windows in force)
    or None. ``fit_hit_ratio``: the hit ratio is resolved at entry to what the set-aside can hold.
    ``standing``: a plain ``set_aside(n)`` call (not used as a context manager): it lives until restored;
    ``orphaned``: its SetAside object is gone, so nothing can restore it any more. ``backend``: the one it
    was entered with, where it ends. ``ending``: its end began (set first, so that an end cut short is
    completed by the next call); ``holder``: (a weak reference to) the object whose ``_scope`` names it
    while it is live; a scope whose holder is freed ends at the next call, so a scope whose ``__exit__`` was
    interrupted before its first line (where no code of l2ctl's runs yet) ends once its object is gone."""

    __slots__ = ("device", "slots", "window", "limit", "share", "reset_on_exit", "fit_hit_ratio", "standing",
                 "orphaned", "owner", "id", "effective", "backend", "ending", "holder")

    def __init__(self, device: int, slots: tuple[Slot, ...] = (), window: Optional[AccessPolicyWindow] = None,
                 limit: LimitRequest = None, share: bool = False, reset_on_exit: bool = False,
                 fit_hit_ratio: bool = False, standing: bool = False, orphaned: bool = False, owner: Any = None) -> None:
        self.device = device
        self.slots = slots
        self.window = window
        self.limit = limit
        self.share = share
        self.reset_on_exit = reset_on_exit
        self.fit_hit_ratio = fit_hit_ratio
        self.standing = standing
        self.orphaned = orphaned
        self.owner = owner  # keeps a foreign stream or graph alive while the scope lives
        self.id = 0
        self.effective: Optional[AccessPolicyWindow] = None  # the window in force (hit ratio after sharing)
        self.backend: Any = None
        self.ending = False
        self.holder: Optional["weakref.ref[Any]"] = None

    def __repr__(self) -> str:
        return (f"Scope(id={self.id}, device={self.device}, slots={len(self.slots)}, window={self.window}, "
                f"limit={self.limit!r}, share={self.share}, standing={self.standing}, ending={self.ending})")


class DeviceState:
    """What the registry knows of one device:

    - ``scopes``: id -> Scope, in entry order;
    - ``base_limit``: what the limit returns to; known while the device has live scopes that needed it;
    - ``applied_request``, ``applied_limit``: the last limit l2ctl asked for (or read), and the grant;
    - ``base_windows``, ``applied_windows``: per covered slot, what it returns to and what l2ctl last applied;
    - ``observed_limit``: the limit as last read or set, kept while idle too: only for budget warnings and
      reports, never for deciding what to restore (a change made outside l2ctl may have happened since);
    - ``in_force_demand``: of the effective windows in force after the last change;
    - ``auto_capped``: the last plan kept an "auto" request at the tax-free limit;
    - ``auto_bounds``: (granularity, tax-free cap), known once probed;
    - ``dirty``: a change is under way or was cut short: what the device holds may be off the plan, so the
      next call reads it and writes the plan;
    - ``shared``: how many live scopes share (the plan scales their windows only when some do);
    - ``batch``: the batch under way (its slots, windows, limit request and journal) until what it did is
      recorded: a call cut short leaves it for the next one."""

    __slots__ = ("device", "maximum", "scopes", "base_limit", "applied_request", "applied_limit", "base_windows",
                 "applied_windows", "observed_limit", "in_force_demand", "auto_capped", "auto_bounds", "dirty", "shared",
                 "batch")

    def __init__(self, device: int, maximum: int) -> None:
        self.device, self.maximum = device, maximum
        self.scopes: dict[int, Scope] = {}
        self.base_limit: Optional[int] = None
        self.applied_request: Optional[int] = None
        self.applied_limit: Optional[int] = None
        self.base_windows: dict[Slot, WindowTuple] = {}
        self.applied_windows: dict[Slot, WindowTuple] = {}
        self.observed_limit: Optional[int] = None
        self.in_force_demand = 0.0
        self.auto_capped = False
        self.auto_bounds: Optional[tuple[int, int]] = None
        self.dirty = False
        self.shared = 0  # live scopes with share=True
        self.batch: Optional[tuple[list[Slot], dict[Slot, WindowTuple], int, bool, list[Any]]] = None

    def __repr__(self) -> str:
        return (f"DeviceState(device={self.device}, scopes={list(self.scopes)}, base_limit={self.base_limit}, "
                f"applied_limit={self.applied_limit}, slots={len(self.applied_windows)}, dirty={self.dirty})")


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
        self.states: "weakref.WeakKeyDictionary[Any, dict[int, DeviceState]]" = weakref.WeakKeyDictionary()
        self.generations: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], int]]" = weakref.WeakKeyDictionary()
        self.granularity: "weakref.WeakKeyDictionary[Any, dict[int, tuple[int, str]]]" = weakref.WeakKeyDictionary()
        self.ids = itertools.count(1)
        # The last backend looked up and its tables, replaced whole: a weak lookup costs more than a scope's
        # CUDA call, and a process uses one backend (the extension) almost always.
        self.last: tuple[Any, dict[int, DeviceState], dict[tuple[int, int], int]] = (None, {}, {})

    def tables(self, backend: Any) -> tuple[dict[int, DeviceState], dict[tuple[int, int], int]]:
        last = self.last
        if backend is last[0]:
            return last[1], last[2]
        states = self.states.setdefault(backend, {})
        generations = self.generations.setdefault(backend, {})
        self.last = (backend, states, generations)
        return states, generations


_registry = _Registry()


def _after_fork_in_child() -> None:
    # A forked child cannot use its parent's CUDA context; it starts with an empty registry and a fresh lock.
    global lock, _registry
    lock = threading.RLock()
    _registry = _Registry()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _locked() -> "threading.RLock":
    """The registry's lock, after the reentry check (``with _locked():``). The C lock's own ``__enter__``
    takes it, so an interrupt cannot leave it taken: it arrives before the lock is held or inside the block."""
    if lock._is_owned():  # type: ignore[attr-defined]  # the C RLock's own check
        raise RuntimeError(REENTRY_HINT)
    return lock


def _state(backend: Backend, device: int, maximum: int) -> DeviceState:
    states = _registry.tables(backend)[0]
    state = states.get(device)
    if state is None:
        state = states[device] = DeviceState(device, maximum)
    return state


def device_state(backend: Backend, device: int) -> Optional[DeviceState]:
    """The registry's record of ``device`` on ``backend`` (tests compare it whole), or None."""
    return _registry.tables(backend)[0].get(device)


def _generations(backend: Backend) -> dict[tuple[int, int], int]:
    """(kind, handle) -> generation for ``backend`` (empty while no handle of it died)."""
    return _registry.tables(backend)[1]


def stream_slot(handle: int) -> Slot:
    last = _registry.last
    generations = last[2] if _backend._active is last[0] else _generations(_backend._active)
    return (STREAM, handle, generations.get((STREAM, handle), 0) if generations else 0)


def node_slots(handles: Iterable[int]) -> tuple[Slot, ...]:
    """Slots of many kernel nodes at once (a graph of N nodes is N slots)."""
    generations = _generations(_backend._active)
    return tuple((NODE, h, generations.get((NODE, h), 0)) for h in handles)


# ---- the plan: the rules, written once -----------------------------------------------------------------


class _Plan(NamedTuple):
    limit: Optional[int]  # the limit to ask for (None: none asked, none to restore)
    at_least: bool  # the request is "at least limit": the base is unknown and the plan depends on it
    top: dict[Slot, Scope]  # every live slot a scope covers -> the scope whose window goes there
    in_force: list[Scope]  # the scopes latest on at least one live slot, in entry order
    capped: bool  # an "auto" request was held at the tax-free limit


def _plan(backend: Backend, state: DeviceState) -> _Plan:
    return _plan_with(_generations(backend), state)


def _plan_with(generations: dict[tuple[int, int], int], state: DeviceState) -> _Plan:
    """What the device should hold, from the live scopes:

    - a slot's window is the window of the latest-entered live scope on it (with none, its base);
    - the limit is a fold over the scopes in entry order, from the base limit: an exact request sets it;
      ``"auto"`` raises it, never lowers it, to the demand (hit ratio x bytes) of the windows in force among
      the scopes entered so far, rounded up to the granularity and capped at the tax-free limit (the
      driver's default). With the base unknown, the fold is the request "at least" its floor (the device
      raises its limit only if below, and reports what it had: that is the base);
    - ``share=True`` scopes in force have their hit ratios scaled so that their demand fits what the other
      windows in force leave of the limit (each scope's ``effective`` window).

    The windows themselves: ``windows(plan, state)``."""
    top: dict[Slot, Scope] = {}  # slot -> the latest scope with a window on it, so far in the fold
    exact: Optional[int] = None  # the fold's value once an exact request was seen
    floor = 0  # until then the value is max(base, floor)
    auto = capped = False
    for scope in state.scopes.values():
        if scope.window is not None:
            for slot in scope.slots:
                if not generations or slot[2] == generations.get((slot[0], slot[1]), 0):
                    top[slot] = scope
        request = scope.limit
        if request is None:
            continue
        if request != "auto":
            exact = request  # type: ignore[assignment]
            continue
        auto = True
        demand = sum(s.window.demand for s in _distinct(top.values()) if s.window is not None)
        if demand > 0:
            step, cap = _auto_bounds(state)
            start = floor if exact is None else exact
            value = auto_set_aside(demand, start, step, cap)
            capped = capped or value < min(state.maximum, round_up(math.ceil(demand), step))
            if exact is None:
                floor = value
            else:
                exact = value
    in_force = sorted(_distinct(top.values()), key=_by_id) if len(top) > 1 else list(top.values())
    if exact is not None:
        limit: Optional[int] = exact
    elif state.base_limit is not None:
        limit = max(state.base_limit, floor)
    else:
        limit = floor if auto else None
    at_least = exact is None and state.base_limit is None and auto
    for scope in in_force:
        scope.effective = scope.window
    if state.shared:
        _share(in_force, limit if limit is not None and not at_least else state.applied_limit)
    return _new_tuple(_Plan, (limit, at_least, top, in_force, capped))  # without NamedTuple's Python __new__


def windows(plan: _Plan, state: DeviceState) -> dict[Slot, WindowTuple]:
    """Every slot l2ctl covers and the window the plan puts there (its base where no scope is)."""
    out = state.base_windows.copy()
    for slot, scope in plan.top.items():
        out[slot] = scope.effective  # type: ignore[assignment]  # a window is the tuple the backend takes
    return out


def _by_id(scope: Scope) -> int:
    return scope.id


def _distinct(scopes: Iterable[Scope]) -> list[Scope]:
    seen: dict[int, Scope] = {}
    for scope in scopes:
        seen[scope.id] = scope
    return list(seen.values())


def _auto_bounds(state: DeviceState) -> tuple[int, int]:
    """(granularity, tax-free cap) of the device, probed once (the probe sets and puts back the limit)."""
    if state.auto_bounds is None:
        step = _granularity(_backend._active, state.device, state.maximum)[0]
        state.auto_bounds = (step, tax_free_limit(state.maximum, step))
    return state.auto_bounds


def _share(in_force: list[Scope], limit: Optional[int]) -> None:
    """Shared PERSISTING scopes' effective windows scaled to fit what the non-shared ones leave of the
    limit (the source documents' rule)."""
    shared = [s for s in in_force if s.share and s.window is not None and s.window.hit_prop == _PERSISTING]
    if not shared or limit is None:
        return
    fixed = sum(s.window.demand for s in in_force if s not in shared and s.window is not None)
    requests = [(s.window.hit_ratio, s.window.num_bytes) for s in shared if s.window is not None]
    for scope, ratio in zip(shared, shared_hit_ratios(requests, max(0, int(limit - fixed)))):
        assert scope.window is not None
        scope.effective = scope.window._replace(hit_ratio=ratio)


# ---- applying the plan -------------------------------------------------------------------------------------


def _sync(backend: Backend, state: DeviceState, *, reset: bool = False, removed: bool = False) -> None:
    """Make the device match the plan in one batched call: the windows that differ from what l2ctl last
    applied, the limit when its request differs, and a reset of persisting lines when asked. ``dirty``
    stays set until the device matches, so a change cut short is finished by the next call. ``removed``:
    scopes or slots went, so slots nothing covers any more are forgotten."""
    state.dirty = True
    if state.batch is not None:  # a batch whose recording was cut short: what it read is needed now
        _record_batch(state)
    last = _registry.last
    generations = last[2] if backend is last[0] else _generations(backend)
    plan = _plan_with(generations, state)
    top = plan.top
    applied = state.applied_windows
    changes: dict[Slot, WindowTuple] = {}
    for slot, scope in top.items():
        if applied.get(slot) != scope.effective:
            changes[slot] = scope.effective  # type: ignore[assignment]  # a window is the tuple the backend takes
    if len(state.base_windows) > len(top):  # slots no scope covers: back to their base
        for slot, base in state.base_windows.items():
            if slot not in top and applied.get(slot) != base:
                changes[slot] = base
    limit = plan.limit
    if limit is not None and not plan.at_least and limit == state.applied_request:
        limit = None
    if changes or limit is not None or reset:
        # With "at least", the batch reads the base and grants max(base, the fold): the plan's own value. (A
        # plan that needs the base's value itself, shared or fitted windows, learns it before: enter.)
        _apply(backend, state, changes, limit, plan.at_least, reset)
    demand = 0.0
    for scope in plan.in_force:
        if scope.effective is not None:
            demand += scope.effective.demand
    state.in_force_demand = demand
    state.auto_capped = plan.capped
    if removed:
        _forget_idle(generations, state)
    state.dirty = False


def _apply(backend: Backend, state: DeviceState, changes: dict[Slot, WindowTuple], limit: Optional[int],
           at_least: bool, reset: bool) -> None:
    """One crossing (``apply_window`` when every change is one window on one kind of holder, the cheapest
    arguments; else ``apply_state``), which also reads what newly covered slots held (their base) and, with
    a limit, what the limit was (the base limit, when unknown). The batch's result lands in a journal
    inside the call: an interrupt as it returns cannot lose what it read (``_settle`` records it). On a
    failure the registry learns what the device holds."""
    bases = state.base_windows
    request = -1 if limit is None else limit
    slots = list(changes)
    first = changes[slots[0]] if slots else _EMPTY
    kind = slots[0][0] if slots else STREAM
    fresh = mixed = False
    handles = []
    for slot, window in changes.items():
        if slot not in bases:
            fresh = True
        if slot[0] != kind or window is not first and window != first:
            mixed = True
        handles.append(slot[1])
    order = slots if not mixed else [s for s in slots if s[0] == STREAM] + [s for s in slots if s[0] != STREAM]
    journal: list[Any] = []
    state.batch = (order, changes, request, at_least, journal)
    try:
        if not mixed:  # one window on one kind of holder
            backend.apply_window(state.device, kind, handles, first[0], first[1], first[2], first[3], first[4], fresh,
                                 request, at_least, reset, journal)
        else:
            backend.apply_state(state.device, request, at_least, [(s[1], changes[s]) for s in order if s[0] == STREAM],
                                [(s[1], changes[s]) for s in order if s[0] != STREAM], reset, fresh, journal)
    except CudaError as exc:
        state.batch = None  # a failed batch puts back what it changed: nothing to record
        _resync(backend, state, slots)
        raise _translate(exc, state.device) from exc
    except BaseException:
        _record_batch(state)  # cut short: the batch may have run (then its journal says what it read)
        _resync(backend, state, slots)
        raise
    _record_batch(state)


def _record_batch(state: DeviceState) -> None:
    """What the batch in the journal did: the base of every slot it covered for the first time, the windows
    it applied, and the limit (the base limit, when it read it first)."""
    batch = state.batch
    if batch is None:
        return
    order, changes, request, at_least, journal = batch
    if journal:  # idempotent, and the batch is dropped last: recording cut short is done again whole
        before, after, previous = journal[0]
        bases = state.base_windows
        for slot, old in zip(order, previous):
            if slot not in bases:
                bases[slot] = tuple(old)
        state.applied_windows.update(changes)
        if request >= 0:
            if state.base_limit is None:
                state.base_limit = int(before)  # nothing of l2ctl's had changed it: what was there is the base
            state.applied_request = int(after) if at_least else request
            state.applied_limit = state.observed_limit = int(after)
    state.batch = None


def _resync(backend: Backend, state: DeviceState, slots: list[Slot]) -> None:
    """After a failed batch, learn what the device really holds: the batch put back the limit and the
    slots it had read first (every slot l2ctl covered for the first time); the others may have changed."""
    state.dirty = True
    for slot in slots:
        if slot not in state.base_windows:
            state.applied_windows.pop(slot, None)  # put back to what l2ctl never knew: nothing to track
            continue
        try:
            state.applied_windows[slot] = _read_window(backend, slot)
        except Exception:
            state.applied_windows.pop(slot, None)  # unknown: the next plan writes it again
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


def _read_window(backend: Backend, slot: Slot) -> WindowTuple:
    if slot[0] == STREAM:
        return tuple(backend.get_stream_window(slot[1]))  # type: ignore[return-value]
    return tuple(backend.get_node_window(slot[1]))  # type: ignore[return-value]


def _translate(exc: CudaError, device: int) -> BaseException:
    if exc.name in _REFUSED_LIMIT and "SetLimit" in exc.call:
        return NotSupportedError(f"device {device}: {exc}; {MPS_HINT}")
    return exc


def _forget_idle(generations: dict[tuple[int, int], int], state: DeviceState) -> None:
    """Slots no live scope covers are back to their base and forgotten (re-read when a scope next covers
    them, so changes made outside l2ctl in between are respected); so is the limit once nothing is live."""
    if state.scopes:
        covered = {slot for s in state.scopes.values() for slot in s.slots}
        for slot in [s for s in state.base_windows
                     if s not in covered or generations and s[2] != generations.get((s[0], s[1]), 0)]:
            del state.base_windows[slot]
            state.applied_windows.pop(slot, None)
    else:
        state.base_windows.clear()
        state.applied_windows.clear()
        state.base_limit = state.applied_limit = state.applied_request = None


def _settle(backend: Backend, state: DeviceState, *, quiet: bool = False) -> None:
    """What calls cut short (or refused by CUDA) left behind, finished first by every call: scopes whose
    end began are ended (the lines reset if one asked and no window is left); a device left dirty is read
    back and given the plan. Both are no-ops in the common case. ``quiet``: a query's; a CUDA error here
    leaves the device dirty for the next change, which raises it, instead of failing the query."""
    # A scope whose holder was freed while live had its __exit__ cut short before its first line: it ends too.
    ending = [s for s in state.scopes.values() if s.ending or s.holder is not None and s.holder() is None]
    if not ending and not state.dirty:
        return
    if state.batch is not None:  # a batch cut short as it returned: what it read is in its journal
        _record_batch(state)
    if quiet:
        try:
            _settle(backend, state)
        except Exception:
            pass
        return
    was_dirty, state.dirty = state.dirty, True  # first: this settling, if cut short, is done again
    for scope in ending:
        _unregister(state, scope)
    if was_dirty:
        state.shared = sum(s.share for s in state.scopes.values())  # a count an interrupt may have left off
        _resync(backend, state, list(state.applied_windows))
    reset = False  # loops, not any(): this runs at every end
    for scope in ending:
        if scope.reset_on_exit:
            reset = True
            for other in state.scopes.values():
                if other.window is not None:
                    reset = False
                    break
            break
    _sync(backend, state, reset=reset, removed=True)


def _register(state: DeviceState, scope: Scope, holder: Any) -> None:
    scope.id = next(_registry.ids)
    state.scopes[scope.id] = scope
    state.shared += scope.share  # no call between these two lines: nothing can interrupt them
    if holder is not None:
        holder._scope = scope


def _unregister(state: DeviceState, scope: Scope) -> None:
    scopes = state.scopes
    if scopes.get(scope.id) is scope:
        del scopes[scope.id]
        state.shared -= scope.share  # no call between these two lines: nothing can interrupt them
    holder = scope.holder() if scope.holder is not None else None
    if holder is not None and getattr(holder, "_scope", None) is scope:
        holder._scope = None


def _lookup(backend: Backend, device: int) -> Optional[DeviceState]:
    last = _registry.last
    return (last[1] if backend is last[0] else _registry.tables(backend)[0]).get(device)


# ---- entry points -----------------------------------------------------------------------------------------
# Each takes the lock through _locked() (which refuses reentry) and settles what an interrupted call left.


def enter(scope: Scope, maximum: int, holder: Any = None) -> tuple[int, float, bool]:
    """Register ``scope`` and make the device match. Atomic: on any exception nothing stays registered and
    the device is put back as it was (or, if that too is cut short, at the next call). ``holder``: the
    object whose ``_scope`` names a live scope; entering it while it holds one is refused (RuntimeError),
    so one object is entered once however many threads try. Returns the limit in force (read once when
    l2ctl does not own it), the demand of the windows in force, and whether an "auto" request was kept at
    the tax-free limit: what the caller's warnings need."""
    backend = _backend._active
    scope.backend = backend
    try:
        return _enter(backend, scope, maximum, holder)
    except BaseException:
        # Also an interrupt as the lock is released, after the scope was registered: the next call ends it.
        scope.ending = True
        raise


def _enter(backend: Backend, scope: Scope, maximum: int, holder: Any) -> tuple[int, float, bool]:
    with _locked():
        last = _registry.last
        state = (last[1] if backend is last[0] else _registry.tables(backend)[0]).get(scope.device)
        if state is None:
            state = _state(backend, scope.device, maximum)
        elif state.dirty or state.scopes:
            _settle(backend, state)
        if holder is not None:
            if holder._scope is not None:
                raise RuntimeError("this scope is already active (entered in another thread?); create a new one")
            scope.holder = weakref.ref(holder)  # a holder freed while live ends its scope (its __del__)
        try:
            _register(state, scope, holder)
            fit_capped = False
            if scope.fit_hit_ratio and scope.window is not None:
                # As much of the window as the set-aside can hold next to the other windows in force.
                _learn_base_limit(backend, state)
                plan = _plan(backend, state)
                fit_capped = plan.capped  # the whole window wanted more than "auto" gives
                room = max(0.0, (plan.limit or 0) - sum(s.window.demand for s in plan.in_force
                                                        if s is not scope and s.window is not None))
                scope.window = scope.window._replace(hit_ratio=default_hit_ratio(int(room), scope.window.num_bytes))
            elif state.shared:
                _learn_base_limit(backend, state)  # sharing needs the limit's value to plan
            _sync(backend, state)
            state.auto_capped = state.auto_capped or fit_capped
        except BaseException:
            scope.ending = state.dirty = True  # first: if what follows is cut short, the next call finishes it
            _unregister(state, scope)
            try:
                _sync(backend, state, reset=False, removed=True)
            except BaseException:
                pass  # the first error is the one to see; the device stays dirty for the next call
            raise
        if scope.standing:
            # A plain set_aside call whose SetAside is gone can never be restored, so it shadows every
            # earlier plain call for good: those can go (the fold restarts at the latest exact request),
            # which keeps a loop of plain calls from growing the registry.
            orphans = [s.id for s in state.scopes.values() if s.standing and s.orphaned]
            if orphans:
                for old in [s for s in state.scopes.values() if s.standing and s.id < max(orphans)]:
                    _unregister(state, old)
        limit = state.applied_limit if state.applied_limit is not None else _seen_limit(backend, state)
        return limit, state.in_force_demand, scope.limit == "auto" and state.auto_capped


def _learn_base_limit(backend: Backend, state: DeviceState) -> None:
    """Read the limit before planning when the plan needs its value (a hit ratio fitted to the room left,
    shared windows). Everything else l2ctl returns to it learns from the batch that changes it."""
    if state.base_limit is None:
        limit = int(backend.get_persisting_limit(state.device))
        state.base_limit = state.applied_limit = state.applied_request = state.observed_limit = limit


def exit(scope: Scope) -> None:
    """End ``scope`` (idempotent) on the backend it was entered with, and make the device match the scopes
    left. The persisting lines are reset when the scope asked for it and no other scope with a window is
    live on the device. Marked ``ending`` first: if this call is cut short, the next one finishes it."""
    scope.ending = True
    backend = scope.backend
    if backend is None:
        return  # never entered
    with _locked():
        state = _lookup(backend, scope.device)
        if state is not None:
            _settle(backend, state)


def add_slots(scope: Scope, slots: Iterable[Slot], owner: Any = None) -> bool:
    """More slots for a live scope: its window goes there too, planned like the ones it entered with (a
    stream made current inside a ``graph.torch_captures()`` scope, where eager kernels then launch). Its
    demand on the limit is unchanged: one window, on more holders. ``owner`` is kept alive with the scope.
    False when the scope is no longer live (nothing changes)."""
    backend = scope.backend
    if backend is None or scope.ending:
        return False
    with _locked():
        state = _lookup(backend, scope.device)
        if state is None:
            return False
        _settle(backend, state)
        if state.scopes.get(scope.id) is not scope:
            return False
        new = tuple(slot for slot in dict.fromkeys(slots) if slot not in scope.slots)
        if not new:
            return True
        if owner is not None:
            scope.owner = (scope.owner, owner)
        scope.slots = scope.slots + new  # one assignment: the next plan (this one, or a settle) covers them
        _sync(backend, state)
    return True


def set_base_window(slots: Iterable[Slot], device: int, maximum: int, window: AccessPolicyWindow) -> None:
    """A window set outside any scope (``l2ctl.set_window``, ``Graph.set_window``): applied at once on
    idle slots; on a slot a live scope covers, it becomes what the slot returns to when the scopes end."""
    backend = _backend._active
    value = window.as_tuple()
    with _locked():
        state = _state(backend, device, maximum)
        _settle(backend, state)
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
    backend = _backend._active
    with _locked():
        generations = _registry.tables(backend)[1]
        for handle in handles:
            key = (kind, int(handle))
            generations[key] = generations.get(key, 0) + 1
        for state in _registry.tables(backend)[0].values():
            dead = [s for s in state.base_windows if s[2] != generations.get((s[0], s[1]), 0)]
            for slot in dead:
                del state.base_windows[slot]
                state.applied_windows.pop(slot, None)
            if dead and state.scopes:
                # Windows that were in force there are no longer: the limit and shared ratios follow.
                _sync(backend, state, reset=False, removed=True)


def known_limit(device: int) -> Optional[int]:
    """The limit in force when the registry owns it (a live scope needed it); None otherwise."""
    backend = _backend._active
    with _locked():
        state = _registry.tables(backend)[0].get(device)
        if state is None:
            return None
        _settle(backend, state, quiet=True)
        return state.applied_limit


def _seen_limit(backend: Backend, state: DeviceState) -> int:
    if state.applied_limit is not None:
        return state.applied_limit
    if state.observed_limit is None:
        state.observed_limit = int(backend.get_persisting_limit(state.device))
    return state.observed_limit


def observed_limit(device: int, maximum: int) -> int:
    """The limit in force as l2ctl last saw it (read once when it never has): for warnings and reports."""
    backend = _backend._active
    with _locked():
        state = _state(backend, device, maximum)
        _settle(backend, state, quiet=True)
        return _seen_limit(backend, state)


def snapshot(device: int, maximum: int) -> Snapshot:
    """The limit and the windows in force on ``device`` (reads the limit when l2ctl does not own it)."""
    backend = _backend._active
    with _locked():
        state = _state(backend, device, maximum)
        _settle(backend, state, quiet=True)
        limit = state.applied_limit if state.applied_limit is not None else int(backend.get_persisting_limit(device))
        state.observed_limit = limit
        in_force = _plan(backend, state).in_force
        return Snapshot(device, limit, tuple((s, s.effective or s.window) for s in in_force if s.window is not None))


def live_scopes(device: int) -> list[Scope]:
    backend = _backend._active
    with _locked():
        state = _registry.tables(backend)[0].get(device)
        if state is None:
            return []
        _settle(backend, state, quiet=True)
        return list(state.scopes.values())


def reset_lines(device: int) -> None:
    """cudaCtxResetPersistingL2Cache, ordered with every other change."""
    with _locked():
        _backend._active.reset_persisting_lines(device)


def granularity(device: int, maximum: int) -> tuple[int, str]:
    """(step, direction) of the driver's rounding of limit requests, probed once per backend and device:
    the probe sets the limit a few times and puts back what was there, under the lock."""
    backend = _backend._active
    with _locked():
        return _granularity(backend, device, maximum)


def _granularity(backend: Backend, device: int, maximum: int) -> tuple[int, str]:
    known = _registry.granularity.get(backend, {}).get(device)
    if known is not None:
        return known
    state = _registry.tables(backend)[0].get(device)
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
    with _locked():
        known = _registry.granularity.get(_backend._active, {}).get(device)
        return None if known is None else known[0]


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


def states() -> Iterator[tuple[Any, DeviceState]]:
    """(backend, state) for every device the registry knows (tests)."""
    for backend, per_backend in list(_registry.states.items()):
        for state in per_backend.values():
            yield backend, state


def restore_all() -> None:
    """At interpreter exit: end every live scope on every device, each with the backend it was made with."""
    with lock:
        for backend, state in states():
            if not state.scopes:
                continue
            for scope in state.scopes.values():
                scope.ending = True
            try:
                _settle(backend, state)
            except Exception:
                pass  # the process is ending; nothing left to tell


atexit.register(restore_all)
