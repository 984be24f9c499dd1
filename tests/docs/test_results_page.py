"""docs/results.md is generated from benchmarks/results/*.json and kept up to date.

The generator runs as a command (tests never import benchmarks/): a results file committed
without regenerating the page fails here with the command to run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.results_md", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_results_page_is_up_to_date() -> None:
    done = _generate("--check")
    assert done.returncode == 0, done.stderr + "\nrun: python -m benchmarks.results_md"


def test_every_results_file_is_on_the_page_with_its_machine() -> None:
    page = (ROOT / "docs" / "results.md").read_text()
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert f"`benchmarks/results/{path.name}`" in page
    # The general model's numbers name the machine they ran on (cpu, cores, date).
    general = json.loads((ROOT / "benchmarks/results/general_model.json").read_text())
    info = general["general"]["machine"]
    assert f"{info['cpu']}, {info['cores']} cores" in page and info["date"] in page


def test_a_new_results_file_is_listed_and_a_stale_page_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "new_probe.json").write_text(
        json.dumps({"run": {"accuracy": 0.875, "ece": 0.0123, "cpu": "Test CPU"}})
    )
    page = tmp_path / "results.md"
    made = _generate("--results", str(results), "--out", str(page))
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    assert "`benchmarks/results/new_probe.json`" in text
    assert "| `run` | – | 87.50 % | – | 0.0123 | Test CPU |" in text
    assert _generate("--results", str(results), "--out", str(page), "--check").returncode == 0
    page.write_text(text.replace("87.50", "88.00"))
    stale = _generate("--results", str(results), "--out", str(page), "--check")
    assert stale.returncode == 1 and "python -m benchmarks.results_md" in stale.stderr
