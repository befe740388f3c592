"""What a scope costs in calls into the backend: one crossing per side (the window, with the limit and the
reset of lines in the same batch), no property query or limit read once the device is known, a foreign
buffer's range checked once while its owner lives; and how a refused crossing leaves the device."""

from __future__ import annotations

import gc
import os
import warnings
from typing import Any, Callable

import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, _device, _registry
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


@pytest.mark.parametrize("settings,per_scope", [
    (dict(set_aside=None, reset_on_exit=False), 2),  # lean: the window on, the window off
    ({}, 2),  # default: "auto" limit and the window in one batch, then window, limit and reset in one
    (dict(policy=l2ctl.Policy(set_aside=4 * 3_276_800, hit_ratio=0.75)), 2),
])
def test_one_crossing_per_side(fake, crossings, settings, per_scope):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    ratio = {} if "policy" in settings else {"hit_ratio": 0.75}
    with l2ctl.persist(s, buf, **ratio, **settings):
        pass  # the first scope may learn the device (granularity probe, properties)
    counter = crossings()
    for _ in range(20):
        with l2ctl.persist(s, buf, **ratio, **settings):
            pass
    assert counter.count.get("device_properties", 0) == 0 and counter.count.get("device_count", 0) == 0
    assert counter.total() == 20 * per_scope, counter.count
    assert fake.state()[1] == () and fake.device(0).limit == fake.device(0).initial_limit


def test_set_aside_scope_is_one_crossing_per_side(fake, crossings):
    with l2ctl.set_aside(3_276_800):
        pass
    counter = crossings()
    for _ in range(10):
        with l2ctl.set_aside(3_276_800):
            pass
    # set_aside reads the limit it replaces and the one granted (for SetAside.previous and the int it is)
    batches = counter.count.get("apply_batch", 0)
    assert batches == 20 and counter.count.get("device_properties", 0) == 0, counter.count


def test_foreign_buffers_are_checked_once_while_their_owner_lives(fake, crossings):
    s, block = l2ctl.Stream(), l2ctl.DeviceBuffer(8 * MiB)

    class Array:  # what CuPy or Numba hand over: an interface over someone else's allocation
        def __init__(self, ptr: int, nbytes: int) -> None:
            self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    array = Array(block.ptr + MiB, 2 * MiB)
    counter = crossings(("pointer_info",))
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
# JAX, when an earlier test imported it, warns at every fork from its own at-fork hook; the child here runs no
# JAX and exits at once
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_forked_child_forgets_the_parents_view(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    l2ctl.device_info()
    scope = l2ctl.persist(s, buf, 0.5)
    scope.__enter__()
    pid = os.fork()
    if pid == 0:  # the child: no cached properties, no registry, a lock it can take
        ok = not _device._cache and not _registry._planners and _registry.lock.acquire(timeout=1)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    scope.__exit__(None, None, None)
    assert os.WEXITSTATUS(status) == 0


def test_a_policy_is_checked_when_made_and_its_scope_costs_what_the_arguments_cost(fake, crossings):
    with pytest.raises(ValueError):
        l2ctl.Policy(hit_ratio=1.5)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        l2ctl.Policy(set_aside=1.5)
    with pytest.raises(TypeError):
        l2ctl.Policy(enabled=1)  # type: ignore[arg-type]
    assert l2ctl.Policy(hit_ratio=1.0000001).hit_ratio == 1.0
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    counts = []
    for make in (lambda: l2ctl.persist(s, buf, 0.75, set_aside=2 * 3_276_800),
                 lambda: l2ctl.persist(s, buf, policy=l2ctl.Policy(set_aside=2 * 3_276_800, hit_ratio=0.75))):
        with make():
            pass
        counter = crossings()
        for _ in range(5):
            with make() as scope:
                assert scope.window.hit_ratio == 0.75 and fake.device(0).limit == 2 * 3_276_800
        counts.append(dict(counter.count))
    assert counts[0] == counts[1]
    assert fake.device(0).limit == fake.device(0).initial_limit


def test_the_lone_lean_scope_fails_cleanly(fake, monkeypatch):
    """The commonest scope (the only one on its device, on one stream, no limit): a refused entry leaves
    nothing registered and the stream as it was; after a refused exit the next call puts the device back
    to the plan (the stream's own window); a window changed outside l2ctl while no scope was live is read
    again."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    outside = AccessPolicyWindow.for_buffer(buf, 0.25)
    l2ctl.set_window(s, outside)
    with l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
        assert l2ctl.get_window(s).hit_ratio == 0.75
    assert l2ctl.get_window(s) == outside
    real = fake.apply_batch

    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError("cudaStreamSetAttribute(stream, ...)", 1, "cudaErrorInvalidValue", "invalid argument",
                              "stream")

    monkeypatch.setattr(fake, "apply_batch", refuse)
    with pytest.raises(l2ctl.CudaError, match="cudaErrorInvalidValue"):
        with l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False):
            pytest.fail("the block must not run")
    assert l2ctl.budget().scopes == () and l2ctl.get_window(s) == outside
    monkeypatch.setattr(fake, "apply_batch", real)
    scope = l2ctl.persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)
    scope.__enter__()
    monkeypatch.setattr(fake, "apply_batch", refuse)
    with pytest.raises(l2ctl.CudaError):
        scope.__exit__(None, None, None)
    assert l2ctl.get_window(s).hit_ratio == 0.75  # the refused exit changed nothing...
    monkeypatch.setattr(fake, "apply_batch", real)
    assert l2ctl.budget().scopes == () and l2ctl.get_window(s) == outside  # ...and the next call put it back
    with l2ctl.persist(s, buf, 0.5, set_aside=None, reset_on_exit=False):
        assert l2ctl.get_window(s).hit_ratio == 0.5
    assert l2ctl.get_window(s) == outside  # the base l2ctl kept through the failure
    l2ctl.clear_window(s)
    with l2ctl.persist(s, buf, 0.5, set_aside=None, reset_on_exit=False):
        pass
    assert l2ctl.get_window(s).empty and fake.device(0).limit == fake.device(0).initial_limit


def test_the_lone_default_scope_raises_the_limit_in_its_one_crossing_and_fails_cleanly(fake, crossings, monkeypatch):
    """The lone "auto" scope: the window and the limit in one crossing (the limit only raised, to the window's
    demand rounded up to the granularity, never past the driver's default); a refused crossing leaves no
    scope, the limit and the stream as they were."""
    s = l2ctl.Stream()
    big = l2ctl.DeviceBuffer(16 * MiB)  # 12 MiB at 0.75: more than the initial limit (9.375 MiB)
    initial = fake.device(0).limit
    counter = crossings()
    with pytest.warns(l2ctl.SetAsideTaxWarning):  # the demand is above the tax-free default: capped there
        with l2ctl.persist(s, big, 0.75) as scope:
            assert fake.device(0).limit == initial == scope.set_aside
    small = l2ctl.DeviceBuffer(2 * MiB)
    fake.device(0).limit = 0  # an idle device whose limit someone set to nothing
    with l2ctl.persist(s, small, 0.75) as scope:
        assert fake.device(0).limit == 3_276_800 == scope.set_aside  # raised to one granule
    assert fake.device(0).limit == 0 and l2ctl.get_window(s).empty
    fake.device(0).limit = initial
    assert counter.count.get("apply_batch", 0) == 4, counter.count

    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError("cudaDeviceSetLimit(...)", 1, "cudaErrorInvalidValue", "invalid argument", "device 0")

    real = fake.apply_batch
    monkeypatch.setattr(fake, "apply_batch", refuse)
    with pytest.raises(l2ctl.CudaError):
        with l2ctl.persist(s, small, 0.75):
            pytest.fail("the block must not run")
    monkeypatch.setattr(fake, "apply_batch", real)
    assert l2ctl.budget().scopes == () and fake.device(0).limit == initial and l2ctl.get_window(s).empty
    with l2ctl.persist(s, small, 0.75):
        pass
    assert fake.device(0).limit == initial and l2ctl.get_window(s).empty


# ---- found by review of the fast paths (each failed before its fix) --------------------------------------


def _refusing(name: str = "cudaStreamSetAttribute(stream, ...)") -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise l2ctl.CudaError(name, 1, "cudaErrorInvalidValue", "invalid argument", "")
    return refuse


def test_a_limit_refused_by_mps_leaves_no_scope():
    with FakeBackend.installed(FakeDevice.mps_client()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB)
        for _ in range(2):  # the refused limit raises inside the lone scope's path, every time
            with pytest.raises(l2ctl.NotSupportedError):
                with l2ctl.persist(s, buf, 0.75, set_aside=3_276_800):
                    pytest.fail("the block must not run")
            assert _registry.live_scopes(0) == [] and l2ctl.get_window(s).empty
        with l2ctl.persist(s, buf, 0.75, set_aside=None) as scope:  # the limit MPS gave still works
            assert scope.set_aside == fake.device(0).limit


def test_a_refused_entry_leaves_no_limit_the_registry_thinks_it_owns(fake, monkeypatch):
    s, other, buf = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB)
    granule = 3_276_800
    fake.device(0).limit = 2 * granule
    real = fake.apply_batch
    for live in (False, True):  # the lone scope's path; the fast path beside a live scope
        outer = l2ctl.persist(other, buf, 0.5, set_aside=None, reset_on_exit=False)
        if live:
            with warnings.catch_warnings():  # l2ctl last saw the limit at 0 (it reads an idle device's once)
                warnings.simplefilter("ignore", l2ctl.L2BudgetWarning)
                outer.__enter__()
        monkeypatch.setattr(fake, "apply_batch", _refusing())
        with pytest.raises(l2ctl.CudaError):
            with l2ctl.persist(s, buf, 0.75, set_aside=None):
                pass
        monkeypatch.setattr(fake, "apply_batch", real)
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
    monkeypatch.setattr(fake, "apply_batch", _refusing("cudaCtxResetPersistingL2Cache()"))
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


def _graph(fake: FakeBackend, s: l2ctl.Stream, kernels: int) -> Any:
    from l2ctl import graph

    with graph.capture(s) as g:
        for _ in range(kernels):
            fake.launch_fake_kernel(s.handle)
    return g


def test_a_graph_scope_is_one_crossing_per_side_over_all_its_nodes(fake, crossings):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    g = _graph(fake, s, 8)
    before = fake.state()
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False):
        pass  # the first scope learns the device
    counter = crossings()
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False) as p:
        assert counter.count == {"apply_batch": 1}
        assert [k.window for k in g.kernel_nodes()] == [p.window] * 8
    assert counter.count == {"apply_batch": 2}
    assert fake.state() == before


def test_nodes_with_different_bases_each_go_back_to_their_own(fake):
    s, lut, other = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(MiB)
    g = _graph(fake, s, 2)
    first = g.kernel_nodes()[0]
    fake.apply_batch(0, -1, False, False, False, [(1, first.node, AccessPolicyWindow.for_buffer(other, 0.25))])
    before = fake.state()
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False) as p:
        assert [k.window for k in g.kernel_nodes()] == [p.window] * 2
    assert fake.state() == before


def test_an_auto_scope_is_one_crossing_per_side_once_the_granularity_is_known(fake, crossings):
    s, lut, small = l2ctl.Stream(), l2ctl.DeviceBuffer(16 * MiB), l2ctl.DeviceBuffer(MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(s, lut, 1.0):  # probes the granularity
            pass
    counter = crossings()
    with pytest.warns(l2ctl.SetAsideTaxWarning):
        with l2ctl.persist(s, lut, 1.0) as p:
            # 16 MiB asks past the tax-free limit: "auto" stops there, in the one crossing, and says so
            assert p.set_aside == fake.device(0).initial_limit
    assert counter.count == {"apply_batch": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with l2ctl.persist(s, small, 1.0) as p:  # within the tax-free limit: nothing to say
            assert p.set_aside == fake.device(0).initial_limit
    assert counter.count == {"apply_batch": 4}


def test_warnings_name_the_users_line_and_a_raising_filter_ends_the_scope(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    big = l2ctl.DeviceBuffer(fake.device(0).initial_limit + 8 * MiB)
    with l2ctl.persist(s, lut, 0.5, set_aside=None):
        pass
    before = fake.state()
    with pytest.warns(l2ctl.L2BudgetWarning) as caught:  # more than the set-aside, with the limit left alone
        with l2ctl.persist(s, big, 1.0, set_aside=None):
            pass
    assert [w.filename for w in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error", l2ctl.L2BudgetWarning)
        p = l2ctl.persist(s, big, 1.0, set_aside=None)
        with pytest.raises(l2ctl.L2BudgetWarning):
            p.__enter__()
    assert not p.active and not _registry.live_scopes(0) and fake.state() == before


def test_a_failed_end_raises_or_notes_the_blocks_error(fake, monkeypatch):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)

    def refused(*args: object) -> Any:
        raise l2ctl.CudaError("cudaStreamSetAttribute", 1, "cudaErrorInvalidValue", "invalid argument", "")

    p = l2ctl.persist(s, lut, 0.5, set_aside=None)
    p.__enter__()
    monkeypatch.setattr(fake, "apply_batch", refused)
    with pytest.raises(l2ctl.CudaError, match="cudaStreamSetAttribute"):
        p.__exit__(None, None, None)
    assert not p.active and not _registry.live_scopes(0)
    p.__exit__(None, None, None)  # ended once: a second exit does nothing
    monkeypatch.undo()
    with pytest.raises(KeyError) as raised:
        with l2ctl.persist(s, lut, 0.5, set_aside=None):
            monkeypatch.setattr(fake, "apply_batch", refused)
            raise KeyError("the block's own error")
    assert "restoring device state after the error also failed" in " ".join(getattr(raised.value, "__notes__", []))
    monkeypatch.undo()
    assert l2ctl.budget().scopes == () and fake.state()[1] == ()  # the next call put the device back


def test_it_holds_the_registrys_lock(fake):
    """Another thread holding the lock keeps an entry out until it lets go."""
    import threading

    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    entered = threading.Event()
    scope = l2ctl.persist(s, lut, 0.5, set_aside=None, reset_on_exit=False)
    with _registry.lock:
        worker = threading.Thread(target=lambda: (scope.__enter__(), entered.set()))
        worker.start()
        assert not entered.wait(0.2)  # blocked on the lock
        assert fake.state()[1] == ()
    worker.join(5)
    assert entered.is_set() and scope.active
    scope.__exit__(None, None, None)
    assert fake.state()[1] == ()


def test_a_persist_object_is_collected_with_its_cycles(fake):
    import weakref

    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    p = l2ctl.persist(s, lut, 0.5)
    with p:
        pass
    lut.scope = p  # type: ignore[attr-defined]  # a cycle through the buffer the scope holds
    gone = weakref.ref(p)
    del p, lut
    gc.collect()
    assert gone() is None
