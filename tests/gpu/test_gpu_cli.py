"""The command line on a real GPU: its CSV names the GPU and carries no simulator's mark, and an output smaller
than this GPU's L2 is refused before anything runs."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import pytest

import l2ctl

pytestmark = pytest.mark.gpu


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "L2CTL_SIMULATE"}  # the real GPU, whatever the caller set
    return subprocess.run([sys.executable, "-m", "l2ctl", *args], capture_output=True, text=True, timeout=300, env=env)


def test_a_measured_csv_names_the_gpu_and_no_simulator(gpu_state):
    r = _run("bench", "stride", "--strides", "4,8", "--repeat", "2", "--warmup", "1", "--quiet", "--csv", "-")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    name = l2ctl.device_info().name
    assert [row["variant"] for row in rows] == ["4B", "8B"]
    assert all(row["device"] == name and row["simulated"] == "" for row in rows), rows
    assert "SIMULATED" not in r.stderr  # the table went to stderr: no simulator's line in it


def test_an_output_smaller_than_this_gpus_l2_is_refused(gpu_state):
    l2 = l2ctl.device_info().l2_cache_size
    r = _run("bench", "--out-bytes", str(l2 - 4096), "--quiet")
    assert r.returncode == 2 and "smaller than the L2" in r.stderr and r.stderr.count("\n") == 1, r.stderr
