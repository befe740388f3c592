"""PyTorch's graph styles on the simulator: a torch.cuda.CUDAGraph whose executable was made before the
window (keep_graph=True: l2ctl has torch re-instantiate it; keep_graph=False: refused), the graphs torch
records on its own streams (graph.torch_captures()), CuPy graphs and compiled functions (refused, saying
what to do), and the timing the harm came from: a larger set-aside without the window is slower."""

from __future__ import annotations


import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, _torch_graphs, benchmark_gallery, graph
from l2ctl.testing.torch_graphs import FakeGraphTrees, FakeTorchGraph

MiB = 1 << 20


@pytest.fixture
def trees(fake):
    stand_in = FakeGraphTrees()
    previous = _torch_graphs.use_trees(stand_in)
    try:
        yield stand_in
    finally:
        _torch_graphs.use_trees(previous)
        stand_in.close()


def _scatter(fake, acc):
    """A kernel that re-reads ``acc`` at random while updates stream past, as a scatter-add does (the
    simulator's stand-in for the gallery's, l2ctl.testing.ModeledWorkload.scatter_add)."""
    def launch(stream: int) -> None:
        fake.launch_modeled_kernel(stream, "index_add", streamed_bytes=1.5 * (1 << 30), hot=(acc.ptr, acc.nbytes),
                                   hot_reads=32 * (1.5 * (1 << 30) / 12), read_fraction=0.98)
    return launch


def _captured(fake, s, acc, keep_graph=True):
    g = FakeTorchGraph(keep_graph=keep_graph)
    g.capture_begin(s)
    _scatter(fake, acc)(s.handle)
    _scatter(fake, acc)(s.handle)
    g.capture_end()
    return g


def _replayed_windows(fake):
    return fake.launched[-1][1]


def test_a_torch_graph_replayed_before_the_scope_gets_the_window(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(fake, s, acc)
        g.replay(s)  # torch's executable exists before the scope: warm up first, then optimise
        assert all(w[1] == 0 for w in _replayed_windows(fake))
        before = fake.state()
        with l2ctl.persist(g, acc, 1.0) as p:
            g.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),) * 2  # torch's own replay() carries it
            assert g.instantiations == 2  # torch re-instantiated its executable from the template
        g.replay(s)
        assert all(w[1] == 0 for w in _replayed_windows(fake))  # and again after the scope
        assert fake.state() == before


def test_a_torch_graph_first_replayed_inside_the_scope(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(fake, s, acc)
        with l2ctl.persist(graph.as_graph(g), acc, 1.0) as p:
            assert g.instantiations == 0  # nothing to re-instantiate: the first replay instantiates
            g.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),) * 2
        g.replay(s)  # the executable made inside the scope was made anew at its end
        assert all(w[1] == 0 for w in _replayed_windows(fake)) and g.instantiations == 2


def test_a_selection_of_a_torch_graphs_nodes(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(fake, s, acc)
        g.replay(s)
        first = graph.as_graph(g).kernel_nodes()[0].node
        assert graph.as_graph(g) is graph.as_graph(g)  # one view per torch graph
        with l2ctl.persist(graph.as_graph(g).select(lambda k: k.node == first), acc, 0.5) as p:
            g.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(), (0, 0, 0.0, 0, 0))


def test_a_torch_graph_without_its_template_is_refused_before_any_change(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(fake, s, acc, keep_graph=False)
        before, calls = fake.state(), len(fake.calls)
        with pytest.raises(ValueError, match="keep_graph=True"):
            l2ctl.persist(g, acc, 1.0, set_aside="max")
        with pytest.raises(ValueError, match="keep_graph=True"):
            graph.as_graph(g)
        assert fake.state() == before and len(fake.calls) == calls


def test_cupy_graphs_and_functions_are_refused_saying_what_to_do(fake):
    class Graph:  # as cupy.cuda.Graph presents itself
        graphExec = 1
    Graph.__module__ = "cupy.cuda.graph"
    with l2ctl.DeviceBuffer(MiB) as buf:
        with pytest.raises(ValueError, match="begin_capture"):
            l2ctl.persist(Graph(), buf)
        with pytest.raises(ValueError, match="begin_capture"):
            graph.as_graph(Graph())
        with pytest.raises(TypeError, match="torch_captures"):
            l2ctl.persist(lambda: None, buf)


def test_the_window_reaches_graphs_recorded_inside_torch_captures(fake, trees):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
            node = trees.record(_scatter(fake, acc))  # warm-up and recording inside the scope
            node.graph.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),)
        assert fake.state() == before  # the capture streams are back to what they held
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max"):  # it carries the window: admitted
            node.graph.replay(s)
        node.graph.replay(s)
        assert _replayed_windows(fake) == (p.window.as_tuple(),)  # a recording keeps the window it was captured with


def test_graphs_recorded_outside_any_scope_refuse_a_torch_captures_scope(fake, trees):
    with l2ctl.DeviceBuffer(4 * MiB) as acc:
        trees.record(_scatter(fake, acc))  # warmed up and recorded first: the harm the issue measured
        before, calls = fake.state(), len(fake.calls)
        with pytest.raises(ValueError, match="before the compiled function's first call"):
            with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max"):
                pass
        assert fake.state() == before and len(fake.calls) == calls
        trees.roots.clear()  # torch.compiler.reset()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0):
            trees.record(_scatter(fake, acc))


def test_a_recording_under_another_window_refuses_the_scope_unless_told_what_replays(fake, trees):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc, l2ctl.DeviceBuffer(4 * MiB) as other:
        with l2ctl.scoped_window(graph.torch_captures(), AccessPolicyWindow()):
            plain = trees.record(_scatter(fake, acc))  # the same code recorded without a window, knowingly
        with pytest.raises(ValueError, match="1 recorded under another window"):  # the plain one is there
            with l2ctl.persist(graph.torch_captures(), other, 1.0):
                pass
        with l2ctl.persist(graph.torch_captures(replays=lambda window: []), other, 1.0):  # it replays nothing else
            trees.record(_scatter(fake, other))
        limit = fake.device(0).limit
        for window_of in (acc, other):  # neither no window nor another buffer's window reaches these replays
            with pytest.raises(ValueError, match="recorded under another window"):
                with l2ctl.persist(graph.torch_captures(), window_of, 0.5, set_aside="max"):
                    pass
        assert fake.device(0).limit == limit
        own: list[object] = []
        narrowed = graph.torch_captures(replays=lambda window: own)  # code that knows what its block replays
        with l2ctl.persist(narrowed, acc, 1.0) as p:
            windowed = trees.record(_scatter(fake, acc))
            own.append(windowed)
        with l2ctl.persist(narrowed, acc, 1.0):  # its recording carries the window: admitted
            windowed.graph.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),)
        with pytest.raises(ValueError, match="0 graph"):
            with l2ctl.persist(narrowed, other, 1.0):
                pass
        plain.graph.replay(s)
        assert _replayed_windows(fake) == ((0, 0, 0.0, 0, 0),)


def test_a_graph_recorded_before_the_window_is_on_the_streams_is_not_taken_for_windowed(fake, trees, monkeypatch):
    from l2ctl import _registry

    enter = _registry.enter

    def record_first(*args):  # a recording that happens after the scope was admitted, before it applies
        trees.record(_scatter(fake, acc))
        return enter(*args)

    with l2ctl.DeviceBuffer(4 * MiB) as acc:
        monkeypatch.setattr(_registry, "enter", record_first)
        with l2ctl.persist(graph.torch_captures(), acc, 1.0):
            pass
        monkeypatch.setattr(_registry, "enter", enter)
        with pytest.raises(ValueError, match="1 graph"):
            with l2ctl.persist(graph.torch_captures(), acc, 1.0):
                pass


def test_a_view_keeps_no_torch_graph_alive(fake):
    import gc
    import weakref

    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(MiB) as acc:
        g = _captured(fake, s, acc)
        with l2ctl.persist(g, acc, 1.0):
            pass
        gone = weakref.ref(g)
        del g
        gc.collect()
        assert gone() is None


def _time(s, run, n=5):
    with l2ctl.Timer(s) as t:
        for _ in range(n):
            run()
    return t.elapsed_ms / n


def test_replays_take_what_the_eager_step_takes_under_the_same_scope(fake):
    """The simulator reproduces the issue's measurement: with the executable made before the window and only
    the template carrying it (what l2ctl did before), a larger set-aside makes the replays slower than no
    persistence at all, as the same step run eagerly with the set-aside and no window. Through l2ctl's path,
    a replay takes what the eager step takes under the same scope: the window reaches it."""
    info = l2ctl.device_info()
    acc_bytes = int(0.64 * info.l2_cache_size) // MiB * MiB
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(acc_bytes) as acc:
        step = _scatter(fake, acc)
        g = _captured(fake, s, acc)
        g.replay(s)
        baseline = _time(s, lambda: g.replay(s))
        ratio = l2ctl.auto_set_aside_cap() / acc_bytes  # what the default set-aside holds
        window = AccessPolicyWindow.for_buffer(acc, ratio)
        with l2ctl.set_aside("max"):
            eager_no_window = _time(s, lambda: (step(s.handle), step(s.handle)))
            template = graph.as_graph(g)
            for k in template.kernel_nodes():  # the template only, as before: the executable never sees it
                fake.set_node_window(k.node, *window)
            harmed = _time(s, lambda: g.replay(s))
            for k in template.kernel_nodes():
                fake.set_node_window(k.node, 0, 0, 0.0, 0, 0)
        assert harmed > 1.2 * baseline and harmed == pytest.approx(eager_no_window, rel=0.02), (baseline, harmed)
        with l2ctl.persist(s, acc, ratio):
            eager = _time(s, lambda: (step(s.handle), step(s.handle)))
        with l2ctl.persist(g, acc, ratio):
            replayed = _time(s, lambda: g.replay(s))
        assert replayed == pytest.approx(eager, rel=0.02) and replayed < baseline, (baseline, eager, replayed)


def test_tune_on_a_torch_graph_puts_each_point_on_what_replays(fake):
    from l2ctl.testing.workloads import ModeledWorkload

    with l2ctl.Stream() as s, ModeledWorkload.scatter_add() as w:
        g = FakeTorchGraph(keep_graph=True)
        g.capture_begin(s)
        w.enqueue(s)
        g.capture_end()
        g.replay(s)  # warmed up first
        seen = []

        def replay(stream):
            g.replay(stream)
            seen.append(_replayed_windows(fake)[0])
            w._launched = len(w.kernels)  # the graph ran the workload's kernels

        before = fake.state()
        tuned = l2ctl.tune(replay, g, w.candidates(), stream=s, rounds=3, repeat=2, warmup=0)
        assert fake.state() == before
        acc = w.buffers["acc"]
        windowed = [x for x in seen if x[1]]
        assert windowed and {x[0] for x in windowed} <= {b.ptr for b in w.buffers.values()}
        assert tuned.persists and tuned.buffer_name == "acc" and tuned.speedup > 1.1, str(tuned)
        with tuned.persist(g) as p:
            g.replay(s)
            assert _replayed_windows(fake)[0] == p.window.as_tuple() and p.window.base_ptr == acc.ptr


def test_tune_refuses_what_it_cannot_vary(fake, trees):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(MiB) as buf:
        with pytest.raises(ValueError, match="keep_graph=True"):
            l2ctl.tune(lambda st: None, graph.torch_captures(), buf, stream=s)
        with pytest.raises(ValueError, match="no other stream"):
            l2ctl.tune(lambda st: None, s, buf, stream=l2ctl.Stream())
        g = _captured(fake, s, buf)
        with pytest.raises(ValueError, match="pass stream="):
            l2ctl.tune(lambda st: None, g, buf)


def test_the_gallery_tunes_graphed_and_compiled_rows_on_the_simulator(fake, trees):
    from l2ctl.testing.workloads import ModeledCompiled, ModeledGraphed, ModeledWorkload

    compiled = []

    def make_compiled(device):
        w = ModeledCompiled(ModeledWorkload.scatter_add(device), trees)
        compiled.append(w)
        return w

    factories = {"scatter-add": ModeledWorkload.scatter_add,
                 "scatter-add-graphed": lambda device: ModeledGraphed(ModeledWorkload.scatter_add(device)),
                 "scatter-add-compiled": make_compiled}
    limit = fake.device(0).limit
    with l2ctl.Stream() as s:
        report = benchmark_gallery.bench_workloads(s, factories=factories, runs=2, progress=False)
    assert fake.device(0).limit == limit and not any(w[1] for w in fake.windows.values())
    assert not any(w[1] for w in fake.node_windows.values())  # the graphed row's nodes: back to no window
    rows = {r["workload"]: r for r in report.summary["rows"]}
    assert [rows[n]["mode"] for n in factories] == ["eager", "graphed", "compiled"]
    for name in factories:  # the same step gains the same whichever way it replays: the window reaches it
        assert rows[name]["tuned_buffer"] == "acc" and rows[name]["tuned_min_speedup"] > 1.1, (name, rows[name])
    eager, graphed = rows["scatter-add"]["tuned_min_speedup"], rows["scatter-add-graphed"]["tuned_min_speedup"]
    assert graphed == pytest.approx(eager, rel=0.05)
    assert all(r.verified for r in report.records) and report.summary["never_slower"]
    # one recording per window the compiled step ran under, every one of them known to l2ctl
    assert compiled[0].compilations == len(trees.recorded(0)) > 3
    assert _torch_graphs.without(trees.recorded(0), (0, 0, 0.0, 0, 0))[0] == 0
