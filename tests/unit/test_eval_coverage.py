"""Accuracy-coverage curves and per-row predictions: the math, and ``clef-agents eval``'s
``--plot`` (curve beside the reliability diagram) and ``--predictions``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clef_agents.cli import main
from clef_engine.evaluation import coverage_curve, decided_at_precision
from clef_engine.runtime.thresholds import fit_rows
from clef_engine.schema.questions import Choice
from clef_engine.testing import write_tiny_bert

# Top probabilities 0.9, 0.8, 0.7, 0.6 (rows 0-3); rows 0, 1, 3 right.
PROBS = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
LABELS = np.array([0, 1, 1, 1])


def test_curve_points_are_the_most_confident_rows() -> None:
    curve = coverage_curve(PROBS, LABELS, points=4)
    assert [c["threshold"] for c in curve] == [0.9, 0.8, 0.7, 0.6]
    assert [c["coverage"] for c in curve] == [0.25, 0.5, 0.75, 1.0]
    assert [c["accuracy"] for c in curve] == pytest.approx([1.0, 1.0, 2 / 3, 0.75])


def test_curve_keeps_ties_together() -> None:
    probs = np.array([[0.9, 0.1], [0.7, 0.3], [0.7, 0.3]])
    curve = coverage_curve(probs, np.array([0, 0, 1]), points=3)
    # Coverage 2/3 would split the two 0.7 rows: both are kept.
    assert [(c["coverage"], c["n"]) for c in curve] == [
        (pytest.approx(1 / 3), 1),
        (1.0, 3),
        (1.0, 3),
    ]


def test_decided_at_precision() -> None:
    assert decided_at_precision(PROBS, LABELS, 0.95) == {
        "coverage": 0.5,
        "threshold": 0.8,
        "accuracy": 1.0,
    }
    nothing = decided_at_precision(PROBS, np.array([1, 0, 0, 0]), 0.95)
    assert nothing["coverage"] == 0.0 and nothing["threshold"] is None


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    return write_tiny_bert(tmp_path / "model")


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    rows = ["text,label"]
    words = ["card", "refund", "login", "cash", "pin", "money"]
    for i in range(24):
        label = ("refund", "login", "card")[i % 3]
        rows.append(f"{words[i % 6]} {label} {i},{label}")
    path = tmp_path / "test.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _eval(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = main(["eval", *[str(a) for a in argv], "--json", "--no-progress"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def test_eval_writes_the_curve_beside_the_diagram_and_the_predictions(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path, tmp_path: Path
) -> None:
    plot, rows = tmp_path / "out" / "rel.png", tmp_path / "rows.jsonl"
    plot.parent.mkdir()
    code, summary, _ = _eval(
        capsys, data, "--model", model_dir, "--plot", plot, "--predictions", rows
    )
    assert code == 0
    assert plot.is_file() and (tmp_path / "out" / "rel-coverage.png").is_file()
    assert summary["coverage_json"] == str(tmp_path / "out" / "rel-coverage.json")
    curve = json.loads((tmp_path / "out" / "rel-coverage.json").read_text())
    assert curve["n"] == 24 and curve["curve"][-1]["coverage"] == 1.0
    assert curve["curve"][-1]["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-4)
    assert curve["at_95_precision"]["coverage"] == pytest.approx(
        summary["decided_at_95_precision"], abs=1e-4
    )
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(lines) == 24 and lines[0]["text"] == "card refund 0"
    assert sum(r["correct"] for r in lines) / 24 == pytest.approx(summary["accuracy"], abs=1e-4)
    for r in lines:
        assert set(r["probabilities"]) == {"card", "login", "refund"}
        assert sum(r["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
        assert r["probability"] == max(r["probabilities"].values())
        assert r["correct"] is (r["prediction"] == r["label"]) and r["abstained"] is None
    assert "saved_thresholds_decided" not in summary


def test_eval_reports_the_saved_thresholds(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path, tmp_path: Path
) -> None:
    question = Choice(criteria=["card", "login", "refund"])
    fit_rows(
        [(question, p, True) for p in np.linspace(0.34, 0.38, 10)],
        target_coverage=0.5,
        min_rows=10,
    ).save(model_dir)
    rows = tmp_path / "rows.jsonl"
    code, summary, _ = _eval(capsys, data, "--model", model_dir, "--predictions", rows)
    assert code == 0
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert all(isinstance(r["abstained"], bool) for r in lines)
    decided = [r for r in lines if not r["abstained"]]
    assert summary["saved_thresholds_decided"] == pytest.approx(len(decided) / 24, abs=1e-4)


def test_unwritable_outputs_fail_before_evaluating(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path, tmp_path: Path
) -> None:
    code, _, err = _eval(capsys, data, "--model", model_dir, "--predictions", tmp_path)
    assert code == 2 and "--predictions" in err and "is a directory" in err
    code, _, err = _eval(
        capsys, data, "--model", model_dir, "--plot", tmp_path / "missing" / "rel.png"
    )
    assert code == 2 and "--plot" in err
