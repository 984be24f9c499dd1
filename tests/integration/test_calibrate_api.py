"""``clef_engine.train.calibrate``: the library call behind ``clef-agents calibrate``."""

from __future__ import annotations

import json
import shutil

import pytest
from test_finetune_tiny import QUESTIONS, backbone_dir, config, dataset, memorised

from clef_engine import DecisionEngine, InvalidRequestError
from clef_engine.train import CalibrationReport, Trainer, TrainingDataError, calibrate

pytest.importorskip("peft")
pytestmark = pytest.mark.slow
__all__ = ["backbone_dir"]  # the module fixture, shared


@pytest.fixture(scope="module")
def model(backbone_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    Trainer(config(epochs=1), backbone=str(backbone_dir)).fit(memorised(), out)
    return out


def test_dry_run_reports_and_saves_nothing(model) -> None:
    before = (model / "config.json").read_bytes()
    report = calibrate(model, memorised(n=90, seed=3), dry_run=True, device="cpu")
    assert isinstance(report, CalibrationReport)
    assert report.labels == 90 and report.saved is None
    assert set(report.before) == set(report.after) == {"ece", "nll", "brier"}
    assert report.after["nll"] <= report.before["nll"] + 1e-6  # fitted on these rows
    assert "choice/b2" in report.temperatures
    assert report.memory is not None and "route" in report.memory
    assert len(report.probabilities["after"]) == len(report.targets) == 90
    assert (model / "config.json").read_bytes() == before
    assert set(report.to_dict()) == {
        "labels",
        "before",
        "after",
        "temperatures",
        "histograms",
        "memory",
    }


def test_saving_updates_the_model_dir_that_then_loads_with_it(model, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    report = calibrate(copy, memorised(n=90, seed=3), device="cpu", source="notebook")
    assert report.saved == str(copy)
    saved = json.loads((copy / "config.json").read_text())["calibration"]
    assert saved["source"] == "notebook on word bags (90 labels)"
    engine = DecisionEngine.from_pretrained(copy, device="cpu")
    assert engine.calibrator.temperatures == pytest.approx(report.temperatures)
    # A new dir instead: the model dir is left as it was.
    again = calibrate(model, memorised(n=90, seed=3), out=tmp_path / "new", device="cpu")
    assert again.saved == str(tmp_path / "new")
    assert json.loads((model / "config.json").read_text()).get("calibration") != saved
    loaded = DecisionEngine.from_pretrained(tmp_path / "new", device="cpu")
    state = dataset(n=1, seed=4).examples[0].state
    probabilities = loaded.decide(state, dict(QUESTIONS)).answers["route"].probabilities
    assert sum(probabilities.values()) == pytest.approx(1.0)


def test_bad_calls_are_typed_errors_naming_the_field(model, backbone_dir, tmp_path) -> None:
    with pytest.raises(InvalidRequestError, match="bare Hugging Face model dir; pass out=DIR") as e:
        calibrate(backbone_dir, memorised(n=30), device="cpu")
    assert e.value.field == "out"
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(InvalidRequestError, match="is a file") as e:
        calibrate(model, memorised(n=30), out=file, device="cpu")
    assert e.value.field == "out"
    nothing = memorised(n=30)
    nothing.examples = [type(ex)(ex.state, {}) for ex in nothing.examples]
    with pytest.raises(TrainingDataError, match="no labelled questions that calibration can fit"):
        calibrate(model, nothing, dry_run=True, device="cpu")
    with pytest.raises(TrainingDataError, match="no such file"):
        calibrate(model, tmp_path / "none.csv", dry_run=True, device="cpu")
