"""Discovery on eager steps, on the simulator: tune(step, stream, "discover") reads the kernels' arguments as the
step launches them (the launch recorder: CUPTI's callbacks in the extension, FakeLaunchRecorder here), keeps the
ranges found at the same address in every recorded step, and reports those that move. A GNN layer whose
accumulator is a temporary of the step gains from it; one that keeps its last output, so that the temporary
comes from another block each step, gets "no persistence" with the reason; no CUPTI, or CUPTI held by another subscriber,
is refused with what to do, before anything changed."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys

import pytest

import l2ctl
from l2ctl import _kernel_buffers, _torch_graphs, candidates, graph
from l2ctl.testing import FakeBackend
from stand_ins import ModeledEagerStep


def _tune(w, s, **kw):
    return l2ctl.tune(w, s, "discover", rounds=3, repeat=2, warmup=0, **kw)


def test_discover_on_a_stream_finds_the_temporary_the_step_allocates_inside(fake):
    with l2ctl.Stream() as s, ModeledEagerStep() as w:
        before = fake.state()
        tuned = _tune(w, s)
        assert fake.state() == before
        out = w.buffers["out"]
        assert tuned.persists and tuned.speedup > 1.05 and tuned.ci[0] > 1, str(tuned)
        assert tuned.buffer_name.startswith("memory of zeros_kernel, index_add_kernel"), tuned.buffer_name
        assert tuned.policy.enabled and tuned.buffer == (out.ptr, out.nbytes)
        considered = tuned.considered
        assert considered is not None and considered.kind == "range"
        assert "too large" in " ".join(considered.skipped.values())  # the 0.5 GiB of gathered rows
        text = str(tuned.report())
        assert "the chosen range:" in text and "index_add_kernel" in text
        with tuned.persist(s):  # the window on the stream covers where the next step's temporary comes back
            w.enqueue(s)
            assert fake.windows[s.handle][0] == out.ptr == w.buffers["out"].ptr


def test_a_temporary_that_moves_between_steps_is_reported_and_never_tried(fake):
    with l2ctl.Stream() as s, ModeledEagerStep(keeps_last=True) as w:
        listed = candidates.from_steps(lambda: w.enqueue(s))
        (label,) = [name for name, why in listed.skipped.items() if why.startswith("moves between steps")]
        assert label.startswith("memory of zeros_kernel") and label not in listed.tried
        assert "a window on one step's address misses the next step's data" in listed.skipped[label]
        assert listed.total == 5 and not listed.tried  # x, src, dst and the gathered rows: too large; out moves
        before = fake.state()
        tuned = _tune(w, s)  # nothing left to try: "no persistence", saying why
        assert not tuned.persists and re.match(r"no range the step's kernels are given can be tried: .*moves between",
                                               tuned.reason), tuned.reason
        assert fake.state() == before  # nothing was left changed


def test_a_range_at_the_same_place_every_step_is_stable_and_words_that_point_nowhere_are_dropped(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 << 20) as a:
        found = _kernel_buffers.record_steps(
            lambda: fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(a.ptr, 7)), 0)
        assert [(b.ptr, b.nbytes) for b in found.stable] == [(a.ptr, a.nbytes)]
        assert found.steps == 3 and found.launches == (1, 1, 1) and not found.moved


def test_without_cupti_discovery_says_what_to_install_and_runs_nothing():
    with FakeBackend.installed(cupti=False) as fake, l2ctl.Stream() as s, ModeledEagerStep() as w:
        before = fake.state()
        with pytest.raises(l2ctl.CountersUnavailableError, match="nvidia-cuda-cupti"):
            _tune(w, s)
        assert w._launched == 0 and fake.state() == before


def test_another_subscriber_is_refused_and_the_recorder_is_released_on_every_path(fake):
    with l2ctl.Stream() as s, ModeledEagerStep() as w:
        fake.cupti_load("libcupti.so")
        other = fake.LaunchRecorder(8)
        other.start()
        with pytest.raises(l2ctl.CountersUnavailableError, match="another CUPTI user"):
            candidates.from_steps(lambda: w.enqueue(s))
        assert w._launched == 0  # refused before the step ran
        other.stop()

        def failing() -> None:
            w.enqueue(s)
            if w._launched > 3:  # the warm-up passes, the first recorded step fails
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            candidates.from_steps(failing)
        assert fake.subscriber is None
        candidates.from_steps(lambda: w.enqueue(s))  # the one subscription is free again
        assert fake.subscriber is None


def test_the_recorder_sees_launch_calls_not_graph_replays(fake):
    fake.cupti_load("libcupti.so")
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(1 << 20) as a:
        with graph.capture(s) as g:
            fake.launch_modeled_kernel(s.handle, "captured", streamed_bytes=1e3, args=(a.ptr,))
        recorder = fake.LaunchRecorder(2)
        recorder.start()
        fake.launch_modeled_kernel(s.handle, "eager", streamed_bytes=1e3, args=(a.ptr, 0, a.ptr + 64))
        g.launch(s)
        for _ in range(2):
            fake.launch_fake_kernel(s.handle)
        launches = recorder.stop()
        assert launches == [("eager", s.handle, 0, [(0, 0, a.ptr), (2, 0, a.ptr + 64)]),
                            ("fake_kernel", s.handle, 0, [])]
        assert recorder.dropped == 1 and fake.subscriber is None
        dropped = fake.LaunchRecorder(1)
        dropped.start()
        del dropped
        gc.collect()
        assert fake.subscriber is None  # a recorder collected while recording unsubscribes


def test_torch_blocks_freed_inside_the_step_are_its_temporaries(fake, monkeypatch):
    """With torch: a block that is cached but held by nobody after the step was freed inside it."""
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 << 20) as seg:
        held, freed = (seg.ptr, 2 << 20), (seg.ptr + (2 << 20), 4 << 20)
        blocks = [(*held, False, True), (*freed, False, False)]  # (base, size, private, allocated)
        monkeypatch.setattr(_torch_graphs, "allocator_blocks",
                            lambda device, freed=False: [b for b in blocks if freed or b[3]])
        found = _kernel_buffers.record_steps(lambda: fake.launch_modeled_kernel(
            s.handle, "k", streamed_bytes=1e6, args=(held[0], freed[0] + 256)), 0)
        owners = {(b.ptr, b.nbytes): b.owner for b in found.stable}
        assert owners == {held: "torch's cache", freed: "a temporary of the step"}


def test_a_temporary_torch_traced_is_known_by_its_own_extent_not_its_merged_cached_block(fake, monkeypatch):
    """With torch: a temporary carved from a large cached block that merges back with the free memory around it
    once the step frees it is found by the allocation torch's memory history traced (its own extent), so a
    256 MiB free block does not hide a 4 MiB temporary behind the candidate rule's "too large"."""
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(256 << 20) as seg:
        temporary = (seg.ptr + (64 << 20), 4 << 20)
        merged = [(seg.ptr, 256 << 20, False, False)]  # after the step: one free cached block
        monkeypatch.setattr(_torch_graphs, "allocator_blocks",
                            lambda device, freed=False: merged if freed else [])
        traced = []

        def trace(device):
            traced.append(device)
            return lambda: _torch_graphs.allocations_in([
                {"action": "segment_alloc", "addr": seg.ptr, "size": 256 << 20},
                {"action": "alloc", "addr": temporary[0], "size": temporary[1]},
                {"action": "free_requested", "addr": temporary[0], "size": temporary[1]},
                {"action": "alloc", "addr": temporary[0], "size": temporary[1]}])

        monkeypatch.setattr(_torch_graphs, "trace_allocations", trace)
        found = _kernel_buffers.record_steps(lambda: fake.launch_modeled_kernel(
            s.handle, "k", streamed_bytes=1e6, args=(temporary[0] + 512,)), 0)
        assert traced == [0, 0, 0]  # the three recorded runs, not the warm-up
        assert [(b.ptr, b.nbytes, b.owner) for b in found.stable] == [(*temporary, "a temporary of the step")]


def test_allocations_in_a_trace_are_its_alloc_actions_once_each_largest_first():
    trace = [{"action": "alloc", "addr": 4096, "size": 512}, {"action": "segment_alloc", "addr": 0, "size": 1 << 20},
             {"action": "alloc", "addr": 8192, "size": 2048}, {"action": "alloc", "addr": 4096, "size": 512},
             {"action": "free_completed", "addr": 8192, "size": 2048}, {"action": "alloc", "addr": 0, "size": 0}]
    assert _torch_graphs.allocations_in(trace) == [(8192, 2048), (4096, 512)]


def test_record_steps_checks_its_arguments_before_running(fake):
    ran = []
    for steps in (1, 17, True, 2.0):
        with pytest.raises(ValueError, match="steps must be an int from 2 to 16"):
            _kernel_buffers.record_steps(lambda: ran.append(1), 0, steps=steps)
    assert not ran


def test_launches_from_several_threads_are_all_recorded(fake, run_threads):
    fake.cupti_load("libcupti.so")
    with l2ctl.DeviceBuffer(1 << 20) as a:
        streams = [l2ctl.Stream() for _ in range(4)]
        recorder = fake.LaunchRecorder(1000)
        recorder.start()

        def launch(stream) -> None:
            for _ in range(25):
                fake.launch_modeled_kernel(stream.handle, "k", streamed_bytes=1e3, args=(a.ptr,))

        try:
            run_threads(launch, [(st,) for st in streams])
        finally:
            launches = recorder.stop()
        assert len(launches) == 100 and {h for _n, h, _d, _w in launches} == {st.handle for st in streams}
        for st in streams:
            st.close()


_EXTENSION_RECORDER = """
import l2ctl
from l2ctl import _core
from l2ctl._counters import find_cupti
from l2ctl._errors import CuptiError

try:
    _core.LaunchRecorder(4)
    raise SystemExit("constructed without libcupti loaded")
except CuptiError as exc:
    assert exc.code == -1 and "libcupti is not loaded" in str(exc), exc
for path in find_cupti():
    try:
        _core.cupti_load(path)
        break
    except CuptiError:
        continue
if not _core.cupti_loaded():
    print("no libcupti")
elif _core.device_count() == 0:
    try:
        _core.LaunchRecorder(4)
        raise SystemExit("constructed without a driver")
    except l2ctl.NotSupportedError as exc:
        assert "cuFuncGetParamInfo" in str(exc) and "CUDA 12.4" in str(exc), exc
    print("no driver")
else:
    recorder = _core.LaunchRecorder(4)
    recorder.start()
    assert recorder.stop() == [] and recorder.dropped == 0 and recorder.unreadable == 0
    print("recorded")
"""


def test_the_extensions_recorder_refuses_clearly_without_cupti_or_a_driver():
    """The compiled LaunchRecorder as bound, in a process of its own (loading libcupti lasts the process): without
    libcupti loaded, CUPTI's error -1; without a driver of CUDA 12.4 (no GPU), the driver it needs; with both, a
    recording of nothing."""
    done = subprocess.run([sys.executable, "-c", _EXTENSION_RECORDER], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "L2CTL_SIMULATE": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("no libcupti", "no driver", "recorded"), done.stdout


def test_a_range_found_in_some_steps_only_is_reported_even_when_the_steps_differ(fake):
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 << 20) as a, l2ctl.DeviceBuffer(8 << 20) as b:
        runs = []

        def step() -> None:  # the last step launches one kernel more, given b
            runs.append(1)
            fake.launch_modeled_kernel(s.handle, "k", streamed_bytes=1e6, args=(a.ptr,))
            if len(runs) == 4:
                fake.launch_modeled_kernel(s.handle, "extra", streamed_bytes=1e6, args=(b.ptr,))

        found = _kernel_buffers.record_steps(step, 0)
        assert [x.ptr for x in found.stable] == [a.ptr] and found.launches == (1, 1, 2)
        assert found.moved == {"memory of extra": f"moves between steps: at 0x{b.ptr:x} in 1 of 3 recorded steps, so "
                                                  "a window there would miss in the others"}


def test_only_the_devices_launches_count_and_are_matched_among_themselves():
    from l2ctl.testing import FakeDevice

    with FakeBackend.installed(FakeDevice.h100(), FakeDevice.h100()) as fake:
        with l2ctl.Stream(0) as s0, l2ctl.Stream(1) as s1, l2ctl.DeviceBuffer(8 << 20, device=1) as other:
            cache: list[l2ctl.DeviceBuffer] = []
            runs = []

            def step() -> None:  # device 1 launches first, a varying number of times; device 0's temporary stays
                runs.append(1)
                for _ in range(len(runs)):
                    fake.launch_modeled_kernel(s1.handle, "elsewhere", streamed_bytes=1e3, args=(other.ptr,))
                tmp = cache.pop() if cache else l2ctl.DeviceBuffer(8 << 20, device=0)
                fake.launch_modeled_kernel(s0.handle, "k", streamed_bytes=1e6, args=(tmp.ptr,))
                cache.append(tmp)

            found = _kernel_buffers.record_steps(step, 0)
            assert [b.ptr for b in found.stable] == [cache[0].ptr] and not found.moved
            assert found.launches == (1, 1, 1)
            cache[0].free()
