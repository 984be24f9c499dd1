"""Execute notebooks/finetune_calibrate.ipynb on a tiny BANKING77 subset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("peft")
pytestmark = [pytest.mark.slow, pytest.mark.integration]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "finetune_calibrate.ipynb"


def test_notebook_is_committed_with_its_outputs() -> None:
    from test_notebooks import saved_outputs_are_a_clean_run

    outputs = saved_outputs_are_a_clean_run(NOTEBOOK)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "fine-tuned, calibrated" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # both diagrams


def test_notebook_runs_on_a_small_subset(banking77_dir, tmp_path, monkeypatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        "NB_LABELS": "4",
        "NB_PER_LABEL": "5",
        "NB_TEST_PER_LABEL": "4",
        "NB_EPOCHS": "1",
        "NB_LORA_RANK": "2",
        "CLEF_DATA_DIR": str(banking77_dir.parent),
        "NB_OUT": str(tmp_path / "model"),
        "HF_HUB_OFFLINE": "1",
    }
    root = str(NOTEBOOK.parents[1])  # the kernel imports this checkout's engine
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    assert (tmp_path / "model" / "reliability-raw.png").stat().st_size > 0
    assert (tmp_path / "model" / "reliability-calibrated.png").is_file()
    assert (tmp_path / "model" / "head.safetensors").is_file()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "fine-tuned, calibrated" in outputs
    assert os.environ["NB_LABELS"] == "4"
