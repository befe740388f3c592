"""Scopes outside a ``with`` block, on the simulator: a "no persistence" scope that describes itself, the
app-lifetime form (``start()`` ... ``stop()``, ended at garbage collection and at interpreter exit, shared with
``with`` scopes, across threads and a fork), best effort (``strict=False``) on each kind of device that cannot
persist, and clamping on request. (The same scopes under real-signal interrupts: tests/registry/
test_restore_promise.py.)"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import l2ctl
from l2ctl import _backend, _persist, _registry
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20
G = 3_276_800  # the simulated H100's limit granularity


@pytest.fixture(autouse=True)
def _warn_again():
    """Best effort warns once per device and reason in a process: each test starts with none warned."""
    _persist._warned_unavailable.clear()
    yield
    _persist._warned_unavailable.clear()


def _stream_window(fake: FakeBackend, s: l2ctl.Stream) -> tuple[int, ...]:
    return tuple(fake.get_stream_window(s.handle))


# ---- "no persistence" -------------------------------------------------------------------------------------------

def test_a_no_persistence_scope_describes_what_it_applied_and_why(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    for enter in (lambda p: p.__enter__(), lambda p: p.start()):
        p = l2ctl.persist(s, buf, policy=l2ctl.Policy(enabled=False))
        assert p is enter(p)
        assert p.window == l2ctl.AccessPolicyWindow() and not p.active and not p.clipped
        assert p.set_aside == fake.device(0).initial_limit  # the limit in force: untouched
        assert p.device == 0 and p.stream == s.handle
        assert p.reason == "the policy is disabled" and "off: the policy is disabled" in repr(p)
        assert fake.state() == before
        p.stop()
    assert fake.state() == before


def test_a_no_persistence_scope_on_a_graph_names_its_device(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
    before = fake.state()
    with l2ctl.persist(g, buf, policy=l2ctl.Policy(enabled=False)) as p:
        assert p.device == 0 and p.stream != 0 and p.set_aside == fake.device(0).initial_limit
    assert fake.state() == before


# ---- the app-lifetime form ----------------------------------------------------------------------------------------

def test_start_applies_and_stop_restores(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    p = l2ctl.persist(s, buf, 1.0, set_aside=2 * G).start()
    assert p.active and p.reason is None and p.set_aside == 2 * G == fake.device(0).limit
    assert _stream_window(fake, s)[:2] == (buf.ptr, 4 * MiB)
    with pytest.raises(RuntimeError, match="already active"):
        p.start()
    p.stop()
    assert not p.active and fake.state() == before
    p.stop()  # a second stop: nothing
    p.start().close()  # the same object again; close() is stop()
    assert fake.state() == before


def test_a_started_scope_ends_when_collected(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    p = l2ctl.persist(s, buf, 1.0, set_aside=2 * G).start()
    del p  # the last reference: ended at once, without another l2ctl call
    assert fake.state() == before
    cyclic = l2ctl.persist(s, buf, 1.0, set_aside=3 * G).start()
    holder = {"scope": cyclic}
    holder["self"] = holder  # only the cycle collector frees it
    del cyclic, holder
    assert fake.device(0).limit == 3 * G
    gc.collect()
    assert fake.state() == before


@pytest.mark.parametrize("cut", ["start", "stop"])
def test_an_interrupt_as_start_or_stop_changes_the_device_leaves_nothing_behind(fake, monkeypatch, cut):
    """The interrupt lands as the backend's call returns, its change made (the worst place); real signals at any
    place: tests/registry/test_restore_promise.py."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    p = l2ctl.persist(s, buf, 1.0, set_aside=2 * G)

    def interrupt_after(call):
        def interrupted(*args, **kwargs):
            call(*args, **kwargs)
            raise KeyboardInterrupt
        return interrupted

    if cut == "stop":
        p.start()
    with monkeypatch.context() as patch:
        patch.setattr(fake, "apply_batch", interrupt_after(fake.apply_batch))
        with pytest.raises(KeyboardInterrupt):
            p.start() if cut == "start" else p.stop()
    assert l2ctl.budget().scopes == ()  # the next l2ctl call settles what the interrupted one left
    assert fake.state() == before and not p.active


def test_app_scopes_and_with_scopes_share_a_device_and_end_in_any_order(fake):
    s, t = l2ctl.Stream(), l2ctl.Stream()
    a, b = l2ctl.DeviceBuffer(2 * MiB), l2ctl.DeviceBuffer(2 * MiB)
    l2ctl.set_window(t, l2ctl.AccessPolicyWindow.for_buffer(b, 0.25))  # a base the scopes must give back
    before = fake.state()
    app = l2ctl.persist(s, a, 1.0, set_aside=4 * G).start()
    with l2ctl.persist(t, b, 0.5, set_aside=2 * G):
        assert fake.device(0).limit == 2 * G  # the latest exact request
        app.stop()  # the app scope ends first: the block's scope keeps its window and limit
        assert fake.device(0).limit == 2 * G and _stream_window(fake, t)[:3] == (b.ptr, 2 * MiB, 0.5)
        assert _stream_window(fake, s)[1] == 0
        app.start()
    assert fake.device(0).limit == 4 * G and _stream_window(fake, s)[:2] == (a.ptr, 2 * MiB)
    assert _stream_window(fake, t) == dict(before[1])[t.handle]
    app.stop()
    assert fake.state() == before


def test_app_scopes_started_and_stopped_in_other_threads(fake, run_threads):
    streams = [l2ctl.Stream() for _ in range(4)]
    buf = l2ctl.DeviceBuffer(MiB)
    before = fake.state()
    started: list[l2ctl.Persist] = []

    def start(s: l2ctl.Stream) -> None:
        for _ in range(20):
            l2ctl.persist(s, buf, 0.5).start().stop()
        started.append(l2ctl.persist(s, buf, 0.5).start())

    run_threads(start, [(s,) for s in streams])
    assert len(l2ctl.budget().scopes) == 4
    run_threads(lambda p: p.stop(), [(p,) for p in started])  # stopped by threads that did not start them
    assert l2ctl.budget().scopes == () and fake.state() == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_forked_child_can_stop_the_parents_app_scope_without_touching_it(fake):
    """The child inherits the object, not the parent's registry: stopping it there ends nothing of the parent's,
    and the child's own scopes work; the parent's scope stays live until the parent stops it."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    before = fake.state()
    p = l2ctl.persist(s, buf, 0.5, set_aside=2 * G).start()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            p.stop()
            with l2ctl.persist(s, buf, 0.5, set_aside=3 * G):
                ok = fake.device(0).limit == 3 * G
            code = 0 if ok and not p.active else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert p.active and fake.device(0).limit == 2 * G
    p.stop()
    assert fake.state() == before


_AT_EXIT = textwrap.dedent("""
    import atexit, json
    seen = {}

    def report():  # registered before l2ctl's own exit hook, so it runs after it (atexit runs last-in first-out)
        seen["after"] = repr(fake.state())
        print(json.dumps(seen))

    atexit.register(report)
    import l2ctl
    from l2ctl import _backend
    fake = _backend.current()
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 << 20)
    seen["before"] = repr(fake.state())
    app = l2ctl.persist(s, buf, 1.0, set_aside=2 * 3_276_800).start()  # never stopped, still referenced
    seen["during"] = repr(fake.state())
""")


def test_a_started_scope_is_ended_at_interpreter_exit(tmp_path):
    """What this proves: in a process that exits with an app scope live and referenced (so no finalizer ends
    it), the simulated device is back as it was before the scope by the time an exit hook registered before
    l2ctl's runs, i.e. after l2ctl's own hook. It cannot see a real driver's state after the process is gone;
    on a GPU the driver drops the process's context then anyway."""
    script = tmp_path / "app.py"
    script.write_text(_AT_EXIT)
    env = {**os.environ, "L2CTL_SIMULATE": "h100"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["during"] != seen["before"]
    assert seen["after"] == seen["before"]


# ---- best effort ----------------------------------------------------------------------------------------------

UNAVAILABLE = {
    "pre-Ampere": (FakeDevice.turing, "compute capability 7.5 is below 8.0"),
    "MIG": (FakeDevice.mig, "persistingL2CacheMaxSize is 0"),
    "MPS": (FakeDevice.mps_client, "cannot be set from a client under MPS"),
}


@pytest.mark.parametrize("kind", sorted(UNAVAILABLE))
def test_best_effort_changes_nothing_where_the_device_cannot_persist_and_says_why(kind):
    make, why = UNAVAILABLE[kind]
    # under MPS only a request to set the limit is refused (the default "auto" takes the limit MPS gives)
    asks = {"set_aside": "max"} if kind == "MPS" else {}
    with FakeBackend.installed(make()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
        before = fake.state()
        with pytest.raises(l2ctl.NotSupportedError, match=why.replace("(", r"\(")):
            with l2ctl.persist(s, buf, 0.5, **asks):
                pass
        assert fake.state() == before
        with pytest.warns(l2ctl.PersistenceUnavailableWarning, match=why) as caught:
            with l2ctl.persist(s, buf, 0.5, strict=False, **asks) as p:
                assert not p.active and why in str(p.reason) and p.window == l2ctl.AccessPolicyWindow()
                assert p.device == 0 and p.stream == s.handle
                assert p.set_aside == (fake.device(0).limit if kind == "MPS" else 0)
                assert fake.state() == before
            app = l2ctl.persist(s, buf, 0.5, strict=False, **asks).start()  # warned once: not again
            app.stop()
        assert len(caught) == 1 and caught[0].filename == __file__
        assert fake.state() == before
        with pytest.raises(ValueError):  # best effort is about the device, not the arguments
            l2ctl.persist(s, buf, 1.5, strict=False)
        with pytest.raises(TypeError):
            l2ctl.persist(s, buf, 0.5, strict=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["pre-Ampere", "MIG"])
def test_a_best_effort_warning_a_filter_raised_is_not_counted_as_said(kind):
    """Under ``-W error`` the first best-effort scope raised PersistenceUnavailableWarning and every later one entered
    silently: the reason was recorded as said before ``warnings.warn`` ran. Each entry raises it now, and once the
    filter lets it through it is shown (once)."""
    make, why = UNAVAILABLE[kind]
    with FakeBackend.installed(make()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
        before = fake.state()
        with warnings.catch_warnings():
            warnings.simplefilter("error", l2ctl.PersistenceUnavailableWarning)
            for start in (lambda p: p.__enter__(), lambda p: p.start(), lambda p: p.__enter__()):
                with pytest.raises(l2ctl.PersistenceUnavailableWarning, match=why):
                    start(l2ctl.persist(s, buf, 0.5, strict=False))
                assert fake.state() == before and _registry.live_scopes(0) == []
        with pytest.warns(l2ctl.PersistenceUnavailableWarning, match=why) as caught:
            for _ in range(2):
                with l2ctl.persist(s, buf, 0.5, strict=False) as p:
                    assert not p.active
        assert len(caught) == 1 and fake.state() == before


def test_best_effort_under_mps_still_persists_what_needs_no_limit():
    """Under MPS only the limit is refused: a scope that leaves it alone is applied."""
    with FakeBackend.installed(FakeDevice.mps_client()) as fake:
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with l2ctl.persist(s, buf, 0.5, set_aside=None, strict=False) as p:
                assert p.active and p.reason is None and _stream_window(fake, s)[:2] == (buf.ptr, MiB)


class _ForeignArray:
    """Memory another library describes (``__cuda_array_interface__``): an argument that needs no device to make."""

    __cuda_array_interface__ = {"shape": (1024,), "typestr": "<f4", "data": (0x7F00_0000_0000, False), "version": 3}


def test_best_effort_with_no_device():
    """No GPU (or a driver too old, which the backend reports the same way): the legacy default stream and a
    foreign array make a scope without a device; entering it finds none."""
    with _backend.use(FakeBackend.without_devices()):
        with pytest.raises(l2ctl.NoDeviceError):
            l2ctl.persist(None, _ForeignArray(), 0.5).start()
        with pytest.warns(l2ctl.PersistenceUnavailableWarning, match="no CUDA device"):
            with l2ctl.persist(None, _ForeignArray(), 0.5, strict=False) as p:
                assert not p.active and "no CUDA device" in str(p.reason)
                assert p.device == -1 and p.stream == 0 and p.set_aside == 0
                assert p.window == l2ctl.AccessPolicyWindow()


# ---- clamping -----------------------------------------------------------------------------------------------------

def test_a_set_aside_above_the_max_is_clamped_only_on_request(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(4 * MiB)
    maximum = fake.device(0).persisting_l2_cache_max_size
    before = fake.state()
    with pytest.raises(ValueError, match=f"exceeds persistingL2CacheMaxSize \\({maximum} bytes\\).*clamp=True"):
        l2ctl.persist(s, buf, 1.0, set_aside=maximum + 1).start()
    assert fake.state() == before
    with pytest.warns(l2ctl.SetAsideClampedWarning, match=f"{maximum + 1} bytes .* clamped to {maximum} bytes"):
        with l2ctl.persist(s, buf, 1.0, set_aside=maximum + 1, clamp=True) as p:
            assert p.set_aside == maximum == fake.device(0).limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within the max, clamp=True changes nothing and says nothing
        with l2ctl.persist(s, buf, 1.0, set_aside=2 * G, clamp=True) as p:
            assert p.set_aside == 2 * G
    assert fake.state() == before
    with pytest.raises(ValueError, match="exceeds"):  # set_aside() itself keeps the same rule
        l2ctl.set_aside(maximum + 1)
