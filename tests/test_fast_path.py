"""The fast path of a persist scope (issue "A persist scope costs no more than the raw CUDA calls"): one
crossing into the backend per side, no property query or limit read on the hot path, validation done once,
and the same outcome as the registry's general plan (conftest turns on that check for every test)."""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, _device, _registry
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


class Crossings:
    """Counts the calls l2ctl makes into the backend (each one a crossing into C++ on a GPU)."""

    def __init__(self, fake: FakeBackend, names: tuple[str, ...]) -> None:
        self.count: dict[str, int] = {}
        self.depth = 0  # the simulator's own calls to its other methods are not crossings
        for name in names:
            original = getattr(fake, name)

            def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original) -> Any:
                if self.depth == 0:
                    self.count[_name] = self.count.get(_name, 0) + 1
                self.depth += 1
                try:
                    return _original(*args)
                finally:
                    self.depth -= 1

            setattr(fake, name, counted)

    def total(self) -> int:
        return sum(self.count.values())


NAMES = ("apply_state", "apply_window", "get_stream_window", "set_stream_window", "get_persisting_limit", "set_persisting_limit",
         "reset_persisting_lines", "device_properties", "device_count", "pointer_info", "stream_device",
         "current_device")


@pytest.mark.parametrize("settings,per_scope", [
    (dict(set_aside=None, reset_on_exit=False), 2),  # lean: the window on, the window off
    ({}, 2),  # default: "auto" limit and the window in one batch, then window, limit and reset in one
    (dict(policy=l2ctl.Policy(set_aside=4 * 3_276_800, hit_ratio=0.75)), 2),
])
def test_one_crossing_per_side(fake, settings, per_scope):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    ratio = {} if "policy" in settings else {"hit_ratio": 0.75}
    with l2ctl.persist(s, buf, **ratio, **settings):
        pass  # the first scope may learn the device (granularity probe, properties)
    counter = Crossings(fake, NAMES)
    for _ in range(20):
        with l2ctl.persist(s, buf, **ratio, **settings):
            pass
    assert counter.count.get("device_properties", 0) == 0 and counter.count.get("device_count", 0) == 0
    assert counter.total() == 20 * per_scope, counter.count
    assert fake.state()[1] == () and fake.device(0).limit == fake.device(0).initial_limit


def test_set_aside_scope_is_one_crossing_per_side(fake):
    with l2ctl.set_aside(3_276_800):
        pass
    counter = Crossings(fake, NAMES)
    for _ in range(10):
        with l2ctl.set_aside(3_276_800):
            pass
    # set_aside reads the limit it replaces and the one granted (for SetAside.previous and the int it is)
    batches = counter.count.get("apply_state", 0) + counter.count.get("apply_window", 0)
    assert batches == 20 and counter.count.get("device_properties", 0) == 0, counter.count


def test_foreign_buffers_are_checked_once_while_their_owner_lives(fake):
    s, block = l2ctl.Stream(), l2ctl.DeviceBuffer(8 * MiB)

    class Array:  # what CuPy or Numba hand over: an interface over someone else's allocation
        def __init__(self, ptr: int, nbytes: int) -> None:
            self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    array = Array(block.ptr + MiB, 2 * MiB)
    counter = Crossings(fake, ("pointer_info",))
    for _ in range(5):
        with l2ctl.persist(s, array, 0.5, set_aside=None):
            pass
    assert counter.count["pointer_info"] == 1
    del array
    gc.collect()
    again = Array(block.ptr + MiB, 2 * MiB)  # a new object: checked again, whatever its address
    with l2ctl.persist(s, again, 0.5, set_aside=None):
        pass
    assert counter.count["pointer_info"] == 2
    past = Array(block.ptr + 7 * MiB, 2 * MiB)
    with pytest.raises(ValueError, match="runs past its allocation"):
        l2ctl.persist(s, past, 0.5).__enter__()


def test_freed_and_closed_objects_are_still_refused(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, buf, 0.5):
        pass
    buf.free()
    with pytest.raises(ValueError, match="freed"):
        l2ctl.persist(s, buf, 0.5)
    s.close()
    with pytest.raises(ValueError, match="closed"):
        l2ctl.persist(s, l2ctl.DeviceBuffer(MiB), 0.5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_forgets_the_parents_view(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    l2ctl.device_info()
    scope = l2ctl.persist(s, buf, 0.5)
    scope.__enter__()
    pid = os.fork()
    if pid == 0:  # the child: no cached properties, no registry, a lock it can take
        ok = not _device._cache and not _registry._registry.states and _registry.lock.acquire(timeout=1)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    scope.__exit__(None, None, None)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.slow
def test_lean_scope_on_the_simulator_stays_cheap(monkeypatch):
    """A guard with a generous bound (the overhead benchmark is the measure: <= 8 us on the simulated H100)."""
    monkeypatch.setattr(_registry, "CHECK_FAST_PATHS", False)  # the tests' cross-check costs a plan per scope
    with FakeBackend.installed(FakeDevice.h100()):
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
        samples = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(2000):
                with l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
                    pass
            samples.append((time.perf_counter() - start) / 2000 * 1e6)
        median = statistics.median(samples)
        print(f"lean scope on the simulated H100: {median:.1f} us ({sys.version.split()[0]})")
        assert median < 40, samples


def test_a_policy_is_checked_when_made_and_its_scope_costs_what_the_arguments_cost(fake):
    with pytest.raises(ValueError):
        l2ctl.Policy(hit_ratio=1.5)
    with pytest.raises(TypeError):
        l2ctl.Policy(set_aside=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        l2ctl.Policy(enabled=1)  # type: ignore[arg-type]
    assert l2ctl.Policy(hit_ratio=1.0000001).hit_ratio == 1.0
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    counts = []
    for make in (lambda: l2ctl.persist(s, buf, 0.75, set_aside=2 * 3_276_800),
                 lambda: l2ctl.persist(s, buf, policy=l2ctl.Policy(set_aside=2 * 3_276_800, hit_ratio=0.75))):
        with make():
            pass
        counter = Crossings(fake, NAMES)
        for _ in range(5):
            with make() as scope:
                assert scope.window.hit_ratio == 0.75 and fake.device(0).limit == 2 * 3_276_800
        counts.append(dict(counter.count))
    assert counts[0] == counts[1]
    assert fake.device(0).limit == fake.device(0).initial_limit


def test_the_lone_lean_scope_fails_cleanly(fake, monkeypatch):
    """The inline path of the commonest scope (the only one on its device, on one stream, no limit): a
    refused entry leaves nothing registered and the stream as it was; a refused exit leaves the device
    known, so the next scope still ends on the stream's own window; a window changed outside l2ctl while
    no scope was live is read again."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    outside = AccessPolicyWindow.for_buffer(buf, 0.25)
    l2ctl.set_window(s, outside)
    with l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
        assert l2ctl.get_window(s).hit_ratio == 0.75
    assert l2ctl.get_window(s) == outside
    real = fake.apply_window

    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError("cudaStreamSetAttribute(stream, ...)", 1, "cudaErrorInvalidValue", "invalid argument",
                              "stream")

    monkeypatch.setattr(fake, "apply_window", refuse)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        with l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
            pytest.fail("the block must not run")
    assert l2ctl.budget().scopes == () and l2ctl.get_window(s) == outside
    monkeypatch.setattr(fake, "apply_window", real)
    scope = l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)
    scope.__enter__()
    monkeypatch.setattr(fake, "apply_window", refuse)
    with pytest.raises(l2ctl.CudaError):
        scope.__exit__(None, None, None)
    monkeypatch.setattr(fake, "apply_window", real)
    assert l2ctl.budget().scopes == () and l2ctl.get_window(s).hit_ratio == 0.75  # the refused exit changed nothing
    with l2ctl.persist(s, buf, 0.5, set_aside=None, reset_on_exit=False):
        assert l2ctl.get_window(s).hit_ratio == 0.5
    assert l2ctl.get_window(s) == outside  # the base l2ctl kept through the failure
    l2ctl.clear_window(s)
    with l2ctl.persist(s, buf, 0.5, set_aside=None, reset_on_exit=False):
        pass
    assert l2ctl.get_window(s).empty and fake.device(0).limit == fake.device(0).initial_limit


def test_the_lone_default_scope_raises_the_limit_in_its_one_crossing_and_fails_cleanly(fake, monkeypatch):
    """The lone "auto" scope: the window and the limit in one crossing (the limit only raised, to the window's
    demand rounded up to the granularity, never past the driver's default); a refused crossing leaves no
    scope, the limit and the stream as they were."""
    s = l2ctl.Stream()
    big = l2ctl.DeviceBuffer(16 * MiB)  # 12 MiB at 0.75: more than the initial limit (9.375 MiB)
    initial = fake.device(0).limit
    counter = Crossings(fake, NAMES)
    with pytest.warns(l2ctl.SetAsideTaxWarning):  # the demand is above the tax-free default: capped there
        with l2ctl.persist(s, big, 0.75) as scope:
            assert fake.device(0).limit == initial == scope.set_aside
    small = l2ctl.DeviceBuffer(2 * MiB)
    fake.device(0).limit = 0  # an idle device whose limit someone set to nothing
    with l2ctl.persist(s, small, 0.75) as scope:
        assert fake.device(0).limit == 3_276_800 == scope.set_aside  # raised to one granule
    assert fake.device(0).limit == 0 and l2ctl.get_window(s).empty
    fake.device(0).limit = initial
    assert counter.count.get("apply_window", 0) == 4 and counter.count.get("apply_state", 0) == 0, counter.count

    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError("cudaDeviceSetLimit(...)", 1, "cudaErrorInvalidValue", "invalid argument", "device 0")

    real = fake.apply_window
    monkeypatch.setattr(fake, "apply_window", refuse)
    with pytest.raises(l2ctl.CudaError):
        with l2ctl.persist(s, small, 0.75):
            pytest.fail("the block must not run")
    monkeypatch.setattr(fake, "apply_window", real)
    assert l2ctl.budget().scopes == () and fake.device(0).limit == initial and l2ctl.get_window(s).empty
    with l2ctl.persist(s, small, 0.75):
        pass
    assert fake.device(0).limit == initial and l2ctl.get_window(s).empty


# ---- found by review of the fast paths (each failed before its fix) --------------------------------------


def _refusing(name: str = "cudaStreamSetAttribute(stream, ...)") -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError(name, 1, "cudaErrorInvalidValue", "invalid argument", "")
    return refuse


def test_a_default_scope_refused_by_mps_leaves_no_scope():
    with FakeBackend.installed(FakeDevice.mps_client()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB)
        for _ in range(2):  # the limit probe raises inside the lone scope's path, every time
            with pytest.raises(l2ctl.NotSupportedError):
                with l2ctl.persist(s, buf, 0.75):
                    pytest.fail("the block must not run")
            assert _registry.live_scopes(0) == [] and l2ctl.get_window(s).empty
        with l2ctl.persist(s, buf, 0.75, set_aside=None) as scope:  # the limit MPS gave still works
            assert scope.set_aside == fake.device(0).limit


def test_a_refused_entry_leaves_no_limit_the_registry_thinks_it_owns(fake, monkeypatch):
    s, other, buf = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB)
    granule = 3_276_800
    fake.device(0).limit = 2 * granule
    real = fake.apply_window
    for live in (False, True):  # the lone scope's path; the fast path beside a live scope
        outer = l2ctl.persist(other, buf, 0.5, set_aside=None, reset_on_exit=False)
        if live:
            with warnings.catch_warnings():  # l2ctl last saw the limit at 0 (it reads an idle device's once)
                warnings.simplefilter("ignore", l2ctl.L2BudgetWarning)
                outer.__enter__()
        monkeypatch.setattr(fake, "apply_window", _refusing())
        with pytest.raises(l2ctl.CudaError):
            with l2ctl.persist(s, buf, 0.75, set_aside=None):
                pass
        monkeypatch.setattr(fake, "apply_window", real)
        assert _registry.known_limit(0) is None  # nothing of l2ctl's holds the limit
        fake.device(0).limit = 0  # changed outside l2ctl meanwhile
        with l2ctl.persist(s, buf, 0.75, set_aside=2 * granule) as scope:
            assert fake.device(0).limit == 2 * granule == scope.set_aside
        if live:
            outer.__exit__(None, None, None)
        assert fake.device(0).limit == 0 and l2ctl.get_window(s).empty and l2ctl.get_window(other).empty
        fake.device(0).limit = 2 * granule


def test_after_a_refused_exit_the_next_change_puts_the_device_back_to_the_plan(fake, monkeypatch):
    s, other, buf = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    fake.device(0).limit = 0
    scope = l2ctl.persist(s, buf, 0.75)  # "auto": raises the limit
    scope.__enter__()
    assert fake.device(0).limit > 0
    monkeypatch.setattr(fake, "apply_window", _refusing("cudaCtxResetPersistingL2Cache()"))
    with pytest.raises(l2ctl.CudaError):
        scope.__exit__(None, None, None)
    monkeypatch.undo()
    assert l2ctl.get_window(s).hit_ratio == 0.75 and fake.device(0).limit > 0  # the refused exit changed nothing
    with pytest.warns(l2ctl.L2BudgetWarning):  # the limit is back at 0
        with l2ctl.persist(other, buf, 0.5, set_aside=None, reset_on_exit=False):
            # the scope that ended is gone from the device: its stream and the limit are back to their base
            assert l2ctl.get_window(s).empty and fake.device(0).limit == 0
    assert l2ctl.get_window(other).empty and fake.device(0).limit == 0
    with pytest.warns(l2ctl.L2BudgetWarning):
        with l2ctl.persist(s, buf, 0.5, set_aside=None, reset_on_exit=False):
            assert l2ctl.get_window(s).hit_ratio == 0.5
    assert l2ctl.get_window(s).empty


def test_a_closed_streams_window_asks_for_no_set_aside(fake):
    fake.device(0).limit = 0
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    slot = _registry.stream_slot(s.handle)  # what a scope computes before taking the registry's lock
    _registry.forget_slots(_registry.STREAM, [s.handle])  # the stream closes in another thread meanwhile
    scope = _registry.Scope(0, (slot,), AccessPolicyWindow.for_buffer(buf, 0.75), "auto", reset_on_exit=True)
    limit, demand, capped = _registry.enter(scope, fake.device(0).persisting_l2_cache_max_size)
    assert (limit, demand, capped) == (0, 0.0, False) and fake.device(0).limit == 0
    _registry.exit(scope)
    assert fake.device(0).limit == 0
