"""The README's Python examples: each type-checks under mypy --strict and pyright; each that needs no
third-party GPU library runs to completion on the simulated H100, and each that needs PyTorch runs on the
GPU, leaving the device as it found it."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

from l2ctl.testing import FakeBackend, FakeDevice

ROOT = pathlib.Path(__file__).parents[2]
README = ROOT / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
NEEDS_FRAMEWORK = re.compile(r"^\s*import (torch|cupy)", re.M)


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 3


#: The examples that need no framework run on the simulator; torch needs a CUDA device, so those run in
#: test_torch_example_runs_on_the_gpu (and are type-checked everywhere).
SIMULATED_EXAMPLES = [i for i, code in enumerate(EXAMPLES) if not NEEDS_FRAMEWORK.search(code)]


def test_every_example_runs_somewhere():
    assert sorted(SIMULATED_EXAMPLES + TORCH_EXAMPLES) == list(range(len(EXAMPLES)))


@pytest.mark.parametrize("index", SIMULATED_EXAMPLES)
def test_example_runs_on_the_simulator(index):
    code = EXAMPLES[index]
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        exec(compile(code, f"README.md example {index + 1}", "exec"), {"__name__": "__readme__"})
        assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


TORCH_EXAMPLES = [i for i, code in enumerate(EXAMPLES) if re.search(r"^\s*import torch", code, re.M)]

#: docs/reference.md's Python examples: each is pasted as it stands (its imports included) and runs on the simulator.
REFERENCE_EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "reference.md").read_text(), re.S)


def test_the_reference_has_examples():
    assert REFERENCE_EXAMPLES


@pytest.mark.parametrize("index", range(len(REFERENCE_EXAMPLES)))
def test_reference_example_runs_on_the_simulator(index):
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        exec(compile(REFERENCE_EXAMPLES[index], f"docs/reference.md example {index + 1}", "exec"),
             {"__name__": "__reference__"})
        assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


@pytest.mark.gpu
@pytest.mark.parametrize("index", TORCH_EXAMPLES)
def test_torch_example_runs_on_the_gpu(index, gpu_state, monkeypatch):
    torch = pytest.importorskip("torch", reason="the example needs PyTorch")
    # a module torch.compile can find by name, as a user's script is (Dynamo reads sys.modules[f.__module__])
    module = types.ModuleType("__readme__")
    monkeypatch.setitem(sys.modules, "__readme__", module)
    try:
        exec(compile(EXAMPLES[index], f"README.md example {index + 1}", "exec"), module.__dict__)
        torch.cuda.synchronize()
    finally:
        torch.compiler.reset()


@pytest.fixture(scope="module")
def example_files(tmp_path_factory: pytest.TempPathFactory) -> list[pathlib.Path]:
    folder = tmp_path_factory.mktemp("readme")
    paths = []
    for i, code in enumerate(EXAMPLES):
        path = folder / f"example_{i + 1}.py"
        path.write_text(code)
        paths.append(path)
    return paths


def _python_path() -> str:
    # The source tree: its stub (_core.pyi) describes the extension, wherever the package is installed.
    return str(ROOT / "python")


def test_examples_pass_mypy_strict(example_files):
    pytest.importorskip("mypy", reason="mypy is installed by the [dev] extra")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
                          *map(str, example_files)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_examples_pass_pyright(example_files, tmp_path):
    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is installed by the [dev] extra")
    config = tmp_path / "pyrightconfig.json"
    config.write_text('{"typeCheckingMode": "standard", "reportMissingImports": "none", '
                      '"reportMissingModuleSource": "none", "extraPaths": ["%s"]}' % _python_path())
    out = subprocess.run([pyright, "--project", str(config), *map(str, example_files)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_package_passes_mypy_strict():
    pytest.importorskip("mypy", reason="mypy is installed by the [dev] extra")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "l2ctl"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
