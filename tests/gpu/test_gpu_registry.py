"""On the GPU: the registry's guarantees read back through CUDA's own getters, and the hostile-input table
against the real backend (every refusal leaves the limit and the windows as they were)."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import l2ctl
from l2ctl import _backend, graph, kernels

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def _state(s: l2ctl.Stream, g: graph.Graph) -> tuple:
    return (l2ctl.get_set_aside(), l2ctl.get_window(s), tuple(k.window for k in g.kernel_nodes()))


def test_warning_as_error_in_entry_changes_nothing(stream):
    info = l2ctl.device_info()
    with l2ctl.DeviceBuffer(info.persisting_l2_cache_max_size * 2) as big:
        before = (l2ctl.get_set_aside(), l2ctl.get_window(stream))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(l2ctl.L2BudgetWarning):
                l2ctl.persist(stream, big, 1.0, set_aside=0).__enter__()
        assert (l2ctl.get_set_aside(), l2ctl.get_window(stream)) == before
        assert l2ctl.budget().scopes == ()


def test_set_aside_and_persist_in_threads_any_order(gpu_state):
    before = l2ctl.get_set_aside()
    entered, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def limit_thread() -> None:
        try:
            with l2ctl.set_aside("max"):
                entered.set()
                done.wait(10)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=limit_thread)
    t.start()
    entered.wait(10)
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(2 * MiB) as lut:
        scope = l2ctl.persist(s, lut, 1.0)
        scope.__enter__()
        done.set()
        t.join(10)  # the set_aside block ends first
        assert l2ctl.get_window(s) == scope.window
        scope.__exit__(None, None, None)
    assert not errors and l2ctl.get_set_aside() == before


def test_out_of_order_exits_on_one_stream(stream):
    with l2ctl.DeviceBuffer(MiB) as a, l2ctl.DeviceBuffer(2 * MiB) as b:
        first, second = l2ctl.persist(stream, a, 1.0), l2ctl.persist(stream, b, 0.5)
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert l2ctl.get_window(stream) == second.window
        second.__exit__(None, None, None)
        assert l2ctl.get_window(stream).empty


def test_closing_the_stream_or_destroying_the_graph_inside_the_scope(gpu_state):
    before = l2ctl.get_set_aside()
    g_size = l2ctl.set_aside_granularity()
    with l2ctl.DeviceBuffer(MiB) as lut, l2ctl.DeviceBuffer(MiB) as out:
        s = l2ctl.Stream()
        with l2ctl.persist(s, lut, 1.0, set_aside=2 * g_size):
            s.close()
        assert l2ctl.get_set_aside() == before
        with l2ctl.Stream() as s2:
            with graph.capture(s2) as g:
                kernels.write_index(out, s2)
            with l2ctl.persist(g, lut, 1.0, set_aside=2 * g_size):
                g.destroy()
            assert l2ctl.get_set_aside() == before and l2ctl.get_window(s2).empty


def test_torch_tensors_inside_an_allocation_pass_and_ranges_past_it_do_not(stream):
    torch = pytest.importorskip("torch")
    block = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    middle = block[MiB: 2 * MiB]  # a view inside the caching allocator's block
    with l2ctl.persist(stream, middle, 1.0) as p:
        assert l2ctl.get_window(stream).base_ptr == middle.data_ptr() == p.window.base_ptr
    with l2ctl.DeviceBuffer(MiB) as own:
        with pytest.raises(ValueError, match="runs past its allocation"):
            l2ctl.persist(stream, (own.ptr, 8 * MiB), 1.0).__enter__()
        with pytest.raises(ValueError, match="not aligned"):
            kernels.reset_data((own.ptr + 2, 1024), own, stream)
    assert l2ctl.get_window(stream).empty


def test_hostile_table_on_the_real_backend(gpu_state, hostile):
    """The simulator's hostile-input table, against CUDA: each case refused, nothing changed."""
    assert _backend.current() is l2ctl._core
    objects = hostile.Objects()
    gpu_state.watch(objects.s)
    try:
        table = hostile.cases(objects)
        for name, call, error in table:
            before = _state(objects.s, objects.g)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", l2ctl.WindowClippedWarning)
                with pytest.raises(error):
                    call()
            assert _state(objects.s, objects.g) == before, name
        assert len(table) >= 120
    finally:
        objects.g.destroy()
        objects.buf.free()
        objects.partials.free()
        objects.s.close()
    assert np.isfinite(l2ctl.get_set_aside())
