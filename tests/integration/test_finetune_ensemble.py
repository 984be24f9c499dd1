"""An ensemble of fine-tuning runs (``TrainConfig(ensemble=K)``) on a tiny random encoder:
each member on its own seed's validation split, the mean of the members' answers (scored on
the states all of them held out), save/load, int8, resume and the errors of a bad config or
model dir."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_finetune_tiny import (
    QUESTIONS,
    backbone_dir,
    config,
    dataset,
    memorised,
    route_probabilities,
)

from clef_engine import DecisionEngine, ModelLoadError, Noul
from clef_engine.heads.ensemble import EnsembleHead
from clef_engine.heads.memory import MEMORY_FILE
from clef_engine.heads.option_evidence import HEAD_FILE, fingerprint, question_context
from clef_engine.train import TrainConfig, Trainer
from clef_engine.train.config import TrainResult
from clef_engine.train.data import split, split_indices
from clef_engine.train.ensemble import _row_keys, _score_mean

pytest.importorskip("peft")
pytestmark = pytest.mark.slow
__all__ = ["backbone_dir"]  # the module fixture, shared


@pytest.fixture(scope="module")
def ensemble(backbone_dir, tmp_path_factory):
    """Two one-epoch members on 240 states (60 held out): enough for example memories."""
    out = tmp_path_factory.mktemp("ensemble")
    result = Trainer(config(epochs=1, ensemble=2), backbone=str(backbone_dir)).fit(memorised(), out)
    return result, out


def test_members_differ_in_their_start_and_their_split(ensemble) -> None:
    result, out = ensemble
    config = json.loads((out / "config.json").read_text())
    assert config["ensemble"] == ["members/0", "members/1"]
    # By default the mean gets no temperature of its own.
    assert config["calibration"]["temperatures"] == {}
    source = config["calibration"]["source"]
    assert "none: the mean of 2 calibrated members" in source
    reports = [json.loads((out / m / "training.json").read_text()) for m in config["ensemble"]]
    assert [r["config"]["seed"] for r in reports] == [0, 1]
    assert [r["config"]["ensemble"] for r in reports] == [1, 1]
    assert all((out / m / MEMORY_FILE).is_file() for m in config["ensemble"])
    assert (out / "members/0" / HEAD_FILE).read_bytes() != (
        out / "members/1" / HEAD_FILE
    ).read_bytes()
    assert not (out / "checkpoint").exists()
    top = json.loads((out / "training.json").read_text())
    assert [m["seed"] for m in top["members"]] == [0, 1]
    assert set(top["validation"]) == {
        "accuracy",
        "nll",
        "ece",
        "ece_calibrated",
        "members_accuracy",
        "answers",
    }
    assert top["validation"]["ece_calibrated"] == top["validation"]["ece"]
    assert len(result.members) == 2 and result.validation == top["validation"]
    assert {h["member"] for h in result.history} == {0.0, 1.0}


@pytest.mark.parametrize("member", [0, 1])
def test_each_member_is_the_plain_run_of_its_seed(backbone_dir, ensemble, tmp_path, member):
    _, out = ensemble
    Trainer(config(epochs=1, seed=member), backbone=str(backbone_dir)).fit(memorised(), tmp_path)
    for name in (HEAD_FILE, MEMORY_FILE):
        assert (tmp_path / name).read_bytes() == (out / f"members/{member}" / name).read_bytes()


def test_answers_are_the_mean_of_the_members(ensemble) -> None:
    _, out = ensemble
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    assert isinstance(engine.head, EnsembleHead)
    members = [DecisionEngine.from_pretrained(out / f"members/{i}", device="cpu") for i in (0, 1)]
    texts = [ex.state for ex in memorised(n=12, seed=1).examples]
    mean = sum(route_probabilities(m, texts) for m in members) / 2
    assert engine.calibrator.temperature("choice", 3) == 1.0
    torch.testing.assert_close(route_probabilities(engine, texts), mean, atol=1e-9, rtol=0)
    # A question the members were not trained on: zero-shot, as the first member answers it.
    other = {"urgent": Noul(instructions="is this urgent?")}
    assert not engine.head.knows(other["urgent"])
    assert engine.decide(texts[0], other).answers == members[0].decide(texts[0], other).answers
    versions = {engine.model_version, *(m.model_version for m in members)}
    assert len(versions) == 3


def test_the_mean_of_synthetic_held_out_answers_is_scored_without_a_temperature() -> None:
    """Two calibrated members (right 85 % of the time, with 0.85) that err on different
    rows: their mean is right more often than either, and gets no temperature of its own
    (the measured default; a fit there raised test ECE in 12 of 15 BANKING77 ensembles)."""
    data = memorised(n=30)
    question = data.questions["route"]
    fp = fingerprint("choice", data.names("route"), question_context(question))
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (300,), generator=g)
    held = []
    for shift in (1, 2):
        wrong = torch.where(torch.rand(300, generator=g) < 0.15, (labels + shift) % 3, labels)
        probs = torch.full((300, 3), 0.075, dtype=torch.float64)
        probs[torch.arange(300), wrong] = 0.85
        held.append({fp: (probs, labels)})
    members = [TrainResult(None, [], 1, {}, 0.0) for _ in held]  # type: ignore[arg-type]
    calibration, validation = _score_mean(held, data, members)
    assert calibration.temperatures == {} and calibration.temperature("choice", 3) == 1.0
    assert validation["ece_calibrated"] == validation["ece"]
    assert validation["answers"] == 300.0
    # Both members wrong on the same row is rare, so the mean is right more often.
    assert validation["accuracy"] > validation["members_accuracy"]
    held[1] = {fp: (held[1][fp][0], (labels + 1) % 3)}
    with pytest.raises(RuntimeError, match="member 1 was not validated on the states of member 0"):
        _score_mean(held, data, members)


def test_members_hold_out_the_splits_of_their_own_seeds(ensemble) -> None:
    """Member i holds out the split of seed i, as the single run of that seed does; the mean
    is scored on the states both held out, and each member's memory adds its own."""
    _, out = ensemble
    data = memorised()
    reports = [json.loads((out / f"members/{i}/training.json").read_text()) for i in (0, 1)]
    held = [set(split_indices(data, 0.25, seed=i, base_seed=0, shared=0.0)[1]) for i in (0, 1)]
    assert held == [set(split_indices(data, 0.25, seed=i)[1]) for i in (0, 1)]
    assert len(held[0]) == len(held[1]) == 60 and held[0] != held[1]
    common = held[0] & held[1]
    validation = json.loads((out / "training.json").read_text())["validation"]
    assert validation["answers"] == len(common) > 0
    assert [reports[i]["memory"]["route"]["validation_states"] for i in (0, 1)] == [60.0, 60.0]
    assert len(held[0] | held[1]) > 60  # together the members trained on more states


def test_the_mean_is_scored_on_the_rows_every_member_held_out() -> None:
    """Members that held out different states: only the rows both held out count, matched
    by (question, example index) whatever their position."""
    data = memorised(n=30)
    fp = fingerprint("choice", data.names("route"), question_context(data.questions["route"]))
    g = torch.Generator().manual_seed(1)
    probs = [torch.softmax(torch.randn(8, 3, generator=g, dtype=torch.float64), -1) for _ in "ab"]
    labels = torch.randint(0, 3, (8,), generator=g)
    keys = [[("route", i) for i in range(8)], [("route", i) for i in range(4, 12)]]
    other = torch.cat([probs[1][4:], torch.full((4, 3), 1 / 3, dtype=torch.float64)])
    other_labels = torch.cat([labels[4:], (labels[:4] + 1) % 3])  # rows 8..11: not member 0's
    held = [{fp: (probs[0], labels)}, {fp: (other, other_labels)}]
    members = [TrainResult(None, [], 1, {}, 0.0) for _ in held]  # type: ignore[arg-type]
    _, validation = _score_mean(held, data, members, keys=[{fp: k} for k in keys])
    _, expected_validation = _score_mean(
        [{fp: (probs[0][4:], labels[4:])}, {fp: (probs[1][4:], labels[4:])}], data, members
    )
    assert validation == expected_validation and validation["answers"] == 4.0
    with pytest.raises(RuntimeError, match="member 1 held out 8 answers, not the 7 of its split"):
        _score_mean(held, data, members, keys=[{fp: keys[0]}, {fp: keys[1][:7]}])
    assert _row_keys(data, [3, 1])[fp] == [("route", 3), ("route", 1)]
    # Members that held out no state in common: the identity and no validation metrics.
    apart = [{fp: (probs[0][:4], labels[:4])}, {fp: (probs[1][4:], labels[4:])}]
    apart_keys = [{fp: keys[0][:4]}, {fp: keys[1][4:]}]
    identity, nothing = _score_mean(apart, data, members, keys=apart_keys)
    assert identity.temperatures == {} and nothing == {}


def test_ensemble_round_trips_moves_and_quantizes(ensemble, tmp_path) -> None:
    _, out = ensemble
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    engine.save_pretrained(tmp_path / "copy")
    saved = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert saved["ensemble"] == ["members/0", "members/1"]
    again = DecisionEngine.from_pretrained(tmp_path / "copy", device="cpu")
    state, qs = memorised(n=1, seed=2).examples[0].state, dict(QUESTIONS)
    a, b = engine.decide(state, qs), again.decide(state, qs)
    assert a.to_wire()["answers"] == b.to_wire()["answers"]
    assert a.x_model_version == b.x_model_version == saved["model_version"]
    engine.to("cpu")
    assert engine.decide(state, qs).to_wire()["answers"] == a.to_wire()["answers"]
    int8 = DecisionEngine.from_pretrained(out, device="cpu", quantize="int8")
    assert [m.backbone.quantize for m in int8.head.members] == ["int8", "int8"]
    probabilities = int8.decide(state, qs).answers["route"].probabilities
    assert abs(sum(probabilities.values()) - 1.0) < 1e-9


def test_to_moves_every_member_with_its_trained_head(ensemble, monkeypatch) -> None:
    import clef_engine.backbones.encoder as encoder
    import clef_engine.runtime.engine as runtime

    for module in (encoder, runtime):  # no GPU here: move to meta, past the device check
        monkeypatch.setattr(module, "select_device", lambda d: torch.device(d or "cpu"))
    _, out = ensemble
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    engine.to("meta")
    for member in engine.head.members:
        assert member.device.type == "meta"
        assert {p.device.type for p in member.head.module.parameters()} == {"meta"}


def test_resume_keeps_a_finished_member_of_the_same_recipe(backbone_dir, tmp_path, monkeypatch):
    trained: list[str] = []
    interrupt = True
    original = Trainer.fit

    def interrupted(self, data, out, **kwargs):
        if self.config.ensemble == 1:
            trained.append(out.name)
            if out.name == "1" and interrupt:
                raise KeyboardInterrupt
        return original(self, data, out, **kwargs)

    monkeypatch.setattr(Trainer, "fit", interrupted)
    data = memorised(n=48)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(epochs=1, ensemble=2), backbone=str(backbone_dir)).fit(data, tmp_path)
    assert (tmp_path / "checkpoint/member0/held_out.pt").is_file()
    # Another recipe: the finished member does not count and is trained again.
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(epochs=1, ensemble=2, lr=5e-3), backbone=str(backbone_dir)).fit(
            data, tmp_path, resume=True
        )
    assert trained == ["0", "1", "0", "1"]
    # The same recipe on as many other states: trained again too.
    other = memorised(n=48, seed=1)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(epochs=1, ensemble=2, lr=5e-3), backbone=str(backbone_dir)).fit(
            other, tmp_path, resume=True
        )
    assert trained == ["0", "1", "0", "1", "0", "1"]
    interrupt = False
    result = Trainer(config(epochs=1, ensemble=2, lr=5e-3), backbone=str(backbone_dir)).fit(
        other, tmp_path, resume=True
    )
    assert trained == ["0", "1", "0", "1", "0", "1", "1"]  # the same recipe: member 0 kept
    assert [m.directory.name for m in result.members] == ["0", "1"]
    assert result.members[0].history and not (tmp_path / "checkpoint").exists()
    assert isinstance(DecisionEngine.from_pretrained(tmp_path).head, EnsembleHead)


def test_bad_ensemble_configs_and_model_dirs(ensemble, backbone_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="ensemble must be at least 1; got 0"):
        TrainConfig(ensemble=0).check()
    with pytest.raises(ValueError, match="states they hold out; it needs val_fraction > 0"):
        TrainConfig(ensemble=2, val_fraction=0).check()
    _, out = ensemble
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    config = json.loads((copy / "config.json").read_text())

    def load_with(members):
        (copy / "config.json").write_text(json.dumps({**config, "ensemble": members}))
        return DecisionEngine.from_pretrained(copy, device="cpu")

    with pytest.raises(ModelLoadError, match="'ensemble' must be a non-empty list"):
        load_with([])
    with pytest.raises(ModelLoadError, match=r"member '\.\./x' is not inside the model dir"):
        load_with(["../x"])
    shutil.copytree(backbone_dir, copy / "bare")
    with pytest.raises(ModelLoadError, match="must be a fine-tuned clef-agents model dir"):
        load_with(["members/0", "bare"])
    other = json.loads((copy / "members/1/config.json").read_text())
    other["head"]["questions"] = {"0" * 16: {}}
    shutil.copytree(copy / "members/1", copy / "other")
    (copy / "other/config.json").write_text(json.dumps(other))
    with pytest.raises(ModelLoadError, match="'other' was trained on other questions"):
        load_with(["members/0", "other"])
    with pytest.raises(ModelLoadError, match="members/9' does not exist"):
        load_with(["members/0", "members/9"])
    load_with(["members/0", "members/1"])
    with pytest.raises(ModelLoadError, match="do not pass backbone="):
        DecisionEngine.from_pretrained(copy, backbone="encoder")


def test_held_out_answers_without_a_memory_are_the_calibrated_head(backbone_dir, tmp_path):
    """What an ensemble member contributes when it keeps no memory (``memory=False``)."""
    data = dataset(n=24)
    trainer = Trainer(config(epochs=1, memory=False), backbone=str(backbone_dir))
    trainer.fit(data, tmp_path)
    calibration = DecisionEngine.from_pretrained(tmp_path, device="cpu").calibrator
    _, val = split(data, 0.25, seed=0)
    assert set(trainer.held_out) == set(trainer.fps.values()) and len(trainer.fps) == 3
    for qid, fp in trainer.fps.items():
        probs, labels = trainer.held_out[fp]
        _, logits, expected_labels, _ = trainer.evaluate(val.only(qid))
        qtype, n = str(data.questions[qid].type), len(data.names(qid))
        expected = torch.softmax(calibration.scale(torch.stack(logits), qtype, n), dim=-1)
        torch.testing.assert_close(probs, expected)
        assert labels.tolist() == expected_labels
