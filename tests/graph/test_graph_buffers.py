"""What a graph's kernels are given (graph.buffers, graph.inspect) and tune(step, graph, "discover") on the
simulator: a compiled scatter-add that scatters into a temporary of its own, where a window on the user's
accumulator gains nothing and the discovered temporary pays; a gather where nothing pays."""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import graph
from l2ctl.workloads.modeled import ModeledWorkload
from stand_ins import scatter_add_into_temporary


def _captured(fake, w, s):
    with graph.capture(s) as g:
        w.enqueue(s)
    return g


def _replay(g, w):
    def step(stream):
        g.launch(stream)
        w._launched = len(w.kernels)  # the graph ran the workload's kernels

    return step


def test_buffers_map_every_pointer_argument_to_its_memory(fake):
    with l2ctl.Stream() as s, scatter_add_into_temporary() as w:
        g = _captured(fake, w, s)
        acc, tmp = w.buffers["acc"], w.buffers["tmp"]
        found = {b.ptr: b for b in graph.buffers(g, {"acc": acc})}
        assert set(found) == {b.ptr for b in w.buffers.values()}
        assert found[acc.ptr].owner == "yours" and found[acc.ptr].name == "acc"
        assert found[acc.ptr].kernels == ("triton_poi_fused_copy_2",)
        t = found[tmp.ptr]
        assert t.owner == "an allocation" and t.nbytes == tmp.nbytes
        assert t.kernels == ("triton_poi_fused_zero_0", "triton_poi_fused_index_add_1", "triton_poi_fused_copy_2")
        assert t.name.startswith("memory of triton_poi_fused_zero_0") and "(+1)" in t.name
        assert [b.nbytes for b in graph.buffers(g)] == sorted((b.nbytes for b in graph.buffers(g)), reverse=True)
        nodes = graph.inspect(g, {"acc": acc})
        assert [k.function for k in nodes] == [k.name for k in w.kernels]
        assert [b.ptr for b in nodes[2].buffers] == [tmp.ptr, acc.ptr]  # the copy: from the temporary into acc


def test_a_pointer_inside_an_allocation_maps_to_the_whole_allocation(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 << 20) as buf:
        with graph.capture(s) as g:
            fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(buf.ptr + 4096, 12345))
        (found,) = graph.buffers(g)  # 12345 points nowhere: dropped
        assert (found.ptr, found.nbytes) == (buf.ptr, buf.nbytes)


def test_discover_finds_the_temporary_that_the_users_buffer_misses(fake):
    with l2ctl.Stream() as s, scatter_add_into_temporary() as w:
        g = _captured(fake, w, s)
        step = _replay(g, w)
        before = fake.state()
        yours = l2ctl.tune(step, g, {"acc": w.buffers["acc"]}, stream=s, rounds=3, repeat=2, warmup=0)
        assert not yours.persists or yours.speedup <= 1.05, str(yours)
        found = l2ctl.tune(step, g, "discover", stream=s, rounds=3, repeat=2, warmup=0)
        assert fake.state() == before
        assert found.persists and found.speedup > 1.1 and found.speedup > yours.speedup + 0.05, str(found)
        assert found.buffer_name.startswith("memory of triton_poi_fused_zero_0")
        text = str(found.report())
        assert "the chosen range:" in text and "triton_poi_fused_index_add_1" in text and "an allocation" in text
        assert found.considered is not None and found.considered.total == 4
        with found.persist(g):  # the policy goes on the graph's nodes: the temporary's range
            g.launch(s)
            assert fake.launched[-1][1][1][0] == w.buffers["tmp"].ptr


def test_discover_where_nothing_pays(fake):
    with l2ctl.Stream() as s, ModeledWorkload.gather() as w:
        g = _captured(fake, w, s)
        tuned = l2ctl.tune(_replay(g, w), g, "discover", stream=s, rounds=3, repeat=2, warmup=0)
        assert not tuned.persists and tuned.considered is not None and tuned.considered.tried


def test_discover_needs_a_graph_it_can_read(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(1 << 16) as buf:
        with graph.capture(s) as g:
            fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(buf.ptr,))
        calls = len(fake.calls)
        with pytest.raises(ValueError, match="not a selection of a graph's nodes"):
            l2ctl.tune(lambda st: g.launch(st), g.select(lambda node: True), "discover", stream=s)
        assert len(fake.calls) == calls  # refused before anything ran
        with pytest.raises(ValueError, match="queued no GPU work"):  # a stream: the eager step's launches, here none
            l2ctl.tune(lambda st: None, s, "discover")


def test_discover_where_no_range_can_be_tried_says_no_persistence(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(1 << 16) as buf:
        with graph.capture(s) as g:
            fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(buf.ptr,))  # 64 KiB: too small
        before = fake.state()
        tuned = l2ctl.tune(lambda st: g.launch(st), g, "discover", stream=s)
        assert not tuned.persists and tuned.buffer_name is None and tuned.speedup == 1.0
        assert tuned.reason == "no range the graph's kernels are given can be tried: 1 range, 0 tried " \
            f"({tuned.considered.rule.describe()}); not tried: 1 too small"
        assert f"no persistence: {tuned.reason}; 0 points" in str(tuned) and "simulated" in str(tuned)
        text = str(tuned.report())
        assert tuned.reason in text and "candidates: 1 range, 0 tried" in text
        assert tuned.report().summary["reason"] == tuned.reason and tuned.report().records == []
        with tuned.persist(g):  # changes nothing
            g.launch(s)
        assert fake.state() == before


def test_two_unnamed_ranges_given_to_the_same_kernels_keep_their_own_names(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 << 20) as a, l2ctl.DeviceBuffer(16 << 20) as b:
        with graph.capture(s) as g:
            fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(a.ptr, b.ptr))
        found = graph.buffers(g)
        assert len({x.name for x in found}) == 2 and all(x.name.startswith("memory of k @0x") for x in found)
        from l2ctl import candidates

        listed = candidates.from_graph(g)
        assert len(listed) == 2 and "2 ranges, 2 tried" in listed.summary()
