"""The control API on a simulated device (l2ctl.testing.FakeBackend): every path that changes device
state, and every refusal, with the state asserted unchanged where l2ctl must refuse."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, AccessProperty
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


def test_import_touches_nothing_and_counts_no_device():
    # On CI there is no driver: the real backend reports 0 devices and every device call says why.
    from l2ctl import _core

    if _core.device_count() == 0:
        assert l2ctl.device_count() == 0
        for call in (l2ctl.device_info, l2ctl.get_set_aside, l2ctl.reset_persisting_lines,
                     lambda: l2ctl.set_aside(1), l2ctl.Stream, lambda: l2ctl.DeviceBuffer(16),
                     lambda: l2ctl.set_aside_granularity()):
            with pytest.raises(l2ctl.NoDeviceError, match="no CUDA device"):
                call()


def test_device_info(fake):
    info = l2ctl.device_info()
    assert info.supports_persistence and info.persisting_l2_cache_size == 9_830_400
    assert info.compute_capability == (9, 0)
    assert l2ctl.device_info(0) == info
    with pytest.raises(ValueError, match="does not exist"):
        l2ctl.device_info(3)
    with pytest.raises(TypeError):
        l2ctl.device_info("0")


def test_granularity_probe_restores(fake):
    assert l2ctl.set_aside_granularity() == 3_276_800
    assert l2ctl.set_aside_rounding() == "up"
    assert fake.device(0).limit == 9_830_400
    assert l2ctl.device_info().set_aside_granularity == 3_276_800


@pytest.mark.parametrize("rounding", ["down", "nearest", "exact"])
def test_granularity_probe_other_drivers(rounding):
    from l2ctl._registry import _native  # the planner's probe: (granularity, direction) from a few requests

    g, mx = 1000, 10_000
    state = {}

    def ask(n):
        if rounding == "down":
            state["v"] = n // g * g
        elif rounding == "nearest":
            state["v"] = min(mx, (n + g // 2) // g * g)
        else:
            state["v"] = n
        return state["v"]

    step, found = _native.plan_probe_rounding(ask, mx)
    assert found == rounding and step == (1 if rounding == "exact" else g)


def test_set_aside_reads_back_and_restores(fake):
    with l2ctl.set_aside(3 * MiB + 12345) as granted:
        assert granted == 3_276_800 == fake.device(0).limit and granted.previous == 9_830_400
    assert fake.device(0).limit == 9_830_400
    assert l2ctl.set_aside("max") == 32_768_000
    granted = l2ctl.set_aside(0.5)
    assert granted == 16_384_000
    granted.restore()
    assert fake.device(0).limit == 32_768_000


@pytest.mark.parametrize("bad,error", [(-1, ValueError), (32_768_001, ValueError), (1.5, ValueError),
                                       (math.nan, ValueError), ("all", ValueError), (None, TypeError),
                                       (True, TypeError), ([1], TypeError)])
def test_set_aside_refuses_before_cuda(fake, bad, error):
    before = fake.state()
    with pytest.raises(error):
        l2ctl.set_aside(bad)
    assert fake.state() == before and "cudaDeviceSetLimit" not in fake.calls


def test_persist_applies_and_restores(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(16 * MiB)
    with l2ctl.persist(s, lut, hit_ratio=0.75, set_aside=4 * 3_276_800) as p:  # 12 MiB asked for explicitly
        assert l2ctl.get_window(s) == p.window
        assert p.window == AccessPolicyWindow(lut.ptr, lut.nbytes, 0.75, AccessProperty.PERSISTING,
                                              AccessProperty.STREAMING)
        assert p.set_aside == fake.device(0).limit == 4 * 3_276_800
    assert l2ctl.get_window(s).empty and fake.device(0).limit == 9_830_400 and fake.device(0).resets == 1


def test_auto_stops_at_the_drivers_default_and_says_so(fake):
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(16 * MiB)
    with pytest.warns(l2ctl.SetAsideTaxWarning, match="driver's default"):
        with l2ctl.persist(s, lut, hit_ratio=0.75) as p:  # 12 MiB wanted, 9.375 MiB is where the tax begins
            assert p.set_aside == fake.device(0).limit == 9_830_400
    with l2ctl.set_aside(0):  # below the default, auto grows, up to the default
        with l2ctl.persist(s, l2ctl.DeviceBuffer(4 * MiB), 1.0) as p:
            assert p.set_aside == 2 * 3_276_800
    with l2ctl.persist(s, lut, 0.75, set_aside="max") as p:  # asked for: no warning
        assert p.set_aside == 32_768_000
    assert fake.device(0).limit == 9_830_400


def test_persist_auto_never_shrinks_and_default_hit_ratio(fake):
    s = l2ctl.Stream()
    with l2ctl.persist(s, l2ctl.DeviceBuffer(MiB)) as p:
        assert p.set_aside == 9_830_400 and p.window.hit_ratio == 1.0
    big = l2ctl.DeviceBuffer(64 * MiB)
    with pytest.warns(l2ctl.SetAsideTaxWarning, match="window was cut to its first 9830400 bytes"):
        with l2ctl.persist(s, big) as p:  # the window fits the default limit: no tax, and a warning
            assert p.set_aside == 9_830_400
            assert (p.window.base_ptr, p.window.num_bytes, p.window.hit_ratio) == (big.ptr, 9_830_400, 1.0)
            assert l2ctl.get_window(s) == p.window
    with l2ctl.persist(s, big, set_aside="max") as p:
        assert p.set_aside == 32_768_000 and (p.window.num_bytes, p.window.hit_ratio) == (32_768_000, 1.0)
    with l2ctl.persist(s, big, set_aside=None) as p:
        assert p.set_aside == 9_830_400
    with pytest.warns(l2ctl.L2BudgetWarning, match="set-aside is 0 bytes"):
        with l2ctl.persist(s, big, 0.1, set_aside=0) as p:
            assert p.set_aside == 0 == fake.device(0).limit
    assert fake.device(0).limit == 9_830_400


def test_persist_offset_and_num_bytes(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, buf, 1.0, offset=4096, num_bytes=8192) as p:
        assert (p.window.base_ptr, p.window.num_bytes) == (buf.ptr + 4096, 8192)
    with pytest.raises(ValueError, match="past the end"):
        l2ctl.persist(s, buf, 1.0, offset=4096, num_bytes=MiB)


def test_persist_clips_with_warning(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(200 * MiB)
    with pytest.warns(l2ctl.WindowClippedWarning, match="clipped"):
        with l2ctl.persist(s, buf, 0.1, set_aside="max") as p:
            assert p.clipped and p.window.num_bytes == 128 * MiB


def test_persist_restores_after_exception(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    with pytest.raises(KeyboardInterrupt):
        with l2ctl.persist(s, buf, 1.0, set_aside=32_768_000):
            assert fake.device(0).limit == 32_768_000
            raise KeyboardInterrupt
    assert fake.state() == before


def test_nesting_and_out_of_order_exit(fake):
    g = 3_276_800
    s1, s2 = l2ctl.Stream(), l2ctl.Stream()
    a, b = l2ctl.DeviceBuffer(2 * MiB), l2ctl.DeviceBuffer(4 * MiB)
    outer = l2ctl.persist(s1, a, 1.0)
    inner = l2ctl.persist(s1, b, 1.0)
    other = l2ctl.persist(s2, b, 1.0)
    with l2ctl.set_aside(0):  # a low limit, so that "auto" has room to grow (up to the driver's default)
        outer.__enter__()
        assert fake.device(0).limit == g
        inner.__enter__()
        assert l2ctl.get_window(s1).base_ptr == b.ptr and fake.device(0).limit == 2 * g
        other.__enter__()
        assert fake.device(0).limit == 3 * g  # grown for the windows in force: 4 + 4 MiB
        inner.__exit__(None, None, None)
        assert l2ctl.get_window(s1) == outer.window and fake.device(0).limit == 2 * g  # 2 + 4 MiB
        outer.__exit__(None, None, None)  # ends before `other`: the limit is what `other` still needs
        assert fake.device(0).limit == 2 * g and l2ctl.get_window(s1).empty
        other.__exit__(None, None, None)
        assert fake.device(0).limit == 0 and not fake.windows
    assert fake.device(0).limit == 9_830_400 and l2ctl.budget().scopes == ()


def test_share_scales_hit_ratios(fake):
    g = 3_276_800
    s1, s2 = l2ctl.Stream(), l2ctl.Stream()
    a, b = l2ctl.DeviceBuffer(g), l2ctl.DeviceBuffer(g)
    with l2ctl.set_aside(g):
        with l2ctl.persist(s1, a, 1.0, set_aside=None, share=True):
            with l2ctl.persist(s2, b, 1.0, set_aside=None, share=True):
                assert fake.windows[s1.handle][2] == fake.windows[s2.handle][2] == 0.5
                assert not l2ctl.budget().oversubscribed
            assert fake.windows[s1.handle][2] == 1.0
        with pytest.warns(l2ctl.L2BudgetWarning, match="thrash"):
            with l2ctl.persist(s1, a, 1.0, set_aside=None), l2ctl.persist(s2, b, 1.0, set_aside=None):
                assert l2ctl.budget().oversubscribed


def test_policy_objects(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    with l2ctl.persist(s, buf, policy=l2ctl.Policy(set_aside=6_553_600, hit_ratio=0.5)) as p:
        assert p.set_aside == 6_553_600 and p.window.hit_ratio == 0.5
    with l2ctl.persist(s, buf, policy=l2ctl.Policy(enabled=False)) as p:
        assert not p.active and l2ctl.get_window(s).empty and fake.device(0).limit == 9_830_400
    with pytest.raises(TypeError):
        l2ctl.persist(s, buf, policy=object())


def _hostile_persist_calls(s, buf):
    yield "nan hit ratio", lambda: l2ctl.persist(s, buf, float("nan")), ValueError
    yield "inf hit ratio", lambda: l2ctl.persist(s, buf, float("inf")), ValueError
    yield "negative hit ratio", lambda: l2ctl.persist(s, buf, -0.5), ValueError
    yield "hit ratio 1.5", lambda: l2ctl.persist(s, buf, 1.5), ValueError
    yield "1 + epsilon", lambda: l2ctl.persist(s, buf, 1 + 1e-5), ValueError
    yield "string hit ratio", lambda: l2ctl.persist(s, buf, "1"), TypeError
    yield "None buffer", lambda: l2ctl.persist(s, None), TypeError
    yield "numpy buffer", lambda: l2ctl.persist(s, np.zeros(4)), ValueError
    yield "int buffer", lambda: l2ctl.persist(s, 1234), TypeError
    yield "zero bytes", lambda: l2ctl.persist(s, buf, 1.0, num_bytes=0), ValueError
    yield "negative bytes", lambda: l2ctl.persist(s, buf, 1.0, num_bytes=-4), ValueError
    yield "past the end", lambda: l2ctl.persist(s, buf, 1.0, num_bytes=buf.nbytes + 1), ValueError
    yield "offset outside", lambda: l2ctl.persist(s, buf, 1.0, offset=buf.nbytes), ValueError
    yield "float bytes", lambda: l2ctl.persist(s, buf, 1.0, num_bytes=1.5), TypeError
    yield "bad stream", lambda: l2ctl.persist("stream", buf), TypeError
    yield "bool stream", lambda: l2ctl.persist(True, buf), TypeError
    yield "persisting miss", lambda: l2ctl.persist(s, buf, miss_prop=AccessProperty.PERSISTING), ValueError
    yield "bad property", lambda: l2ctl.persist(s, buf, hit_prop=7), ValueError
    yield "bad set_aside", lambda: l2ctl.persist(s, buf, set_aside="lots"), ValueError
    yield "negative set_aside", lambda: l2ctl.persist(s, buf, set_aside=-1), ValueError
    yield "bool reset", lambda: l2ctl.persist(s, buf, reset_on_exit=1), TypeError


def test_hostile_input_is_refused_before_any_cuda_call(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, buf, 0.3):
        pass  # a first, valid scope so the device has been seen
    for name, call, error in _hostile_persist_calls(s, buf):
        before, ncalls = fake.state(), len(fake.calls)
        with pytest.raises(error) as info:
            with call():
                pass
        assert fake.state() == before, name
        assert not any(c in ("cudaDeviceSetLimit", "cudaStreamSetAttribute") for c in fake.calls[ncalls:]), name
        assert str(info.value), name


def test_refusals_that_need_the_device_leave_no_state(fake):
    s = l2ctl.Stream()
    buf = l2ctl.DeviceBuffer(MiB)
    before = fake.state()
    for bad in [(0x1234_0000, 4096)]:  # a pointer CUDA says is host memory
        with pytest.raises(ValueError, match="host memory"):
            with l2ctl.persist(s, bad, 1.0):
                pass
    over = AccessPolicyWindow(buf.ptr, 129 * MiB, 0.5, AccessProperty.PERSISTING)
    with pytest.raises(ValueError, match="accessPolicyMaxWindowSize"):
        l2ctl.set_window(s, over)
    buf.free()
    with pytest.raises(ValueError, match="freed"):
        l2ctl.persist(s, buf)
    s.close()
    with pytest.raises(ValueError, match="closed"):
        l2ctl.persist(s, l2ctl.DeviceBuffer(16))
    assert fake.state()[0] == before[0]


def test_buffer_on_another_device():
    with FakeBackend.installed(FakeDevice.h100(), FakeDevice.h100()) as fake:
        s0 = l2ctl.Stream(0)
        buf1 = l2ctl.DeviceBuffer(MiB, device=1)
        before = fake.state()
        with pytest.raises(ValueError, match="device 1 but the stream is on device 0"):
            with l2ctl.persist(s0, buf1):
                pass
        raw = (buf1.ptr, buf1.nbytes)  # the device is only known from CUDA's pointer attributes
        with pytest.raises(ValueError, match="device 1 but the stream is on device 0"):
            with l2ctl.persist(s0, raw):
                pass
        assert fake.state() == before


@pytest.mark.parametrize("device,match", [(FakeDevice.turing(), "below 8.0"), (FakeDevice.mig(), "MIG")])
def test_devices_that_cannot_persist(device, match):
    with FakeBackend.installed(device) as fake:
        info = l2ctl.device_info()
        assert not info.supports_persistence and match in info.unsupported_reason
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
        before = fake.state()
        for call in (lambda: l2ctl.set_aside(0), l2ctl.reset_persisting_lines, l2ctl.set_aside_granularity,
                     lambda: l2ctl.persist(s, buf, 0.5).__enter__(),
                     lambda: l2ctl.set_window(s, AccessPolicyWindow.for_buffer(buf, 0.5))):
            with pytest.raises(l2ctl.NotSupportedError, match=match):
                call()
        assert fake.state() == before


def test_mps_refusal_names_the_environment_variable():
    with FakeBackend.installed(FakeDevice.mps_client()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
        with pytest.raises(l2ctl.NotSupportedError, match="CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT"):
            l2ctl.set_aside(4 * MiB)
        before = fake.state()
        with pytest.raises(l2ctl.NotSupportedError, match="MPS"):
            with l2ctl.persist(s, buf, 1.0, set_aside=3_276_800):
                pass
        assert fake.state() == before
        with l2ctl.persist(s, buf, 1.0, set_aside=None) as p:  # the limit MPS gave still works
            assert p.set_aside == fake.device(0).limit


def test_cuda_error_carries_call_and_numbers():
    err = l2ctl.CudaError("cudaDeviceSetLimit(x)", 1, "cudaErrorInvalidValue", "invalid argument", "device 0, 5 bytes")
    assert isinstance(err, RuntimeError)
    assert "cudaDeviceSetLimit" in str(err) and "cudaErrorInvalidValue" in str(err) and "5 bytes" in str(err)
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert (again.call, again.code, again.name, again.details) == (err.call, 1, err.name, err.details)


# how many scopes overlap depends on the threads' timing: five or more ask for more than the tax-free
# set-aside, and "auto" says so
@pytest.mark.filterwarnings("ignore::l2ctl.L2BudgetWarning", "ignore::l2ctl.SetAsideTaxWarning")
def test_threads_share_the_registry(fake, run_threads):
    lut = l2ctl.DeviceBuffer(4 * MiB)
    barrier = threading.Barrier(8)

    def worker():
        s = l2ctl.Stream()
        barrier.wait()
        for _ in range(50):
            with l2ctl.persist(s, lut, 0.5):
                assert l2ctl.get_window(s).hit_ratio == 0.5
        s.close()

    run_threads(worker, [()] * 8)
    assert fake.device(0).limit == 9_830_400 and not fake.windows
    assert l2ctl.budget().scopes == ()


def test_atexit_restores_open_scopes(fake):
    from l2ctl import _registry

    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    scope = l2ctl.persist(s, buf, 1.0, set_aside=32_768_000)
    scope.__enter__()
    assert fake.device(0).limit == 32_768_000
    _registry.restore_all()  # what the interpreter runs at exit
    assert fake.device(0).limit == 9_830_400 and not fake.windows
    scope._scope = None  # the scope was torn down by the exit hook


def test_device_buffer_on_fake(fake):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    with l2ctl.DeviceBuffer.from_numpy(data) as buf:
        np.testing.assert_array_equal(buf.to_numpy(), data)
        assert buf.__cuda_array_interface__["shape"] == (3, 4)
        from l2ctl._interop import resolve_buffer

        assert resolve_buffer(buf).nbytes == 48
    with pytest.raises(ValueError):
        l2ctl.DeviceBuffer(10, dtype=np.float32)
    with pytest.raises(ValueError):
        l2ctl.DeviceBuffer(0)
