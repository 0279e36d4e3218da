"""Notebooks run top to bottom in a real Jupyter kernel."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # one CPU device in the kernel, as in Colab's CPU runtime
  monkeypatch.setenv("JAXRLHF_NOTEBOOK_STEPS", "20")
  path = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
  notebook = nbformat.read(path, as_version=4)
  NotebookClient(notebook, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
  outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                    for o in cell.get("outputs", []))
  assert "val-core/jaxrlhf/recall/reward/mean@1" in outputs
  image_cell = notebook.cells[4]
  assert any("image/png" in o.get("data", {}) for o in image_cell.outputs)
