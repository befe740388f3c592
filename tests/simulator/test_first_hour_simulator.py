"""Issue 43, the first hour, on the simulator's switch and versions: an L2CTL_SIMULATE that names no GPU is an
error at the first device call, device_count() included, and the simulated runtime is the build's."""

from __future__ import annotations

import os
import subprocess
import sys

import l2ctl
from l2ctl import _core, cli
from l2ctl.testing import FakeBackend, FakeDevice


def test_an_unknown_simulate_value_is_an_error_at_device_count():
    code = "import l2ctl; print(l2ctl.device_count())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "L2CTL_SIMULATE": "garbage"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout  # was 0, printing 0, with nothing on stderr
    assert "NoDeviceError" in out.stderr and "L2CTL_SIMULATE='garbage'" in out.stderr and "h100" in out.stderr


def test_a_machine_without_gpus_still_counts_zero():
    with FakeBackend.without_devices().install():
        assert l2ctl.device_count() == 0


def test_the_simulated_runtime_is_the_builds(monkeypatch, capsys):
    monkeypatch.setattr(_core, "runtime_version", lambda: 12090)  # a CUDA 12.9 build
    with FakeBackend.installed(FakeDevice.h100()):
        assert l2ctl.versions()["runtime"] == 12090
        assert cli.main(["info"]) == 0
    assert "runtime 12.9" in capsys.readouterr().out
