"""A simulated call is atomic, as a driver call is (issue 36), so that the suite tells l2ctl's holes from the
simulator's: an exception a signal's handler raises (a KeyboardInterrupt, a MemoryError) lands before the
call changes anything or after its change and its journal entry; an allocation failing inside it changes
nothing; an interrupt cannot leave its lock held; a child forked while another thread is inside a call
can make calls; streams and buffers made and released under interrupts leave nothing behind. Each test
failed on main at 54abbb9; the last but one is l2ctl's own hole, found once the simulator was atomic (the planner's
granularity probe swallowed a failed put-back of the limit it probed), fixed in src/l2ctl/planner.cpp. An allocation
failing right after a batch returned whole (issue 41) found two more of l2ctl's: the journal's reading into the
planner (src/planner_bindings.cpp) and restore_all() skipping a dirty device with no scope live (planner.cpp)."""

from __future__ import annotations

import gc
import os
import random
import signal
import threading
import types
import time
from typing import Any, Callable, Optional

import pytest

import l2ctl
from l2ctl import _registry
from l2ctl.testing import FakeBackend

MiB = 1 << 20
G = 3_276_800  # the simulated H100's limit granularity
SECONDS = float(os.environ.get("L2CTL_INTERRUPT_SECONDS", "3"))
BATCHES = ("apply_batch",)  # the call with a journal
STATE_CALLS = BATCHES + ("set_persisting_limit", "reset_persisting_lines")

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")


def _scopes(parts: types.SimpleNamespace) -> list[Callable[[], None]]:
    """A block of each kind of scope, so that every batch form (one window, many, a limit, a reset) is made."""
    s, t, small, big, g, nested = parts.s, parts.t, parts.small, parts.big, parts.g, parts.nested

    def block(scope: Any) -> Callable[[], None]:
        def run() -> None:
            with scope():
                pass
        return run

    return [block(lambda: l2ctl.persist(s, small, 0.75, set_aside=None, reset_on_exit=False)),
            block(lambda: l2ctl.persist(t, small, 0.5)),
            block(lambda: l2ctl.persist(s, big, None, set_aside=4 * G)),
            block(lambda: l2ctl.persist(g, small, 0.5)),
            block(lambda: l2ctl.set_aside(3 * G)),
            nested]


class Attack:
    """Wraps the backend's state-changing calls (the planner looks each up on the backend at every call): each
    runs with a one-shot timer set to a random point of it, whose handler raises ``kind``. After a call the
    signal cut short, the device (``FakeBackend.state``) must be as before it, or as the same call made whole
    leaves it (made again, it changes nothing), and a batch's journal must say which."""

    def __init__(self, fake: FakeBackend, kind: type[BaseException], longest: float) -> None:
        self.fake, self.kind, self.longest = fake, kind, longest
        self.armed = self.fired = False
        self.cut = 0  # calls the signal cut short
        self.errors: list[str] = []
        for name in STATE_CALLS:
            setattr(fake, name, self._wrap(name, getattr(fake, name)))

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed, self.fired = False, True
            raise self.kind("the attack's signal")

    def __enter__(self) -> "Attack":
        # The garbage collector's callbacks that other libraries installed (hypothesis times its collections) are
        # set aside meanwhile: a signal landing in one is not l2ctl's to survive, and CPython reports it as an
        # exception it ignored, which pytest turns into this test's failure.
        self._gc_callbacks = gc.callbacks[:]
        gc.callbacks.clear()
        self._old = signal.signal(signal.SIGALRM, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False
        _stop_alarms(self._old)
        gc.callbacks[:] = self._gc_callbacks
        for name in STATE_CALLS:
            delattr(self.fake, name)

    def _wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def attacked(*args: Any) -> Any:
            journal = args[-1] if name in BATCHES and isinstance(args[-1], list) else None
            before = self.fake.state()
            self.fired = False
            signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-6, self.longest))
            self.armed = True
            try:
                return call(*args)
            except BaseException:
                self.armed = False
                if self.fired:
                    self.cut += 1
                    wrong = _whole_or_untouched(self.fake, name, call, args, before, journal)
                    if wrong:
                        self.errors.append(wrong)
                raise
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        return attacked


def _whole_or_untouched(fake: FakeBackend, name: str, call: Callable[..., Any], args: tuple[Any, ...], before: Any,
                        journal: Optional[list[Any]]) -> Optional[str]:
    """What is wrong with the device after ``call(*args)`` failed (cut short or refused), if anything: it must be as
    before the call, or as the call made whole leaves it (the call made again then changes nothing); a batch's
    journal must say which."""
    left = fake.state()
    if left == before and not journal:
        return None  # failed before it changed anything
    try:
        call(*(args[:-1] + ([],) if journal is not None else args))
    except Exception as exc:
        return f"{name}: made again, it failed ({exc!r}) after leaving {left} (before: {before})"
    if fake.state() != left:
        return f"{name} was left half done: {before} -> {left} -> (made whole) {fake.state()}"
    if journal is not None and not journal:
        return f"{name} changed the device ({before} -> {left}) and its journal is empty"
    return None


def _stop_alarms(old: Any) -> None:
    """The timer stopped and its handler replaced: by one that does nothing where there was none (a signal
    already on its way finds a Python handler; the default action would end the process)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, _late_alarm if old in (signal.SIG_DFL, signal.SIG_IGN, None) else old)


def _late_alarm(signum: int, frame: Any) -> None:
    """A timer's signal that arrives after its attack ended: nothing to do."""


def _attack(fake: FakeBackend, parts: types.SimpleNamespace, kind: type[BaseException], seconds: float) -> Attack:
    blocks = _scopes(parts)
    for block in blocks:
        block()  # every kind once, uninterrupted: the device is learnt (granularity, properties)
    start = time.perf_counter()
    for block in blocks:
        block()
    longest = (time.perf_counter() - start) / len(blocks) / 2  # about a call's time (a block makes two or more)
    deadline = time.monotonic() + seconds
    with Attack(fake, kind, longest) as attack:
        while time.monotonic() < deadline:
            for block in blocks:
                try:
                    block()
                except kind:
                    pass
                except Exception as exc:  # a MemoryError cut short: l2ctl says the backend's call failed
                    if "the attack's signal" not in repr(exc) + repr(exc.__cause__) + repr(exc.__context__):
                        raise
    return attack


def _restored(fake: FakeBackend, initial: Any) -> None:
    _registry.restore_all()
    assert l2ctl.budget().scopes == ()
    limits, streams, nodes = fake.state()
    assert limits == initial[0]
    assert all(w[1] == 0 for _, w in nodes)
    assert len(streams) == 1  # only the raw window set on t, as it was


def _put_back(fake: FakeBackend, state: Any) -> None:
    """The simulated device set to ``state`` (its limit, stream and node windows) behind l2ctl's back, then
    l2ctl's record settled and forgotten."""
    fake.set_persisting_limit(0, state[0][0])
    streams, nodes, empty = dict(state[1]), dict(state[2]), (0, 0, 0.0, 0, 0)
    fake.apply_batch(0, -1, False, False, False, [(0, h, streams.get(h, empty)) for h, _ in fake.state()[1]]
                     + [(1, h, nodes.get(h, empty)) for h, _ in fake.state()[2]])
    l2ctl.budget()
    _registry.restore_all()


@pytest.mark.parametrize("kind", [KeyboardInterrupt, MemoryError])
def test_a_signal_inside_a_call_lands_before_its_change_or_after_its_journal_entry(fake, scope_parts, kind):
    """On main, 3-6% of the calls cut short were left half done or unjournaled (the windows of half a batch, a
    window changed with an empty journal)."""
    initial = fake.state()
    attack = _attack(fake, scope_parts, kind, SECONDS)
    assert attack.cut > 50, attack.cut
    assert not attack.errors, f"{len(attack.errors)} of {attack.cut} calls cut short: {attack.errors[:3]}"
    _restored(fake, initial)


def _testcapi() -> Any:
    """CPython's test hooks (set_nomemory makes the allocations from one to another fail), or a skip."""
    testcapi = pytest.importorskip("_testcapi", reason="needs CPython's _testcapi (set_nomemory)")
    if not hasattr(testcapi, "set_nomemory"):
        pytest.skip("this CPython's _testcapi has no set_nomemory")
    return testcapi


def _out_of_memory(block: Callable[[], None]) -> bool:
    """Runs ``block``: whether it failed for lack of memory (a MemoryError, or l2ctl's translation of the backend's);
    any other error is raised."""
    try:
        block()
    except MemoryError:
        return True
    except Exception as exc:
        if not isinstance(exc.__cause__ or exc.__context__, MemoryError) and "MemoryError" not in str(exc):
            raise
        return True
    return False


def test_an_allocation_failing_inside_a_call_changes_nothing(fake, scope_parts):
    """Every allocation of each kind of batch fails in turn (CPython's test hook): the call fails whole, the
    limit stays as it was, and restore_all() restores the device."""
    testcapi = _testcapi()
    initial = fake.state()
    blocks = _scopes(scope_parts)
    for block in blocks:
        block()  # the device learnt first: a failure in the granularity probe is l2ctl's hole (see below)
    failures: list[str] = []
    failing, failed = [0], [False]

    def wrap(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def failing_at(*args: Any) -> Any:
            before = fake.state()
            journal = args[-1] if isinstance(args[-1], list) else None
            if failing[0]:
                testcapi.set_nomemory(failing[0], failing[0] + 1)
            try:
                return call(*args)
            except MemoryError:
                testcapi.remove_mem_hooks()
                failed[0] = True
                wrong = _whole_or_untouched(fake, name, call, args, before, journal)
                if wrong:
                    failures.append(wrong)
                raise
            finally:
                testcapi.remove_mem_hooks()
        return failing_at

    for name in BATCHES + ("set_persisting_limit",):
        setattr(fake, name, wrap(name, getattr(fake, name)))
    made = 0
    for block in blocks:
        for at in range(1, 1000):
            failing[0], failed[0] = at, False
            made += _out_of_memory(block)
            failing[0] = 0
            limit = fake.state()[0]
            l2ctl.budget()  # the next call settles what the failed one left
            _registry.restore_all()
            if fake.state()[0] != initial[0]:
                failures.append(f"after a failure at allocation {at}: the limit {limit} -> {fake.state()[0]}")
            if not failed[0]:
                break  # past the calls' last allocation
    assert made > 20, made
    assert not failures, failures[:3]
    _restored(fake, initial)


def test_an_allocation_failing_right_after_a_batch_returns_is_restored_by_restore_all(fake, scope_parts):
    """Each allocation after a batch returned whole fails in turn (CPython's test hook), then restore_all() alone, as
    at interpreter exit: the device must be as it was and the planner's record must say so. l2ctl's holes, not the
    simulator's (issue 41, 8): the first allocation, reading the journal into the planner (a list iterator), lost
    what the batch had read (the base limit, the base windows), so nothing ever put them back; a later one, cutting
    the next batch (a scope's end) short after its scope left the registry, left the device dirty with no scope
    live, which restore_all() skipped. Before, 110 of the 240 trials left the device changed or its record dirty."""
    testcapi = _testcapi()
    initial = fake.state()
    blocks = _scopes(scope_parts)
    for block in blocks:
        block()  # the device learnt first (granularity, properties)
    after_blocks = fake.state()  # as initial, the graph's nodes holding an empty window now
    assert after_blocks[:2] == initial[:2]
    armed = [-1]  # the allocation to fail after the next batch returns, or -1

    def wrap(call: Callable[..., Any]) -> Callable[..., Any]:
        def failing_after(*args: Any) -> Any:
            result = call(*args)
            if armed[0] >= 0:
                testcapi.set_nomemory(armed[0], armed[0] + 1)
                armed[0] = -1
            return result
        return failing_after

    for name in BATCHES:
        setattr(fake, name, wrap(getattr(fake, name)))
    failures: list[str] = []
    made = 0
    for index, block in enumerate(blocks):
        for at in range(40):
            armed[0] = at
            try:
                made += _out_of_memory(block)
            finally:
                testcapi.remove_mem_hooks()
                armed[0] = -1
            _registry.restore_all()  # alone: nothing else settles what the failure left
            record = _registry._planners[fake].device_state(0)
            if fake.state() != after_blocks or record.scopes or record.dirty:
                failures.append(f"block {index}, allocation {at}: {after_blocks[:2]} -> {fake.state()[:2]} "
                                f"(dirty: {record.dirty})")
                _put_back(fake, after_blocks)  # the next trial starts from the same state
    for name in BATCHES:
        delattr(fake, name)
    gc.collect()  # the cycles the failures left (tracebacks' frames hold the fake) go now, not in a later test
    assert made > 50, made
    assert not failures, (len(failures), failures[:3])
    _restored(fake, initial)


def test_a_failure_putting_back_the_probed_limit_is_raised_and_restored(fake):
    """The first scope with a set-aside probes the driver's granularity (it sets the limit and puts it back);
    the put-back fails (an allocation failure in the backend's call, which changes nothing): the scope's entry
    must say so, or the limit must be back once restore_all() returns."""
    stream, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB)
    initial = fake.device(0).limit
    real, made = fake.set_persisting_limit, []

    def failing_second(device: int, nbytes: int) -> int:
        made.append(nbytes)
        if len(made) == 2:  # the probe's put-back
            raise MemoryError
        return real(device, nbytes)

    fake.set_persisting_limit = failing_second
    raised = False
    try:
        with l2ctl.persist(stream, buf, 0.5):
            pass
    except MemoryError:
        raised = True
    finally:
        del fake.set_persisting_limit
    assert made[1] == initial  # the put-back was the failing call
    _registry.restore_all()
    assert raised or fake.device(0).limit == initial, f"the limit stays {fake.device(0).limit}, not {initial}"


def test_an_interrupt_right_after_the_lock_is_taken_leaves_it_free(fake):
    """The main thread's calls are interrupted while another thread's calls keep the lock busy, so that many
    interrupts arrive while the main thread waits for it and land as it gets it. On main, the lock stayed
    held (the other thread hung) within a second."""
    stream = fake.Stream(0)
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            fake.get_stream_window(stream.handle)

    worker = threading.Thread(target=other, daemon=True)
    delivered, armed = [0], [False]

    def handler(signum: int, frame: Any) -> None:
        if armed[0]:
            delivered[0] += 1
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    worker.start()
    deadline = time.monotonic() + SECONDS
    signal.setitimer(signal.ITIMER_REAL, 20e-6, 20e-6)
    while time.monotonic() < deadline and worker.is_alive():
        try:
            armed[0] = True
            fake.apply_batch(0, -1, False, False, False, [(0, stream.handle, (0, 0, 0.0, 0, 0))])
            armed[0] = False
        except KeyboardInterrupt:
            armed[0] = False
    _stop_alarms(old)
    stop.set()
    worker.join(10)
    assert not worker.is_alive(), "the other thread waits for a lock an interrupt left held"
    assert delivered[0] > 100, delivered[0]
    with fake.lock:  # free
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning",
                            "ignore:os.fork:RuntimeWarning")  # JAX's at-fork warning where it is loaded (the GPU suite)
def test_a_child_forked_while_another_thread_is_inside_a_call_makes_calls(fake):
    """Another thread is inside a simulated call (its kernel's timing waits) when the main thread forks: the
    child makes calls on the simulated device and exits. On main, it hung on the lock the other thread held."""
    stream = fake.Stream(0)
    inside, leave = threading.Event(), threading.Event()
    model = fake.models[0]
    evaluate = model.evaluate

    def slow_evaluate(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        leave.wait(30)
        return evaluate(*args, **kwargs)

    model.evaluate = slow_evaluate
    worker = threading.Thread(target=fake.launch_fake_kernel, args=(stream.handle,))
    worker.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: a call on the simulated device, and a scope through l2ctl
            code = 1
            try:
                fake.get_persisting_limit(0)
                with l2ctl.persist(l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), 0.5):
                    pass
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the simulator's lock")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        leave.set()
        worker.join(10)
        model.evaluate = evaluate
    assert not worker.is_alive()


def test_streams_and_memory_made_and_released_under_interrupts_leave_nothing_behind(fake):
    """Buffers and streams made, freed and closed, each call with a one-shot timer at a random point of it: once
    the objects are gone, no allocation and no stream is left (an owner released whatever cut its call short)."""
    used, streams = list(fake.memory.used), set(fake._streams)
    armed, cut = [False], [0]

    def handler(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            cut[0] += 1
            raise KeyboardInterrupt

    def attacked(call: Callable[[], Any], longest: float) -> Any:
        signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-6, longest))
        try:
            armed[0] = True
            result = call()
            armed[0] = False
            return result
        except KeyboardInterrupt:
            armed[0] = False
            return None

    start = time.perf_counter()
    fake.DeviceMemory(0, MiB).free()
    fake.Stream(0).close()
    longest = time.perf_counter() - start
    old = signal.signal(signal.SIGALRM, handler)
    try:
        deadline = time.monotonic() + SECONDS / 2
        while time.monotonic() < deadline:
            buffer = attacked(lambda: fake.DeviceMemory(0, MiB), longest)
            stream = attacked(lambda: fake.Stream(0), longest)
            if buffer is not None:
                attacked(buffer.free, longest)
            if stream is not None:
                attacked(stream.close, longest)
            buffer = stream = None
    finally:
        armed[0] = False
        _stop_alarms(old)
    gc.collect()
    fake.get_persisting_limit(0)  # the next call makes the releases the destructors left
    assert cut[0] > 20, cut[0]
    assert fake.memory.used == used
    assert set(fake._streams) == streams
