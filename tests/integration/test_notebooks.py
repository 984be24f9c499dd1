"""notebooks/quickstart.ipynb: committed with its outputs, and still runs top to bottom."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


def saved_outputs_are_a_clean_run(path: Path) -> list:
    """Every code cell ran once, in order, without an error; returns the outputs."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]
    for cell in code:  # the library, not the engine folder, is what a user imports
        assert "clef_engine" not in cell.source
    return outputs


def test_quickstart_is_committed_with_its_outputs() -> None:
    outputs = saved_outputs_are_a_clean_run(NOTEBOOK)
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the reliability diagram


def test_quickstart_executes(banking77_dir: Path, tmp_path: Path, monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("langchain_core")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel inherits the environment: find the package and the data, stay offline.
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))
    monkeypatch.setenv("CLEF_DATA_DIR", str(banking77_dir.parent))
    monkeypatch.setenv("NB_OUT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "accuracy" in text and "ECE" in text
    assert "route:" in text and "source:" in text
    assert (tmp_path / "reliability-quickstart.png").stat().st_size > 0
