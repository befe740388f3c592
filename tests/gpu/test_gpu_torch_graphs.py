"""On the GPU, with PyTorch: every graph style PyTorch has, persisted through l2ctl or refused before any
change; kernel names of torch's graphs; tune on a torch graph. (How much each gains is the gallery's
business: python -m l2ctl bench workloads.)"""

from __future__ import annotations

import warnings

import pytest

import l2ctl
from l2ctl import graph

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="these tests need PyTorch")
MiB = 1 << 20


@pytest.fixture
def step(scatter_add_case):
    """A scatter-add into an accumulator of 0.64 x L2 (sized from this GPU), with its expected result."""
    acc, index, values, expected = (scatter_add_case.acc, scatter_add_case.index, scatter_add_case.values,
                                    scatter_add_case.expected)

    def run() -> None:
        acc.index_add_(0, index, values)

    run.index, run.values = index, values  # type: ignore[attr-defined]  # for a step that takes acc as an argument

    def check() -> bool:
        torch.cuda.synchronize()
        return bool(torch.equal(acc.double(), expected))

    return acc, run, check


def _captured(run, keep_graph=True):
    g = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up outside the capture
        with torch.cuda.graph(g, stream=s):
            run()
    torch.cuda.current_stream().wait_stream(s)
    return g


def test_a_torch_graph_replayed_before_the_scope(step):
    acc, run, check = step
    g = _captured(run)
    g.replay()  # torch's executable exists before the scope
    view = graph.as_graph(g)
    nodes = view.kernel_nodes()
    assert nodes and all(k.function and k.grid[0] > 0 and k.block[0] > 0 for k in nodes), nodes  # named by the driver
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(g, acc, 1.0) as p:
            assert all(k.window == p.window for k in graph.inspect(g))
            assert view.reinstantiations == 1  # torch's executable was made anew from the template
            acc.zero_()
            g.replay()
            assert check()
    assert all(k.window.empty for k in graph.inspect(g)) and view.reinstantiations == 2
    acc.zero_()
    g.replay()
    assert check()


def test_a_torch_graph_without_its_template_is_refused(step):
    acc, run, _ = step
    g = _captured(run, keep_graph=False)
    before = l2ctl.get_set_aside()
    with pytest.raises(ValueError, match="keep_graph=True"):
        l2ctl.persist(g, acc, 1.0, set_aside="max")
    assert l2ctl.get_set_aside() == before


def test_make_graphed_callables_inside_torch_captures(step):
    acc, _, _ = step
    lin = torch.nn.Linear(256, 256).cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with warnings.catch_warnings(), l2ctl.persist(graph.torch_captures(), lin.weight, 1.0) as p:
        warnings.filterwarnings("ignore", category=UserWarning, module="torch")  # torch's notes on its own streams
        capture_stream = torch.cuda.graph.default_capture_stream
        assert l2ctl.get_window(capture_stream) == p.window  # what the captures below copy into their nodes
        graphed = torch.cuda.make_graphed_callables(lin, (x,))
        y = graphed(x)
        y.sum().backward()
        torch.cuda.synchronize()
        assert torch.allclose(y, lin(x))
    assert l2ctl.get_window(capture_stream).empty


def test_compiled_graphs_recorded_inside_torch_captures(step):
    acc, run, check = step
    import types

    def fresh():
        code = run.__code__.replace()  # a code object of its own: compiled and recorded anew
        return torch.compile(types.FunctionType(code, run.__globals__, "run", None, run.__closure__),
                             mode="reduce-overhead")

    torch._dynamo.mark_static_address(acc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
            with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
                compiled = fresh()
                for _ in range(3):  # warm-up, recording, replay
                    acc.zero_()
                    torch.compiler.cudagraph_mark_step_begin()
                    compiled()
                assert check()
            recorded = l2ctl._torch_graphs.trees.recorded(acc.device.index)
            assert recorded and l2ctl._torch_graphs.without(recorded, p.window.as_tuple()) == (0, 0)
            unknown = fresh()
            for _ in range(3):  # recorded outside any scope
                torch.compiler.cudagraph_mark_step_begin()
                unknown()
            before = l2ctl.get_set_aside()
            with pytest.raises(ValueError, match="1 graph.s. recorded outside any l2ctl.graph.torch_captures"):
                with l2ctl.persist(graph.torch_captures(), acc, 1.0, set_aside="max"):
                    pass
            assert l2ctl.get_set_aside() == before
    finally:
        torch.compiler.reset()


def test_tune_on_a_torch_graph(step):
    acc, run, check = step
    g = _captured(run)
    g.replay()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())

    class Replay:
        def enqueue(self, stream):
            with torch.cuda.stream(stream):
                acc.zero_()
                g.replay()

        def verify(self, stream):
            stream.synchronize()
            return check()

    tuned = l2ctl.tune(Replay(), g, {"acc": acc}, stream=s, rounds=3, repeat=3)
    assert tuned.seconds < 60 and all(k.window.empty for k in graph.inspect(g))
    with tuned.persist(g):
        Replay().enqueue(s)
    assert Replay().verify(s)


def test_torch_compile_without_its_graphs_gets_the_window_on_the_current_stream(step):
    """An in-place step whose accumulator is an argument not marked static: torch skips its CUDA graphs
    ("mutated inputs") and runs the kernels eagerly on the current stream; the torch_captures scope puts its
    window there too, and on a stream made current inside it."""
    acc, run, check = step
    index, values = run.index, run.values

    def scatter(a):
        a.index_add_(0, index, values)

    compiled = torch.compile(scatter, mode="reduce-overhead")
    side = torch.cuda.Stream()
    before = l2ctl._torch_graphs.recordings(acc.device.index)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
            with l2ctl.persist(graph.torch_captures(), acc, 1.0) as p:
                assert l2ctl.get_window(torch.cuda.current_stream()) == p.window
                for _ in range(3):
                    acc.zero_()
                    torch.compiler.cudagraph_mark_step_begin()
                    compiled(acc)
                assert check()
                with torch.cuda.stream(side):  # made current inside the scope: the window goes there first
                    assert l2ctl.get_window(side) == p.window
                    side.wait_stream(torch.cuda.default_stream())
                    acc.zero_()
                    compiled(acc)
                torch.cuda.current_stream().wait_stream(side)
                assert check()
        assert l2ctl._torch_graphs.recordings(acc.device.index) <= before  # nothing new was graphed
        assert l2ctl.get_window(torch.cuda.current_stream()).empty and l2ctl.get_window(side).empty
        assert torch.cuda.set_stream.__module__.startswith("torch")  # torch's own function again
    finally:
        torch.compiler.reset()


def test_replays_new_with_two_compiled_functions_and_a_graphed_callable(step):
    acc, run, check = step
    import types

    def fresh():
        return torch.compile(types.FunctionType(run.__code__.replace(), run.__globals__, "run", None, run.__closure__),
                             mode="reduce-overhead")

    bias = torch.randn(int(0.3 * l2ctl.device_info().l2_cache_size) // 4, device=acc.device)
    x = torch.randn(64, bias.numel(), device=acc.device)
    torch._dynamo.mark_static_address(acc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
            warnings.filterwarnings("ignore", category=UserWarning, module="torch")
            first = fresh()
            with l2ctl.persist(graph.torch_captures(), acc, 1.0):
                for _ in range(3):
                    torch.compiler.cudagraph_mark_step_begin()
                    first()
            with l2ctl.persist(graph.torch_captures(), bias, 1.0) as other:  # first's recording kept its template
                assert all(k.window == other.window for r in l2ctl._torch_graphs.trees.recorded(acc.device.index)
                           for k in graph.inspect(r.graph))  # so the scope's window went on its nodes
            with torch.no_grad(), l2ctl.persist(graph.torch_captures(replays="new"), bias, 1.0) as p:
                graphed = torch.cuda.make_graphed_callables(lambda t: t + bias, (x,))
                second = fresh()
                for _ in range(3):
                    torch.compiler.cudagraph_mark_step_begin()
                    second()
                assert torch.equal(graphed(x), x + bias)
            recorded = l2ctl._torch_graphs.trees.recorded(acc.device.index)
            assert l2ctl._torch_graphs.without(recorded, p.window.as_tuple()) == (0, 0)  # every one kept its template
    finally:
        torch.compiler.reset()


def test_the_buffers_a_torch_graphs_kernels_are_given(step):
    """Through the driver: the kernel's arguments point at acc (named), and at index and values (torch's
    cache, nobody named them); what discover offers the tuner."""
    acc, run, _ = step
    g = _captured(run)
    found = graph.buffers(g, {"acc": acc})
    by_ptr = {b.ptr: b for b in found}
    assert by_ptr[acc.data_ptr()].owner == "yours" and by_ptr[acc.data_ptr()].name == "acc"
    assert by_ptr[acc.data_ptr()].nbytes == acc.numel() * 4
    for tensor in (run.index, run.values):
        b = next(b for b in found if b.ptr <= tensor.data_ptr() < b.ptr + b.nbytes)
        assert b.owner in ("torch's cache", "an allocation") and b.nbytes >= tensor.numel() * tensor.element_size()
    nodes = graph.inspect(g, {"acc": acc})
    assert any(any(b.name == "acc" for b in k.buffers) for k in nodes), [(k.function, k.buffers) for k in nodes]


def test_discover_names_a_compiled_graphs_temporary(step):
    """acc.zero_(); acc.index_add_(...) compiled together and captured: Inductor scatters into a temporary of
    the graph's private pool and copies it into acc. graph.buffers finds it, given to every kernel."""
    acc, run, _ = step
    index, values = run.index, run.values

    def zero_and_scatter() -> None:
        acc.zero_()
        acc.index_add_(0, index, values)

    compiled = torch.compile(zero_and_scatter)
    try:
        g = _captured(compiled)
        found = graph.buffers(g, {"acc": acc})
        shared = [b for b in found if len(b.kernels) == len(graph.inspect(g))]
        assert shared and shared[0].owner == "a temporary of a captured graph", [b.describe() for b in found]
        assert shared[0].nbytes >= acc.numel() * 4
    finally:
        torch.compiler.reset()
