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
    from clef_engine.testing import write_tiny_bert

    model = write_tiny_bert(tmp_path / "model")
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(len(STATES))), "text": STATES}), data)
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps(QUESTIONS))
    return model, data, qfile


def _argv(model: Path, data: Path, qfile: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("batch", str(data), "--questions", str(qfile), "--out", str(out)),
        *("--model", str(model), "--device", "cpu", "--text-col", "text", "--no-progress"),
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
    assert main([*_argv(model, data, qfile, out)[:-1], "--text-col", "nope", "--no-progress"]) == 2
    bad_q = tmp_path / "bad.json"
    bad_q.write_text(json.dumps({"q": {"type": "choice", "instructions": "x", "criteria": ["a"]}}))
    assert main(_argv(model, data, bad_q, out)) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "nope" in err and "criteria" in err


def _interrupted(monkeypatch: pytest.MonkeyPatch, argv: list[str], after: int) -> None:
    """Run ``argv`` and interrupt it once ``after`` rows are answered (chunks kept)."""
    import clef_agents.cli.batch as batch

    real = batch.answer_rows
    answered: list[int] = []

    def flaky(engine: Any, rows: list[int], *a: Any, **k: Any) -> Any:
        if len(answered) >= after:
            raise KeyboardInterrupt
        answered.extend(rows)
        return real(engine, rows, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(batch, "answer_rows", flaky)
        assert main(argv) == 130


def test_csv_byte_that_is_not_utf8_fails_only_its_row(inputs: Any, tmp_path: Path) -> None:
    """C1: one bad byte made pyarrow read the whole column as binary (image bytes)."""
    model, _, qfile = inputs
    data = tmp_path / "in.csv"
    data.write_bytes(b"id,text\n0,my card never arrived\n1,bad \xff byte\n2,refund me\n")
    out = tmp_path / "out.parquet"
    assert main(_argv(model, data, qfile, out)) == 0
    table = pq.read_table(out).to_pylist()
    assert [r["error"] is None for r in table] == [True, False, True]
    assert "not valid UTF-8" in table[1]["error"] and "0xff" in table[1]["error"]
    assert table[1]["answers"] is None and table[0]["q.intent"] in {"card", "rate", "pin"}


def test_csv_numbers_are_text_states(inputs: Any, tmp_path: Path) -> None:
    """C4: an all-numeric column was read as int64, and an int is no state."""
    model, _, qfile = inputs
    data = tmp_path / "in.csv"
    data.write_text("text\n123\n4.5\n007\n")
    out = tmp_path / "out.parquet"
    assert main(_argv(model, data, qfile, out)) == 0
    table = pq.read_table(out).to_pylist()
    assert [r["error"] for r in table] == [None, None, None]
    parquet = tmp_path / "nums.parquet"
    pq.write_table(pa.table({"text": [1, 22, 333]}), parquet)
    assert main(_argv(model, parquet, qfile, tmp_path / "o2.parquet")) == 0
    assert [r["error"] for r in pq.read_table(tmp_path / "o2.parquet").to_pylist()] == [None] * 3


def test_resume_refuses_chunks_of_another_input_and_restart_discards_them(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """C2: chunks of another input with the same --out were mixed into the new output."""
    model, data, qfile = inputs
    out = tmp_path / "out.parquet"
    _interrupted(monkeypatch, _argv(model, data, qfile, out, "--chunk-rows", "4"), after=8)
    other = tmp_path / "other.parquet"
    states = [f"other state {i}" for i in range(len(STATES))]  # same row count
    pq.write_table(pa.table({"text": states}), other)
    capsys.readouterr()
    assert main(_argv(model, other, qfile, out, "--chunk-rows", "4")) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1
    assert "the input file's content" in line and "--restart" in line
    assert "questions" not in line and not out.exists()
    assert main(_argv(model, other, qfile, out, "--chunk-rows", "4", "--restart")) == 0
    assert "discarding 2 chunk(s)" in capsys.readouterr().err
    from clef_engine import DecisionEngine

    engine = DecisionEngine.from_pretrained(model, device="cpu")
    table = pq.read_table(out).to_pylist()
    for rec, state in zip(table, states, strict=True):  # every answer is of the new input
        expected = engine.decide(state, QUESTIONS).to_wire()["answers"]["urgent"]["noul"]
        assert rec["q.urgent"] == pytest.approx(expected, abs=1e-5)


def test_resume_refuses_other_questions_model_or_options(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from clef_engine.testing import write_tiny_bert

    model, data, qfile = inputs
    out = tmp_path / "out.parquet"
    _interrupted(monkeypatch, _argv(model, data, qfile, out, "--chunk-rows", "4"), after=4)
    q2 = tmp_path / "q2.json"
    q2.write_text(json.dumps({**QUESTIONS, "urgent": {"type": "noul", "instructions": "late?"}}))
    model2 = write_tiny_bert(tmp_path / "model2", seed=1)
    cases = [
        (_argv(model, data, q2, out), "the questions"),
        (_argv(model2, data, qfile, out), "the model version"),
        ([*_argv(model, data, qfile, out), "--dtype", "bf16"], "--dtype (auto then, bf16 now)"),
    ]
    for argv, needle in cases:
        capsys.readouterr()
        assert main(argv) == 2, needle
        err = capsys.readouterr().err
        assert needle in err and "--restart" in err and "Traceback" not in err
    assert main(_argv(model, data, qfile, out)) == 0  # the same run resumes
    assert pq.read_table(out).num_rows == len(STATES)


def test_shorter_input_with_stale_chunks_says_what_to_do(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """C3: stale chunks of a longer input failed with 'assembled N rows for M input rows'."""
    model, data, qfile = inputs
    out = tmp_path / "out.parquet"
    _interrupted(monkeypatch, _argv(model, data, qfile, out, "--chunk-rows", "4"), after=12)
    short = tmp_path / "short.parquet"
    pq.write_table(pa.table({"text": STATES[:5]}), short)
    capsys.readouterr()
    assert main(_argv(model, short, qfile, out)) == 2
    err = capsys.readouterr().err
    assert "row count (15 then, 5 now)" in err and "--restart" in err
    # Chunks from before manifests existed cannot be checked: refused too, with the remedy.
    (out.with_name(out.name + ".parts") / "manifest.json").unlink()
    assert main(_argv(model, data, qfile, out)) == 2
    err = capsys.readouterr().err
    assert "no readable manifest.json" in err and "--restart" in err
    assert main([*_argv(model, short, qfile, out), "--restart"]) == 0
    assert pq.read_table(out)["row"].to_pylist() == list(range(5))


def test_stale_rows_past_the_input_are_a_usage_error(tmp_path: Path) -> None:
    import clef_agents.cli.batch as batch
    from clef_agents.cli import UsageError

    parts = tmp_path / "o.parquet.parts"
    parts.mkdir()
    schema = batch._schema(QUESTIONS)
    batch.write_part(parts, [batch.record(9, ValueError("x"), QUESTIONS)], schema)
    with pytest.raises(UsageError, match="--restart"):
        batch.done_rows(parts, 5)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".pq"])
def test_output_format_follows_the_out_suffix(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    from clef_agents.fake import FakeEngine

    monkeypatch.setattr("clef_agents.cli.batch.build_engine", lambda args: FakeEngine())
    model, data, qfile = inputs
    out = tmp_path / f"answers{suffix}"
    assert main(_argv(model, data, qfile, out)) == 0
    if suffix == ".csv":
        import csv

        with out.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["row"]) for r in rows] == list(range(len(STATES)))
        good = [r for r, s in zip(rows, STATES, strict=True) if s]
        assert all(json.loads(r["answers"])["intent"]["choice"] == r["q.intent"] for r in good)
        assert all("state" in r["error"] for r, s in zip(rows, STATES, strict=True) if not s)
    elif suffix == ".jsonl":
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert [r["row"] for r in rows] == list(range(len(STATES)))
        for r, state in zip(rows, STATES, strict=True):
            if state:  # answers is an object here, not JSON text
                assert r["answers"]["intent"]["choice"] == r["q.intent"] and r["error"] is None
            else:
                assert r["answers"] is None and "state" in r["error"]
    else:
        assert pq.read_table(out).num_rows == len(STATES)


def test_unknown_output_suffix_exits_2_before_any_work(
    inputs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def no_engine(args: Any) -> Any:
        raise AssertionError("loaded a model although --out cannot be written")

    monkeypatch.setattr("clef_agents.cli.batch.build_engine", no_engine)
    model, data, qfile = inputs
    assert main(_argv(model, data, qfile, tmp_path / "answers.txt")) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1
    assert "--out" in line and ".csv" in line and ".jsonl" in line and ".parquet" in line
