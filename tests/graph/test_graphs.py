"""l2ctl's own graphs on the simulator: windows copied at capture, a scope on a graph's kernel nodes that
re-instantiates the executable before its next launch, capture rules."""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import AccessPolicyWindow

MiB = 1 << 20


def test_graph_scopes_on_the_fake(fake):
    from l2ctl import graph

    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    l2ctl.set_window(s, AccessPolicyWindow.for_buffer(lut, 0.5))
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
        fake.launch_fake_kernel(s.handle)
    l2ctl.clear_window(s)
    assert [k.window.hit_ratio for k in graph.inspect(g)] == [0.5, 0.5]  # copied at capture
    g.launch(s)
    with l2ctl.persist(g, lut, 1.0) as p:
        g.launch(s)
        assert fake.launched[-1][1][0] == p.window.as_tuple()  # the instance was refreshed
        assert g.reinstantiations == 1
    with l2ctl.persist(g, lut, 0.25) as p:
        g.launch(s)
        assert fake.launched[-1][1][0] == p.window.as_tuple() and g.reinstantiations == 2
    assert [k.window.hit_ratio for k in g.kernel_nodes()] == [0.5, 0.5]
    with pytest.raises(ValueError, match="default stream"):
        with graph.capture(None):
            pass


def test_the_default_window_on_a_graph_is_its_first_bytes_that_fit(fake):
    """hit_ratio=None on a graph's kernel nodes, as on a stream: a window larger than the set-aside "auto" grants
    becomes its first granted bytes (256-byte units) at hit ratio 1.0, and that is what a replay launches with; an
    explicit hit ratio keeps the window as given; a range named by offset/num_bytes is cut from its offset."""
    import warnings

    from l2ctl import graph

    s, workspace = l2ctl.Stream(), l2ctl.DeviceBuffer(15 * MiB)  # Albatross's shape: larger than the 9.375 MiB cap
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
        fake.launch_fake_kernel(s.handle)
    g.launch(s)
    cap = l2ctl.auto_set_aside_cap()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(g, workspace) as p:
            g.launch(s)
            assert p.set_aside == cap
            assert (p.window.base_ptr, p.window.num_bytes, p.window.hit_ratio) == (workspace.ptr, cap // 256 * 256, 1.0)
            assert all(k.window == p.window for k in g.kernel_nodes())
            assert fake.launched[-1][1][0] == p.window.as_tuple()
        with l2ctl.persist(g, workspace, offset=MiB, num_bytes=12 * MiB) as p:
            assert (p.window.base_ptr, p.window.num_bytes, p.window.hit_ratio) == (workspace.ptr + MiB,
                                                                                   cap // 256 * 256, 1.0)
    with l2ctl.persist(g, workspace, cap / workspace.nbytes) as p:  # asked for: the whole window at that ratio
        assert (p.window.num_bytes, p.window.hit_ratio) == (workspace.nbytes, pytest.approx(cap / workspace.nbytes))
    with l2ctl.persist(g, workspace, num_bytes=4 * MiB) as p:  # fits: as given, at 1.0
        assert (p.window.num_bytes, p.window.hit_ratio) == (4 * MiB, 1.0)
    assert all(k.window.empty for k in g.kernel_nodes())


def test_a_whole_graph_scope_writes_its_nodes_after_another_view_of_the_graph_is_destroyed(fake):
    # Destroying a view of the graph (the same handle, borrowed) tells the registry its nodes died: their slots
    # move to a new generation. A whole-graph scope reused the slots it had remembered, of the old generation,
    # which the planner never writes: the window silently did not reach the nodes (a predicate's scope did).
    from l2ctl import graph

    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
    with l2ctl.persist(g, lut, 0.5):
        assert [k.window.hit_ratio for k in g.kernel_nodes()] == [0.5]
    view = graph.as_graph(g.handle)
    view.kernel_nodes()
    view.destroy()
    with l2ctl.persist(g, lut, 0.5):
        assert [k.window.hit_ratio for k in g.kernel_nodes()] == [0.5]
    assert [k.window.hit_ratio for k in g.kernel_nodes()] == [0.0]


def test_a_capture_object_captures_once(fake):
    # The compiled Capture kept only "capturing or not": entered again, it captured into the same Graph object,
    # whose first CUDA graph was dropped under its cached kernel nodes (reading them: cudaErrorInvalidValue). The
    # generator it replaced refused a second entry.
    from l2ctl import graph

    s = l2ctl.Stream()
    capture = graph.capture(s)
    with capture as g:
        fake.launch_fake_kernel(s.handle)
    nodes = [k.node for k in g.kernel_nodes()]
    with pytest.raises(RuntimeError, match="this capture has ended"):
        with capture:
            pytest.fail("the block must not run")
    assert not fake.is_capturing(s.handle)
    assert [k.node for k in g.kernel_nodes()] == nodes and len(nodes) == 1
