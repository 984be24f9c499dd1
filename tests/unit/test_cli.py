"""The CLI: exit codes and one-line messages for bad input; output formats."""

from __future__ import annotations

import io
import json

import pytest

from clef_agents.cli import main
from clef_engine.testing import write_tiny_bert


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
    import clef_engine as engine

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

    from clef_engine import Noul, Score
    from clef_engine.heads.option_evidence import HeadConfig, OptionEvidenceHead, question_context
    from clef_engine.train.recalibrate import trained_questions

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
    rebuilt = trained_questions(SimpleNamespace(head=SimpleNamespace(module=head)), None)
    assert rebuilt is not None and len(rebuilt) == 4
    for q in rebuilt.values():
        assert head.knows(str(q.type), [s.name for s in q.option_specs()], question_context(q))


# -- hostile input: one line, exit 2, never a traceback ------------------------------------


class _BytesStdin(io.TextIOWrapper):
    """A stdin whose ``buffer`` holds raw bytes, as the real one does."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")

    def isatty(self) -> bool:
        return False


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("stdin", "argv", "needle"),
    [
        (bytes(range(256)) * 8, ["decide", "-", "--noul", "q=ok?"], "stdin: not valid UTF-8"),
        (DEEP, ["decide", "-", "--noul", "q=ok?"], "state: JSON nested too deeply"),
        (bytes(range(256)) * 8, ["decide", "x", "--questions", "-"], "stdin: not valid UTF-8"),
        (DEEP, ["decide", "x", "--questions", "-"], "-: JSON nested too deeply"),
        (b"[" + b"9" * 5000 + b"]", ["decide", "-", "--noul", "q=ok?"], "more than 4300 digits"),
        (b'{"a": 1e999}', ["decide", "-", "--noul", "q=ok?"], "1e999 is out of range"),
    ],
)
def test_hostile_stdin_exits_2_with_one_line(capsys, monkeypatch, stdin, argv, needle):
    monkeypatch.setattr("sys.stdin", _BytesStdin(stdin))
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert needle in _one_error_line(err)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_5000_digit_number_in_questions_file(capsys, tmp_path, suffix):
    path = tmp_path / f"q{suffix}"
    digits = "9" * 5000
    if suffix == ".json":
        path.write_text('{"q": {"type": "noul", "instructions": ' + digits + "}}")
    else:
        path.write_text(f"q:\n  type: noul\n  instructions: {digits}\n")
    code, _, err = _run(capsys, "decide", "x", "--questions", str(path))
    assert code == 2
    assert "a number has more than 4300 digits" in _one_error_line(err)


@pytest.mark.parametrize("arg", ["hello \udcff", "caf\udce9", "\ud800"])
def test_lone_surrogate_argument_exits_2(capsys, arg):
    """Bytes that are not UTF-8 reach argv as lone surrogates (surrogateescape)."""
    code, _, err = _run(capsys, "decide", arg, "--noul", "q=ok?")
    assert code == 2
    line = _one_error_line(err)
    assert "argument 2" in line and "not valid UTF-8" in line
    code, _, err = _run(capsys, "decide", "x", "--noul", f"q={arg}")
    assert code == 2 and "argument 4" in _one_error_line(err)


def test_lone_surrogate_on_a_text_stdin_exits_2(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello \udcff"))
    code, _, err = _run(capsys, "decide", "-", "--noul", "q=ok?")
    assert code == 2 and "stdin: not valid UTF-8 text" in _one_error_line(err)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--lr", "-1"], "argument --lr: must be > 0; got -1"),
        (["--lr", "0"], "argument --lr: must be > 0"),
        (["--lr", "nan"], "argument --lr: must be > 0; got nan"),
        (["--epochs", "0"], "argument --epochs: must be >= 1"),
        (["--batch-size", "-3"], "argument --batch-size"),
        (["--lora-rank", "257"], "argument --lora-rank: must be in [0, 256]"),
        (["--val-fraction", "1.5"], "argument --val-fraction"),
        (["--patience", "0"], "argument --patience"),
        (["--recipe", "fast"], "argument --recipe: invalid choice: 'fast'"),
        (["--ensemble", "0"], "argument --ensemble"),
        (["--seed", "-1"], "argument --seed"),
        (["--examples-per-label", "0"], "argument --examples-per-label"),
        (["--threads", "0"], "argument --threads: must be in [1, 1024]"),
        (["--threads", "two"], "argument --threads: expected an integer"),
    ],
)
def test_finetune_refuses_out_of_range_numbers(capsys, tmp_path, flags, needle):
    code, _, err = _run(capsys, "finetune", "x.csv", "--out", str(tmp_path / "m"), *flags)
    assert code == 2
    assert needle in _one_error_line(err)


def test_finetune_max_rank_matches_the_trainer():
    from clef_agents.cli.finetune import MAX_RANK
    from clef_engine.train.config import MAX_RANK as TRAINER_MAX_RANK

    assert MAX_RANK == TRAINER_MAX_RANK


def test_finetune_out_naming_a_file_exits_2_before_training(capsys, tmp_path, monkeypatch):
    import clef_engine.train

    def no_training(*a, **k):
        raise AssertionError("trained although --out is a file")

    monkeypatch.setattr(clef_engine.train, "load_training_data", no_training)
    existing = tmp_path / "model.bin"
    existing.write_text("not a dir")
    code, _, err = _run(capsys, "finetune", "x.csv", "--out", str(existing))
    assert code == 2 and "is a file" in _one_error_line(err)
    code, _, err = _run(capsys, "finetune", "x.csv", "--out", str(existing / "sub"))
    assert code == 2 and "is a file, not a directory" in _one_error_line(err)


def test_finetune_threads_sets_torch_threads(capsys, tmp_path, monkeypatch):
    """--threads is a real flag (the benchmarks' docs use it): it reaches torch before
    training starts."""
    import torch

    import clef_engine.train

    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(clef_engine.train.Trainer, "fit", stop)
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(8)))
    with pytest.raises(Stop):
        main(["finetune", str(data), "--out", str(tmp_path / "m"), "--threads", "3"])
    assert seen == [3]


# -- eval ----------------------------------------------------------------------------------


def _labelled_csv(path, rows):
    path.write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in rows))
    return path


@pytest.mark.parametrize("target", ["file/r.png", "missing/dir/r.png", "dir", "r.txt"])
def test_eval_plot_path_checked_before_evaluating(capsys, tmp_path, monkeypatch, target):
    import clef_agents.cli.eval as cli_eval

    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()

    def no_engine(args):
        raise AssertionError("evaluated although --plot cannot be written")

    monkeypatch.setattr(cli_eval, "build_engine", no_engine)
    data = _labelled_csv(tmp_path / "d.csv", [("a", "x"), ("b", "y")])
    code, _, err = _run(capsys, "eval", str(data), "--plot", str(tmp_path / target))
    assert code == 2
    assert "--plot" in _one_error_line(err)
    assert not (tmp_path / "r.txt").exists()


def test_eval_batch_size_defaults_to_a_real_batch(capsys, tmp_path, monkeypatch, tiny_dir):
    import clef_engine.evaluation

    seen = {}
    real = clef_engine.evaluation.evaluate

    def spy(*a, **k):
        seen.update(k)
        return real(*a, **k)

    monkeypatch.setattr(clef_engine.evaluation, "evaluate", spy)
    data = _labelled_csv(tmp_path / "d.csv", [("refund", "billing"), ("bug", "tech")] * 20)
    code, out, _ = _run(capsys, "eval", str(data), "--model", tiny_dir, "--json", "--no-progress")
    assert code == 0 and seen["batch_size"] == 32 and json.loads(out)["batch_size"] == 32
    code, _, err = _run(capsys, "eval", str(data), "--batch-size", "0")
    assert code == 2 and "argument --batch-size: must be >= 1" in _one_error_line(err)


def test_eval_limit_samples_across_labels_deterministically():
    from clef_agents.cli.eval import stratified_sample

    labels = ["a"] * 90 + ["b"] * 8 + ["c"] * 2  # sorted: the first 10 rows are all "a"
    picked = stratified_sample(labels, 10, seed=0)
    assert len(picked) == 10 and picked == sorted(picked)
    counts = {lab: sum(labels[i] == lab for i in picked) for lab in "abc"}
    assert counts == {"a": 9, "b": 1, "c": 0} or counts == {"a": 9, "b": 0, "c": 1}
    assert stratified_sample(labels, 10, seed=0) == picked
    assert stratified_sample(labels, 10, seed=1) != picked
    assert stratified_sample(labels, 500, seed=0) == list(range(100))
    shares = stratified_sample(labels, 50, seed=0)
    assert sum(labels[i] == "b" for i in shares) == 4 and sum(labels[i] == "c" for i in shares)


def test_eval_limit_evaluates_every_label(capsys, tmp_path, tiny_dir, monkeypatch):
    import clef_engine.evaluation

    seen = {}
    real = clef_engine.evaluation.evaluate

    def spy(engine_, texts, labels, *a, **k):
        seen["labels"] = list(labels)
        return real(engine_, texts, labels, *a, **k)

    monkeypatch.setattr(clef_engine.evaluation, "evaluate", spy)
    rows = [("refund money", "billing")] * 30 + [("login bug", "tech")] * 30
    data = _labelled_csv(tmp_path / "d.csv", rows)
    code, out, _ = _run(
        capsys, "eval", str(data), "--model", tiny_dir, "--limit", "10", "--json", "--no-progress"
    )
    assert code == 0
    assert json.loads(out)["n"] == 10
    assert sorted(seen["labels"]) == ["billing"] * 5 + ["tech"] * 5  # not the first 10 rows


def test_eval_help_says_limit_is_stratified(capsys):
    code, out, _ = _run(capsys, "eval", "--help")
    assert code == 0 and "stratified by label" in " ".join(out.split())


def test_eval_threads_flag(capsys, tmp_path, monkeypatch, tiny_dir):
    import torch

    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = _labelled_csv(tmp_path / "d.csv", [("refund", "billing"), ("bug", "tech")])
    code, _, _ = _run(
        capsys, "eval", str(data), "--model", tiny_dir, "--threads", "2", "--no-progress"
    )
    assert code == 0 and seen == [2]


# -- a fine-tuned model asked a question it was not trained on ------------------------------


TRAIN_ROWS = [
    (f"{' '.join(words)} {i}", label)
    for i in range(6)
    for label, words in (
        ("billing", ["refund", "payment", "money"]),
        ("tech", ["bug", "error", "login"]),
        ("sales", ["exchange", "rate", "quote"]),
    )
]


@pytest.fixture(scope="module")
def finetuned(tiny_dir, tmp_path_factory):
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("finetuned")
    data = _labelled_csv(root / "train.csv", TRAIN_ROWS)
    out = root / "model"
    argv = [
        *("finetune", str(data), "--out", str(out), "--backbone", tiny_dir),
        *("--epochs", "1", "--lora-rank", "0", "--val-fraction", "0", "--no-memory"),
        *("--no-progress", "--device", "cpu"),
    ]
    assert main(argv) == 0
    return root


def test_eval_warns_when_a_fine_tuned_model_falls_back_to_zero_shot(capsys, finetuned):
    model = str(finetuned / "model")
    data = finetuned / "train.csv"
    code, out, err = _run(capsys, "eval", str(data), "--model", model, "--json", "--no-progress")
    assert code == 0 and json.loads(out)["head"] == "trained"
    assert "warning" not in err
    oos = _labelled_csv(finetuned / "oos.csv", [*TRAIN_ROWS, ("hello there", "oos")])
    code, out, err = _run(capsys, "eval", str(oos), "--model", model, "--json", "--no-progress")
    assert code == 0
    assert json.loads(out)["head"] == "zero_shot"
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1
    assert "labels not among its trained options: 'oos'" in warning[0]
    assert "zero-shot fallback" in warning[0]


def test_answers_say_which_head_gave_them(capsys, finetuned):
    model = str(finetuned / "model")
    argv = ["decide", "refund my money", "--model", model, "--choice", "label=billing,sales,tech"]
    code, out, _ = _run(capsys, *argv, "--noul", "angry=Is it angry?", "--json")
    assert code == 0
    wire = json.loads(out)
    answers = wire["answers"]
    assert answers["label"]["x_head"] == "trained"
    assert answers["angry"]["x_head"] == "zero_shot"
    # The model (not a rule) answered both: x_source stays "model"; x_head tells the heads
    # apart (docs/server.md, docs/finetune.md).
    assert wire["x_source"] == "model"
    code, out, _ = _run(capsys, *argv, "--noul", "angry=Is it angry?")
    assert code == 0
    assert "angry: P(yes)" in out and "[zero-shot: not a trained question]" in out
    assert "[zero-shot" not in out.splitlines()[0]


def test_a_zero_shot_engine_marks_no_head(tiny_dir):
    from clef_engine import DecisionEngine

    result = DecisionEngine.from_pretrained(tiny_dir, device="cpu").decide(
        "x", {"q": {"type": "noul", "instructions": "ok?"}}
    )
    assert "x_head" not in result.to_wire()["answers"]["q"]
