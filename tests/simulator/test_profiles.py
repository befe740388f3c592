"""Every simulated profile (FakeDevice.PROFILES) runs the core: device queries, the set-aside and its rounding,
persist with windows smaller and larger than the max window, the fitted ("auto") hit ratio, a graph, nested
scopes, a timed kernel. Every size comes from the profile's own properties, never from an H100's. Then the
presets themselves: provenance, internal consistency, and the switch (L2CTL_SIMULATE) that installs each."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, _backend, bench, graph, kernels
from l2ctl.testing import FakeBackend, FakeDevice
from l2ctl.testing.devices import H100_TAX_COPY, H100_TAX_WRITE

MiB = 1 << 20
PUBLIC = "properties from public specs; timing model calibrated on Hopper"


@pytest.fixture(params=FakeDevice.PROFILES)
def machine(request):
    with FakeBackend.installed(FakeDevice.named(request.param)) as fake:
        yield fake


def _bytes(n: float) -> int:
    return int(n) // 16 * 16


def test_device_queries(machine):
    dev = machine.device(0)
    info = l2ctl.device_info()
    assert l2ctl.device_count() == 1
    assert (info.name, info.compute_capability, info.multiprocessor_count, info.l2_cache_size,
            info.persisting_l2_cache_max_size, info.access_policy_max_window_size, info.total_memory) == \
        (dev.name, (dev.major, dev.minor), dev.multiprocessor_count, dev.l2_cache_size,
         dev.persisting_l2_cache_max_size, dev.access_policy_max_window_size, dev.total_global_memory)
    assert info.supports_persistence and info.unsupported_reason is None
    assert info.persisting_l2_cache_size == l2ctl.get_set_aside() == dev.initial_limit
    assert l2ctl.set_aside_granularity() == -(-dev.persisting_l2_cache_max_size // 10) == dev.granularity
    assert l2ctl.set_aside_rounding() == "up" and l2ctl.device_info().set_aside_granularity == dev.granularity
    assert l2ctl.auto_set_aside_cap() == dev.initial_limit  # every preset's default is where "auto" stops
    assert dev.limit == dev.initial_limit  # the granularity probe put the limit back
    # every output that reports the device says it is simulated, and what the numbers rest on
    assert "(simulated)" in info.name and dev.provenance in _backend.simulated()


def test_set_aside_rounds_up_to_the_granularity_and_restores(machine):
    dev = machine.device(0)
    g, mx = dev.granularity, dev.persisting_l2_cache_max_size
    with l2ctl.set_aside(1) as granted:
        assert granted == dev.limit == g
    with l2ctl.set_aside(g + 1) as granted:
        assert granted == 2 * g
    with l2ctl.set_aside("max") as granted:
        assert granted == dev.limit == mx
    before = machine.state()
    with pytest.raises(ValueError):
        l2ctl.set_aside(mx + 1)
    assert machine.state() == before and dev.limit == dev.initial_limit


def test_auto_grows_to_the_default_and_stops_there(machine):
    dev = machine.device(0)
    g, cap = dev.granularity, dev.initial_limit
    s = l2ctl.Stream()
    with l2ctl.set_aside(0):  # room for "auto" to grow
        with l2ctl.persist(s, l2ctl.DeviceBuffer(_bytes(g * 1.5)), 1.0) as p:
            assert p.set_aside == dev.limit == 2 * g
        with pytest.warns(l2ctl.SetAsideTaxWarning, match="driver's default"):
            with l2ctl.persist(s, l2ctl.DeviceBuffer(_bytes(cap * 1.5)), 1.0) as p:
                assert p.set_aside == dev.limit == cap
    assert dev.limit == cap and l2ctl.get_window(s).empty


def test_fitted_hit_ratio(machine):
    dev = machine.device(0)
    cap, mx, w = dev.initial_limit, dev.persisting_l2_cache_max_size, dev.access_policy_max_window_size
    s = l2ctl.Stream()
    with l2ctl.persist(s, l2ctl.DeviceBuffer(_bytes(dev.granularity / 2))) as p:
        assert p.set_aside == cap and p.window.hit_ratio == 1.0  # "auto" never shrinks the limit
    big = l2ctl.DeviceBuffer(_bytes(2 * cap))
    with pytest.warns(l2ctl.SetAsideTaxWarning, match="window was cut to its first"):
        with l2ctl.persist(s, big) as p:  # larger than the set-aside: its first bytes that fit, at 1.0
            assert p.set_aside == cap and (p.window.num_bytes, p.window.hit_ratio) == (cap // 256 * 256, 1.0)
            assert machine.windows[s.handle][:3] == (big.ptr, cap // 256 * 256, 1.0)
    assert mx < w  # so a window between the two exists
    huge = l2ctl.DeviceBuffer(_bytes((mx + w) / 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", l2ctl.WindowClippedWarning)
        with l2ctl.persist(s, huge, set_aside="max") as p:
            assert p.set_aside == mx and (p.window.num_bytes, p.window.hit_ratio) == (mx // 256 * 256, 1.0)
            assert machine.windows[s.handle][1:3] == (p.window.num_bytes, p.window.hit_ratio)
        with l2ctl.persist(s, huge, 0.25, set_aside="max") as p:  # a hit ratio given: the window as asked
            assert (p.window.num_bytes, p.window.hit_ratio) == (huge.nbytes, 0.25)
    assert dev.limit == cap and not machine.windows


@pytest.mark.parametrize("over", [-16, 0, 16])
def test_windows_around_the_max_window(machine, over):
    dev = machine.device(0)
    w = dev.access_policy_max_window_size
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(w + over)  # lazy: no host memory
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with l2ctl.persist(s, buf, 0.25, set_aside="max") as p:  # 0.25: exact in the driver's float32
            assert p.clipped == (over > 0) and p.window.num_bytes == min(buf.nbytes, w)
            assert l2ctl.get_window(s) == p.window and machine.windows[s.handle][1] == p.window.num_bytes
    clipped = [c for c in caught if issubclass(c.category, l2ctl.WindowClippedWarning)]
    assert len(clipped) == (over > 0)
    before = machine.state()
    if over > 0:  # a window set directly is refused, not clipped
        with pytest.raises(ValueError, match="accessPolicyMaxWindowSize"):
            l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, buf.nbytes, 0.25))
    assert machine.state() == before and dev.limit == dev.initial_limit and l2ctl.get_window(s).empty


def test_graph_capture_and_persist_on_the_graph(machine):
    dev = machine.device(0)
    s = l2ctl.Stream()
    lut, out = l2ctl.DeviceBuffer(_bytes(dev.granularity / 2)), l2ctl.DeviceBuffer(64 * MiB)
    kernels.write_index(lut, s)
    with graph.capture(s) as g:
        kernels.reset_data(out, lut, s)
    g.launch(s)
    with l2ctl.persist(g, lut, 1.0) as p:
        assert p.set_aside == dev.limit == dev.initial_limit
        g.launch(s)
        assert machine.launched[-1][1][0] == p.window.as_tuple()  # the replay carries the window
    assert all(k.window.empty for k in graph.inspect(g)) and dev.limit == dev.initial_limit
    assert kernels.verify_reset_data(out, lut, s) == 0


def test_nested_scopes_end_in_any_order(machine):
    dev = machine.device(0)
    g = dev.granularity
    s1, s2 = l2ctl.Stream(), l2ctl.Stream()
    a, b = l2ctl.DeviceBuffer(_bytes(0.64 * g)), l2ctl.DeviceBuffer(_bytes(1.28 * g))
    outer, inner, other = l2ctl.persist(s1, a, 1.0), l2ctl.persist(s1, b, 1.0), l2ctl.persist(s2, b, 1.0)
    with l2ctl.set_aside(0):
        outer.__enter__()
        assert dev.limit == g
        inner.__enter__()
        assert l2ctl.get_window(s1).base_ptr == b.ptr and dev.limit == 2 * g
        other.__enter__()
        assert dev.limit == 3 * g  # b on both streams
        inner.__exit__(None, None, None)
        assert l2ctl.get_window(s1) == outer.window and dev.limit == 2 * g
        outer.__exit__(None, None, None)  # ends before `other`: the limit is what `other` still needs
        assert dev.limit == 2 * g and l2ctl.get_window(s1).empty
        other.__exit__(None, None, None)
        assert dev.limit == 0 and not machine.windows
    assert dev.limit == dev.initial_limit and l2ctl.budget().scopes == ()


def test_timing_follows_the_profiles_own_bandwidth(machine):
    dev = machine.device(0)
    with l2ctl.Stream() as s:
        ceilings = bench.measure_ceilings(s, 1 << 30, warmup=1, repeat=3)
        assert ceilings.write_gbps == pytest.approx(dev.write_gbps, rel=0.01)
        assert ceilings.copy_gbps == pytest.approx(dev.copy_gbps, rel=0.01)
        assert ceilings.read_gbps == pytest.approx(dev.read_gbps, rel=0.01)
        lut, out = l2ctl.DeviceBuffer(_bytes(dev.granularity / 2)), l2ctl.DeviceBuffer(1 << 30)
        kernels.write_index(lut, s)

        def run() -> float:
            with l2ctl.Timer(s) as t:
                kernels.reset_data(out, lut, s)
            return t.elapsed_ms

        run()
        plain = run()
        with l2ctl.persist(s, lut, 1.0):
            run()
            held = run()
        assert kernels.verify_reset_data(out, lut, s) == 0
    # the LUT held in L2, what is left is the write stream at this device's write ceiling
    assert held < plain and held == pytest.approx(out.nbytes / dev.write_gbps / 1e6, rel=0.05)


# ---- the presets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FakeDevice.PROFILES)
def test_preset_provenance_and_consistency(name):
    dev = FakeDevice.named(name)
    assert FakeDevice.named(f" {name.upper()} ") == dev and dev.name.endswith("(simulated)")
    if dev.major == 9:
        assert dev.provenance.startswith("properties and timing measured on an H")
    else:  # no such GPU was measured here: its label says so
        assert dev.provenance == PUBLIC
        # "calibrated on Hopper": Hopper's curves, and Hopper's write : copy : read proportions
        assert (dev.tax_write, dev.tax_copy) == (H100_TAX_WRITE, H100_TAX_COPY)
        h100 = FakeDevice.h100()
        assert dev.copy_gbps / dev.write_gbps == pytest.approx(h100.copy_gbps / h100.write_gbps, rel=0.005)
        assert dev.read_gbps / dev.write_gbps == pytest.approx(h100.read_gbps / h100.write_gbps, rel=0.005)
    assert dev.supports_persistence and (dev.major, dev.minor) >= (8, 0)
    assert 0 < dev.persisting_l2_cache_max_size <= dev.l2_cache_size < dev.total_global_memory
    assert dev.persisting_l2_cache_max_size < dev.access_policy_max_window_size <= 128 * MiB
    assert 0 < dev.initial_limit <= dev.persisting_l2_cache_max_size and dev.initial_limit % dev.granularity == 0
    assert dev.initial_limit == -(-(3 * dev.persisting_l2_cache_max_size // 10) // dev.granularity) * dev.granularity
    assert dev.multiprocessor_count > 0 and dev.max_threads_per_multiprocessor in (1536, 2048)
    assert dev.memory_bus_width % 64 == 0 and dev.l2_cache_size % MiB == 0 and not dev.mps
    assert 0 < dev.copy_gbps < min(dev.write_gbps, dev.read_gbps) < dev.l2_gbps and 0 < dev.noise < 0.05
    for curve in (dev.tax_write, dev.tax_copy):
        xs, ys = zip(*curve)
        assert xs[0] == 0.0 and xs[-1] == 1.0 and list(xs) == sorted(set(xs))
        assert ys[0] == 1.0 and all(0 < y <= 1 for y in ys)


def test_the_rtx5090_reads_as_the_card_does():
    """A public report on the 96 MiB-L2 card: persisting max 60 MiB, default limit 18 MiB (not 75% of the L2)."""
    dev = FakeDevice.rtx5090()
    assert (dev.l2_cache_size, dev.persisting_l2_cache_max_size, dev.initial_limit) == (96 * MiB, 60 * MiB, 18 * MiB)
    with FakeBackend.installed(dev):
        assert l2ctl.auto_set_aside_cap() == 18 * MiB and l2ctl.set_aside_granularity() == 6 * MiB


def test_presets_are_distinct():
    devices = [FakeDevice.named(n) for n in FakeDevice.PROFILES]
    assert len({d.name for d in devices}) == len({d.uuid(0) for d in devices}) == len(devices)
    with pytest.raises(ValueError, match="choose from"):
        FakeDevice.named("v100")


@pytest.mark.parametrize("name", FakeDevice.PROFILES)
def test_the_switch_installs_each_profile(name):
    """L2CTL_SIMULATE=<profile> at import: the whole process sees that simulated GPU (a subprocess, so
    the process-wide install stays there)."""
    code = ("import l2ctl; from l2ctl import _backend; i = l2ctl.device_info(); "
            "print(i.name, i.l2_cache_size, l2ctl.set_aside_granularity(), sep='|'); print(_backend.simulated())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "L2CTL_SIMULATE": name},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    dev = FakeDevice.named(name)
    first, second = out.stdout.splitlines()
    assert first == f"{dev.name}|{dev.l2_cache_size}|{dev.granularity}"
    assert second.startswith("simulated by l2ctl.testing, not a GPU") and dev.provenance in second
