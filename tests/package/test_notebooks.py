"""The notebooks: structure and compiling code without a GPU; every notebook's code run to the end on the
simulated H100 (L2CTL_SIMULATE, no Jupyter needed); executed in a real Jupyter kernel (nbclient) on the GPU.
Set L2CTL_NOTEBOOK_OUT=dir to keep the executed copies (they are committed)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = pathlib.Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))  # not a run's copy (the README's simulated.ipynb)
#: Cells (indices in the notebook) whose code scripts/make_notebooks.py has changed since the committed copy was
#: executed on a GPU. Regenerate those notebooks, execute them on a GPU (see the test at the end), commit them and
#: empty their entry.
AWAITING_GPU_RUN: dict[str, tuple[int, ...]] = {}


def _generated() -> dict[str, object]:
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.BOOKS)


GENERATED = _generated()


def _code(cell) -> str:
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_there_are_five_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_structure_and_code_compiles(path):
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# ")
    kinds = [c.cell_type for c in book.cells]
    assert kinds.count("markdown") >= 2 and kinds.count("code") >= 3
    assert book.metadata["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(c for c in book.cells if c.cell_type == "code"):
        compile(_code(cell), f"{path.name}[code {i}]", "exec")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_with_gpu_outputs(path):
    """The committed copy carries the outputs of a GPU run, so the plots show without a GPU."""
    book = nbformat.read(path, as_version=4)
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert outputs, "no outputs: run the notebooks on a GPU (see README) and commit them"
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot in the outputs"
    assert book.metadata.get("l2ctl", {}).get("executed_on"), "metadata does not say which GPU produced the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_code_is_the_generators(path):
    """The committed notebooks carry the generator's cells, except the ones listed as awaiting a GPU run."""
    book, made = nbformat.read(path, as_version=4), GENERATED[path.name]
    assert [c.cell_type for c in book.cells] == [c.cell_type for c in made.cells]
    changed = tuple(i for i, (a, b) in enumerate(zip(book.cells, made.cells)) if a.source != b.source)
    assert changed == AWAITING_GPU_RUN.get(path.name, ()), (
        "the generator and the committed notebook differ in other cells than AWAITING_GPU_RUN says: regenerate "
        "the notebook, execute it on a GPU and commit it (or update the list, if a GPU run is planned)")


# Runs a notebook's code cells in order in one namespace, as a kernel would: magics are no-ops (the only one is
# %matplotlib inline; Agg draws instead), each cell's stdout kept; then the simulated machine's state.
RUNNER = r"""
import contextlib, io, json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
cells, namespace, outputs = json.load(open(sys.argv[1])), {"__name__": "__main__"}, []
for i, source in enumerate(cells):
    lines = [line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
             for line in source.splitlines()]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile("\n".join(lines), f"code cell {i}", "exec"), namespace)
    finally:
        print(f"--- code cell {i}\n{buf.getvalue()}", end="")
    outputs.append(buf.getvalue())
from l2ctl import _backend
machine = _backend.current()
device = machine.device(0)
json.dump({"outputs": outputs, "figures": len(plt.get_fignums()), "simulated": _backend.simulated(),
           "restored": device.limit == device.initial_limit and not machine.windows}, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_on_the_simulator(path, tmp_path):
    """The one switch (L2CTL_SIMULATE) runs each notebook to its end without a GPU or Jupyter, in a subprocess
    (the switch is process-wide), and its first output says the device is simulated. The code run is the
    generator's (the committed copy's, but for the cells AWAITING_GPU_RUN)."""
    cells = [c.source for c in GENERATED[path.name].cells if c.cell_type == "code"]
    (tmp_path / "cells.json").write_text(json.dumps(cells))
    out = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "cells.json"), str(tmp_path / "out.json")],
                         env={**os.environ, "L2CTL_SIMULATE": "h100", "MPLBACKEND": "Agg"}, cwd=path.parent,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    result = json.loads((tmp_path / "out.json").read_text())
    outputs = result["outputs"]
    assert len(outputs) == len(cells) and "H100 80GB HBM3 (simulated):" in outputs[0]
    assert result["simulated"].startswith("simulated by l2ctl.testing") and result["restored"]
    if "import torch" in "".join(cells):  # PyTorch needs a real GPU: every torch cell says it skipped
        assert "the cells below are skipped" in outputs[0]
        assert all(o.startswith("skipped: PyTorch needs a CUDA GPU (this one is simulated)") for o in outputs[1:])
    else:
        assert result["figures"] > 0 and not any("skipped" in o for o in outputs)


def test_the_readmes_simulated_jupyter_run_works(tmp_path):
    """The README's line for running a notebook without a GPU, run as written: a Jupyter kernel started with
    L2CTL_SIMULATE runs the notebook to its end, and says it is simulated."""
    import re
    import shutil

    command = re.search(r"`L2CTL_SIMULATE=(\w+) jupyter execute --output=\S+ (\S+)`", (ROOT / "README.md").read_text())
    assert command, "the README no longer says how to run a notebook on the simulator"
    jupyter = shutil.which("jupyter-execute", path=os.path.dirname(sys.executable)) or shutil.which("jupyter-execute")
    if jupyter is None or importlib.util.find_spec("ipykernel") is None:
        pytest.skip("needs nbclient and ipykernel: pip install '.[notebooks]'")
    out = tmp_path / "executed.ipynb"
    r = subprocess.run([jupyter, f"--output={out}", command.group(2)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "L2CTL_SIMULATE": command.group(1), "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = "".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "(simulated)" in said and "L2CTL_SIMULATE is set: simulated by l2ctl.testing" in said


def test_the_readmes_notebook_command_keeps_what_it_ran():
    """`jupyter execute` alone runs a notebook and throws its outputs away: the README's line writes them to a
    notebook of their own (not over the committed GPU run), which the [notebooks] extra can run (nbclient 0.10
    has --output) and open (JupyterLab)."""
    import re

    readme = (ROOT / "README.md").read_text()
    command = re.search(r"`L2CTL_SIMULATE=\w+ jupyter execute --output=(\w+) notebooks/(\S+)`", readme)
    assert command, "the README's notebook command does not keep its results (--output=NAME)"
    assert f"notebooks/{command.group(1)}.ipynb" in readme, "the README does not say where the results go"
    assert command.group(1) + ".ipynb" != command.group(2), "the run would overwrite the committed GPU outputs"
    assert f"/notebooks/{command.group(1)}.ipynb" in (ROOT / ".gitignore").read_text().splitlines()
    extra = re.search(r"^notebooks = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert extra, "pyproject.toml has no [notebooks] extra"
    needs = dict(re.findall(r'"([\w-]+)>=([\d.]+)"', extra.group(1)))
    assert tuple(map(int, needs.get("nbclient", "0").split("."))) >= (0, 10), "jupyter execute --output needs nbclient 0.10"
    assert "ipykernel" in needs and ({"jupyterlab", "notebook"} & set(needs)), "nothing to run or open a notebook with"


def test_the_gpu_only_notebook_says_so_first():
    """A notebook whose cells all skip on the simulator says, in its first cell, that it needs a GPU."""
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        if any("import torch" in c.source for c in book.cells):
            assert "needs a CUDA GPU" in book.cells[0].source and "simulator" in book.cells[0].source, path.name


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_executes_in_a_jupyter_kernel(path, gpu_state):
    nbclient = pytest.importorskip("nbclient", reason="nbclient and ipykernel are needed to execute notebooks")
    import l2ctl

    book = nbformat.read(path, as_version=4)
    if any("import torch" in c.source for c in book.cells) and importlib.util.find_spec("torch") is None:
        pytest.skip("this notebook needs PyTorch")
    for cell in book.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any("image/png" in o.get("data", {}) for c in book.cells if c.cell_type == "code" for o in c.outputs)
    info = l2ctl.device_info()
    book.metadata["l2ctl"] = {"executed_on": info.name, "driver": l2ctl.versions()["driver"], "l2ctl": l2ctl.__version__}
    out = os.environ.get("L2CTL_NOTEBOOK_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        nbformat.write(book, os.path.join(out, path.name))
