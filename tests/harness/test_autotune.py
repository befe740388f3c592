"""``l2ctl.autotune`` on the simulator: it calls the step exactly as often as the app does, decides within MAX_CALLS
by the tuner's rules (a gain where one is there, "no persistence" with the right cause where none is), decides per
argument shape within its bound, runs every later call under the choice, and restores the device at stop(), when
it is collected and at interpreter exit; best effort and threads."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import l2ctl
from l2ctl import autotuner
from l2ctl.testing import FakeBackend, FakeDevice
from stand_ins import SetAsideSurface, scatter_add_into_temporary

MiB = 1 << 20


class Step:
    """reset_data of a LUT into a large output on ``stream`` (persisting the LUT pays on the simulator), counting
    its calls and, on request, the stream's window while it runs."""

    def __init__(self, fake: FakeBackend, lut_words: int = 1 << 20, out_words: int = 64 << 20) -> None:
        self.fake = fake
        self.lut = l2ctl.DeviceBuffer.from_numpy(np.arange(lut_words, dtype=np.int32))
        self.out = l2ctl.DeviceBuffer(out_words, dtype=np.int32)
        self.stream = l2ctl.Stream()
        self.calls = 0
        self.windows: list[tuple[int, int]] = []

    def __call__(self) -> int:
        self.calls += 1
        self.windows.append(tuple(self.fake.get_stream_window(self.stream.handle))[:2])
        l2ctl.kernels.reset_data(self.out, self.lut, self.stream)
        return self.calls


def _run(tuned, calls: int, *args) -> list[object]:
    return [tuned(*args) for _ in range(calls)]


@pytest.mark.parametrize("candidates", ["listed", "discover"])
def test_it_calls_the_step_as_often_as_the_app_and_decides_a_gain_within_its_calls(fake, candidates):
    step = Step(fake)
    initial = fake.state()
    tuned = l2ctl.autotune(step, {"lut": step.lut, "out": step.out} if candidates == "listed" else "discover",
                           stream=step.stream)
    assert tuned.__wrapped__ is step  # functools.wraps: the step's name, doc and signature
    results = _run(tuned, 300)
    assert step.calls == 300 and results == list(range(1, 301)), "the step's own results, one call per app call"
    (decision,) = tuned.report()
    assert decision.phase == "decided" and decision.decided_at <= autotuner.MAX_CALLS, decision
    assert decision.policy.enabled and decision.speedup > 1.05 and decision.ci[0] > 1.0, decision
    assert decision.buffer_name == "lut" or "reset_data" in str(decision.buffer_name)
    assert decision.calls == 300 and decision.points and "confirmed" in decision.reason
    # every call after the decision ran under the window on the LUT; window and set-aside are held between calls
    after = step.windows[decision.decided_at:]
    assert after and all(w == (step.lut.ptr, step.lut.nbytes) for w in after), after[:3]
    assert tuple(fake.get_stream_window(step.stream.handle))[:2] == (step.lut.ptr, step.lut.nbytes)
    assert l2ctl.get_set_aside() == decision.policy.set_aside
    tuned.stop()
    assert fake.state() == initial
    _run(tuned, 5)
    assert step.calls == 305 and step.windows[-5:] == [(0, 0)] * 5 and fake.state() == initial


def test_no_persistence_when_nothing_pays_names_the_cause_and_leaves_the_device(fake):
    """A copy that streams its source once: persisting it buys nothing, so the search finds no winner."""
    src, dst = l2ctl.DeviceBuffer(16 << 20, dtype=np.int32), l2ctl.DeviceBuffer(16 << 20, dtype=np.int32)
    s = l2ctl.Stream()
    calls = []

    def copy() -> None:
        calls.append(1)
        l2ctl.kernels.copy_words(dst, src, s)

    initial = fake.state()
    tuned = l2ctl.autotune(copy, {"src": src}, stream=s)
    _run(tuned, 250)
    (decision,) = tuned.report()
    assert len(calls) == 250 and decision.phase == "decided" and not decision.policy.enabled
    assert decision.reason.startswith("no point was faster than the baseline beyond the noise"), decision.reason
    assert fake.state() == initial and "no persistence" in str(tuned)


def test_discovery_that_finds_nothing_says_so(fake):
    s = l2ctl.Stream()
    calls = []
    tuned = l2ctl.autotune(lambda: calls.append(1), stream=s)  # launches no kernel at all
    _run(tuned, 10)
    (decision,) = tuned.report()
    assert len(calls) == 10 and decision.phase == "decided" and not decision.policy.enabled
    assert decision.decided_at == 1 + autotuner.DISCOVERY_STEPS
    assert "no range the step's kernels are given can be tried" in decision.reason


def test_a_surface_that_is_not_monotonic_above_the_window_gets_its_best_point(fake):
    """The tuner's screen and refine stage, on the app's calls: the H200's 8 MiB surface replayed, where the fastest
    set-aside (4 granules, above the tax-free cap by the tax rule's margin) is one above the first that holds the
    window."""
    s = l2ctl.Stream()
    with SetAsideSurface.h200_lut_8mib() as w:
        tuned = l2ctl.autotune(lambda: w.enqueue(s), {"lut": w.buf}, stream=s)
        _run(tuned, autotuner.MAX_CALLS + 10)
        (decision,) = tuned.report()
        assert decision.phase == "decided" and decision.policy.enabled, decision
        assert decision.policy.set_aside == 4 * w.granularity and decision.policy.hit_ratio == 1.0, decision
        assert w.calls == autotuner.MAX_CALLS + 10
        tuned.stop()


def test_a_decision_per_argument_shape_within_its_bound(fake):
    step = Step(fake)
    tuned = l2ctl.autotune(lambda a: step(), {"lut": step.lut}, stream=step.stream, max_decisions=2)
    small, large = np.zeros(4, np.float32), np.zeros((2, 3), np.float32)
    for _ in range(220):
        tuned(small)
        tuned(large)
    decisions = tuned.report()
    assert [d.key[0][1] for d in decisions] == [(4,), (2, 3)] and all(d.phase == "decided" for d in decisions)
    assert step.calls == 440 and all(d.calls == 220 for d in decisions)
    held = l2ctl.get_set_aside()
    tuned(np.zeros(7, np.int64))  # a third shape: the oldest decision goes, with what it held
    assert [d.key[0][1] for d in tuned.report()] == [(2, 3), (7,)]
    assert "(2, 3) float32" in str(tuned) and held == decisions[1].policy.set_aside
    tuned.stop()


def test_it_is_restored_when_collected_and_at_exit(fake):
    step = Step(fake)
    initial = fake.state()
    tuned = l2ctl.autotune(step, {"lut": step.lut}, stream=step.stream)
    _run(tuned, 200)
    assert tuned.report()[0].policy.enabled and fake.state() != initial
    del tuned
    gc.collect()
    assert fake.state() == initial
    program = textwrap.dedent("""
        import atexit, json, numpy as np
        def report():
            print(json.dumps({"limit": fake.get_persisting_limit(0), "initial": initial}))
        atexit.register(report)  # runs after l2ctl's own exit hook
        import l2ctl
        from l2ctl.testing import FakeBackend
        fake = FakeBackend()
        l2ctl._backend.install(fake)
        initial = fake.get_persisting_limit(0)
        lut = l2ctl.DeviceBuffer.from_numpy(np.arange(1 << 20, dtype=np.int32))
        out, s = l2ctl.DeviceBuffer(64 << 20, dtype=np.int32), l2ctl.Stream()
        tuned = l2ctl.autotune(lambda: l2ctl.kernels.reset_data(out, lut, s), {"lut": lut}, stream=s)
        for _ in range(200):
            tuned()
        assert tuned.report()[0].policy.enabled and fake.get_persisting_limit(0) != initial
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state["limit"] == state["initial"], state


def test_best_effort_where_the_device_cannot_persist():
    with FakeBackend.installed(FakeDevice.turing()) as fake:
        buf, s = l2ctl.DeviceBuffer(MiB), l2ctl.Stream()
        calls = []
        before = fake.state()
        strict = l2ctl.autotune(lambda: calls.append(1), {"buf": buf}, stream=s)
        for _ in range(2):  # every call is refused the same way, the step never run (not only the first)
            with pytest.raises(l2ctl.NotSupportedError, match="compute capability 7.5"):
                strict()
        assert calls == [] and fake.state() == before
        tuned = l2ctl.autotune(lambda: calls.append(1), {"buf": buf}, stream=s, strict=False)
        with pytest.warns(l2ctl.PersistenceUnavailableWarning, match="compute capability 7.5"):
            _run(tuned, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _run(tuned, 3)  # warned once
        (decision,) = tuned.report()
        assert len(calls) == 6 and not decision.policy.enabled and "compute capability 7.5" in decision.reason
        assert fake.state() == before


def test_discovery_without_cupti_raises_before_the_step_runs_or_with_strict_false_says_why():
    with FakeBackend.installed(cupti=False) as fake:
        step = Step(fake)
        before = fake.state()
        with pytest.raises(l2ctl.CountersUnavailableError, match="nvidia-cuda-cupti"):
            l2ctl.autotune(step, stream=step.stream)()
        assert step.calls == 0 and fake.state() == before
        tuned = l2ctl.autotune(step, stream=step.stream, strict=False)
        with pytest.warns(l2ctl.PersistenceUnavailableWarning, match="nvidia-cuda-cupti"):
            results = _run(tuned, 3)
        (decision,) = tuned.report()
        assert results == [1, 2, 3] and step.calls == 3 and not decision.policy.enabled
        assert decision.reason.startswith("discovery cannot record the step's launches"), decision.reason
        assert fake.state() == before


def test_a_step_that_launches_too_many_kernels_to_discover_from_keeps_its_results_and_says_why(fake, monkeypatch):
    from l2ctl import _kernel_buffers

    monkeypatch.setattr(_kernel_buffers, "MAX_LAUNCHES", 4)
    step = Step(fake)

    def many() -> int:
        for _ in range(5):
            step()
        return step.calls

    tuned = l2ctl.autotune(many, stream=step.stream)
    results = _run(tuned, 6)  # the first run overflows the recorder: the step ran, its result is kept
    (decision,) = tuned.report()
    assert results == [5, 10, 15, 20, 25, 30] and decision.phase == "decided" and not decision.policy.enabled
    assert decision.reason == ("no range can be discovered: the step launched more than 4 kernels: too many to "
                               "discover from"), decision.reason
    assert decision.decided_at == 1 and fake.subscriber is None


def test_calls_from_several_threads_are_all_made_and_the_decision_is_reached(fake):
    step = Step(fake)
    lock = threading.Lock()
    initial = fake.state()

    def counted() -> None:
        with lock:  # the simulated step itself is not meant for concurrent calls on one stream
            step()

    tuned = l2ctl.autotune(counted, {"lut": step.lut}, stream=step.stream)
    threads = [threading.Thread(target=_run, args=(tuned, 150)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    (decision,) = tuned.report()
    assert step.calls == 600 and decision.phase == "decided", decision
    tuned.stop()
    assert fake.state() == initial


def test_the_first_measured_call_starts_the_decision_even_when_another_thread_s_call_counted_first(fake):
    """The race a GPU run met (4 threads): a call that found another thread measuring ran untouched but was counted,
    so the measuring thread's call was no longer "call 1" and skipped the decision's start."""
    step = Step(fake)
    tuned = l2ctl.autotune(step, {"lut": step.lut}, stream=step.stream)
    state = tuned._new_state(())
    with state.busy:  # another thread's call is being measured: this one runs untouched, and is counted
        tuned()
    _run(tuned, 250)
    (decision,) = tuned.report()
    assert step.calls == 251 and decision.phase == "decided" and decision.policy.enabled, decision
    tuned.stop()


def test_a_step_that_raises_is_measured_again_and_raises_as_it_is(fake):
    step = Step(fake)
    fail = {7, 50}

    def flaky() -> int:
        n = step()
        if n in fail:
            raise KeyError(n)
        return n

    tuned = l2ctl.autotune(flaky, {"lut": step.lut}, stream=step.stream)
    for i in range(1, 251):
        if i in fail:
            with pytest.raises(KeyError):
                tuned()
        else:
            assert tuned() == i
    assert tuned.report()[0].phase == "decided" and step.calls == 250
    tuned.stop()


@pytest.mark.parametrize("kwargs,error", [
    ({"rounds": 2}, "rounds must be an int from 3"), ({"max_decisions": 0}, "max_decisions"),
    ({"confidence": 1.5}, "confidence"), ({"min_gain": -0.1}, "min_gain"), ({"strict": 1}, "strict must be a bool"),
    ({"candidates": "discovr"}, "'discover'"), ({"stream": "s"}, "stream"),
])
def test_arguments_are_checked_before_any_call(fake, kwargs, error):
    with pytest.raises((TypeError, ValueError), match=error):
        l2ctl.autotune(lambda: None, **kwargs)
    with pytest.raises(TypeError, match="the step to call"):
        l2ctl.autotune(3)  # type: ignore[arg-type]


def test_a_choice_the_confirmation_does_not_reproduce_is_no_persistence_saying_so(fake):
    """The step changes what it does once the confirmation begins (a plain copy, which nothing persisted speeds up):
    the choice of the search does not reproduce, and the answer says so, with the confirmation's numbers."""
    step = Step(fake)
    src = l2ctl.DeviceBuffer(step.out.nbytes, dtype=np.int32)
    tuned = None

    def changing() -> None:
        if tuned is not None and tuned.report() and tuned.report()[0].phase == "confirm":
            l2ctl.kernels.copy_words(step.out, src, step.stream)
        else:
            step()

    tuned = l2ctl.autotune(changing, {"lut": step.lut}, stream=step.stream)
    initial = fake.state()
    _run(tuned, autotuner.MAX_CALLS)
    (decision,) = tuned.report()
    assert decision.phase == "decided" and not decision.policy.enabled, decision
    assert decision.reason.startswith("the choice (lut: set-aside") and "did not reproduce" in decision.reason
    assert fake.state() == initial


# ---- torch's forms (the simulator's graph trees and compiled step stand in for torch's) ----------------------------

def _compiled(trees, workload, graphs: bool = True):
    """A step compiled with mode="reduce-overhead" as the app calls it: no arguments, on the current stream."""
    from stand_ins import FakeCompiledStep

    compiled = FakeCompiledStep(trees, workload, graphs=graphs)
    s = l2ctl.Stream()

    def step() -> None:
        with trees.stream(s), workload.on_stream(s):
            compiled()

    return step, compiled, s


def test_a_compiled_step_torch_graphs_is_tuned_on_its_recorded_graph(fake, trees):
    initial = fake.state()
    with scatter_add_into_temporary() as w:
        step, compiled, s = _compiled(trees, w)
        tuned = l2ctl.autotune(step, stream=s)
        for _ in range(260):
            tuned()
        assert compiled.calls == 260 and len(trees.recorded(0)) == 1  # one recording, replayed since
        (decision,) = tuned.report()
        assert decision.policy.enabled and decision.speedup > 1.1, str(decision)
        # the temporary Inductor scatters into, which only the recorded graph's kernel arguments show
        assert decision.buffer_name.startswith("memory of triton_poi_fused_zero_0"), str(decision)
        assert "a recording of torch.compile's CUDA graph trees" in decision.considered.details[decision.buffer_name]
        tuned()  # a replay in steady state: its kernel nodes carry the window
        assert fake.launched[-1][1][1][0] == w.buffers["tmp"].ptr, fake.launched[-1]
        tuned.stop()
    assert fake.state()[:2] == initial[:2]


def test_a_compiled_step_torch_did_not_graph_is_tuned_on_its_eager_kernels_and_torch_s_reason_is_said(fake, trees):
    from stand_ins import SteppedWorkload

    with SteppedWorkload.scatter_add(0) as w:
        step, compiled, s = _compiled(trees, w, graphs=False)
        tuned = l2ctl.autotune(step, stream=s)
        for _ in range(240):
            tuned()
        assert compiled.calls == 240 and not trees.recorded(0)
        (decision,) = tuned.report()
        assert decision.policy.enabled and decision.speedup > 1.1, str(decision)
        assert "torch ran compiled code without CUDA graphs (skipping cudagraphs due to mutated inputs" \
            in decision.considered.summary()
        tuned.stop()


def test_no_persistence_where_torch_holds_recordings_no_window_reaches_says_the_step_may_replay_them(fake, trees):
    with scatter_add_into_temporary() as w:
        old, _, _ = _compiled(trees, w)
        for _ in range(3):
            old()  # recorded outside any torch_captures(): its template is gone
    src, dst = l2ctl.DeviceBuffer(16 << 20, dtype=np.int32), l2ctl.DeviceBuffer(16 << 20, dtype=np.int32)
    s = l2ctl.Stream()
    tuned = l2ctl.autotune(lambda: l2ctl.kernels.copy_words(dst, src, s), {"src": src}, stream=s)
    _run(tuned, 250)
    (decision,) = tuned.report()
    assert decision.phase == "decided" and not decision.policy.enabled, str(decision)
    assert decision.reason.startswith("no point was faster than the baseline"), decision.reason
    assert "hold 1 recording(s) made before autotune saw the step" in decision.reason, decision.reason
    trees.reset()
    again = l2ctl.autotune(lambda: l2ctl.kernels.copy_words(dst, src, s), {"src": src}, stream=s)
    _run(again, 250)
    assert "recording(s)" not in again.report()[0].reason  # none held: nothing to say
