"""`clef-agents batch` locally: one output row per input row, errors per row, resumable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_agents.cli import main

STATES = ["my card never arrived", "", "exchange rate is wrong", "pin blocked", "refund me"] * 3
QUESTIONS = {
    "intent": {"type": "choice", "instructions": "intent", "criteria": ["card", "rate", "pin"]},
    "urgent": {"type": "noul", "instructions": "urgent?"},
}


@pytest.fixture()
def inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    from engine.testing import write_tiny_bert

    model = write_tiny_bert(tmp_path / "model")
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(len(STATES))), "text": STATES}), data)
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps(QUESTIONS))
    return model, data, qfile


def _argv(model: Path, data: Path, qfile: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("batch", str(data), "--questions", str(qfile), "--out", str(out)),
        *("--model", str(model), "--device", "cpu", "--column", "text", "--no-progress"),
        *extra,
    ]


def test_one_row_per_input_row_errors_kept(inputs: Any, tmp_path: Path, tiny_engine: Any) -> None:
    model, data, qfile = inputs
    out = tmp_path / "out.parquet"
    assert main(_argv(model, data, qfile, out, "--chunk-rows", "4", "--batch-size", "3")) == 0
    table = pq.read_table(out).to_pylist()
    assert [r["row"] for r in table] == list(range(len(STATES)))
    for rec, state in zip(table, STATES, strict=True):
        if state:
            assert rec["error"] is None
            answers = json.loads(rec["answers"])
            assert rec["q.intent"] == answers["intent"]["choice"] in {"card", "rate", "pin"}
            assert rec["q.urgent"] == pytest.approx(answers["urgent"]["noul"])
        else:
            assert rec["answers"] is None and "state" in rec["error"]
    assert not out.with_name(out.name + ".parts").exists()


def test_interrupted_run_resumes_without_redoing_rows(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import clef_agents.cli.batch as batch

    model, data, qfile = inputs
    out = tmp_path / "out.parquet"
    answered: list[int] = []
    real = batch.answer_rows

    def flaky(engine: Any, rows: list[int], *a: Any, **k: Any) -> Any:
        if answered and len(answered) >= 8:
            raise KeyboardInterrupt
        answered.extend(rows)
        return real(engine, rows, *a, **k)

    monkeypatch.setattr(batch, "answer_rows", flaky)
    assert main(_argv(model, data, qfile, out, "--chunk-rows", "4")) == 130
    assert not out.exists() and sorted(answered) == list(range(8))
    first = list(answered)
    answered.clear()
    monkeypatch.setattr(
        batch,
        "answer_rows",
        lambda e, rows, *a, **k: (answered.extend(rows), real(e, rows, *a, **k))[1],
    )
    assert main(_argv(model, data, qfile, out, "--chunk-rows", "4")) == 0
    assert sorted(answered) == list(range(8, len(STATES))), "done chunks are not redone"
    rows = pq.read_table(out)["row"].to_pylist()
    assert rows == list(range(len(STATES))) and first == list(range(8))


def test_bad_inputs_are_usage_errors(inputs: Any, tmp_path: Path, capsys: Any) -> None:
    model, data, qfile = inputs
    out = tmp_path / "o.parquet"
    assert main(_argv(model, tmp_path / "missing.csv", qfile, out)) == 2
    assert main([*_argv(model, data, qfile, out)[:-1], "--column", "nope", "--no-progress"]) == 2
    bad_q = tmp_path / "bad.json"
    bad_q.write_text(json.dumps({"q": {"type": "choice", "instructions": "x", "criteria": ["a"]}}))
    assert main(_argv(model, data, bad_q, out)) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "nope" in err and "criteria" in err
