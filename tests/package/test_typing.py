"""The public API as a user's type checker sees it: a script using it passes pyright (strict) and mypy
(--strict --disallow-any-expr), and arguments given in the wrong order (a buffer for a stream, a stream for a
buffer), a set-aside that is no request (``set_aside="lots"``: bytes, "auto", "max" or None), and a misspelt keyword
of a tuned policy's persist (``strcit=False``), are errors on their lines for both."""

from __future__ import annotations

import json
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys

import pytest

from l2ctl.testing import FakeBackend, FakeDevice

ROOT = pathlib.Path(__file__).parents[2]
USER_SCRIPT = pathlib.Path(__file__).with_name("typing_user_script.py")

# Every line marked "wrong" must be an error for both checkers, and no other line.
WRONG_SCRIPT = """\
import l2ctl
from l2ctl import DeviceBuffer, Event, Stream


def swapped(stream: Stream, buf: DeviceBuffer, event: Event) -> None:
    l2ctl.persist(buf, stream, 0.75)  # wrong
    l2ctl.persist(stream, buf, 0.75)
    l2ctl.kernels.write_index(stream, buf)  # wrong
    l2ctl.kernels.write_index(buf, stream)
    l2ctl.graph.capture(buf)  # wrong
    event.record(buf)  # wrong
    stream.wait(buf)  # wrong
    l2ctl.persist(stream, buf, 0.75, set_aside="lots")  # wrong
    l2ctl.persist(stream, buf, 0.75, set_aside="max")
    l2ctl.Policy(set_aside="lots")  # wrong
    l2ctl.set_aside("lots")  # wrong


def tuned_keywords(stream: Stream, tuned: l2ctl.TunedPolicy) -> None:
    tuned.persist(stream, strcit=False)  # wrong
    tuned.persist(stream, strict=False, reset_on_exit=False)
"""
WRONG_LINES = {i for i, line in enumerate(WRONG_SCRIPT.splitlines(), 1) if line.endswith("# wrong")}
PERSIST_LINE = min(WRONG_LINES)


def _pyright() -> str:
    # The interpreter's own environment first (a venv not activated), then PATH, as test_readme.py does.
    here = os.path.join(os.path.dirname(sys.executable), "pyright")
    found = here if os.path.exists(here) else shutil.which("pyright")
    if found is None:
        pytest.skip("pyright is installed by the [dev] extra")
    return found


def _pyright_errors(script: pathlib.Path, tmp_path: pathlib.Path) -> list[tuple[int, str]]:
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"typeCheckingMode": "strict", "reportMissingModuleSource": "none",
                                  "extraPaths": [str(ROOT / "python")]}))  # the source tree: its stub types _core
    out = subprocess.run([_pyright(), "--outputjson", "--project", str(config), "--pythonpath", sys.executable,
                          str(script)], capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"pyright did not report (exit {out.returncode}): {out.stdout}{out.stderr}") from None
    return [(d["range"]["start"]["line"] + 1, d["message"]) for d in report["generalDiagnostics"]
            if d["severity"] == "error"]


def _mypy_errors(script: pathlib.Path) -> list[tuple[int, str]]:
    pytest.importorskip("mypy", reason="mypy is installed by the [dev] extra")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
                          "--no-incremental", str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    found = re.finditer(rf"^{re.escape(str(script))}:(\d+): error: (.*)$", out.stdout, re.M)
    errors = [(int(m[1]), m[2]) for m in found]
    elsewhere = [line for line in out.stdout.splitlines() if ": error:" in line and not line.startswith(f"{script}:")]
    assert out.returncode == (1 if errors else 0) and not elsewhere, out.stdout + out.stderr
    return errors


@pytest.fixture
def wrong_script(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "wrong_order.py"
    path.write_text(WRONG_SCRIPT)
    return path


def test_the_user_script_passes_pyright_strict(tmp_path):
    errors = _pyright_errors(USER_SCRIPT, tmp_path)
    assert not errors, errors


def test_the_user_script_passes_mypy_strict_with_no_any():  # its first line: "# mypy: disallow-any-expr"
    errors = _mypy_errors(USER_SCRIPT)
    assert not errors, errors


def test_the_user_script_runs_on_the_simulator():
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        runpy.run_path(str(USER_SCRIPT), run_name="__main__")
        assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


def _check_wrong(errors: list[tuple[int, str]], checker: str) -> None:
    assert {line for line, _ in errors} == WRONG_LINES, (checker, errors)
    persist = [message for line, message in errors if line == PERSIST_LINE]
    assert len(persist) == 2, (checker, persist)  # both the stream and the buffer refused


def test_pyright_rejects_arguments_in_the_wrong_order(wrong_script, tmp_path):
    _check_wrong(_pyright_errors(wrong_script, tmp_path), "pyright")


def test_mypy_rejects_arguments_in_the_wrong_order(wrong_script):
    _check_wrong(_mypy_errors(wrong_script), "mypy")
