"""Training the general decision model on a tiny mixture: resumable, and its model dir loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clef_engine import DecisionEngine, Noul
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


def test_the_command_writes_a_loadable_calibrated_model_dir(
    mixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    # The held-out rows follow --split-seed when given (runs of two seeds share them).
    from clef_engine.train import general

    split_seeds: list[int] = []
    real_split = general.split_rows

    def recording_split(sets: object, fraction: float, seed: int) -> object:
        split_seeds.append(seed)
        return real_split(sets, fraction, seed)  # type: ignore[arg-type]

    monkeypatch.setattr(general, "split_rows", recording_split)
    recal = [*args, "--calibration-per-set", "40", "--recalibrate", "--seed", "3"]
    assert main(recal) == 0 and main([*recal, "--split-seed", "0"]) == 0
    assert split_seeds == [3, 0]


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
