"""examples/app_lifetime.py on the simulator (the GPU suite runs it on a GPU: tests/gpu/test_gpu_app_lifetime.py):
it serves the model three ways, verifies every output, leaves the simulated device as found and writes a record
that says it was simulated."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "app_lifetime.py"


def test_the_app_lifetime_example_runs_simulated(tmp_path):
    out = tmp_path / "app_lifetime.json"
    env = {**os.environ, "L2CTL_SIMULATE": "h100"}
    run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "2", "--rounds", "3", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads(out.read_text())
    assert record["verified"] and record["device_restored"]
    assert "simulated" in record["environment"]["simulated"] and "SIMULATED" in run.stdout
    device = record["environment"]["device"]
    # sizes from the device's L2, not constants; the helper really set a limit above the driver's default
    assert record["config"]["table_bytes"] == device["l2_cache_size"] // 4 // (1 << 20) * (1 << 20)
    assert record["config"]["out_bytes"] == 20 * device["l2_cache_size"]
    assert record["config"]["helper_set_aside"] > device["persisting_limit_at_start"]
    assert all(len(run_["step_ms"]) == 3 for way in record["runs"].values() for run_ in way)
    # the model charges a set-aside's tax to a copy that has no window: the helper's harm shows in the record
    assert record["helper_harm"]["copy_slowdown"] > 1.0
    assert record["l2ctl_scope"]["reason"] is None or "no persistence" in record["l2ctl_scope"]["reason"]
