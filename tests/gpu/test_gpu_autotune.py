"""``l2ctl.autotune`` on the GPU: the step runs exactly as often as the app calls it, a decision is reached within
MAX_CALLS with the tuner's rules, the outputs stay right under every arm, and stop() leaves the device as found.
(Whether it gains is a benchmark's question: scripts/bench_autotune.py.)"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import l2ctl
from l2ctl import autotuner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("candidates", ["listed", "discover"])
def test_autotune_decides_on_the_apps_calls_and_restores_the_device(candidates):
    info = l2ctl.device_info()
    lut = l2ctl.DeviceBuffer.from_numpy(np.arange(info.persisting_l2_cache_max_size // 16, dtype=np.int32))
    out = l2ctl.DeviceBuffer(4 * info.l2_cache_size // 4, dtype=np.int32)
    calls = []
    with l2ctl.Stream() as s:
        limit, window = l2ctl.get_set_aside(), l2ctl.get_window(s)

        def step() -> None:
            calls.append(1)
            l2ctl.kernels.reset_data(out, lut, s)

        tuned = l2ctl.autotune(step, {"lut": lut} if candidates == "listed" else "discover", stream=s)
        for _ in range(autotuner.MAX_CALLS + 20):
            tuned()
        assert l2ctl.kernels.verify_reset_data(out, lut, s) == 0
        (decision,) = tuned.report()
        assert len(calls) == autotuner.MAX_CALLS + 20 and decision.calls == len(calls)
        assert decision.phase == "decided" and decision.decided_at <= autotuner.MAX_CALLS, decision
        assert decision.reason, decision
        if decision.policy.enabled:
            assert l2ctl.get_set_aside() >= decision.policy.set_aside
        tuned.stop()
        s.synchronize()
        assert l2ctl.get_set_aside() == limit and l2ctl.get_window(s) == window


@pytest.mark.parametrize("form", ["compiled-in-function", "compiled-module", "default-graph"])
def test_autotune_on_torch_forms_keeps_the_outputs_and_the_calls_and_restores_the_device(scatter_add_case, form):
    """A reduce-overhead step torch runs without graphs (written in a function: "mutated inputs"), one it records
    (its tensors marked static) and a graph made with torch's defaults inside torch_captures(): each wrapped as an
    app would, called on torch's current stream."""
    import torch

    state = scatter_add_case
    calls = []
    if form == "default-graph":
        capture = torch.cuda.Stream()
        with l2ctl.graph.torch_captures():
            g = torch.cuda.CUDAGraph()  # made inside the block: torch keeps its template
            with torch.cuda.stream(capture):
                state.acc.zero_()  # warmed up on the capture stream first, as torch.cuda.graph asks
                state.acc.index_add_(0, state.index, state.values)
                with torch.cuda.graph(g, stream=capture):
                    state.acc.zero_()
                    state.acc.index_add_(0, state.index, state.values)
        run = g.replay
    else:
        torch.compiler.reset()
        if form == "compiled-module":  # a module's top-level function over its tensors, marked static: graphed
            module = types.ModuleType("app_step")
            sys.modules["app_step"] = module  # Dynamo reads a function's globals through its module
            module.__dict__.update(acc=state.acc, index=state.index, values=state.values)
            for t in (state.acc, state.index, state.values):
                torch._dynamo.mark_static_address(t)
            exec(compile("def zero_and_scatter():\n    acc.zero_()\n    acc.index_add_(0, index, values)\n",
                         "app_step.py", "exec"), module.__dict__)
            run = torch.compile(module.zero_and_scatter, mode="reduce-overhead")
        else:
            def zero_and_scatter() -> None:  # its tensors in closure cells: torch skips graphs
                state.acc.zero_()
                state.acc.index_add_(0, state.index, state.values)

            run = torch.compile(zero_and_scatter, mode="reduce-overhead")

    def step() -> None:
        calls.append(1)
        run()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    limit, window = l2ctl.get_set_aside(), l2ctl.get_window(s)
    # Inductor's FX graph cache off: its key does not tell the unmarked step from a marked one, and this test's
    # skipped graph would be found by a later test's compile of the same step (tests/gpu/test_gpu_kept_templates.py)
    with torch.cuda.stream(s), torch._inductor.config.patch(fx_graph_cache=False):
        tuned = l2ctl.autotune(step)
        for _ in range(autotuner.MAX_CALLS + 20):
            tuned()
        torch.cuda.synchronize()
        assert torch.equal(state.acc.double(), state.expected)
        (decision,) = tuned.report()
        assert len(calls) == autotuner.MAX_CALLS + 20 and decision.phase == "decided", str(decision)
        assert decision.considered is not None and decision.considered.tried, str(decision)
        if form == "compiled-in-function":
            assert "torch ran compiled code without CUDA graphs (skipping cudagraphs due to mutated inputs" \
                in decision.considered.summary(), decision.considered.summary()
        tuned.stop()
    torch.cuda.synchronize()
    assert l2ctl.get_set_aside() == limit and l2ctl.get_window(s) == window
    torch.compiler.reset()
    sys.modules.pop("app_step", None)


def test_autotune_called_from_worker_threads_where_torch_is_in_use(scatter_add_case):
    """torch keeps its compiled graph trees in thread-local state that a plain worker thread lacks (its get_obj
    asserts there): the first measured call, made in a worker, must not fail on it (a GPU run lost that thread's
    calls), and every call of every thread runs."""
    import threading

    import torch

    state, calls, errors = scatter_add_case, [], []
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    limit, window = l2ctl.get_set_aside(), l2ctl.get_window(s)
    lock = threading.Lock()

    def step() -> None:
        with lock, torch.cuda.stream(s):  # one stream, one call at a time: the step's own order
            calls.append(1)
            state.acc.zero_()
            state.acc.index_add_(0, state.index, state.values)

    tuned = l2ctl.autotune(step, stream=s)

    def run() -> None:
        try:
            for _ in range(250):  # about a third of the calls are measured: the others find one being measured
                tuned()
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread's own traceback
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    (decision,) = tuned.report()
    assert len(calls) == 750 and decision.phase == "decided", str(decision)
    torch.cuda.synchronize()
    assert torch.equal(state.acc.double(), state.expected)
    tuned.stop()
    torch.cuda.synchronize()
    assert l2ctl.get_set_aside() == limit and l2ctl.get_window(s) == window
