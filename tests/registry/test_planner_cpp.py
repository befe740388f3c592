"""The planner's C++ unit tests (tests/registry/cpp/test_planner.cpp): built with the C++ compiler at hand from
src/l2ctl/planner.cpp (plain C++17, no Python, no CUDA) and run; each of its cases is reported here. Skipped
with the reason where there is no compiler or no source tree (a wheel tested outside its checkout)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "tests" / "registry" / "cpp" / "test_planner.cpp", ROOT / "src" / "l2ctl" / "planner.cpp"]
CASES = 13  # the run(...) calls in test_planner.cpp


@pytest.fixture(scope="module")
def planner_tests(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    if not all(p.exists() for p in SOURCES):
        pytest.skip("the C++ sources are not here (testing an installed wheel outside its checkout)")
    binary = tmp_path_factory.mktemp("planner") / "test_planner"
    build = subprocess.run([compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{ROOT / 'src'}",
                            *map(str, SOURCES), "-o", str(binary)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    return run.returncode, run.stdout + run.stderr


def test_every_case_of_the_planners_unit_tests_passes(planner_tests: tuple[int, str]) -> None:
    returncode, report = planner_tests
    failed = [line for line in report.splitlines() if line.startswith("FAIL")]
    passed = [line for line in report.splitlines() if line.startswith("ok ")]
    assert not failed and returncode == 0, report
    assert len(passed) == CASES, report
