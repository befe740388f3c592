"""On the GPU, with PyTorch (issue 35): the graphs torch makes inside ``graph.torch_captures()`` keep their template
and still replay as their maker expects; persist, tune and "discover" reach a graph made with torch's defaults,
make_graphed_callables' graphs and a torch.compile(mode="reduce-overhead") step as the user wrote it; what was
recorded outside any block is refused, saying how to fix it. (What each gains: scripts/bench_torch_captures.py.)"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest

import l2ctl
from l2ctl import graph

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::l2ctl.SetAsideTaxWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning:torch")]  # torch's notes on its own graphs
torch = pytest.importorskip("torch", reason="these tests need PyTorch")
FAST = {"rounds": 3, "repeat": 2, "warmup": 1}


@pytest.fixture
def state(scatter_add_case):
    """scatter_add_case, with torch.compile's caches and graph trees reset before and after, and Inductor's FX graph
    cache off: its key does not tell a step whose accumulator is marked static from the same step unmarked, so a
    graph cached by an earlier test or process brings that one's "skipping cudagraphs due to mutated inputs"."""
    torch.compiler.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield scatter_add_case
    torch.cuda.synchronize()
    torch.compiler.reset()


def _right(state) -> bool:
    torch.cuda.synchronize()
    return bool(torch.equal(state.acc.double(), state.expected))


def _stream():
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    return s


def _default_graph(state, s):
    g = torch.cuda.CUDAGraph()  # torch's defaults: keep_graph=False
    with torch.cuda.stream(s):
        state.acc.zero_()
        state.acc.index_add_(0, state.index, state.values)  # warm-up
        with torch.cuda.graph(g, stream=s):
            state.acc.zero_()
            state.acc.index_add_(0, state.index, state.values)
    return g


def test_a_default_flag_graph_made_inside_the_block_keeps_its_template_and_takes_a_scope(state):
    own = {name: torch.cuda.CUDAGraph.__dict__.get(name) for name in ("__init__", "capture_end")}
    s = _stream()
    with graph.torch_captures() as captures:
        g = _default_graph(state, s)
        assert g.raw_cuda_graph_exec() and g.raw_cuda_graph()  # executable at capture end, and the template kept
    assert {name: torch.cuda.CUDAGraph.__dict__.get(name) for name in own} == own  # torch's class put back
    assert captures.graphs() == [g]
    with torch.cuda.stream(s):
        g.replay()
    assert _right(state)
    limit = l2ctl.get_set_aside()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(g, state.acc, 1.0) as p:
            assert all(k.window == p.window for k in graph.inspect(g))
            with torch.cuda.stream(s):
                g.replay()
            assert _right(state)
    assert all(k.window.empty for k in graph.inspect(g)) and l2ctl.get_set_aside() == limit
    with torch.cuda.stream(s):
        g.replay()
    assert _right(state)


def test_kept_graphs_torch_drops_inside_a_scope_live_until_its_end(state):
    """A torch_captures() scope holds the kept graphs it put its window on: one freed inside the block (here the
    user's last reference dropped, and torch.compiler.reset() dropping the graph trees' recordings) would take its
    template with it, and the scope's end would write to its freed kernel nodes (a segfault before the fix)."""
    run, s = _compiled(state), _stream()
    with graph.torch_captures() as captures:
        g = _default_graph(state, s)
        for _ in range(3):  # warm-up, recording, replay
            run(s)
    refs = [weakref.ref(k) for k in captures.graphs()]
    assert len(refs) >= 2, "torch recorded no graph of the step"
    del captures
    limit = l2ctl.get_set_aside()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(graph.torch_captures(), state.acc, 1.0) as p:
            assert all(k.window == p.window for k in graph.inspect(g))
            del g
            torch.cuda.synchronize()
            torch.compiler.reset()
            gc.collect()
            assert all(r() is not None for r in refs)  # held by the scope
    torch.cuda.synchronize()
    gc.collect()
    assert refs[0]() is None and l2ctl.get_set_aside() == limit  # the user's graph freed with the scope


def test_a_default_flag_graph_made_outside_every_block_is_refused_naming_the_block(state):
    g = _default_graph(state, _stream())
    limit = l2ctl.get_set_aside()
    with pytest.raises(ValueError, match=r"torch_captures\(\)"):
        l2ctl.persist(g, state.acc, 1.0)
    assert l2ctl.get_set_aside() == limit


def test_make_graphed_callables_inside_the_block(state):
    bias = torch.randn(int(0.4 * l2ctl.device_info().l2_cache_size) // 4, device=state.acc.device)
    x = torch.randn(64, bias.numel(), device=bias.device)

    def add(t):
        return t + bias

    with graph.torch_captures() as captures, torch.no_grad():
        graphed = torch.cuda.make_graphed_callables(add, (x,), allow_unused_input=True)
    assert captures.graphs()  # its forward graph, kept
    limit = l2ctl.get_set_aside()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
        with l2ctl.persist(captures, bias, 1.0) as p:
            kept = [k for g in captures.graphs() for k in graph.inspect(g)]
            assert kept and all(k.window == p.window for k in kept)
            assert torch.equal(graphed(x), x + bias)
        assert torch.equal(graphed(x), x + bias)
    assert l2ctl.get_set_aside() == limit


def _compiled(state):
    torch._dynamo.mark_static_address(state.acc)

    def zero_and_scatter():  # the user's step as written
        state.acc.zero_()
        state.acc.index_add_(0, state.index, state.values)

    compiled = torch.compile(zero_and_scatter, mode="reduce-overhead")

    def run(stream):
        with torch.cuda.stream(stream):
            torch.compiler.cudagraph_mark_step_begin()
            compiled()
    return run


def test_tune_discovers_on_a_reduce_overhead_step_as_written(state):
    run, s = _compiled(state), _stream()
    limit = l2ctl.get_set_aside()
    with graph.torch_captures() as captures:
        tuned = l2ctl.tune(run, captures, "discover", stream=s, **FAST)
        kept = captures.graphs()
        assert kept, "torch recorded no graph of the step"
        details = tuned.considered.details.values()  # what each tried range is, in which graph, given to which kernels
        assert any("a recording of torch.compile's CUDA graph trees" in d and "triton" in d for d in details), \
            (details, captures.skips())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", l2ctl.SetAsideTaxWarning)
            with tuned.persist(captures) as p:
                run(s)
                if tuned.persists:
                    assert all(k.window == p.window for g in kept for k in graph.inspect(g))
    assert _right(state) and l2ctl.get_set_aside() == limit
    assert all(k.window.empty for g in kept for k in graph.inspect(g))
    run(s)
    assert _right(state)


def test_a_step_recorded_before_any_block_is_refused_saying_how(state):
    run, s = _compiled(state), _stream()
    for _ in range(3):
        run(s)  # warm-up and recording outside any block: the template is gone
    with pytest.raises(ValueError, match=r"first call inside `with l2ctl.graph.torch_captures\(\):`"):
        l2ctl.tune(run, graph.torch_captures(), "discover", stream=s, **FAST)
    run(s)
    assert _right(state)


def test_discover_on_a_step_torch_did_not_graph_reads_its_eager_launches_and_says_why(state):
    def scatter(acc):  # acc is an input mutated in place, not marked static: torch skips its graphs
        acc.index_add_(0, state.index, state.values)

    compiled = torch.compile(scatter, mode="reduce-overhead")
    other = torch.zeros_like(state.acc)

    def run(stream):
        with torch.cuda.stream(stream):
            compiled(other)

    captures = graph.torch_captures()
    tuned = l2ctl.tune(run, captures, "discover", stream=_stream(), **FAST)
    assert any("mutated inputs" in why for why in captures.skips()), captures.skips()
    assert "torch ran compiled code without CUDA graphs (skipping cudagraphs due to mutated inputs" in tuned.reason
    assert tuned.considered is not None and tuned.considered.tried, str(tuned.report())  # found through CUPTI
    if tuned.persists:  # what it persists is the accumulator the step's eager kernel updates
        assert tuned.buffer[0] == other.data_ptr(), str(tuned.report())
