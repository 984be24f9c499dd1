"""``clef-agents finetune`` and ``clef-agents calibrate`` on a tiny random encoder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from clef_agents.cli import main
from clef_engine import DecisionEngine
from clef_engine.testing import write_tiny_bert

pytest.importorskip("peft")
pytestmark = pytest.mark.slow

WORDS = {
    "billing": "refund payment money",
    "tech": "bug error login page",
    "sales": "exchange rate",
}


def write_csv(path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["text,intent"]
    for i in range(n):
        label = list(WORDS)[i % 3]
        words = WORDS[label].split()
        rng.shuffle(words)
        lines.append(f"{' '.join(words)} {seed} {i},{label}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("bert"))


def test_finetune_then_calibrate_then_load(tiny_dir, tmp_path, capsys) -> None:
    train, heldout, out = tmp_path / "train.csv", tmp_path / "heldout.csv", tmp_path / "model"
    write_csv(train, 18, seed=0)
    write_csv(heldout, 30, seed=1)
    code = main(
        [
            "finetune",
            str(train),
            "--out",
            str(out),
            "--backbone",
            str(tiny_dir),
            "--label-col",
            "intent",
            "--epochs",
            "2",
            "--lora-rank",
            "2",
            "--batch-size",
            "6",
            "--examples-per-label",
            "5",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["states"] == 15 and summary["best_epoch"] >= 1
    config = json.loads((out / "config.json").read_text())
    assert config["head"]["questions"]
    trained_with = json.loads((out / "training.json").read_text())["config"]
    assert (trained_with["head"], trained_with["epochs"], trained_with["lr"]) == (
        "option_evidence",
        2,
        5e-4,
    )  # --recipe full (the default) with --epochs on top

    png = tmp_path / "rel.png"
    code = main(
        [
            "calibrate",
            str(out),
            str(heldout),
            "--histogram",
            "--plot",
            str(png),
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["labels"] == 30
    assert set(report["before"]) == {"ece", "nll", "brier"}
    # Temperature scaling cannot make the fitted data's NLL worse.
    assert report["after"]["nll"] <= report["before"]["nll"] + 1e-6
    assert (tmp_path / "rel-before.png").stat().st_size > 0
    assert (tmp_path / "rel-after.png").is_file()
    saved = json.loads((out / "config.json").read_text())
    assert saved["calibration"]["source"].startswith("clef-agents calibrate")
    assert saved["head"] == config["head"]

    engine = DecisionEngine.from_pretrained(out, device="cpu")
    assert engine.calibrator.temperatures == pytest.approx(
        {k: float(v) for k, v in report["temperatures"].items()}
    )


def test_finetune_refuses_unusable_data(tiny_dir, tmp_path, capsys) -> None:
    data = tmp_path / "one.csv"
    data.write_text("text,label\nhello,a\nworld,a\n")
    code = main(["finetune", str(data), "--out", str(tmp_path / "m"), "--backbone", str(tiny_dir)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "only one label ('a')" in err
    code = main(["finetune", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "m")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_calibrate_refuses_to_overwrite_a_bare_hf_dir(tiny_dir, tmp_path, capsys) -> None:
    data = tmp_path / "d.csv"
    write_csv(data, 12, seed=2)
    code = main(["calibrate", str(tiny_dir), str(data), "--label-col", "intent"])
    assert code == 2
    assert "--out" in capsys.readouterr().err
    code = main(
        [
            "calibrate",
            str(tiny_dir),
            str(data),
            "--label-col",
            "intent",
            "--out",
            str(tmp_path / "cal"),
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "cal" / "config.json").read_text())["format"] == "clef-agents"


def small_finetune(tiny_dir, tmp_path) -> tuple[Path, list[str]]:
    """18 labelled rows and the ``finetune`` arguments of a quick LoRA run on them."""
    train, out = tmp_path / "train.csv", tmp_path / "model"
    write_csv(train, 18, seed=0)
    args = ["finetune", str(train), "--out", str(out), "--backbone", str(tiny_dir)]
    args += ["--label-col", "intent", "--lora-rank", "2", "--no-progress", "--device", "cpu"]
    return out, args


def test_finetune_few_shot_recipe(tiny_dir, tmp_path, capsys) -> None:
    out, args = small_finetune(tiny_dir, tmp_path)
    code = main([*args, "--recipe", "few-shot"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["best_epoch"] == 0  # no head epochs
    # No validation split: the memory is cross-fitted on the head's folds; 18 rows (plus
    # the option texts) are too few to choose its settings on, so none is kept.
    ((_, memory),) = summary["memory"].items()
    assert memory["cross_fitted"] == 1 and memory["held_out"] < 50 and "lam" not in memory
    assert not (out / "memory.safetensors").exists()
    report = json.loads((out / "training.json").read_text())
    assert report["config"]["head"] == "prototype"
    assert report["config"]["val_fraction"] == 0.0
    assert report["history"][0]["contrastive_steps"] == 30
    head = json.loads((out / "config.json").read_text())["head"]
    assert [q["prototype"] for q in head["questions"].values()] == [True]
    # Without adapters (--lora-rank 0) the recipe drops its contrastive stage, which
    # trains only them, and fits the prototype head on the frozen backbone.
    head_only = tmp_path / "head_only"
    code = main([*args, "--recipe", "few-shot", "--lora-rank", "0", "--out", str(head_only)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((head_only / "training.json").read_text())
    assert report["config"]["lora_rank"] == 0
    assert report["config"]["contrastive_steps"] == 0 and report["history"] == []
    assert report["config"]["head"] == "prototype"


@pytest.mark.parametrize(
    "flags",
    [
        ["--rdrop-weight", "0.5"],
        ["--ema-decay", "0.9"],
        ["--dora"],
        ["--lora-plus-ratio", "4"],
        ["--refit"],
        ["--contrastive-weight", "0.5"],
        ["--bank-init", "examples"],
        ["--no-head"],
        ["--shared-split", "1"],
        ["--ensemble-temperature"],
        ["--head", "prototype"],
    ],
)
def test_finetune_ablation_flags_are_gone(tiny_dir, tmp_path, capsys, flags) -> None:
    """The probes run in benchmarks/ (probe_trainer.py), not through the CLI."""
    _, args = small_finetune(tiny_dir, tmp_path)
    assert main([*args, *flags]) == 2
    assert f"unrecognized arguments: {flags[0]}" in capsys.readouterr().err


def test_finetune_with_unlabelled_states(tiny_dir, tmp_path, capsys) -> None:
    out, args = small_finetune(tiny_dir, tmp_path)
    unlabeled = tmp_path / "unlabeled.csv"
    write_csv(unlabeled, 9, seed=5)  # its intent column is ignored
    recipe = ["--recipe", "few-shot"]
    code = main([*args, *recipe, "--unlabeled", str(unlabeled), "--pseudo-per-label", "2"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["unlabeled_states"] == 9
    assert 2 <= summary["pseudo_labels"] <= 6  # at most 2 for each of the 3 intents
    report = json.loads((out / "training.json").read_text())
    assert report["config"]["pseudo_per_label"] == 2
    assert report["history"][-1]["unlabeled_states"] == 9
    # Misuse is a usage error naming the fix, not a traceback.
    train = Path(args[1])  # every state of it is labelled
    for bad, error in [
        (["--unlabeled", str(unlabeled)], "they need head='prototype'"),
        ([*recipe, "--pseudo-per-label", "2"], "give both"),
        ([*recipe, "--unlabeled-text-col", "intent"], "give both"),
        ([*recipe, "--unlabeled", str(tmp_path / "none.csv")], "none.csv: no such file"),
        ([*recipe, "--unlabeled", str(unlabeled), "--pseudo-per-label", "0"], "must be >= 1"),
        ([*recipe, "--unlabeled", str(train)], "none of the 18 unlabelled states is left"),
        (
            [*recipe, "--unlabeled", str(unlabeled), "--unlabeled-text-col", "body"],
            "no text column 'body'",
        ),
    ]:
        assert main([*args, *bad]) == 2
        assert error in capsys.readouterr().err


def write_word_bags(path, n: int, seed: int, rotate: int = 0) -> None:
    """Rows repeating one of 30 word bags, each with its own intent (bags and intents
    from seed 0, so every file shares them): the nearest training rows know the intent.
    ``rotate`` moves every bag's intent to the next one, so those neighbours are wrong."""
    rng = random.Random(0)
    vocab = "refund payment money bug error login page exchange rate card fee cash pin".split()
    bags = [" ".join(rng.sample(vocab, 4)) for _ in range(30)]
    names = list(WORDS)
    intents = [names[(names.index(rng.choice(names)) + rotate) % 3] for _ in bags]
    rows = [f"{bags[i % 30]} {seed} {i},{intents[i % 30]}" for i in range(n)]
    path.write_text("text,intent\n" + "\n".join(rows) + "\n")


def test_finetune_keeps_an_example_memory_and_calibrate_refits_it(tiny_dir, tmp_path, capsys):
    out, args = small_finetune(tiny_dir, tmp_path)
    heldout = tmp_path / "heldout.csv"
    write_word_bags(Path(args[1]), 240, seed=0)  # in place of its 18 rows
    write_word_bags(heldout, 90, seed=1)
    assert main([*args, "--epochs", "1", "--val-fraction", "0.25"]) == 0
    summary = json.loads(capsys.readouterr().out)
    ((_, fit),) = summary["memory"].items()
    assert fit["held_out"] == 60 and fit["nll_memory"] < fit["nll_head"]
    ((fp, stored),) = json.loads((out / "config.json").read_text())["head"]["memory"].items()
    assert stored["lam"] == fit["lam"]

    # --dry-run reports and saves nothing; --out writes the refitted memory elsewhere.
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["calibrate", str(out), str(heldout), "--device", "cpu", "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)["memory"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == files
    copy = tmp_path / "copy"
    assert main(["calibrate", str(out), str(heldout), "--device", "cpu", "--out", str(copy)]) == 0
    assert json.loads(capsys.readouterr().out)["memory"] == dry
    ((_, copied),) = json.loads((copy / "config.json").read_text())["head"]["memory"].items()
    ((_, refit),) = dry.items()
    assert copied["lam"] == refit["lam"] and (copy / "memory.safetensors").is_file()
    # Too few held-out rows to judge: the memory stays as it is.
    few = tmp_path / "few.csv"
    write_word_bags(few, 30, seed=3)
    assert main(["calibrate", str(out), str(few), "--device", "cpu"]) == 0
    ((_, kept),) = json.loads(capsys.readouterr().out)["memory"].items()
    assert kept["unchanged"] == 1 and kept["held_out"] == 30
    assert json.loads((out / "config.json").read_text())["head"]["memory"][fp] == stored

    assert main(["calibrate", str(out), str(heldout), "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    ((_, refit),) = report["memory"].items()  # its question id is calibrate's, "label"
    assert refit["held_out"] == 90 and refit["nll_memory"] < refit["nll_head"]
    assert refit["nll_before"] > refit["nll_memory"]  # refitted on these rows, it beats the old
    saved = json.loads((out / "config.json").read_text())["head"]["memory"][fp]
    assert {k: saved[k] for k in ("k", "tau", "lam", "temperature")} == {
        k: refit[k] for k in ("k", "tau", "lam", "temperature")
    }
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    assert engine.head.memory.questions[fp].settings.lam == refit["lam"]
    # Held-out rows whose neighbours in the memory are all wrong: the memory goes.
    write_word_bags(heldout, 90, seed=2, rotate=1)
    assert main(["calibrate", str(out), str(heldout), "--device", "cpu"]) == 0
    ((_, dropped),) = json.loads(capsys.readouterr().out)["memory"].items()
    assert "lam" not in dropped and dropped["held_out"] == 90
    assert "memory" not in json.loads((out / "config.json").read_text())["head"]
    assert not (out / "memory.safetensors").exists()
    assert DecisionEngine.from_pretrained(out, device="cpu").head.memory is None

    # The validation states join the memory once they chose its settings.
    assert main([*args, "--epochs", "1", "--val-fraction", "0.25"]) == 0
    ((_, fit),) = json.loads(capsys.readouterr().out)["memory"].items()
    assert fit["validation_states"] == 60
    memory = DecisionEngine.from_pretrained(out, device="cpu").head.memory
    assert [len(m) for m in memory.questions.values()] == [240]

    assert main([*args, "--epochs", "1", "--val-fraction", "0.25", "--no-memory"]) == 0
    assert "memory" not in json.loads(capsys.readouterr().out)
    assert not (out / "memory.safetensors").exists()
    assert main([*args, "--memory-max-states", "0"]) == 2
    assert "argument --memory-max-states: must be >= 1; got 0" in capsys.readouterr().err


def test_finetune_an_ensemble_then_calibrate_its_mean(tiny_dir, tmp_path, capsys) -> None:
    out, args = small_finetune(tiny_dir, tmp_path)
    assert main([*args, "--epochs", "1", "--recipe", "ensemble", "--val-fraction", "0.3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["members"]) == 2 and "ece_calibrated" in summary["validation"]
    config = json.loads((out / "config.json").read_text())
    assert config["ensemble"] == ["members/0", "members/1"]
    assert config["calibration"]["source"] == "none: the mean of 2 calibrated members"
    report = json.loads((out / "training.json").read_text())
    assert (report["config"]["ensemble"], report["config"]["lr"]) == (2, 1e-3)
    heldout = tmp_path / "heldout.csv"
    write_csv(heldout, 30, seed=1)
    calibrated = tmp_path / "calibrated"
    code = main(
        ["calibrate", str(out), str(heldout), "--label-col", "intent", "--out", str(calibrated)]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["labels"] == 30
    assert report["after"]["nll"] <= report["before"]["nll"] + 1e-6
    # The mean gets a temperature of its own; the members are copied unchanged.
    saved = json.loads((calibrated / "config.json").read_text())
    assert saved["ensemble"] == ["members/0", "members/1"]
    assert saved["calibration"]["source"].startswith("clef-agents calibrate")
    for member in saved["ensemble"]:
        assert (calibrated / member / "head.safetensors").read_bytes() == (
            out / member / "head.safetensors"
        ).read_bytes()
    engine = DecisionEngine.from_pretrained(calibrated, device="cpu")
    assert engine.calibrator.temperatures == pytest.approx(
        {k: float(v) for k, v in report["temperatures"].items()}
    )
    # A bad ensemble size is a usage error naming the limit.
    assert main([*args, "--ensemble", "0"]) == 2
    assert "argument --ensemble: must be >= 1; got 0" in capsys.readouterr().err
