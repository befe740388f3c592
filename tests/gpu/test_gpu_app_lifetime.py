"""On the GPU (issue 34): a "no persistence" scope describes itself, an app-lifetime scope is restored at stop()
and when its object is collected, clamping on request, and the app-lifetime example (examples/app_lifetime.py)
runs, verifies its outputs, leaves the device as found and writes its record (L2CTL_APP_LIFETIME_JSON names
the file; the numbers are for a person to read: no test asserts a time)."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys

import pytest

import l2ctl

pytestmark = pytest.mark.gpu
MiB = 1 << 20
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "app_lifetime.py"


def test_a_no_persistence_scope_describes_itself(stream):
    with l2ctl.DeviceBuffer(4 * MiB) as buf:
        before = (l2ctl.get_set_aside(), l2ctl.get_window(stream))
        with l2ctl.persist(stream, buf, policy=l2ctl.Policy(enabled=False)) as p:
            assert p.reason == "the policy is disabled" and not p.active
            assert p.window == l2ctl.AccessPolicyWindow() and p.set_aside == before[0]
            assert p.device == l2ctl.device_info().index and p.stream == stream.handle
            assert (l2ctl.get_set_aside(), l2ctl.get_window(stream)) == before


def test_an_app_scope_is_restored_at_stop_and_when_collected(stream):
    step = l2ctl.set_aside_granularity()
    with l2ctl.DeviceBuffer(4 * MiB) as buf:
        before = (l2ctl.get_set_aside(), l2ctl.get_window(stream))
        asked = before[0] + step if before[0] + step <= l2ctl.device_info().persisting_l2_cache_max_size else step
        p = l2ctl.persist(stream, buf, 1.0, set_aside=asked).start()
        assert l2ctl.get_set_aside() == asked and l2ctl.get_window(stream).num_bytes == 4 * MiB
        p.stop()
        assert (l2ctl.get_set_aside(), l2ctl.get_window(stream)) == before
        p = l2ctl.persist(stream, buf, 1.0, set_aside=asked).start()
        del p
        gc.collect()
        assert (l2ctl.get_set_aside(), l2ctl.get_window(stream)) == before


def test_a_set_aside_above_the_max_is_clamped_on_request(stream):
    maximum = l2ctl.device_info().persisting_l2_cache_max_size
    with l2ctl.DeviceBuffer(4 * MiB) as buf:
        with pytest.raises(ValueError, match="clamp=True"):
            l2ctl.persist(stream, buf, 1.0, set_aside=maximum + 1).start()
        with pytest.warns(l2ctl.SetAsideClampedWarning, match=f"clamped to {maximum} bytes"):
            with l2ctl.persist(stream, buf, 1.0, set_aside=maximum + 1, clamp=True) as p:
                assert p.set_aside == maximum == l2ctl.get_set_aside()


def test_the_app_lifetime_example(gpu_state, tmp_path):
    out = pathlib.Path(os.environ.get("L2CTL_APP_LIFETIME_JSON", str(tmp_path / "app_lifetime.json")))
    env = {k: v for k, v in os.environ.items() if k != "L2CTL_SIMULATE"}
    run = subprocess.run([sys.executable, str(EXAMPLE), "--json", str(out)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads(out.read_text())
    assert record["verified"] and record["device_restored"] and not record["environment"]["simulated"]
    assert record["config"]["helper_set_aside"] > record["environment"]["device"]["persisting_limit_at_start"]
    assert set(record["median_step_ms"]) == {"baseline", "helper", "l2ctl"}
    print(run.stdout)
