"""``clef-agents thresholds``: fits, saves into the model dir, reports; bad input is one line
and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clef_agents.cli import main
from clef_engine.runtime.thresholds import THRESHOLDS_FILE
from clef_engine.testing import write_tiny_bert

WORDS = ["card", "refund", "login", "cash", "pin", "money", "bug", "error", "help", "payment"]


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    return write_tiny_bert(tmp_path / "model")


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    rows = ["text,label"]
    for i in range(60):
        label = ("refund", "login", "card")[i % 3]
        rows.append(f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]} {label} {i},{label}")
    path = tmp_path / "heldout.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    capsys.readouterr()  # not the fixtures' output
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fits_saves_and_the_model_then_abstains(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path
) -> None:
    code, out, _ = _run(
        capsys, "thresholds", data, "--model", model_dir, "--target-coverage", "0.5",
        "--min-rows", "30", "--json",
    )  # fmt: skip
    assert code == 0
    report = json.loads(out)
    saved = json.loads((model_dir / THRESHOLDS_FILE).read_text())
    assert report["saved"] == str(model_dir / THRESHOLDS_FILE)
    assert saved["target"] == {"coverage": 0.5} and saved["type"]["choice"]["n"] == 60
    assert report["decided_automatically"] == pytest.approx(0.5, abs=0.05)
    (key,) = saved["question"]
    assert saved["names"][key] == "choice [card, login, refund]"
    # The model dir now answers that question with its saved threshold.
    code, out, _ = _run(
        capsys, "decide", "refund my card", "--model", model_dir,
        "--choice", "label=refund,login,card", "--json",
    )  # fmt: skip
    answer = json.loads(out)["answers"]["label"]
    assert code == 0 and answer["x_threshold"] == saved["question"][key]["threshold"]
    assert answer["x_abstained"] is (max(answer["probabilities"].values()) < answer["x_threshold"])


def test_table_output_and_dry_run(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path
) -> None:
    code, out, err = _run(
        capsys, "thresholds", data, "--model", model_dir, "--target-coverage", "0.8",
        "--min-rows", "30", "--dry-run",
    )  # fmt: skip
    assert code == 0
    assert "decided automatically: 80.0% of the answers at coverage 80.0%" in out
    assert "question  choice [card, login, refund]" in out
    assert not (model_dir / THRESHOLDS_FILE).exists() and "not written" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target-precision", "0.9", "--target-coverage", "0.5"], "not allowed with"),
        (["--target-precision", "1.5"], "must be in (0, 1]"),
        (["--min-rows", "0"], "must be >= 1"),
        (["--min-rows", "1000"], "no question type has 1000 (min_rows)"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], model_dir: Path, data: Path, extra: list[str], message: str
) -> None:
    code, _, err = _run(capsys, "thresholds", data, "--model", model_dir, *extra)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_needs_a_model_dir_to_save_into(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    code, _, err = _run(capsys, "thresholds", data)
    assert code == 2 and "--model DIR" in err
    code, _, err = _run(capsys, "thresholds", data, "--model", data.parent / "missing")
    assert code == 2 and "no such directory" in err
