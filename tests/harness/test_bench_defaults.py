"""scripts/bench_defaults.py (issue 42, item 3) end to end on the simulator, and the results table made from its
record (scripts/make_results.py): the GPU run is the lead's; here the script's arms, verification and record."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import make_results  # noqa: E402


def test_quick_run_on_the_simulator_and_its_table(tmp_path, monkeypatch):
    out = tmp_path / "h200" / "defaults.json"
    out.parent.mkdir()
    env = {**os.environ, "L2CTL_SIMULATE": "h200"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_defaults.py"), "--quick", "--json", str(out),
                           "--workloads", "broadcast,albatross"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert record["environment"]["simulated"]
    by_name = {r["workload"]: r for r in record["results"]}
    stand_in = by_name["albatross"]
    cap = stand_in["tax_free_cap"]
    assert stand_in["target"] == "graph" and stand_in["granted"] == cap < stand_in["window_bytes"]
    assert stand_in["first_bytes"] == cap // 256 * 256 and not stand_in["forms_identical"]
    assert abs(stand_in["whole_hit_ratio"] - cap / stand_in["window_bytes"]) < 1e-12
    for r in record["results"]:
        assert r["verified"] == {"none": True, "whole": True, "first": True}
        assert set(r["speedup"]) == {"whole", "first"} and r["winner"] in ("first", "whole", "tie")
    assert record["summary"]["keep"] in ("first", "whole", "neither")

    monkeypatch.setattr(make_results, "RECORDS", tmp_path)
    table = make_results.defaults_table("h200")
    assert "| albatross | graph |" in table and "(simulated)" in table and "every output verified" in table
    assert make_results.defaults_table("h100") == ""  # no record: no table
