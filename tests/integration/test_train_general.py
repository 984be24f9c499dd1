"""Training the general decision model on a tiny mixture: resumable, and its model dir loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_engine import DecisionEngine, Noul
from clef_engine.train.general import GeneralTrainer, main
from clef_engine.train.mixture import MixtureSampler, load_mixture

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
