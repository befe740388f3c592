"""Interpreter exit with threads still inside l2ctl, on the simulator: the process exits cleanly (CPython before 3.14
ends a daemon thread that asks for the GIL during finalization with pthread_exit, whose forced unwind crashed the
process inside l2ctl's C++ frames), every device is restored by l2ctl's exit hook, and no scope is entered after it.
Each case runs in fresh processes, several times, since the crash depended on where the threads were; the GPU test runs
them on the CUDA backend, with kernels launched and synchronized as the process exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from l2ctl import _core, _nvrtc

RUNS = int(os.environ.get("L2CTL_EXIT_RUNS", "4"))

# Registered before l2ctl is imported, so it runs after l2ctl's own exit hook (atexit runs in reverse order): it
# reports what the device holds then, and what a late l2ctl call gets.
PROGRAM = textwrap.dedent("""
    import atexit, json, sys, threading, time

    def device_state():
        return backend.get_persisting_limit(0), tuple(backend.get_stream_window(s.handle))

    def report():
        state = {"restored": device_state() == initial}
        try:
            l2ctl.persist(s, buf, 0.5).start()
            state["late"] = "entered"
        except RuntimeError as e:
            state["late"] = str(e)
        print(json.dumps(state), flush=True)

    atexit.register(report)
    import l2ctl
    from l2ctl import _core, _nvrtc, kernels
    from l2ctl.testing import FakeBackend
    if sys.argv[2] == "simulated":
        l2ctl._backend.install(FakeBackend())
    backend = l2ctl._backend.current()
    s, t, buf = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(1 << 20)
    initial = device_state()
    mode = sys.argv[1]

    def scopes_in_with_blocks():
        while True:
            with l2ctl.persist(s, buf, 0.5):
                pass

    def app_lifetime_scopes():
        own = l2ctl.Stream()
        while True:
            l2ctl.persist(own, buf, 0.25).start().stop()

    def calls_that_release_the_gil():  # pybind11's call guard
        while True:
            _core.device_count()

    def kernels_launched_and_waited_for():
        own, out = l2ctl.Stream(), l2ctl.DeviceBuffer(64 << 20)
        while True:
            with l2ctl.persist(own, buf, 1.0):
                kernels.reset_data(out, buf, own)
                own.synchronize()

    def a_kernel_compile():  # seconds of NVRTC with the GIL released
        candidates = _nvrtc.search_paths(_core.runtime_version() // 1000, _core.driver_version())
        while True:
            _core.kernel_image(90, True, candidates, "")

    work = {"with": (scopes_in_with_blocks, 1), "app": (app_lifetime_scopes, 12),
            "release": (calls_that_release_the_gil, 2), "compile": (a_kernel_compile, 1),
            "kernels": (kernels_launched_and_waited_for, 2), "mixed": (None, 0)}[mode]
    workers = [work] if mode != "mixed" else [(scopes_in_with_blocks, 2), (app_lifetime_scopes, 4),
                                              (calls_that_release_the_gil, 1)]
    for target, count in workers:
        for _ in range(count):
            threading.Thread(target=target, daemon=True).start()
    time.sleep(0.3 if mode != "compile" else 0.5)
""")


def _nvrtc_found() -> bool:
    try:
        _core.kernel_image(90, True, _nvrtc.search_paths(_core.runtime_version() // 1000, _core.driver_version()), "")
        return True
    except Exception:
        return False


def _exits_cleanly(mode: str, backend: str) -> None:
    for run in range(RUNS):
        out = subprocess.run([sys.executable, "-c", PROGRAM, mode, backend], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, (run, out.returncode, out.stderr[-2000:])
        assert "terminate called" not in out.stderr and "Fatal Python error" not in out.stderr, out.stderr[-2000:]
        state = json.loads(out.stdout.strip().splitlines()[-1])
        assert state["restored"], (run, state)
        assert "restored every device at interpreter exit" in state["late"], state


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["with", "app", "release", "mixed", "compile"])
def test_daemon_threads_inside_l2ctl_at_exit_never_crash_and_the_device_is_restored(mode):
    if mode == "compile" and not _nvrtc_found():
        pytest.skip("no NVRTC on this machine: the compile case needs one")
    _exits_cleanly(mode, "simulated")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["with", "app", "release", "kernels", "mixed"])
def test_gpu_daemon_threads_inside_l2ctl_at_exit_never_crash_and_the_device_is_restored(mode):
    _exits_cleanly(mode, "cuda")
