"""The registry's lone-scope path in C (l2ctl._fastpath): what it takes on, what it declines, and that it
ends in the state the general plan would (conftest checks every fast path against the plan)."""

from __future__ import annotations

import ast
import pathlib
import threading
import warnings
from typing import Any

import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, _fastpath, _registry, graph
from l2ctl.testing import FakeBackend

from test_fast_path import NAMES, Crossings

MiB = 1 << 20
STUB = pathlib.Path(l2ctl.__file__).with_name("_fastpath.pyi")


def _stub_names(class_name: str) -> tuple[set[str], set[str]]:
    tree = ast.parse(STUB.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fields = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"}
    fields |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return functions, fields


def test_the_stub_names_what_the_module_has():
    functions, fields = _stub_names("DeviceState")
    classes = {"DeviceState", "PersistCore"}
    assert functions == {name for name in dir(_fastpath) if not name.startswith("_") and name not in classes}
    state = _fastpath.DeviceState(3, 1000)
    assert fields == {name for name in dir(state) if not name.startswith("_")}
    _, persist_fields = _stub_names("PersistCore")
    own = set(vars(_fastpath.PersistCore)) - set(vars(object))
    assert persist_fields == own - {"__doc__", "__new__", "__module__"}
    assert (state.device, state.maximum, state.scopes, state.base_windows, state.applied_windows) == (3, 1000, {}, {}, {})
    assert (state.base_limit, state.applied_limit, state.auto_bounds, state.dirty, state.limited) == (None, None, None, False, 0)
    with pytest.raises(TypeError):
        state.dirty = 1  # type: ignore[assignment]  # a bool, as the C code reads it
    with pytest.raises(AttributeError):
        state.scopes = {}  # type: ignore[misc]


def _graph(fake: FakeBackend, s: l2ctl.Stream, kernels: int) -> Any:
    with graph.capture(s) as g:
        for _ in range(kernels):
            fake.launch_fake_kernel(s.handle)
    return g


def test_a_lone_graph_scope_is_one_crossing_per_side_over_all_its_nodes(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    g = _graph(fake, s, 8)
    before = fake.state()
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False):
        pass  # the first scope learns the device
    counter = Crossings(fake, NAMES)
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False) as p:
        assert counter.count == {"apply_window": 1}
        assert [k.window for k in g.kernel_nodes()] == [p.window] * 8
    assert counter.count == {"apply_window": 2}
    assert fake.state() == before


def test_nodes_with_different_bases_go_back_through_the_general_plan(fake):
    s, lut, other = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(MiB)
    g = _graph(fake, s, 2)
    first = g.kernel_nodes()[0]
    graph_base = AccessPolicyWindow.for_buffer(other, 0.25)
    fake.set_node_window(first.node, *graph_base)
    before = fake.state()
    with l2ctl.persist(g, lut, 0.5, set_aside=None, reset_on_exit=False) as p:
        assert [k.window for k in g.kernel_nodes()] == [p.window] * 2
    assert fake.state() == before  # each node back to its own base


def test_it_declines_what_is_not_a_lone_scope_and_changes_nothing(fake):
    s, t, lut = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, lut, 0.5) as outer:
        state = _registry._registry.last[1][0]
        scope = _registry.Scope(0, (_registry.stream_slot(t.handle),), AccessPolicyWindow.for_buffer(lut, 0.5))
        held = fake.state(), dict(state.scopes), dict(state.applied_windows)
        assert _fastpath.enter_lone(fake, state, scope, {}) is None  # a second scope on the device
        assert (fake.state(), dict(state.scopes), dict(state.applied_windows)) == held
        assert outer._scope is not None
        assert _fastpath.exit_lone(fake, state, scope) is True  # not registered: nothing to do
        with l2ctl.persist(t, lut, 0.25):
            assert _fastpath.exit_lone(fake, state, outer._scope) is False  # not the last scope
            assert len(state.scopes) == 2
    assert fake.state()[1] == () and not state.scopes


def test_a_failing_hook_leaves_the_batchs_own_error(fake, monkeypatch):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, lut, 0.5, set_aside=None, reset_on_exit=False):
        pass

    def broken_hook(*args: object) -> BaseException:
        raise RuntimeError("the hook broke")

    def refused(*args: object) -> Any:
        raise l2ctl.CudaError("cudaStreamSetAttribute", 1, "cudaErrorInvalidValue", "invalid argument", "")

    monkeypatch.setattr(fake, "apply_window", refused)
    _fastpath.configure(_registry.lock, _registry._registry.ids, broken_hook)
    try:
        with pytest.raises(l2ctl.CudaError, match="cudaStreamSetAttribute"):
            with l2ctl.persist(s, lut, 0.5, set_aside=None, reset_on_exit=False):
                pass
    finally:
        _fastpath.configure(_registry.lock, _registry._registry.ids, _registry._lone_failed)
    monkeypatch.undo()
    assert not _registry.live_scopes(0)
    with l2ctl.persist(s, lut, 0.5):  # the device goes back to the plan (it was marked dirty or never changed)
        pass
    assert fake.state()[1] == ()


def test_it_holds_the_registrys_lock(fake, monkeypatch):
    """Another thread holding the lock keeps the lone path out until it lets go."""
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, lut, 0.5, set_aside=None, reset_on_exit=False):
        pass
    entered = threading.Event()
    with _registry.lock:
        worker = threading.Thread(target=lambda: (l2ctl.persist(s, lut, 0.5, set_aside=None,
                                                                reset_on_exit=False).__enter__(), entered.set()))
        worker.start()
        assert not entered.wait(0.2)  # blocked on the lock
        assert fake.state()[1] == ()
    worker.join(5)
    assert entered.is_set() and len(_registry.live_scopes(0)) == 1
    scope = _registry.live_scopes(0)[0]
    _registry.exit(scope)
    assert fake.state()[1] == ()


def test_an_auto_scope_takes_the_c_path_once_the_granularity_is_known(fake):
    s, lut, small = l2ctl.Stream(), l2ctl.DeviceBuffer(16 * MiB), l2ctl.DeviceBuffer(MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(s, lut, 1.0):  # probes the granularity through the general path
            pass
    counter = Crossings(fake, NAMES)
    with pytest.warns(l2ctl.SetAsideTaxWarning):
        with l2ctl.persist(s, lut, 1.0) as p:
            # 16 MiB asks past the tax-free limit: "auto" stops there, in the one crossing, and says so
            assert p.set_aside == fake.device(0).initial_limit
    assert counter.count == {"apply_window": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with l2ctl.persist(s, small, 1.0) as p:  # within the tax-free limit: nothing to say
            assert p.set_aside == fake.device(0).initial_limit
    assert counter.count == {"apply_window": 4}


# ---- Persist's own entry and exit in C (PersistCore) ---------------------------------------------------


class GeneralCalls:
    """Counts the calls of Persist's general path (its Python entry and exit)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = {"_enter_general": 0, "_exit_general": 0}
        for name in self.count:
            original = getattr(l2ctl.Persist, name)

            def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
                self.count[_name] += 1
                return _original(*args)

            monkeypatch.setattr(l2ctl.Persist, name, counted)


def test_a_lone_stream_scope_enters_and_ends_without_the_general_path(fake, monkeypatch):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    before = fake.state()
    with l2ctl.persist(s, lut, 0.5):
        pass  # the first scope learns the device (its properties, its registry record, the limit's granularity)
    general, counter = GeneralCalls(monkeypatch), Crossings(fake, NAMES)
    for settings in (dict(set_aside=None, reset_on_exit=False), {}):
        with l2ctl.persist(s, lut, 0.5, **settings) as p:
            assert p.active and p.device == 0 and p.stream == s.handle and not p.clipped
            assert p.window == AccessPolicyWindow.for_buffer(lut, 0.5) and type(p.window) is AccessPolicyWindow
            assert type(fake).get_stream_window(fake, s.handle) == tuple(p.window)  # not a counted crossing
            assert [sc.window for sc in _registry.live_scopes(0)] == [p.window]
        assert not p.active and not _registry.live_scopes(0)
    assert general.count == {"_enter_general": 0, "_exit_general": 0}
    assert counter.count == {"apply_window": 4}
    assert fake.state() == before


MAX_WINDOW = 128 * MiB  # FakeDevice.h100's accessPolicyMaxWindowSize


@pytest.mark.parametrize("case", ["share", "fit hit ratio", "exact limit", "max limit", "offset", "num_bytes",
                                  "clipped", "nested", "graph", "disabled policy"])
def test_every_other_scope_takes_the_general_path_and_ends_as_before(fake, monkeypatch, case):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, lut, 0.5):
        pass
    buf = l2ctl.DeviceBuffer(MAX_WINDOW + MiB) if case == "clipped" else lut
    target: Any = _graph(fake, s, 2) if case == "graph" else s
    before = fake.state()
    kwargs: dict[str, Any] = {
        "share": dict(share=True), "fit hit ratio": {}, "exact limit": dict(set_aside=3_276_800),
        "max limit": dict(set_aside="max"), "offset": dict(offset=4096), "num_bytes": dict(num_bytes=4096),
        "clipped": {}, "nested": {}, "graph": {}, "disabled policy": dict(policy=l2ctl.Policy(enabled=False)),
    }[case]
    ratio = None if case in ("fit hit ratio", "disabled policy") else 0.5
    general = GeneralCalls(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # clipped windows and the set-aside's tax say so; not the point here
        outer = l2ctl.persist(l2ctl.Stream(), lut, 0.25) if case == "nested" else None
        if outer is not None:
            outer.__enter__()
        with l2ctl.persist(target, buf, ratio, **kwargs) as p:
            if case != "disabled policy":
                assert p.active and [sc.effective is not None for sc in _registry.live_scopes(0)][-1]
        if outer is not None:
            outer.__exit__(None, None, None)
    assert general.count["_enter_general"] == 1
    # A lone scope ends in C however it entered, unless it is shared (the others' share changes) or on a graph.
    assert general.count["_exit_general"] == (1 if case in ("share", "nested", "graph") else 0)
    assert fake.state() == before and not _registry.live_scopes(0)


def test_its_warnings_name_the_users_line_and_a_raising_filter_ends_the_scope(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    big = l2ctl.DeviceBuffer(fake.device(0).initial_limit + 8 * MiB)
    with l2ctl.persist(s, lut, 0.5, set_aside=None):
        pass
    before = fake.state()
    # More than the set-aside asked of it with the limit left alone: the budget warning, from the C path.
    with pytest.warns(l2ctl.L2BudgetWarning) as caught:
        with l2ctl.persist(s, big, 1.0, set_aside=None):
            pass
    assert [w.filename for w in caught] == [__file__]
    with pytest.warns(l2ctl.L2BudgetWarning) as caught:  # the general path (a byte range) says it as well
        with l2ctl.persist(s, big, 1.0, set_aside=None, share=False, offset=0, num_bytes=big.nbytes):
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
    with l2ctl.persist(s, lut, 0.5, set_aside=None):
        pass
    general = GeneralCalls(monkeypatch)

    def refused(*args: object) -> Any:
        raise l2ctl.CudaError("cudaStreamSetAttribute", 1, "cudaErrorInvalidValue", "invalid argument", "")

    p = l2ctl.persist(s, lut, 0.5, set_aside=None)
    p.__enter__()
    monkeypatch.setattr(fake, "apply_window", refused)
    with pytest.raises(l2ctl.CudaError, match="cudaStreamSetAttribute"):
        p.__exit__(None, None, None)
    assert not p.active and not _registry.live_scopes(0)
    p.__exit__(None, None, None)  # ended once: a second exit does nothing
    monkeypatch.setattr(fake, "apply_window", type(fake).apply_window.__get__(fake))
    with pytest.raises(KeyError) as raised:
        with l2ctl.persist(s, lut, 0.5, set_aside=None):
            monkeypatch.setattr(fake, "apply_window", refused)
            raise KeyError("the block's own error")
    assert "restoring device state after the error also failed" in " ".join(getattr(raised.value, "__notes__", []))
    # Both ends were C's; after the failed one the device went through the general plan once (marked dirty).
    assert general.count == {"_enter_general": 1, "_exit_general": 0}


def test_a_persist_object_is_collected_with_its_cycles(fake):
    import gc
    import weakref

    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    p = l2ctl.persist(s, lut, 0.5)
    with p:
        pass
    p.window = [p]  # a cycle through a field the C type holds: the collector must see it (tp_traverse)
    gone = weakref.ref(p)
    del p
    gc.collect()
    assert gone() is None


def test_fields_reassigned_while_it_enters_do_not_pull_the_ground_away(fake):
    """A foreign buffer's check runs Python code in the middle of the C entry; the fields it read stay alive
    (held) even if that code rebinds them, as another thread could."""
    from l2ctl import _backend, _device
    from l2ctl._device import check_owned_pointer

    s, block = l2ctl.Stream(), l2ctl.DeviceBuffer(8 * MiB)

    class Array:  # a foreign object: its stream and buffer references live only in the scope's fields
        def __init__(self, ptr: int, nbytes: int) -> None:
            self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    with l2ctl.persist(s, block, 0.5, set_aside=None):
        pass
    p = l2ctl.persist(s.handle, Array(block.ptr, 2 * MiB), 0.5, set_aside=None)

    def meddling_check(*args: Any) -> None:
        check_owned_pointer(*args)
        p._ref, p._buffer, p._requested_hit_ratio = None, None, None  # the only references to them

    _fastpath.configure_persist(_backend, _registry, _device._last, _registry.Scope, AccessPolicyWindow, meddling_check)
    try:
        with p:
            assert p.window == AccessPolicyWindow.for_buffer(block, 0.5)._replace(num_bytes=2 * MiB)
    finally:
        _fastpath.configure_persist(_backend, _registry, _device._last, _registry.Scope, AccessPolicyWindow,
                                    check_owned_pointer)
    assert not _registry.live_scopes(0) and fake.state()[1] == ()
