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


def _stub_names() -> tuple[set[str], set[str]]:
    tree = ast.parse(STUB.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    state = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeviceState")
    fields = {n.name for n in state.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"}
    fields |= {n.target.id for n in state.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return functions, fields


def test_the_stub_names_what_the_module_has():
    functions, fields = _stub_names()
    assert functions == {name for name in dir(_fastpath) if not name.startswith("_") and name != "DeviceState"}
    state = _fastpath.DeviceState(3, 1000)
    assert fields == {name for name in dir(state) if not name.startswith("_")}
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
