"""Every example notebook runs headless (nbclient) and ends where its walk-through says.

Each problem notebook must show its category in ``%classify``'s output, end with ``Verify:
resolved`` and write its record notebook; the healthy one is classified healthy and exported.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("torch")
pytest.importorskip("nbclient")

HERE = Path(__file__).resolve().parent.parent / "example_notebooks"
CATEGORIES = ("loss_not_decreasing", "overfitting", "gradient_instability", "memory_issue",
              "performance_issue", "convergence_to_wrong_solution")


def execute(name: str, cwd: Path) -> list[str]:
    """Run a notebook in ``cwd``; the text of each code cell's outputs, in order."""
    from nbclient import NotebookClient

    nb = nbformat.read(HERE / name, as_version=4)
    env_before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "PYTHONPATH")}
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent)] + ([env_before["PYTHONPATH"]] if env_before["PYTHONPATH"] else []))
    try:
        NotebookClient(nb, timeout=240, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            texts.append("\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                                   for o in cell.outputs))
    return texts


def test_every_category_has_a_notebook():
    names = {p.name for p in HERE.glob("*.ipynb")}
    assert names >= {f"{c}.ipynb" for c in CATEGORIES} | {"healthy.ipynb"}


@pytest.mark.slow
@pytest.mark.parametrize("category", CATEGORIES)
def test_walkthrough_notebook(category, tmp_path):
    _walkthrough(category, category, tmp_path)


@pytest.mark.slow
def test_keras_notebook(tmp_path):
    pytest.importorskip("tensorflow")
    _walkthrough("keras_loss_not_decreasing", "loss_not_decreasing", tmp_path)


def _walkthrough(name: str, category: str, tmp_path: Path) -> None:
    outs = execute(f"{name}.ipynb", tmp_path)
    text = "\n".join(outs)
    classify = next(o for o in outs if o.startswith("Classification:"))
    assert classify.startswith(f"Classification: {category} "), classify
    assert re.search(r"\[confirmed\] \w+", text), "Isolate confirmed nothing"
    assert "approved: the fix for" in text
    verdicts = re.findall(r"^Verify: (\w+)", text, flags=re.MULTILINE)
    assert verdicts == ["resolved"], text[-3000:]
    assert (tmp_path / f"{name}_record.ipynb").exists()
    record = nbformat.read(tmp_path / f"{name}_record.ipynb", as_version=4)
    nbformat.validate(record)
    shutil.rmtree(tmp_path / ".model_debugger", ignore_errors=True)


@pytest.mark.slow
def test_healthy_notebook(tmp_path):
    outs = execute("healthy.ipynb", tmp_path)
    text = "\n".join(outs)
    assert "Classification: healthy" in text
    assert "fix allowed: False" in text
    assert "Verify:" not in text
    assert (tmp_path / "healthy_record.ipynb").exists()


def test_notebooks_match_their_builder():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build", HERE / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for name, nb in build.notebooks().items():
        on_disk = nbformat.read(HERE / name, as_version=4)
        assert [c.source for c in on_disk.cells] == [c.source for c in nb.cells], name
