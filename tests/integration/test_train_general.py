"""Training the general decision model on a tiny mixture: resumable, and its model dir loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clef_engine import Choice, DecisionEngine, Noul
from clef_engine.heads.zero_shot import question_state
from clef_engine.train.general import GeneralTrainer, main, raw_logits
from clef_engine.train.mixture import Item, MixtureSampler, load_mixture

pytestmark = pytest.mark.integration


def _write(root: Path, name: str, rows: list[dict[str, str]]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def mixture(tmp_path: Path) -> Path:
    root = tmp_path / "mix"
    _write(
        root,
        "snips",
        [{"text": f"play song number {i}", "label": "PlayMusic"} for i in range(12)]
        + [{"text": f"will it rain in city {i}", "label": "GetWeather"} for i in range(12)],
    )
    _write(
        root,
        "cr",
        [{"text": f"love this phone {i}", "label": "positive"} for i in range(12)]
        + [{"text": f"it broke on day {i}", "label": "negative"} for i in range(12)],
    )
    return root


def test_a_resumed_run_continues_where_it_stopped(mixture: Path, tmp_path: Path) -> None:
    sets = load_mixture(mixture)
    first = GeneralTrainer(batch_size=4, seed=1)
    first.train(MixtureSampler(sets, seed=1), 2, checkpoint=tmp_path / "ckpt", checkpoint_every=1)
    assert json.loads((tmp_path / "ckpt" / "meta.json").read_text())["step"] == 2
    again = GeneralTrainer(batch_size=4, seed=1)
    stats = again.train(MixtureSampler(sets, seed=1), 3, checkpoint=tmp_path / "ckpt")
    assert stats["steps"] == 3
    trained = dict(first._named())
    for name, p in again._named():  # the resumed weights started from the checkpoint
        if name == "log_scale":
            continue
        assert p.shape == trained[name].shape
    # The same step draws the same batch, so a resumed run sees what a straight run would.
    a, b = first.batch(MixtureSampler(sets, seed=1)), first.batch(MixtureSampler(sets, seed=1))
    assert [(x.state, x.label) for x in a] == [(y.state, y.label) for y in b]


def test_the_command_writes_a_loadable_calibrated_model_dir(mixture: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    args = ["--data", str(mixture), "--out", str(out), "--steps", "2", "--batch-size", "4"]
    assert main([*args, "--calibration-per-set", "40", "--exclude", "snips"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["scorer"] == {"option_texts": "prompted"}
    assert (
        "cr" in config["calibration"]["source"]
        or "left out: snips" in config["calibration"]["source"]
    )
    assert config["calibration"]["temperatures"] and config["calibration_int8"]["temperatures"]
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "train.json").read_text())["sets"] == ["cr"]
    engine = DecisionEngine.from_pretrained(out)
    assert engine.head.prompted
    answer = engine.decide("it broke after a week", {"q": Noul(instructions="Is it positive?")})
    assert 0.0 < answer.answers["q"].noul < 1.0
    int8 = DecisionEngine.from_pretrained(out, quantize="int8")
    assert int8.calibrator.to_dict() == config["calibration_int8"]
    # --recalibrate refits the calibrations of the dir on the same held-out rows, no training.
    (out / "config.json").write_text(json.dumps({**config, "calibration": {}}))
    assert main([*args, "--calibration-per-set", "40", "--exclude", "snips", "--recalibrate"]) == 0
    again = json.loads((out / "config.json").read_text())
    assert again["calibration"]["temperatures"] == pytest.approx(
        config["calibration"]["temperatures"]
    )


def test_a_head_trains_resumes_and_answers_every_question(mixture: Path, tmp_path: Path) -> None:
    """``--head``: the option-evidence head trains with the adapter, is checkpointed with
    it, and the model dir's head answers questions it never saw, on prompted option texts,
    with the calibration fitted on the head's own logits."""
    sets = load_mixture(mixture)
    first = GeneralTrainer(batch_size=4, seed=1, head=True)
    first.train(MixtureSampler(sets, seed=1), 2, checkpoint=tmp_path / "ckpt")
    again = GeneralTrainer(batch_size=4, seed=1, head=True)
    again.load_checkpoint(tmp_path / "ckpt")
    assert again.head is not None and first.head is not None
    for (name, p), (_, q) in zip(again.head.named_parameters(), first.head.named_parameters()):
        assert torch.equal(p, q), name
    # Training moved the evidence correction off its zero start.
    assert float(first.head.out.weight.detach().abs().sum()) > 0.0

    out = tmp_path / "model"
    args = ["--data", str(mixture), "--out", str(out), "--steps", "2", "--batch-size", "4"]
    assert main([*args, "--calibration-per-set", "20", "--head"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["head"]["scope"] == "all" and config["head"]["questions"] == {}
    engine = DecisionEngine.from_pretrained(out)
    assert engine.head.prompted and engine.head.knows(Noul(instructions="Is it urgent?"))
    question = Noul(instructions="Is it urgent?")
    items = [Item("the server is down", question, 0, "x")]
    raw = raw_logits(engine, items)[0]
    expected = torch.softmax(engine.calibrator.scale(raw.double().unsqueeze(0), "noul", 2), -1)
    answer = engine.decide("the server is down", {"q": question}).answers["q"]
    assert answer.noul == pytest.approx(float(expected[0, 0]), abs=1e-6)


def test_a_question_aware_model_reads_yes_no_questions_with_their_state(
    mixture: Path, tmp_path: Path
) -> None:
    """``--question-aware``: the model dir says so, and the engine then reads a yes/no
    question's state with the question in front, the same way in answers and in the
    calibration fit; other questions still share the state's own vector."""
    out = tmp_path / "model"
    args = ["--data", str(mixture), "--out", str(out), "--steps", "2", "--batch-size", "4"]
    assert main([*args, "--calibration-per-set", "20", "--question-aware"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["scorer"] == {"option_texts": "prompted", "noul_state": "question_aware"}
    engine = DecisionEngine.from_pretrained(out)
    assert engine.head.question_aware  # type: ignore[attr-defined]
    state, question = "the server is down", Noul(instructions="Is it urgent?")
    team = Choice(instructions="Which team?", criteria=["ops", "sales"])
    raw = raw_logits(engine, [Item(state, question, 0, "x")])[0]
    text = question_state(question, state)
    assert text == "Is it urgent? [SEP] the server is down"
    vector = engine.backbone.encode([text]).pooled[0].float()
    prepared = engine.prepare_question(question)
    assert prepared.vectors is not None
    assert torch.allclose(raw, vector @ prepared.vectors.float().T, atol=1e-5)
    expected = torch.softmax(engine.calibrator.scale(raw.double().unsqueeze(0), "noul", 2), -1)
    aware = engine.decide(state, {"q": question, "team": team})
    assert aware.answers["q"].noul == pytest.approx(float(expected[0, 0]), abs=1e-6)

    engine.head.question_aware = False  # type: ignore[attr-defined]
    plain = engine.decide(state, {"q": question, "team": team})
    assert plain.answers["q"].noul != pytest.approx(aware.answers["q"].noul, abs=1e-6)
    assert plain.answers["team"].probabilities == pytest.approx(
        aware.answers["team"].probabilities, abs=1e-9
    )
    # The second reading of the state is counted in the usage.
    assert aware.usage.input_tokens > plain.usage.input_tokens
