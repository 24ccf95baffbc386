"""Both notebooks run top to bottom (nbclient, the python3 kernel of this environment), in a scratch folder."""

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _execute(name: str, tmp_path) -> nbformat.NotebookNode:
    path = tmp_path / name
    shutil.copy(NOTEBOOKS / name, path)
    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook


def _text(notebook) -> str:
    return "\n".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream")


def test_quickstart_trains_and_plots(tmp_path):
    notebook = _execute("01_quickstart.ipynb", tmp_path)
    text = _text(notebook)
    before, after = (float(x) for x in text.split("held-out accuracy ")[1].split()[0::2][:2])
    assert after > before, text[-500:]
    images = [out for cell in notebook.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) == 1


def test_anatomy_of_a_step_shows_every_tensor(tmp_path):
    text = _text(_execute("02_anatomy_of_a_step.ipynb", tmp_path))
    for shown in ("prompt_ids (12,", "response_mask", "group_ids", "per function", "advantages", "old log-probs",
                  "KL to the reference (k3), zero before any update: 0.0", "loss", "change of each response"):
        assert shown in text, shown
    assert "every response with an advantage moved its way: True" in text


def test_notebooks_match_their_builder(tmp_path):
    """notebooks/build.py is the source: the committed notebooks are what it writes."""
    import runpy

    module = runpy.run_path(str(NOTEBOOKS / "build.py"))
    for name, cells in (("01_quickstart.ipynb", module["QUICKSTART"]), ("02_anatomy_of_a_step.ipynb", module["ANATOMY"])):
        module["build"](cells, tmp_path / name)
        assert (tmp_path / name).read_text() == (NOTEBOOKS / name).read_text(), f"run python notebooks/build.py ({name})"
