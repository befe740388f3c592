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
