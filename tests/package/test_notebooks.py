"""The notebooks: structure and compiling code without a GPU; executed in a real Jupyter kernel
(nbclient) on the GPU. Set L2CTL_NOTEBOOK_OUT=dir to keep the executed copies (they are committed)."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


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
