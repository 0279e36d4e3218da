"""Notebooks run top to bottom in a real Jupyter kernel."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", subprocess_env()["XLA_FLAGS"])  # one CPU device in the kernel, as in Colab's
  monkeypatch.setenv("JAXRLHF_NOTEBOOK_STEPS", "20")
  path = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
  notebook = nbformat.read(path, as_version=4)
  NotebookClient(
    notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}
  ).execute()
  outputs = "".join(
    o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
  )
  assert "val-core/jaxrlhf/recall/reward/mean@1" in outputs
  image_cell = notebook.cells[4]
  assert any("image/png" in o.get("data", {}) for o in image_cell.outputs)


def _execute(name, monkeypatch, steps):
  monkeypatch.setenv("XLA_FLAGS", subprocess_env()["XLA_FLAGS"])  # one CPU device, as in Colab's CPU runtime
  monkeypatch.setenv("JAXRLHF_NOTEBOOK_STEPS", str(steps))
  for key in ("JAXRLHF_MODEL_PATH", "JAXRLHF_DATA_DIR"):
    monkeypatch.delenv(key, raising=False)  # the notebook builds its tiny model and data
  notebook = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
  NotebookClient(
    notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}
  ).execute()
  return notebook


def _images(notebook) -> int:
  return sum(
    "image/png" in o.get("data", {}) for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
  )


@pytest.mark.slow
def test_grpo_notebook_draws_validation_and_samples(monkeypatch):
  notebook = _execute("grpo_gsm8k.ipynb", monkeypatch, steps=4)
  assert _images(notebook) == 1
  html = "".join(o.get("data", {}).get("text/html", "") for o in notebook.cells[-1].outputs)
  assert "<th>response</th>" in html and html.count("<tr>") >= 2
  assert "<tr><td><pre></pre></td>" not in html  # every sample shows its prompt (val_generations.jsonl's keys)
  run_dir = os.path.join(ROOT, "runs", "notebook_grpo", "quickstart", "recall_grpo")
  assert os.path.exists(os.path.join(run_dir, "validation_curve.png"))


@pytest.mark.slow
def test_one_step_notebook_draws_the_tokens(monkeypatch):
  notebook = _execute("inside_one_ppo_step.ipynb", monkeypatch, steps=1)
  assert _images(notebook) == 2
  text = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
  assert "clip fraction after the update" in text
  run_dir = os.path.join(ROOT, "runs", "notebook_one_step", "quickstart", "recall_ppo")
  for figure in ("one_step_tokens.png", "one_step_ratio.png"):
    assert os.path.exists(os.path.join(run_dir, figure))


def test_the_docs_link_every_notebook():
  page = open(os.path.join(ROOT, "docs", "quickstarts.md")).read()  # the README links it for the notebooks
  section = page.split("## Notebooks", 1)[1].split("\n## ", 1)[0]
  for name in sorted(os.listdir(os.path.join(ROOT, "notebooks"))):
    if name.endswith(".ipynb"):
      assert f"(../notebooks/{name})" in section, name
      notebook = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
      assert not any(cell.get("outputs") for cell in notebook.cells), f"{name}: commit it without outputs"
