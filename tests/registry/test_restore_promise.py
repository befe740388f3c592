"""The restore promise under attack, on the simulator: asynchronous exceptions delivered by real signals (a
timer) at any point of an entry or an end (of `with` blocks and of app-lifetime scopes' start() and stop()),
also while waiting for the registry's lock; finalizers that call
l2ctl from inside l2ctl, forced at every allocation of an entry and an end; one scope object entered from
two threads at once; a live scope initialised again; streams and pointers of another CUDA context. (A
scope ended while another simulator is installed: tests/registry/test_registry.py.) Whatever happens, no lock stays held, no scope is orphaned,
and the device is back when the interrupted call returns or at the next l2ctl call."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import types
import time
import warnings
from typing import Any, Callable

import pytest

import l2ctl
from l2ctl import _registry
from l2ctl.testing import FakeBackend

MiB = 1 << 20
G = 3_276_800
SECONDS = float(os.environ.get("L2CTL_INTERRUPT_SECONDS", "3"))

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")


def _scopes(parts: types.SimpleNamespace) -> list[Callable[[], None]]:
    """One of each kind of scope, each a block that enters and ends it."""
    s, t, small, big, g, nested = parts.s, parts.t, parts.small, parts.big, parts.g, parts.nested

    def app_scope_ended_inside_a_block() -> None:
        # An app-lifetime scope an interrupt cuts off (before `app` is bound, or before stop()) is ended when
        # its object goes: the device is back once the interrupt has unwound this frame.
        app = l2ctl.persist(s, big, 0.25, set_aside=2 * G).start()
        with l2ctl.persist(t, small, 0.5):
            app.stop()

    return [
        lambda: l2ctl.persist(s, small, 0.75, set_aside=None, reset_on_exit=False).__enter__().__exit__(None, None, None),
        lambda: l2ctl.persist(t, small, 0.5).start().stop(),
        app_scope_ended_inside_a_block,
        lambda: _block(l2ctl.persist(t, small, 0.5)),
        lambda: _block(l2ctl.persist(s, big, None, set_aside=4 * G)),
        lambda: _block(l2ctl.persist(g, small, 0.5)),
        _set_aside_block,
        nested,
    ]


def _set_aside_block() -> None:
    with l2ctl.set_aside(3 * G):
        pass


def _block(scope: Any) -> None:
    with scope:
        pass


class Timer:
    """SIGALRM every ``interval`` seconds, raising KeyboardInterrupt while ``armed`` (so that the test's own
    bookkeeping is never interrupted)."""

    def __init__(self, interval: float) -> None:
        self.interval, self.armed, self.delivered = interval, False, 0

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.delivered += 1
            raise KeyboardInterrupt

    def __enter__(self) -> "Timer":
        self._old = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        self.armed = False
        # A SIGALRM already on its way (caught by another thread, not yet handled here) must still find a
        # Python handler: with the default action put back it ends the process ("Alarm clock"), and CPython
        # reports one it finds without a handler as "ignored due to race condition". So a handler that does
        # nothing stays (the default action of a timer nobody arms is never needed again in the suite).
        signal.signal(signal.SIGALRM, _late_alarm if self._old in (signal.SIG_DFL, signal.SIG_IGN, None) else self._old)


def _late_alarm(signum: int, frame: Any) -> None:
    """A timer's signal that arrives after its Timer ended: nothing to do."""


def _no_lock_held() -> None:
    assert not _registry.lock._is_owned()  # type: ignore[attr-defined]
    assert _registry.lock.acquire(timeout=5), "the registry's lock stayed held"
    _registry.lock.release()


def _device_is_back(fake: FakeBackend, initial: tuple[Any, ...], t_window: tuple[int, ...]) -> None:
    assert l2ctl.budget().scopes == ()  # the next l2ctl call: it settles what an interrupted one left
    # An interrupt after set_aside() returned and before its `with` began leaves what a plain call leaves:
    # a standing request (documented), dropped by the next plain call or at exit. Nothing else stays.
    live = _registry.live_scopes(0)
    assert all(s.standing and s.window is None for s in live), live
    _registry.restore_all()
    assert not _registry.live_scopes(0)
    limits, streams, nodes = fake.state()
    assert limits == initial[0] and all(w[1] == 0 for _, w in nodes)
    assert [w for _, w in streams] == [t_window]  # only the raw window set on t, as it was


def _block_time(blocks: list[Callable[[], None]]) -> float:
    """The median time one block takes uninterrupted; the timer's interval is set from it, so that some
    blocks complete and most are cut short, on a fast host or a slow one."""
    times = []
    for _ in range(20):
        for block in blocks:
            start = time.perf_counter()
            block()
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _attack(fake: FakeBackend, blocks: list[Callable[[], None]], per_block: float, seconds: float,
            ) -> tuple[int, int]:
    """Runs the blocks round and round under a timer whose interval is ``per_block`` times a block's time
    (the timer and the blocks drift apart, so interrupts land everywhere): (blocks that completed,
    interrupts delivered)."""
    interval = max(50e-6, per_block * _block_time(blocks))
    # An interrupt can land in a finalizer that runs inside a block (Python swallows it there, as
    # "unraisable"): collected here, they must all be the timer's.
    unraisable: list[type[BaseException]] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(u.exc_type)
    try:
        with Timer(interval) as timer:
            completed = _rounds(blocks, timer, seconds)
    finally:
        sys.unraisablehook = hook
    assert set(unraisable) <= {KeyboardInterrupt}, set(unraisable)
    return completed, timer.delivered


def _rounds(blocks: list[Callable[[], None]], timer: Timer, seconds: float) -> int:
    """Blocks completed in ``seconds`` of rounds; after each interrupt, no lock may stay held."""
    completed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for block in blocks:
            try:
                timer.armed = True
                block()
                timer.armed = False
                completed += 1
            except KeyboardInterrupt:
                timer.armed = False
                _no_lock_held()
    return completed


def test_interrupts_at_any_point_leave_no_lock_and_no_scope(fake, scope_parts):
    initial = fake.state()
    blocks = _scopes(scope_parts)
    for block in blocks:
        block()  # every kind once, uninterrupted: the device is learnt (granularity, properties)
    t_window = tuple(fake.windows.values())[0]
    completed, delivered = _attack(fake, blocks, 1.3, SECONDS)
    assert delivered > 1000 and completed > 100, (completed, delivered)
    _device_is_back(fake, initial, t_window)


def test_interrupts_while_waiting_for_the_registrys_lock(fake, scope_parts):
    """Another thread takes the registry's lock again and again: entries and ends wait for it, and are
    interrupted there too."""
    initial = fake.state()
    blocks = _scopes(scope_parts)
    for block in blocks:
        block()
    t_window = tuple(fake.windows.values())[0]
    stop = threading.Event()

    def holder() -> None:
        while not stop.is_set():
            with _registry.lock:
                time.sleep(20e-6)
            time.sleep(5e-6)

    other = threading.Thread(target=holder)
    other.start()
    try:
        completed, delivered = _attack(fake, blocks, 1.7, SECONDS)
    finally:
        stop.set()
        other.join(5)
    assert delivered > 500 and completed > 50, (completed, delivered)
    _device_is_back(fake, initial, t_window)


def test_finalizers_calling_l2ctl_from_inside_l2ctl_are_refused_and_the_scopes_end_right(fake, scope_parts):
    """A finalizer (a reference cycle's __del__) that opens a scope while l2ctl is changing device state on
    the same thread is refused with a RuntimeError that says why; one that runs elsewhere is served. The
    collector runs at every allocation (threshold 1; from Python 3.12 at the next point where Python code
    runs), and every collection leaves a new such cycle for the next: a finalizer runs wherever one can,
    through the entry and the end of each kind of scope, the registry compiled or not. The device ends as
    it began, and every outcome is one of the two."""
    initial = fake.state()
    blocks = _scopes(scope_parts)
    for block in blocks:
        block()
    t_window = tuple(fake.windows.values())[0]
    other, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    outcomes: list[str] = []
    planting = False

    class Finalizer:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            try:
                with warnings.catch_warnings():  # a served scope may warn of the budget: not the point here
                    warnings.simplefilter("ignore")
                    with l2ctl.persist(other, buf, 0.5):
                        outcomes.append("served")
            except RuntimeError as exc:
                outcomes.append("refused" if "finalizer" in str(exc) else f"wrong: {exc}")
            except BaseException as exc:
                outcomes.append(f"wrong: {exc!r}")

    def plant(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and planting:
            Finalizer()  # garbage for the next collection

    threshold = gc.get_threshold()
    gc.callbacks.append(plant)
    try:
        gc.set_threshold(1)
        for _ in range(10):
            for block in blocks:
                planting = True
                block()
                planting = False
                _no_lock_held()
    finally:
        planting = False
        gc.set_threshold(*threshold)
        gc.callbacks.remove(plant)
        gc.collect()
    assert set(outcomes) == {"refused", "served"}, set(outcomes)
    _device_is_back(fake, initial, t_window)


def test_one_scope_object_entered_from_two_threads_is_entered_once(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    initial = fake.state()
    for _ in range(200):
        scope = l2ctl.persist(s, buf, 0.5)
        start = threading.Barrier(2)
        results: list[str] = []

        def enter() -> None:
            start.wait()
            try:
                scope.__enter__()
                results.append("entered")
            except RuntimeError as exc:
                assert "already active" in str(exc)
                results.append("refused")

        threads = [threading.Thread(target=enter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert sorted(results) == ["entered", "refused"]
        assert len(_registry.live_scopes(0)) == 1
        scope.__exit__(None, None, None)
        assert not _registry.live_scopes(0) and fake.state() == initial


def test_a_live_scope_cannot_be_initialised_again(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, buf, 0.5) as scope:
        with pytest.raises(RuntimeError, match="live"):
            scope.__init__(s, buf, 0.25)  # type: ignore[misc]
        assert scope.window.hit_ratio == 0.5 and len(_registry.live_scopes(0)) == 1
    assert not _registry.live_scopes(0) and fake.state()[1] == ()


def test_streams_and_pointers_of_another_cuda_context_are_refused_before_any_change(fake):
    context = fake.create_context(0)
    foreign_stream = fake.foreign_stream(context)
    foreign_memory = fake.foreign_memory(context, MiB)
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    before, calls = fake.state(), len(fake.calls)
    with pytest.raises(ValueError, match=f"context 0x{context:x}.*not to the primary context of device 0"):
        with l2ctl.persist(foreign_stream, buf, 0.5):
            pass
    with pytest.raises(ValueError, match=f"context 0x{context:x}"):
        with l2ctl.persist(s, (foreign_memory, MiB), 0.5):
            pass
    with pytest.raises(ValueError, match=f"context 0x{context:x}"):
        l2ctl.set_window(foreign_stream, l2ctl.AccessPolicyWindow.for_buffer(buf, 0.5))
    assert fake.state() == before and not {"cudaStreamSetAttribute", "cudaDeviceSetLimit"} & set(fake.calls[calls:])
    with l2ctl.persist(s, buf, 0.5):  # the primary context's own objects still work
        pass
    assert fake.state() == before
