"""The CLI: exit codes and one-line messages for bad input; output formats."""

from __future__ import annotations

import io
import json

import pytest

from clef_agents.cli import main
from engine.testing import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(write_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert"))


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_decide_inline_questions_table_and_json(capsys, tiny_dir):
    code, out, _ = _run(
        capsys,
        "decide",
        "my card never arrived",
        "--model",
        tiny_dir,
        "--choice",
        "intent=card_arrival,refund",
        "--noul",
        "angry=Is it angry?",
        "--score",
        "urgency=low,high",
    )
    assert code == 0
    assert out.startswith("intent: ")
    assert "angry: P(yes) = " in out
    code, out, _ = _run(
        capsys,
        "decide",
        "my card never arrived",
        "--model",
        tiny_dir,
        "--choice",
        "intent=card_arrival,refund",
        "--json",
    )
    assert code == 0
    wire = json.loads(out)
    assert set(wire["answers"]["intent"]["probabilities"]) == {"card_arrival", "refund"}
    assert wire["usage"]["output_tokens"] == 0


def test_decide_dtype_flag_reaches_the_engine(capsys, tiny_dir, monkeypatch):
    import engine

    seen = {}
    real = engine.DecisionEngine.from_pretrained.__func__

    def spy(cls, path, **kwargs):
        seen.update(kwargs)
        return real(cls, path, **kwargs)

    monkeypatch.setattr(engine.DecisionEngine, "from_pretrained", classmethod(spy))
    args = ("decide", "refund please", "--model", tiny_dir, "--choice", "i=refund,card", "--json")
    code, out, _ = _run(capsys, *args, "--dtype", "bf16")
    assert code == 0 and seen["dtype"] == "bf16"
    bf16 = json.loads(out)["answers"]["i"]["probabilities"]
    seen.clear()
    code, out, _ = _run(capsys, *args)
    assert code == 0 and "dtype" not in seen  # auto: the engine's own default
    fp32 = json.loads(out)["answers"]["i"]["probabilities"]
    assert abs(bf16["refund"] - fp32["refund"]) < 0.05


def test_decide_questions_file_yaml_and_stdin_state(capsys, tiny_dir, tmp_path, monkeypatch):
    qfile = tmp_path / "q.yaml"
    qfile.write_text(
        "route:\n  type: choice\n  instructions: Route\n  criteria: {billing: money, tech: bugs}\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO('{"msg": "login bug"}'))
    code, out, _ = _run(
        capsys, "decide", "-", "--questions", str(qfile), "--model", tiny_dir, "--json"
    )
    assert code == 0
    assert json.loads(out)["answers"]["route"]["choice"] in {"billing", "tech"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["decide", "x", "--questions", "/no/such/file.json"], "no such file"),
        (["decide", "x", "--choice", "q=only"], "2..255 options; got 1"),
        (
            ["decide", "x", "--choice", "q=" + ",".join(f"o{i}" for i in range(300))],
            "2..255 options; got 300",
        ),
        (["decide", "x", "--choice", "noequals"], "expected ID=VALUE"),
        (["decide", "x"], "no questions"),
        (["decide", "   ", "--noul", "q=ok?"], "state is empty"),
        (["eval", "/no/such.csv"], "no such file"),
        (["decide", "x", "--nope"], "unrecognized arguments"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    line = _one_error_line(err)
    assert line.startswith("clef-agents: error:")
    assert needle in line


def test_malformed_json_and_unknown_type(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"q": {"type": "choice",')
    code, _, err = _run(capsys, "decide", "x", "--questions", str(bad))
    assert code == 2 and "malformed JSON at line 1" in _one_error_line(err)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"q": {"type": "ranking", "instructions": "x"}}))
    code, _, err = _run(capsys, "decide", "x", "--questions", str(unknown))
    assert code == 2 and "questions.q" in _one_error_line(err) and "ranking" in err


def test_missing_model_dir_exits_2(capsys, tmp_path):
    code, _, err = _run(capsys, "decide", "x", "--noul", "q=ok?", "--model", str(tmp_path / "none"))
    assert code == 2 and "does not exist" in _one_error_line(err)


def test_eval_csv_and_jsonl_with_plot(capsys, tiny_dir, tmp_path):
    rows = [
        ("refund my money", "billing"),
        ("payment refund", "billing"),
        ("login error", "tech"),
        ("bug on the page", "tech"),
    ] * 3
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("text,label\n" + "\n".join(f"{t},{lab}" for t, lab in rows) + "\n")
    png = tmp_path / "r.png"
    code, out, _ = _run(
        capsys,
        "eval",
        str(csv_path),
        "--model",
        tiny_dir,
        "--json",
        "--no-progress",
        "--plot",
        str(png),
    )
    assert code == 0
    metrics = json.loads(out)
    assert metrics["n"] == len(rows) and metrics["n_labels"] == 2
    assert 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["ece"] <= 1
    assert metrics["latency_p95_ms"] >= metrics["latency_p50_ms"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"q": t, "y": lab}) for t, lab in rows))
    code, out, _ = _run(
        capsys,
        "eval",
        str(jsonl),
        "--text-col",
        "q",
        "--label-col",
        "y",
        "--model",
        tiny_dir,
        "--examples-per-label",
        "2",
        "--json",
        "--no-progress",
        "--batch-size",
        "4",
    )
    assert code == 0
    assert json.loads(out)["n"] == len(rows) - 4  # the 2 x 2 examples are left out


def test_eval_missing_column_names_columns(capsys, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,category\nhello,a\n")
    code, _, err = _run(capsys, "eval", str(path), "--label-col", "label")
    assert code == 2
    line = _one_error_line(err)
    assert "'label'" in line and "['text', 'category']" in line


def test_no_command_prints_help_and_exits_2(capsys):
    code, _, err = _run(capsys)
    assert code == 2 and "decide" in err


def test_calibrate_rebuilds_trained_yes_no_and_score_questions_by_their_wording() -> None:
    """text,label data names no question: ``calibrate`` rebuilds the trained ones from the
    head, and a noul or score question is only known by its wording (question_context)."""
    from types import SimpleNamespace

    import torch

    from clef_agents.cli.calibrate import _trained_questions
    from engine import Noul, Score
    from engine.heads.option_evidence import HeadConfig, OptionEvidenceHead, question_context

    trained = {
        "human": Noul(instructions="needs a human?"),
        "side": Noul(criteria={"true": "urgent", "false": "can wait"}),
        "urgency": Score(instructions="urgency", criteria=["low", "medium", "high"]),
        "partly": Score(instructions="how bad?", criteria=[None, "bad", "worse"]),
    }
    head = OptionEvidenceHead(HeadConfig(hidden_size=8, dim=8, heads=2))
    for q in trained.values():
        names = [s.name for s in q.option_specs()]
        head.add_question(str(q.type), names, torch.randn(len(names), 8), question_context(q))
    rebuilt = _trained_questions(SimpleNamespace(head=SimpleNamespace(module=head)), None)
    assert rebuilt is not None and len(rebuilt) == 4
    for q in rebuilt.values():
        assert head.knows(str(q.type), [s.name for s in q.option_specs()], question_context(q))
