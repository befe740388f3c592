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


def _captured(scatter, fake, s, acc, keep_graph=True):
    g = FakeTorchGraph(keep_graph=keep_graph)
    g.capture_begin(s)
    scatter(acc)(s.handle)
    scatter(acc)(s.handle)
    g.capture_end()
    return g


def _replayed_windows(fake):
    return fake.launched[-1][1]


def test_a_torch_graph_replayed_before_the_scope_gets_the_window(fake, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(scatter, fake, s, acc)
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


def test_a_torch_graph_first_replayed_inside_the_scope(fake, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(scatter, fake, s, acc)
        with l2ctl.persist(graph.as_graph(g), acc, 1.0) as p:
            assert g.instantiations == 0  # nothing to re-instantiate: the first replay instantiates
            g.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),) * 2
        g.replay(s)  # the executable made inside the scope was made anew at its end
        assert all(w[1] == 0 for w in _replayed_windows(fake)) and g.instantiations == 2


def test_a_selection_of_a_torch_graphs_nodes(fake, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(scatter, fake, s, acc)
        g.replay(s)
        first = graph.as_graph(g).kernel_nodes()[0].node
        assert graph.as_graph(g) is graph.as_graph(g)  # one view per torch graph
        with l2ctl.persist(graph.as_graph(g).select(lambda k: k.node == first), acc, 0.5) as p:
            g.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(), (0, 0, 0.0, 0, 0))


def test_a_torch_graph_without_its_template_is_refused_before_any_change(fake, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(scatter, fake, s, acc, keep_graph=False)
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


def test_the_window_reaches_graphs_recorded_inside_torch_captures(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
            node = trees.record(scatter(acc))  # warm-up and recording inside the scope
            node.graph.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),)
        state = fake.state()  # the capture streams, and the recording's nodes, are back to no window
        assert state[:2] == before[:2] and [w for _, w in state[2]] == [(0, 0, 0.0, 0, 0)]
        node.graph.replay(s)
        assert _replayed_windows(fake) == ((0, 0, 0.0, 0, 0),) and node.graph.instantiations == 2
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max"):  # its template kept: admitted
            node.graph.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),)


def test_graphs_recorded_outside_any_scope_refuse_a_torch_captures_scope(fake, trees, scatter):
    with l2ctl.DeviceBuffer(4 * MiB) as acc:
        trees.record(scatter(acc))  # warmed up and recorded first: the harm the issue measured
        before, calls = fake.state(), len(fake.calls)
        with pytest.raises(ValueError, match=r"first call inside `with l2ctl.graph.torch_captures\(\):`"):
            with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max"):
                pass
        assert fake.state() == before and len(fake.calls) == calls
        trees.roots.clear()  # torch.compiler.reset()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0):
            trees.record(scatter(acc))


def test_a_recording_under_another_window_refuses_the_scope_unless_told_what_replays(fake, trees, scatter):
    trees.keeps_templates = False  # torch < 2.9: a recording keeps the window it was captured with, for good
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc, l2ctl.DeviceBuffer(4 * MiB) as other:
        with l2ctl.scoped_window(graph.torch_captures(), AccessPolicyWindow()):
            plain = trees.record(scatter(acc))  # the same code recorded without a window, knowingly
        with pytest.raises(ValueError, match="1 recorded under another window"):  # the plain one is there
            with l2ctl.persist(graph.torch_captures(), other, 1.0):
                pass
        with l2ctl.persist(graph.torch_captures(replays=lambda window: []), other, 1.0):  # it replays nothing else
            trees.record(scatter(other))
        limit = fake.device(0).limit
        for window_of in (acc, other):  # neither no window nor another buffer's window reaches these replays
            with pytest.raises(ValueError, match="recorded under another window"):
                with l2ctl.persist(graph.torch_captures(), window_of, 0.5, set_aside="max"):
                    pass
        assert fake.device(0).limit == limit
        own: list[object] = []
        narrowed = graph.torch_captures(replays=lambda window: own)  # code that knows what its block replays
        with l2ctl.persist(narrowed, acc, 1.0) as p:
            windowed = trees.record(scatter(acc))
            own.append(windowed)
        with l2ctl.persist(narrowed, acc, 1.0):  # its recording carries the window: admitted
            windowed.graph.replay(s)
            assert _replayed_windows(fake) == (p.window.as_tuple(),)
        with pytest.raises(ValueError, match="0 graph"):
            with l2ctl.persist(narrowed, other, 1.0):
                pass
        plain.graph.replay(s)
        assert _replayed_windows(fake) == ((0, 0, 0.0, 0, 0),)


def test_a_graph_recorded_before_the_window_is_on_the_streams_is_not_taken_for_windowed(fake, trees, monkeypatch, scatter):
    apply_batch = fake.apply_batch
    recorded = []

    def record_first(*args):  # a recording that happens after the scope was admitted, before it applies
        if not recorded:
            recorded.append(trees.record(scatter(acc)))
        return apply_batch(*args)

    with l2ctl.DeviceBuffer(4 * MiB) as acc:
        monkeypatch.setattr(fake, "apply_batch", record_first)  # the planner looks it up at every call
        with l2ctl.persist(graph.torch_captures(), acc, 1.0):
            pass
        monkeypatch.setattr(fake, "apply_batch", apply_batch)
        assert recorded
        with pytest.raises(ValueError, match="1 graph"):
            with l2ctl.persist(graph.torch_captures(), acc, 1.0):
                pass


def test_a_view_keeps_no_torch_graph_alive(fake, scatter):
    import gc
    import weakref

    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(MiB) as acc:
        g = _captured(scatter, fake, s, acc)
        with l2ctl.persist(g, acc, 1.0):
            pass
        gone = weakref.ref(g)
        del g
        gc.collect()
        assert gone() is None


def _time(s, run, n=5):
    run()  # warm-up: a compiled step's first call under a window compiles (and runs) it anew
    with l2ctl.Timer(s) as t:
        for _ in range(n):
            run()
    return t.elapsed_ms / n


def test_replays_take_what_the_eager_step_takes_under_the_same_scope(fake, scatter):
    """The simulator reproduces the issue's measurement: with the executable made before the window and only
    the template carrying it (what l2ctl did before), a larger set-aside makes the replays slower than no
    persistence at all, as the same step run eagerly with the set-aside and no window. Through l2ctl's path,
    a replay takes what the eager step takes under the same scope: the window reaches it."""
    info = l2ctl.device_info()
    acc_bytes = int(0.64 * info.l2_cache_size) // MiB * MiB
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(acc_bytes) as acc:
        step = scatter(acc)
        g = _captured(scatter, fake, s, acc)
        g.replay(s)
        baseline = _time(s, lambda: g.replay(s))
        ratio = l2ctl.auto_set_aside_cap() / acc_bytes  # what the default set-aside holds
        window = AccessPolicyWindow.for_buffer(acc, ratio)
        with l2ctl.set_aside("max"):
            eager_no_window = _time(s, lambda: (step(s.handle), step(s.handle)))
            template = graph.as_graph(g)
            nodes = [k.node for k in template.kernel_nodes()]
            # the template only, as before: the executable never sees it
            fake.apply_batch(0, -1, False, False, False, [(1, node, window) for node in nodes])
            harmed = _time(s, lambda: g.replay(s))
            fake.apply_batch(0, -1, False, False, False, [(1, node, (0, 0, 0.0, 0, 0)) for node in nodes])
        assert harmed > 1.2 * baseline and harmed == pytest.approx(eager_no_window, rel=0.02), (baseline, harmed)
        with l2ctl.persist(s, acc, ratio):
            eager = _time(s, lambda: (step(s.handle), step(s.handle)))
        with l2ctl.persist(g, acc, ratio):
            replayed = _time(s, lambda: g.replay(s))
        assert replayed == pytest.approx(eager, rel=0.02) and replayed < baseline, (baseline, eager, replayed)


def test_tune_on_a_torch_graph_puts_each_point_on_what_replays(fake):
    from l2ctl.workloads.modeled import ModeledWorkload

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


def test_tune_refuses_what_it_cannot_vary(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(MiB) as buf:
        with pytest.raises(ValueError, match="pass stream="):
            l2ctl.tune(lambda st: None, graph.torch_captures(), buf)
        trees.keeps_templates = False
        with pytest.raises(ValueError, match=r"torch >= 2\.9"):
            l2ctl.tune(lambda st: None, graph.torch_captures(), buf, stream=s)
        with pytest.raises(ValueError, match="no other stream"):
            l2ctl.tune(lambda st: None, s, buf, stream=l2ctl.Stream())
        g = _captured(scatter, fake, s, buf)
        with pytest.raises(ValueError, match="pass stream="):
            l2ctl.tune(lambda st: None, g, buf)


def test_the_gallery_tunes_graphed_and_compiled_rows_on_the_simulator(fake, trees):
    from l2ctl.workloads.modeled import ModeledWorkload
    from stand_ins import ModeledCompiled, ModeledGraphed, SteppedWorkload

    compiled = []

    def make_compiled(device):
        w = ModeledCompiled(SteppedWorkload.scatter_add(device), trees)
        compiled.append(w)
        return w

    factories = {"scatter-add": ModeledWorkload.scatter_add,
                 "scatter-add-graphed": lambda device: ModeledGraphed(SteppedWorkload.scatter_add(device)),
                 "scatter-add-compiled": make_compiled,
                 # torch.compile without its graphs: the window must reach its eager kernels on the current stream
                 "scatter-add-compiled-eager": lambda device: ModeledCompiled(SteppedWorkload.scatter_add(device), trees,
                                                                              graphs=False)}
    limit = fake.device(0).limit
    with l2ctl.Stream() as s:
        report = benchmark_gallery.bench_workloads(s, factories=factories, runs=2, progress=False)
    assert fake.device(0).limit == limit and not any(w[1] for w in fake.windows.values())
    assert not any(w[1] for w in fake.node_windows.values())  # the graphed row's nodes: back to no window
    rows = {r["workload"]: r for r in report.summary["rows"]}
    assert [rows[n]["mode"] for n in factories] == ["eager", "graphed", "compiled", "compiled"]
    assert rows["scatter-add-compiled-eager"]["described"]["graphed_compilations"] == 0
    assert rows["scatter-add-compiled"]["described"]["graphed_compilations"] == compiled[0].compilations
    for name in factories:  # the same step gains the same whichever way it replays: the window reaches it
        assert rows[name]["tuned_buffer"] == "acc" and rows[name]["tuned_min_speedup"] > 1.1, (name, rows[name])
    eager, graphed = rows["scatter-add"]["tuned_min_speedup"], rows["scatter-add-graphed"]["tuned_min_speedup"]
    assert graphed == pytest.approx(eager, rel=0.05)
    assert all(r.verified for r in report.records) and report.summary["never_slower"]
    # one recording per window the compiled step ran under, every one of them known to l2ctl
    assert compiled[0].compilations == len(trees.recorded(0)) > 3
    assert _torch_graphs.without(trees.recorded(0), (0, 0, 0.0, 0, 0))[0] == 0


# ---- torch.compile without its graphs: eager kernels on the current stream, and streams made current -------


def test_a_torch_captures_scope_puts_its_window_on_the_current_stream(fake, trees, scatter):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        trees.set_stream(s)  # torch's current stream when the scope enters
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max") as p:
            scatter(acc)(s.handle)  # a kernel torch.compile did not graph: eager, on the current stream
            assert fake.kernel_log[-1].window == p.window.as_tuple()
        assert fake.state() == before and trees.watching == 0


def test_a_stream_made_current_inside_the_scope_gets_the_window_before_any_launch(fake, trees, scatter):
    with l2ctl.Stream() as entry, l2ctl.Stream() as later, l2ctl.DeviceBuffer(4 * MiB) as acc:
        trees.set_stream(entry)
        before = fake.state()
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max") as p:
            assert fake.windows.get(later.handle, (0, 0))[1] == 0
            with trees.stream(later):  # with torch.cuda.stream(later):
                assert fake.windows[later.handle] == p.window.as_tuple()
                scatter(acc)(later.handle)
                assert fake.kernel_log[-1].window == p.window.as_tuple()
            trees.set_stream(later)
        assert fake.state() == before  # both streams back to what they held, the limit too
        assert trees.watching == 0
        trees.set_stream(entry)  # after the scope: nothing watches, nothing changes
        assert fake.state() == before


def test_a_stream_made_current_after_the_scope_ended_is_left_alone(fake, trees):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        scope = l2ctl.persist(graph.torch_captures(), acc, 1.0)
        with scope:
            pass
        before = fake.state()
        trees.set_stream(s)
        assert fake.state() == before and trees.watching == 0


def test_a_stream_of_another_device_is_not_taken():
    from l2ctl.testing import FakeBackend, FakeDevice

    with FakeBackend.installed(FakeDevice.h100(), FakeDevice.h100()) as fake:
        stand_in = FakeGraphTrees()
        previous = _torch_graphs.use_trees(stand_in)
        try:
            with l2ctl.Stream(device=1) as other, l2ctl.DeviceBuffer(4 * MiB, 0) as acc:
                with l2ctl.persist(graph.torch_captures(0), acc, 1.0):
                    stand_in.set_stream(other, 1)
                    assert fake.windows.get(other.handle, (0, 0))[1] == 0
        finally:
            _torch_graphs.use_trees(previous)
            stand_in.close()


def test_the_eager_fallback_of_torch_compile_gains_what_the_eager_step_gains(fake, trees):
    """The issue's harm: torch.compile skipped its graphs (an in-place update of an input not marked static),
    so every kernel ran eagerly on the current stream while the window sat on the capture streams alone.
    The set-aside was in force without its window: slower than no persistence. Now the window is on the
    current stream too, and the compiled step runs as the same eager step runs under a stream scope."""
    from stand_ins import ModeledCompiled, SteppedWorkload

    info = l2ctl.device_info()
    with l2ctl.Stream() as s, SteppedWorkload.scatter_add() as w:
        acc = w.buffers["acc"]
        step = ModeledCompiled(w, trees, graphs=False)
        # the tuner's choice on the gallery's scatter-add: 8 tenths of the max, the window over that much of acc
        set_aside = info.persisting_l2_cache_max_size * 8 // 10
        baseline = _time(s, lambda: step.enqueue(s))
        with l2ctl.persist(graph.torch_captures(), acc, 1.0, num_bytes=set_aside, set_aside=set_aside):
            compiled = _time(s, lambda: step.enqueue(s))
        with l2ctl.persist(s, acc, 1.0, num_bytes=set_aside, set_aside=set_aside):
            eager = _time(s, lambda: w.enqueue(s))
        with l2ctl.set_aside(set_aside):  # what the recipe did before: the set-aside without its window
            harmed = _time(s, lambda: step.enqueue(s))
        assert harmed > 1.2 * baseline, (baseline, harmed)
        assert compiled == pytest.approx(eager, rel=0.02) and 1.2 * compiled < harmed, (baseline, compiled, eager, harmed)
        assert all(r.graph._exec is None for r in trees.recorded(0))  # nothing was graphed


def test_replays_new_admits_a_block_that_replays_only_what_it_records(fake, trees, scatter):
    """Two compiled functions and a graphed callable in one process: the first compiled function recorded
    under a window on another buffer; a block that captures a graphed callable, or first calls a second
    compiled function, replays none of it (torch < 2.9: recordings keep no template)."""
    trees.keeps_templates = False
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc, l2ctl.DeviceBuffer(4 * MiB) as bias:
        with l2ctl.persist(graph.torch_captures(), acc, 1.0):
            first = trees.record(scatter(acc))  # compiled function 1, recorded under acc's window
        with pytest.raises(ValueError, match="replays='new'"):
            l2ctl.persist(graph.torch_captures(), bias, 1.0).__enter__()
        assert not any(w[1] for w in fake.windows.values())  # refused before any change
        with l2ctl.persist(graph.torch_captures(replays="new"), bias, 1.0, set_aside="max") as p:
            # make_graphed_callables captures on torch.cuda.graph's default capture stream
            callable_graph = FakeTorchGraph(keep_graph=False)
            callable_graph.capture_begin(trees.capture_streams(0)[1])
            scatter(bias)(resolve_handle(trees.capture_streams(0)[1]))
            callable_graph.capture_end()
            second = trees.record(scatter(bias))  # compiled function 2, first called inside
            for recorded in (callable_graph, second.graph):
                recorded.replay(s)
                assert _replayed_windows(fake) == (p.window.as_tuple(),)
        first.graph.replay(s)
        assert _replayed_windows(fake)[0][0] == acc.ptr  # the first still carries its own window
        with pytest.raises(TypeError, match="replays must be"):
            graph.torch_captures(replays="old")  # type: ignore[arg-type]


def resolve_handle(stream):
    from l2ctl._interop import resolve_stream

    return resolve_stream(stream).handle


def test_the_stream_watch_wraps_set_stream_only_while_a_scope_lives():
    """l2ctl wraps torch.cuda.set_stream (here a stand-in module) while a watcher lives, calls the watchers of
    the stream's device before the stream becomes current, and puts back what it wrapped, also a wrapper
    another library installed after l2ctl's last scope ended."""
    import types

    from l2ctl._torch_graphs import _StreamWatch

    made_current = []
    module = types.SimpleNamespace()
    module.set_stream = lambda s: made_current.append(("torch", s))
    torch_own = module.set_stream
    watch = _StreamWatch()

    class Stream:
        def __init__(self, device):
            self.device = types.SimpleNamespace(index=device)

    seen = []
    stop = watch.watch(module, 0, lambda s: seen.append(s))
    assert module.set_stream != torch_own
    on0, on1 = Stream(0), Stream(1)
    module.set_stream(on0)
    module.set_stream(on1)
    assert seen == [on0] and made_current == [("torch", on0), ("torch", on1)]  # watchers first, then torch
    stop()
    assert module.set_stream is torch_own
    module.set_stream = other = lambda s: made_current.append(("other", s))  # another library wraps it now
    stop = watch.watch(module, 0, lambda s: seen.append(s))
    module.set_stream(on0)
    assert made_current[-1] == ("other", on0) and seen[-1] is on0
    stop()
    assert module.set_stream is other  # what l2ctl wrapped this time, not torch's from before


def test_an_entry_cut_short_is_ended_once_and_never_entered_again(fake, trees, monkeypatch):
    """If the scope's after-entry call fails, the scope ends through the same object: it stops watching and is
    not taken for a second entry (no watch left for a scope that ended)."""
    with l2ctl.DeviceBuffer(4 * MiB) as acc:
        calls = []
        real = trees.watch_current

        def failing_watch(device, made_current):
            calls.append(device)
            stop = real(device, made_current)
            stop()
            raise RuntimeError("interrupted")

        monkeypatch.setattr(trees, "watch_current", failing_watch)
        before = fake.state()
        with pytest.raises(RuntimeError, match="interrupted"):
            with l2ctl.persist(graph.torch_captures(), acc, 1.0):
                pass
        assert calls == [0] and trees.watching == 0 and fake.state() == before


def test_a_stream_whose_window_cannot_be_set_is_not_kept_in_the_scope(fake, trees, monkeypatch):
    """add_slots is atomic as an entry: when writing the new stream's window fails, the stream is not kept
    (no later plan writes it), the error is raised where the stream was made current, and the scope goes on."""
    from l2ctl import CudaError
    from l2ctl.testing.errors import cuda_error

    with l2ctl.Stream() as entry, l2ctl.Stream() as later, l2ctl.DeviceBuffer(4 * MiB) as acc:
        trees.set_stream(entry)
        before = fake.state()
        real = type(fake).apply_batch

        def refuse_later(self, device, limit, at_least, reset_lines, read_previous, changes, *rest):
            if any(handle == later.handle for _, handle, _ in changes):
                raise cuda_error("cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value)",
                                 "cudaErrorInvalidResourceHandle", f"stream 0x{later.handle:x}")
            return real(self, device, limit, at_least, reset_lines, read_previous, changes, *rest)

        with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
            monkeypatch.setattr(type(fake), "apply_batch", refuse_later)
            with pytest.raises(CudaError):
                trees.set_stream(later)
            monkeypatch.setattr(type(fake), "apply_batch", real)
            assert fake.windows.get(later.handle, (0, 0))[1] == 0
            with l2ctl.Stream() as third, l2ctl.scoped_window(third, AccessPolicyWindow()):
                pass  # another plan of the device: the refused stream is not written by it
            assert fake.windows.get(later.handle, (0, 0))[1] == 0 and fake.windows[entry.handle] == p.window.as_tuple()
            trees.set_stream(later)  # now it can be: it gets the window
            assert fake.windows[later.handle] == p.window.as_tuple()
        assert fake.state() == before


def test_an_interrupt_in_torchs_reinstantiation_at_a_scopes_end(fake, monkeypatch, scatter):
    """The one end that must call Python after the device changed: torch's instantiate() (DESIGN.md). Cut short
    there, the device (the template's node windows) is restored at once and nothing stays live; torch's
    executable keeps the scope's windows until the next scope on the graph re-instantiates it."""
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as acc:
        g = _captured(scatter, fake, s, acc)
        g.replay(s)
        before = fake.state()
        instantiate = g.instantiate
        scope = l2ctl.persist(g, acc, 1.0)
        with scope:
            window = scope.window.as_tuple()

            def cut_short() -> None:  # the scope's end calls it; a signal's handler raises inside
                monkeypatch.setattr(g, "instantiate", instantiate)
                raise KeyboardInterrupt

            monkeypatch.setattr(g, "instantiate", cut_short)
            with pytest.raises(KeyboardInterrupt):
                scope.__exit__(None, None, None)
        assert fake.state() == before and not l2ctl._registry.live_scopes(0)  # the device is back
        g.replay(s)
        assert _replayed_windows(fake) == (window,) * 2  # torch's executable is torch's: stale, as documented
        with l2ctl.persist(g, acc, 0.5, set_aside=None):
            pass  # the next scope on the graph has torch re-instantiate it, at entry and at end
        g.replay(s)
        assert all(w[1] == 0 for w in _replayed_windows(fake))
