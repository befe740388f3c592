"""The API reference (docs/api/, Sphinx autodoc over the public modules) builds without a warning, and its doctests
pass on the simulated H100: the two commands docs/api/conf.py names, in a subprocess each."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_the_api_reference_builds_without_warnings(builder, tmp_path):
    pytest.importorskip("sphinx.cmd.build", reason="Sphinx is installed by the [dev] extra")
    # The doctests' outputs are the simulated H100's, whatever the caller's L2CTL_SIMULATE says.
    env = {**os.environ, "L2CTL_SIMULATE": "h100"}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-E", "-b", builder,
         str(ROOT / "docs" / "api"), str(tmp_path / builder), "-d", str(tmp_path / "doctrees")],
        capture_output=True, text=True, env=env, timeout=300)
    report = tmp_path / builder / "output.txt"
    assert result.returncode == 0, (f"sphinx-build -b {builder} failed:\n{result.stdout}\n{result.stderr}"
                                    + (report.read_text() if report.exists() else ""))
