"""On the GPU: windows on graph kernel nodes, what CUDA does at capture, replays, and the registry."""

from __future__ import annotations

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, graph, kernels

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def setup(gpu_state):
    with l2ctl.Stream() as s:
        gpu_state.watch(s)
        lut = l2ctl.DeviceBuffer.from_numpy(np.arange(7, 7 + (1 << 18), dtype=np.int32))
        out = l2ctl.DeviceBuffer(16 * MiB)
        yield s, lut, out
        s.synchronize()
        lut.free()
        out.free()


def test_capture_copies_the_stream_window_into_nodes(setup):
    s, lut, out = setup
    w = AccessPolicyWindow.for_buffer(lut, 0.75)
    l2ctl.set_window(s, w)
    with graph.capture(s) as g:
        kernels.reset_data(out, lut, s)
        kernels.reset_data(out, lut, s, variant="hinted")
    l2ctl.clear_window(s)
    with g:
        nodes = graph.inspect(g)
        assert len(nodes) == 2 and all(k.window == w for k in nodes)
        assert all("reset_data" in k.function for k in nodes)
        # changing the stream after capture does not change the nodes
        assert all(k.window == w for k in g.kernel_nodes())


def test_persist_on_graph_sets_nodes_updates_instance_and_restores(setup):
    s, lut, out = setup
    before = l2ctl.get_set_aside()
    with graph.capture(s) as g:
        kernels.reset_data(out, lut, s)
    with g:
        g.launch(s)  # instantiated without a window
        out.fill_bytes(0xFF, s)
        with l2ctl.persist(g, lut, 1.0) as p:
            assert all(k.window == p.window for k in g.kernel_nodes())
            assert l2ctl.get_set_aside() == p.set_aside >= lut.nbytes
            g.launch(s)
            assert g.reinstantiations == 1  # the instance picked up the node change
            assert kernels.verify_reset_data(out, lut, s) == 0
        assert all(k.window.empty for k in g.kernel_nodes())
        assert l2ctl.get_set_aside() == before
        assert l2ctl.get_window(s).empty


def test_predicate_selects_nodes(setup):
    s, lut, out = setup
    with graph.capture(s) as g:
        kernels.reset_data(out, lut, s)
        kernels.write_index(out, s)
    with g:
        with l2ctl.persist(g.select(lambda k: "reset_data" in k.function), lut, 0.5):
            windows = {k.function: k.window for k in g.kernel_nodes()}
            assert sum(not w.empty for w in windows.values()) == 1
        assert all(k.window.empty for k in g.kernel_nodes())


def test_capture_error_ends_capture(setup):
    s, lut, out = setup
    with pytest.raises(ZeroDivisionError):
        with graph.capture(s):
            kernels.reset_data(out, lut, s)
            1 / 0
    from l2ctl import _core

    assert not _core.is_capturing(s.handle)


def test_torch_cuda_graph(gpu_state):
    torch = pytest.importorskip("torch")
    lut = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    out = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(s):
        kernels.reset_data(out, lut, s)  # warm-up outside capture
        with torch.cuda.graph(g, stream=s):
            kernels.reset_data(out, lut, s)
    view = graph.as_graph(g)
    assert len(view.kernel_nodes()) == 1
    with l2ctl.persist(view, lut, 1.0):
        assert not view.kernel_nodes()[0].window.empty
    assert view.kernel_nodes()[0].window.empty
    out.zero_()
    g.instantiate() if hasattr(g, "instantiate") else None
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, lut.repeat(256))


def test_shared_scopes_scale_hit_ratios(gpu_state):
    g = l2ctl.set_aside_granularity()
    with l2ctl.set_aside(g) as granted, l2ctl.Stream() as s1, l2ctl.Stream() as s2, \
            l2ctl.DeviceBuffer(granted) as a, l2ctl.DeviceBuffer(granted) as b:
        gpu_state.watch(s1)
        gpu_state.watch(s2)
        with l2ctl.persist(s1, a, 1.0, set_aside=None, share=True):
            assert l2ctl.get_window(s1).hit_ratio == pytest.approx(1.0)
            with l2ctl.persist(s2, b, 1.0, set_aside=None, share=True):
                assert l2ctl.get_window(s1).hit_ratio == pytest.approx(0.5)
                assert l2ctl.get_window(s2).hit_ratio == pytest.approx(0.5)
                assert not l2ctl.budget().oversubscribed
            assert l2ctl.get_window(s1).hit_ratio == pytest.approx(1.0)
        with pytest.warns(l2ctl.L2BudgetWarning):
            with l2ctl.persist(s1, a, 1.0, set_aside=None), l2ctl.persist(s2, b, 1.0, set_aside=None):
                assert l2ctl.budget().oversubscribed


def test_cupy_graph_captured_inside_a_stream_scope(gpu_state):
    cupy = pytest.importorskip("cupy", reason="needs CuPy")
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    gpu_state.watch(s)
    with l2ctl.persist(s, a, 1.0) as p:  # the recipe: the capture copies the stream's window into its nodes
        with s:
            s.begin_capture()
            a += 1
            g = s.end_capture()
        nodes = graph.inspect(int(g.graph))  # CuPy >= 14 keeps the template: its nodes show what was copied
        assert nodes and all(k.window == p.window for k in nodes)
        with pytest.raises(ValueError, match="begin_capture"):
            l2ctl.persist(g, a)  # its executable cannot take a window any more: refused
        g.launch(s)
        s.synchronize()
    assert float(a[5]) == 6.0  # arange: 5, plus the one launch
