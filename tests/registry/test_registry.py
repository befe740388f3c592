"""The registry owns every change l2ctl makes to a device (issue "One registry owns every change").

One test per finding of the attack on the old registry; each failed before the registry recomputed the
device state from the live scopes, and passes now. All on the simulated devices.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, AccessProperty, _backend, _registry, graph, kernels
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20
G = 3_276_800  # the simulated H100's granularity (max / 10)
STATE_CHANGES = ("cudaDeviceSetLimit", "cudaStreamSetAttribute", "cudaGraphKernelNodeSetAttribute",
                 "cudaCtxResetPersistingL2Cache")


def changes(fake: FakeBackend, since: int = 0) -> list[str]:
    return [c for c in fake.calls[since:] if c in STATE_CHANGES]


@contextmanager
def _no_devices() -> Iterator[FakeBackend]:
    with _backend.use(FakeBackend.without_devices()) as backend:
        yield backend  # type: ignore[misc]


# 1. An exception inside enter, after registration, left the scope registered for good.

def test_warning_raised_as_error_in_enter_leaves_nothing_registered(fake):
    s, big, small = l2ctl.Stream(), l2ctl.DeviceBuffer(64 * MiB), l2ctl.DeviceBuffer(MiB)
    before = fake.state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(l2ctl.L2BudgetWarning):
            with l2ctl.persist(s, big, 1.0, set_aside=0):
                pytest.fail("the block must not run")
    assert fake.state() == before and l2ctl.budget().scopes == ()
    with l2ctl.persist(s, small, 1.0, set_aside=4 * G):  # a later clean scope restores as usual
        assert fake.device(0).limit == 4 * G
    assert fake.state() == before


def test_clipped_warning_raised_as_error_leaves_nothing(fake):
    s, huge = l2ctl.Stream(), l2ctl.DeviceBuffer(200 * MiB)
    before = fake.state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", l2ctl.WindowClippedWarning)
        with pytest.raises(l2ctl.WindowClippedWarning):
            l2ctl.persist(s, huge, 0.1).__enter__()
    assert fake.state() == before and l2ctl.budget().scopes == ()


def test_shared_scope_whose_stream_closed_does_not_break_the_next_entry(fake):
    s1, s2 = l2ctl.Stream(), l2ctl.Stream()
    a, b = l2ctl.DeviceBuffer(G), l2ctl.DeviceBuffer(G)
    before_limit = fake.device(0).limit
    with l2ctl.set_aside(G):
        first = l2ctl.persist(s1, a, 1.0, set_aside=None, share=True)
        first.__enter__()
        s1.close()  # the other shared scope's stream is gone: rebalancing must not write to it
        with l2ctl.persist(s2, b, 1.0, set_aside=None, share=True):
            assert fake.windows[s2.handle][2] == 1.0  # the closed stream's window is in force nowhere
        first.__exit__(None, None, None)
    assert fake.device(0).limit == before_limit and not fake.windows
    assert l2ctl.budget().scopes == ()


def test_registry_is_kept_per_backend():
    with FakeBackend.installed(FakeDevice.h100()) as first:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
        left_open = l2ctl.persist(s, buf, 1.0, set_aside=5 * G)
        left_open.__enter__()
        with FakeBackend.installed(FakeDevice.h100()) as second:
            assert l2ctl.budget().scopes == ()  # nothing of the other backend's scopes
            with l2ctl.persist(l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), 1.0, set_aside=7 * G):
                assert second.device(0).limit == 7 * G
            assert second.device(0).limit == second.device(0).initial_limit  # restored: its registry is empty
            assert first.device(0).limit == 5 * G
            left_open.__exit__(None, None, None)  # ended while the other is installed: on its own backend
            assert second.state() == (tuple(d.initial_limit for d in second.devices), (), ())
        assert not left_open.active and first.device(0).limit == first.device(0).initial_limit and not first.windows


# 2. ``with set_aside(...)`` bypassed the registry and its lock.

def test_set_aside_scope_and_persist_in_two_threads_ending_in_any_order(fake):
    lut = l2ctl.DeviceBuffer(4 * MiB)
    entered_a, entered_b, a_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def thread_a() -> None:
        try:
            with l2ctl.set_aside("max"):
                entered_a.set()
                entered_b.wait(5)
        except BaseException as exc:
            errors.append(exc)
        a_done.set()

    def thread_b() -> None:
        try:
            entered_a.wait(5)
            with l2ctl.Stream() as s, l2ctl.persist(s, lut, 1.0):
                entered_b.set()
                a_done.wait(5)  # A ends first, then B
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


def test_set_aside_and_persist_interleaved_in_one_thread(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    limit = l2ctl.set_aside("max")
    limit.__enter__()
    scope = l2ctl.persist(s, lut, 1.0)
    scope.__enter__()
    assert fake.device(0).limit == 32_768_000
    limit.__exit__(None, None, None)  # not LIFO: the set_aside block ends first
    assert fake.device(0).limit == fake.device(0).initial_limit  # auto: 4 MiB fits in the limit there was
    scope.__exit__(None, None, None)
    assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


# 3. Two scopes on one stream ended out of order left a window that no live scope owns.

def test_two_scopes_on_one_stream_ended_out_of_order(fake):
    s, a, b = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(2 * MiB)
    first, second = l2ctl.persist(s, a, 1.0), l2ctl.persist(s, b, 0.5)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the outer one ends first: the inner one's window stays
    assert l2ctl.get_window(s) == second.window
    second.__exit__(None, None, None)
    assert l2ctl.get_window(s).empty and not fake.windows


def test_two_threads_sharing_a_stream(fake):
    s = l2ctl.Stream()
    bufs = [l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(MiB)]
    steps = [threading.Event() for _ in range(3)]
    seen: dict[str, AccessPolicyWindow] = {}

    def first() -> None:
        with l2ctl.persist(s, bufs[0], 1.0):
            steps[0].set()
            steps[1].wait(5)
        steps[2].set()

    def second() -> None:
        steps[0].wait(5)
        with l2ctl.persist(s, bufs[1], 0.5) as p:
            steps[1].set()
            steps[2].wait(5)  # the first thread's scope ended meanwhile
            seen["window"], seen["own"] = l2ctl.get_window(s), p.window  # type: ignore[assignment]

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["window"] == seen["own"]
    assert l2ctl.get_window(s).empty


# 4. share=True rebalancing wrote an outer scope's window over an inner scope's window on the same stream.

def test_rebalancing_never_overwrites_the_window_in_force(fake):
    s1, s2 = l2ctl.Stream(), l2ctl.Stream()
    outer_buf, inner_buf, other_buf = (l2ctl.DeviceBuffer(G) for _ in range(3))
    with l2ctl.set_aside(2 * G):
        with l2ctl.persist(s1, outer_buf, 1.0, set_aside=None, share=True):
            with l2ctl.persist(s1, inner_buf, 1.0, set_aside=None, share=True) as inner:
                with l2ctl.persist(s2, other_buf, 1.0, set_aside=None, share=True):  # triggers a rebalance
                    assert fake.windows[s1.handle][0] == inner_buf.ptr
                assert l2ctl.get_window(s1).base_ptr == inner.window.base_ptr
            assert fake.windows[s1.handle][0] == outer_buf.ptr
    assert not fake.windows


# 5. An "auto" scope lost its set-aside when a nested explicit set_aside=0 scope ended.

def test_auto_scope_keeps_its_set_aside_after_a_nested_explicit_zero(fake):
    s, big, small = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB), l2ctl.DeviceBuffer(MiB)
    l2ctl.set_aside(0)  # below the driver's default, so that "auto" has room to grow
    with l2ctl.persist(s, big, 1.0) as outer:
        need = fake.device(0).limit
        assert need == 2 * G == outer.set_aside
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", l2ctl.L2BudgetWarning)
            with l2ctl.persist(l2ctl.Stream(), small, 0.5, set_aside=0):
                assert fake.device(0).limit == 0
        assert fake.device(0).limit == need
    assert fake.device(0).limit == 0


# 6. The atexit hook used whatever backend was current at exit.

def test_exit_hook_restores_each_scope_with_its_own_backend():
    with FakeBackend.installed(FakeDevice.h100()) as first:
        scope = l2ctl.persist(l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), 1.0, set_aside=9 * G)
        scope.__enter__()
        with FakeBackend.installed(FakeDevice.h100()) as second:
            _registry.restore_all()  # runs while another backend is current
            assert second.calls.count("cudaDeviceSetLimit") == 0
        assert first.device(0).limit == first.device(0).initial_limit and not first.windows
        scope.__exit__(None, None, None)  # ended by the hook already: nothing more happens
        assert first.device(0).limit == first.device(0).initial_limit


# 7. Raw (ptr, nbytes) buffers and kernel arguments were not checked against their allocation.

def test_raw_windows_past_their_allocation_are_refused(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    before, n = fake.state(), len(fake.calls)
    for raw in [(buf.ptr, 2 * MiB), (buf.ptr + MiB - 16, 32)]:
        with pytest.raises(ValueError, match="runs past its allocation"):
            with l2ctl.persist(s, raw, 1.0):
                pass
    with pytest.raises(ValueError, match="runs past its allocation"):
        l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, 2 * MiB, 0.5, AccessProperty.PERSISTING))
    assert fake.state() == before and not changes(fake, n)


def test_kernel_arguments_past_their_allocation_or_misaligned_are_refused(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    n = len(fake.calls)
    with pytest.raises(ValueError, match="runs past its allocation"):
        kernels.write_index((buf.ptr, 2 * MiB), s)
    with pytest.raises(ValueError, match="not aligned"):
        kernels.reset_data((buf.ptr + 2, 1024), buf, s)
    with pytest.raises(ValueError, match="not aligned"):
        kernels.write_index((buf.ptr + 4, 1024), s)  # the 16-byte kernel
    assert not [c for c in fake.calls[n:] if "launch" in c.lower() or c.startswith("kernel")]


# 8. Refusals came after state changes; argument errors hid behind the device check.

def test_harness_refuses_bad_sizes_before_changing_anything(fake):
    s = l2ctl.Stream()
    buf = l2ctl.DeviceBuffer(MiB)
    n = len(fake.calls)

    def work(stream: object) -> None:
        kernels.write_index(buf, stream)

    cases = [
        (lambda: l2ctl.tune(work, s, buf, repeat=0), ValueError),
        (lambda: l2ctl.bench.bench_reset_data([MiB], out_bytes=-1), ValueError),
        (lambda: l2ctl.bench.bench_stride([4], repeat=0), ValueError),
        (lambda: l2ctl.sweep.sweep_hit_ratio(work, s, buf, hit_ratios=[float("nan")]), ValueError),
        (lambda: l2ctl.sweep.measure_point(work, s, buf, -1, None), ValueError),
    ]
    for call, error in cases:
        with pytest.raises(error):
            call()
    with pytest.raises(ValueError):
        with l2ctl.bench.clean_state(s, set_aside=float("nan")):  # type: ignore[arg-type]
            pass
    assert not changes(fake, n)


def test_arguments_are_checked_before_the_device():
    with _no_devices():
        for call, error in [
            (lambda: l2ctl.set_aside(-1), ValueError),
            (lambda: l2ctl.set_aside("lots"), ValueError),
            (lambda: l2ctl.set_aside(True), TypeError),
            (lambda: kernels.write_index((0x10000, 6)), ValueError),
            (lambda: kernels.stride_read((0x10000, 4096), 3, (0x20000, 64)), ValueError),
            (lambda: l2ctl.bench.bench_stride([3]), ValueError),
            (lambda: l2ctl.bench.bench_reset_data(repeat=0), ValueError),
            (lambda: l2ctl.persist(0, (0x10000, 64), 2.0), ValueError),
            (lambda: l2ctl.DeviceBuffer(-5), ValueError),
        ]:
            with pytest.raises(error):
                call()


def test_no_device_gives_no_device_error_not_a_cuda_error():
    with _no_devices():
        for call in (lambda: l2ctl.get_window(0), lambda: l2ctl.clear_window(0), l2ctl.reset_persisting_lines,
                     lambda: kernels.write_index((0x10000, 64), 0), lambda: l2ctl.budget(), l2ctl.device_info,
                     lambda: l2ctl.set_aside(0), lambda: l2ctl.Stream()):
            with pytest.raises(l2ctl.NoDeviceError):
                call()


# 9. Unvalidated numbers hung, or leaked ZeroDivisionError / OverflowError.

@pytest.mark.parametrize("case", ["time_gpu", "tune_warmup", "grid", "block_threads", "buffer", "shape_float",
                                  "shape_str", "shape_overflow", "hit_prop_float", "numpy_bool", "policy_and_ratio"])
def test_numbers_are_bounded_and_typed(fake, case):
    from l2ctl._interop import parse_cuda_array_interface

    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    before, n = fake.state(), len(fake.calls)
    calls = {
        "time_gpu": (lambda: l2ctl.bench.time_gpu(lambda st: None, s, repeat=2**63), ValueError),
        "tune_warmup": (lambda: l2ctl.tune(lambda st: None, s, buf, warmup=2**63), ValueError),
        "grid": (lambda: l2ctl.hit_ratio_grid(2**63), ValueError),
        "block_threads": (lambda: kernels.stride_read(buf, 4, buf, s, block_threads=0), ValueError),
        "buffer": (lambda: l2ctl.DeviceBuffer(2**64), ValueError),
        "shape_float": (lambda: parse_cuda_array_interface({"shape": (2.9,), "typestr": "<f4", "data": (1 << 20, False)}),
                        TypeError),
        "shape_str": (lambda: parse_cuda_array_interface({"shape": ("16",), "typestr": "<f4", "data": (1 << 20, False)}),
                      TypeError),
        "shape_overflow": (lambda: parse_cuda_array_interface({"shape": (2**32 + 1, 2**32), "typestr": "<f8",
                                                               "data": (1 << 20, False)}), ValueError),
        "hit_prop_float": (lambda: l2ctl.persist(s, buf, 0.5, hit_prop=2.0), TypeError),  # type: ignore[arg-type]
        "numpy_bool": (lambda: l2ctl.persist(s, buf, 0.5, hit_prop=np.bool_(True)), TypeError),  # type: ignore[arg-type]
        "policy_and_ratio": (lambda: l2ctl.persist(s, buf, 0.5, policy=l2ctl.Policy(hit_ratio=1.0)), ValueError),
    }
    call, error = calls[case]
    with pytest.raises(error):
        call()
    assert fake.state() == before and not changes(fake, n)


def test_tuning_a_workload_that_queues_nothing_says_so(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with pytest.raises(ValueError, match="0 ms"):
        l2ctl.tune(lambda stream: None, s, buf, warmup=0, repeat=3)
    assert fake.device(0).limit == fake.device(0).initial_limit


# 10. A graph predicate ran under the global lock; closing a stream or destroying a graph inside its scope
#     made the exit write to a dead handle.

def test_graph_predicate_runs_outside_the_lock(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
    answered = threading.Event()

    def predicate(node: graph.KernelNode) -> bool:
        t = threading.Thread(target=lambda: (l2ctl.budget(), answered.set()))
        t.start()
        t.join(5)  # another thread needs the registry while the predicate runs
        return True

    done = threading.Event()

    def run() -> None:
        with l2ctl.persist(g.select(predicate), lut, 1.0):
            pass
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert done.is_set() and answered.is_set(), "deadlock: the predicate ran under the registry's lock"


def test_closing_the_stream_inside_its_scope(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    handle = s.handle
    with l2ctl.persist(s, buf, 1.0, set_aside=3 * G):
        s.close()
        n = len(fake.calls)
    assert "cudaStreamSetAttribute" not in fake.calls[n:]  # nothing written to the dead handle
    assert fake.device(0).limit == fake.device(0).initial_limit and handle not in fake.windows


def test_destroying_the_graph_inside_its_scope(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
    with l2ctl.persist(g, lut, 1.0, set_aside=2 * G):
        g.destroy()
        n = len(fake.calls)
    assert "cudaGraphKernelNodeSetAttribute" not in fake.calls[n:]
    assert fake.device(0).limit == fake.device(0).initial_limit
