"""Templates kept for what torch records inside graph.torch_captures() (issue 35), on the simulator: a graph made
with torch's defaults, a graph-tree recording and a graphed callable's graph keep their template, replay as their
maker expects, and take windows as a keep_graph graph does; tune and "discover" on a reduce-overhead step as the
user wrote it (the simulator's stand-in for torch.compile: tests/stand_ins.py, FakeCompiledStep)."""

from __future__ import annotations

import gc

import pytest

import l2ctl
from l2ctl import _torch_graphs, graph
from l2ctl.testing.torch_graphs import FakeGraphTrees, FakeTorchGraph
from stand_ins import FakeCompiledStep, SteppedWorkload, scatter_add_into_temporary

MiB = 1 << 20
NONE = (0, 0, 0.0, 0, 0)


def _default_graph(scatter, fake, s, acc):
    g = FakeTorchGraph()  # torch.cuda.CUDAGraph() with torch's defaults: keep_graph=False
    g.capture_begin(s)
    scatter(acc)(s.handle)
    g.capture_end()
    return g


def test_a_default_flag_graph_made_inside_the_block_keeps_its_template_and_replays_as_before(fake, trees, scatter):
    own = dict(FakeTorchGraph.__dict__)
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with graph.torch_captures() as captures:
            g = _default_graph(scatter, fake, s, acc)
            assert g.instantiations == 1 and g.raw_cuda_graph_exec()  # made at capture end, as the default does
            explicit = FakeTorchGraph(keep_graph=True)  # asked for: instantiated at its first replay, as asked
            explicit.capture_begin(s)
            scatter(acc)(s.handle)
            explicit.capture_end()
            assert explicit.instantiations == 0
        assert dict(FakeTorchGraph.__dict__) == own  # torch's class put back
        assert captures.graphs() == [g, explicit] and _torch_graphs.kept(0) == [g, explicit]
        g.replay(s)
        assert g.instantiations == 1 and fake.launched[-1][1] == (NONE,)
        before = fake.state()
        with l2ctl.persist(g, acc, 1.0) as p:  # a graph target, as a keep_graph=True one
            g.replay(s)
            assert fake.launched[-1][1] == (p.window.as_tuple(),) and g.instantiations == 2
        g.replay(s)
        assert fake.launched[-1][1] == (NONE,) and fake.state() == before
        outside = _default_graph(scatter, fake, s, acc)  # made outside any scope: its template is gone
        calls = len(fake.calls)
        with pytest.raises(ValueError, match=r"inside `with l2ctl.graph.torch_captures\(\):`"):
            l2ctl.persist(outside, acc, 1.0)
        assert len(fake.calls) == calls and outside not in _torch_graphs.kept(0)
        g.reset()  # torch's reset(): the template is gone, and l2ctl no longer lists it
        assert captures.graphs() == [explicit]


def test_blocks_nest_and_the_class_is_put_back_after_the_last(fake, trees, scatter):
    own = dict(FakeTorchGraph.__dict__)
    outer, inner = graph.torch_captures(), graph.torch_captures()
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with outer:
            with inner:
                a = _default_graph(scatter, fake, s, acc)
            b = _default_graph(scatter, fake, s, acc)  # the outer block still keeps
        c = _default_graph(scatter, fake, s, acc)
        assert outer.graphs() == [a, b] and inner.graphs() == [a] and not _torch_graphs.is_kept(c)
        assert dict(FakeTorchGraph.__dict__) == own
        del a, b
        gc.collect()
        assert outer.graphs() == []  # weakly held: a graph torch drops is forgotten


def test_a_scope_reaches_graph_tree_recordings_made_in_an_earlier_block(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with graph.torch_captures():
            node = trees.record(scatter(acc))  # torch.compile recorded the step: no window
        node.graph.replay(s)
        assert fake.launched[-1][1] == (NONE,)
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max") as p:  # admitted: its template is kept
            node.graph.replay(s)
            assert fake.launched[-1][1] == (p.window.as_tuple(),)
        node.graph.replay(s)
        assert fake.launched[-1][1] == (NONE,) and fake.state() == before
        assert node.graph.instantiations == 3  # at capture end, at the scope's entry and at its end


def test_a_graph_recorded_inside_a_scope_replays_without_the_window_after_it(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
            node = trees.record(scatter(acc))  # captured on the recording stream: CUDA copied the window
            node.graph.replay(s)
            assert fake.launched[-1][1] == (p.window.as_tuple(),)
        node.graph.replay(s)
        assert fake.launched[-1][1] == (NONE,)  # the scope's end put its nodes back, as for any graph


def test_a_kept_graph_torch_drops_inside_a_scope_lives_until_the_scope_ends(fake, trees, scatter):
    """torch.compiler.reset() inside a scope (or the collection of a cycle that held an earlier recording): the
    trees drop a graph whose kernel nodes the scope's window is on. Freed then, its template would be destroyed
    and the scope's end would write to its freed nodes (on the GPU: a segfault); the scope holds it instead."""
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with graph.torch_captures():
            trees.record(scatter(acc))
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
            [kept] = _torch_graphs.kept(0)
            template = kept.raw_cuda_graph()
            assert all(k.window == p.window for k in graph.inspect(kept))
            del kept
            trees.reset()
            gc.collect()
            assert template in fake._graphs  # held by the scope
        assert fake.state()[:2] == before[:2]  # the limit and the streams put back (the graph's nodes are gone)
        assert template not in fake._graphs  # freed with the scope
        assert _torch_graphs.kept(0) == [] and not trees.recorded(0)
        step = trees.record(scatter(acc))  # recorded anew after the reset, outside any block
        step.graph.replay(s)
        assert fake.launched[-1][1] == (NONE,)


def test_a_graphed_callables_graph_captured_inside_the_block(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        with graph.torch_captures() as captures:
            capture_stream = trees.capture_streams(0)[1]  # make_graphed_callables captures on torch's default one
            g = _default_graph(scatter, fake, capture_stream, acc)
        with captures:
            tuned = l2ctl.tune(lambda st: g.replay(st), captures, {"acc": acc}, stream=s, rounds=3, repeat=2, warmup=0)
        assert tuned.persists and tuned.buffer_name == "acc" and tuned.speedup > 1.1, str(tuned)


def _compiled_step(trees, w):
    """The user's step as they wrote it: a function compiled with mode="reduce-overhead", called on ``stream``."""
    compiled = FakeCompiledStep(trees, w)

    def step(stream):
        with trees.stream(stream), w.on_stream(stream):
            compiled()
    return step, compiled


def test_tune_discovers_inductors_temporary_in_a_reduce_overhead_step(fake, trees):
    with l2ctl.Stream() as s, scatter_add_into_temporary() as w:
        step, compiled = _compiled_step(trees, w)
        before = fake.state()
        with graph.torch_captures() as captures:
            tuned = l2ctl.tune(step, captures, "discover", stream=s, rounds=3, repeat=2, warmup=0)
            assert compiled.calls > 3 and len(trees.recorded(0)) == 1  # warm-up, one recording, replays
            assert fake.state()[:2] == before[:2]
            assert tuned.persists and tuned.speedup > 1.1, str(tuned)
            assert tuned.buffer_name.startswith("memory of triton_poi_fused_zero_0")
            text = str(tuned.report())
            assert "in graph 1 of 1 (a recording of torch.compile's CUDA graph trees)" in text
            assert "triton_poi_fused_index_add_1" in text
            with tuned.persist(captures) as p:  # the user's loop, unchanged
                step(s)
                assert fake.launched[-1][1][1][0] == w.buffers["tmp"].ptr == p.window.base_ptr
            step(s)
            assert all(window == NONE for window in fake.launched[-1][1])
        yours = l2ctl.tune(step, graph.torch_captures(), {"acc": w.buffers["acc"]}, stream=s, rounds=3, repeat=2,
                           warmup=0)  # a fresh torch_captures(): tune keeps what it needs itself
        assert not yours.persists or yours.speedup < tuned.speedup - 0.05, str(yours)


def test_discover_on_a_step_recorded_before_any_block_is_refused_saying_how(fake, trees):
    with l2ctl.Stream() as s, scatter_add_into_temporary() as w:
        step, _ = _compiled_step(trees, w)
        for _ in range(3):
            step(s)  # the first calls happened outside any block: the recording's template is gone
        state = fake.state()
        with pytest.raises(ValueError, match=r"first call inside `with l2ctl.graph.torch_captures\(\):`"):
            l2ctl.tune(step, graph.torch_captures(), "discover", stream=s, rounds=3, repeat=2, warmup=0)
        assert fake.state() == state


def test_discover_on_a_step_torch_did_not_graph_finds_its_eager_kernels_and_says_why(fake, trees):
    with l2ctl.Stream() as s, SteppedWorkload.scatter_add(0) as w:
        compiled = FakeCompiledStep(trees, w, graphs=False)  # torch.compile skipped graphs: eager kernels

        def step(stream):
            with trees.stream(stream), w.on_stream(stream):
                compiled()

        captures = graph.torch_captures()
        tuned = l2ctl.tune(step, captures, "discover", stream=s)
        assert not trees.recorded(0) and not captures.graphs()
        assert tuned.persists and tuned.speedup > 1.1, str(tuned)  # the accumulator, found through CUPTI
        assert tuned.buffer[0] == w.buffers["acc"].ptr
        said = "torch ran compiled code without CUDA graphs (skipping cudagraphs due to mutated inputs (1 instances))"
        assert captures.skips() == ["skipping cudagraphs due to mutated inputs (1 instances)"]
        assert said in tuned.reason and said in str(tuned.report())
        with tuned.persist(captures):  # the scope's window reaches the step where torch runs it: the current stream
            step(s)
        assert tuned.persists


def test_no_torch_graph_can_keep_a_template_before_torch_2_9(fake):
    old = FakeGraphTrees(keeps_templates=False)
    previous = _torch_graphs.use_trees(old)
    try:
        with pytest.raises(ValueError, match=r"torch >= 2\.9"):
            with graph.torch_captures():
                pass
    finally:
        _torch_graphs.use_trees(previous)
        old.close()


def test_a_block_that_raises_puts_the_class_back_and_a_later_wrapper_stays(fake, trees):
    own = dict(FakeTorchGraph.__dict__)
    with pytest.raises(RuntimeError, match="the user's"):
        with graph.torch_captures():
            raise RuntimeError("the user's")
    assert dict(FakeTorchGraph.__dict__) == own
    with graph.torch_captures():
        ours = FakeTorchGraph.__init__
        seen = []

        def theirs(self, *args, **kwargs):  # another library wraps the class while l2ctl's wrapper is there
            seen.append(args)
            ours(self, *args, **kwargs)

        FakeTorchGraph.__init__ = theirs
    try:
        assert FakeTorchGraph.__dict__["__init__"] is theirs  # not torn out from under them
        assert FakeTorchGraph.__dict__["capture_end"] is own["capture_end"]
    finally:
        FakeTorchGraph.__init__ = own["__init__"]
