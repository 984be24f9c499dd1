"""Fine-tuning end to end on a tiny random encoder: loss, save/load, fallback, resume."""

from __future__ import annotations

import json
import random
import shutil
import sys
from dataclasses import replace

import pytest
import torch

from clef_engine import Choice, DecisionEngine, MissingDependencyError, Noul, Score
from clef_engine.heads.memory import MEMORY_FILE
from clef_engine.heads.prototype import PrototypeClassifier
from clef_engine.heads.trained import TrainedHead
from clef_engine.testing import write_tiny_bert
from clef_engine.train import Example, TrainConfig, Trainer, TrainingDataError, TrainingSet
from clef_engine.train.data import split

pytest.importorskip("peft")
pytestmark = pytest.mark.slow

QUESTIONS = {
    "route": Choice(instructions="route the ticket", criteria=["billing", "tech", "sales"]),
    "urgency": Score(instructions="urgency", criteria=["low", "medium", "high"]),
    "human": Noul(instructions="needs a human?"),
}
WORDS = {
    "billing": "refund payment money",
    "tech": "bug error login page",
    "sales": "exchange rate",
}


def dataset(n: int = 24, seed: int = 0) -> TrainingSet:
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        label = list(WORDS)[i % 3]
        level = rng.randrange(3)
        words = [*WORDS[label].split(), ["low", "medium", "high"][level]]
        rng.shuffle(words)
        labels = {"route": i % 3, "urgency": level, "human": int(label == "tech")}
        examples.append(Example(" ".join(words) + f" {i}", labels))
    return TrainingSet(dict(QUESTIONS), examples, "synthetic")


def config(**kw) -> TrainConfig:
    base = dict(
        epochs=3,
        batch_size=8,
        lora_rank=2,
        head_dim=16,
        head_heads=2,
        head_lr=1e-2,
        lr=1e-2,
        val_fraction=0.25,
        progress=False,
        max_length=32,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def trained(backbone_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    trainer = Trainer(config(), backbone=str(backbone_dir))
    result = trainer.fit(dataset(n=40), out)
    return trainer, result, out


def test_training_lowers_the_loss(backbone_dir, trained) -> None:
    trainer, result, _ = trained
    data = dataset()
    before = Trainer(config(), backbone=str(backbone_dir))
    before.build(data)
    nll_before = before.evaluate(data)[0]["nll"]
    nll_after = trainer.evaluate(data)[0]["nll"]
    assert nll_after < nll_before
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0]


def test_model_dir_layout_and_report(trained) -> None:
    _, result, out = trained
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "head.safetensors", "adapter", "training.json"} <= names
    assert "checkpoint" not in names
    config = json.loads((out / "config.json").read_text())
    assert config["head"]["kind"] == "option_evidence"
    assert len(config["head"]["questions"]) == 3
    assert set(config["calibration"]["temperatures"]) == {"choice/b2", "score/b2", "noul/b1"}
    report = json.loads((out / "training.json").read_text())
    assert report["best_epoch"] == result.best_epoch >= 1


def test_from_pretrained_uses_the_trained_head(trained) -> None:
    trainer, _, out = trained
    assert_engine_answers_as_the_trainer(trainer, out)


def assert_engine_answers_as_the_trainer(trainer: Trainer, out) -> None:
    """The loaded model dir (adapter merged) gives the trainer's own calibrated answers."""
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    assert isinstance(engine.head, TrainedHead)
    data = dataset(n=6, seed=3)
    texts = [ex.state for ex in data.examples]
    with torch.no_grad():
        tokens, mask, pooled = trainer.features(texts)
        trainer.head.eval()
        qtype, names = "choice", ["billing", "tech", "sales"]
        raw = trainer.head(
            tokens, mask, pooled, trainer.head.option_vectors(qtype, names, None), qtype
        )
    expected = torch.softmax(engine.calibrator.scale(raw.double(), qtype, 3), -1)
    results = engine.decide_batch(texts, {"route": QUESTIONS["route"]})
    got = torch.tensor(
        [[r.answers["route"].probabilities[n] for n in names] for r in results], dtype=torch.float64
    )
    assert torch.allclose(got, expected, atol=1e-4)


def test_option_order_and_wording_do_not_matter_for_trained_choices(trained) -> None:
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    reworded = Choice(instructions="Which team?", criteria=["sales", "billing", "tech"])
    a = engine.decide("refund my money", {"q": QUESTIONS["route"]}).answers["q"].probabilities
    b = engine.decide("refund my money", {"q": reworded}).answers["q"].probabilities
    assert a == pytest.approx(b, abs=1e-9)


def test_untrained_questions_are_answered_zero_shot(trained, backbone_dir) -> None:
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    plain = DecisionEngine(path=backbone_dir, device="cpu")
    new = {"mood": Choice(instructions="mood", criteria=["happy", "angry"])}
    state = "angry about my lost card"
    mixed = engine.decide(state, {**new, "route": QUESTIONS["route"]})
    alone = plain.decide(state, new)
    assert mixed.answers["mood"].probabilities == pytest.approx(alone.answers["mood"].probabilities)
    assert set(mixed.answers) == {"mood", "route"}
    assert mixed.usage.input_tokens >= alone.usage.input_tokens
    # A trained-only request never needs the base backbone.
    fresh = DecisionEngine.from_pretrained(out, device="cpu")
    fresh.decide(state, {"route": QUESTIONS["route"]})
    assert fresh.head._base is None


def test_to_moves_the_trained_head_and_its_zero_shot_engine(trained, monkeypatch) -> None:
    """``DecisionEngine.to`` (the move after a CUDA out-of-memory) takes the trained module
    and a built zero-shot engine along; one built later is built on the new device. The
    machine has no GPU, so the move goes to ``meta`` (tensors without storage), which the
    engine's device check is told to let through."""
    import clef_engine.backbones.encoder as encoder
    import clef_engine.runtime.engine as runtime

    for module in (encoder, runtime):
        monkeypatch.setattr(module, "select_device", lambda d: torch.device(d or "cpu"))
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    built = engine.head.base_engine()
    engine.to("meta")
    assert {p.device.type for p in engine.head.module.parameters()} == {"meta"}
    assert built.device.type == "meta"
    later = DecisionEngine.from_pretrained(out, device="cpu")
    later.to("meta")
    assert later.head._base is None
    assert later.head.base_engine().device.type == "meta"


def test_yes_no_and_score_questions_are_told_apart_by_their_wording(trained, backbone_dir) -> None:
    """Every yes/no question has the options true/false and every 3-level score the levels
    "0".."2": a model trained on "needs a human?" and "urgency" does not answer another
    yes/no or score question with those heads; those are answered zero-shot."""
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    plain = DecisionEngine(path=backbone_dir, device="cpu")
    spam = Noul(instructions="is it spam?")
    anger = Score(instructions="how angry?", criteria=["low", "medium", "high"])
    head = engine.head
    assert isinstance(head, TrainedHead)
    assert head.knows(QUESTIONS["human"]) and head.knows(QUESTIONS["urgency"])
    assert not head.knows(spam) and not head.knows(anger)
    state = "login bug error page"
    mixed = engine.decide(state, {"spam": spam, "anger": anger, "human": QUESTIONS["human"]})
    alone = plain.decide(state, {"spam": spam, "anger": anger})
    assert mixed.answers["spam"].noul == pytest.approx(alone.answers["spam"].noul)
    assert mixed.answers["anger"].probabilities == pytest.approx(
        alone.answers["anger"].probabilities
    )
    trained_only = engine.decide(state, {"human": QUESTIONS["human"]}).answers["human"]
    assert mixed.answers["human"].noul == pytest.approx(trained_only.noul)
    assert mixed.answers["human"].noul != pytest.approx(mixed.answers["spam"].noul)
    # Trained together, two yes/no questions get a head each.
    data = dataset(n=12)
    both = TrainingSet(
        {**data.questions, "spam": spam},
        [Example(ex.state, {**ex.labels, "spam": 1 - ex.labels["human"]}) for ex in data.examples],
        "two yes/no questions",
    )
    trainer = Trainer(config(), backbone=str(backbone_dir))
    trainer.build(both)
    assert trainer.fps["spam"] != trainer.fps["human"]
    assert len(trainer.head.bank) == 4


def test_save_pretrained_round_trip_and_version(trained, tmp_path) -> None:
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    engine.save_pretrained(tmp_path)
    again = DecisionEngine.from_pretrained(tmp_path, device="cpu")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    state, qs = "login page error", dict(QUESTIONS)
    a, b = engine.decide(state, qs), again.decide(state, qs)
    assert a.to_wire()["answers"] == b.to_wire()["answers"]
    assert a.x_model_version == b.x_model_version
    plain = DecisionEngine(path=json.loads((out / "config.json").read_text())["backbone"]["path"])
    assert plain.model_version != engine.model_version


def test_a_small_validation_split_fits_no_memory(trained) -> None:
    _, result, out = trained
    # 40 states, val_fraction 0.25: 10 held-out states, under MIN_HELD_OUT.
    assert {q: r["held_out"] for q, r in result.memory.items()} == dict.fromkeys(QUESTIONS, 10)
    assert all("lam" not in r for r in result.memory.values())
    assert not (out / MEMORY_FILE).exists()
    assert "memory" not in json.loads((out / "config.json").read_text())["head"]
    assert json.loads((out / "training.json").read_text())["memory"] == result.memory


def memorised(n: int = 240, seed: int = 0) -> TrainingSet:
    """States that repeat one of 30 random word bags, each bag with a random route: the
    head learns them slowly, the nearest training states know them at once."""
    rng = random.Random(seed)
    vocab = "refund payment money bug error login page exchange rate card fee cash pin".split()
    bags = [" ".join(rng.sample(vocab, 4)) for _ in range(30)]
    routes = [rng.randrange(3) for _ in bags]
    examples = [Example(f"{bags[i % 30]} {i}", {"route": routes[i % 30]}) for i in range(n)]
    return TrainingSet({"route": QUESTIONS["route"]}, examples, "word bags")


@pytest.fixture(scope="module")
def with_memory(backbone_dir, tmp_path_factory):
    """240 states: 60 held out, enough for an example memory."""
    out = tmp_path_factory.mktemp("memory-model")
    trainer = Trainer(config(epochs=1), backbone=str(backbone_dir))
    return trainer, trainer.fit(memorised(), out), out


def test_example_memory_is_fitted_on_the_validation_split(with_memory) -> None:
    trainer, result, out = with_memory
    report = result.memory["route"]
    assert (report["states"], report["held_out"]) == (180, 60)
    assert report["nll_memory"] < report["nll_head"] / 2
    assert report["k"] in (5, 10, 20, 50) and 0 < report["lam"] <= 1
    described = json.loads((out / "config.json").read_text())["head"]["memory"]
    assert (out / MEMORY_FILE).is_file()
    route = described[trainer.fps["route"]]
    assert route["names"] == ["billing", "tech", "sales"]
    assert {k: route[k] for k in ("k", "tau", "lam", "temperature")} == {
        k: report[k] for k in ("k", "tau", "lam", "temperature")
    }
    assert json.loads((out / "training.json").read_text())["memory"] == result.memory


def test_engine_mixes_the_trained_head_with_the_memory(with_memory) -> None:
    trainer, _, out = with_memory
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    assert isinstance(engine.head, TrainedHead) and engine.head.memory is not None
    texts = [ex.state for ex in memorised(n=12, seed=0).examples]  # bags it has seen
    qtype, names = "choice", ["billing", "tech", "sales"]
    with torch.no_grad():
        tokens, mask, pooled = trainer.features(texts)
        trainer.head.eval()
        raw = trainer.head(
            tokens, mask, pooled, trainer.head.option_vectors(qtype, names, None), qtype
        )
    head_only = torch.softmax(engine.calibrator.scale(raw.double(), qtype, 3), -1)
    assert trainer.memory is not None
    memory = trainer.memory.get(qtype, names)
    assert memory is not None
    expected = memory.mix(head_only, pooled, names)

    def answers(e: DecisionEngine) -> torch.Tensor:
        results = e.decide_batch(texts, {"route": QUESTIONS["route"]})
        rows = [[r.answers["route"].probabilities[n] for n in names] for r in results]
        return torch.tensor(rows, dtype=torch.float64)

    torch.testing.assert_close(answers(engine), expected, atol=1e-4, rtol=0)
    engine.head.memory = None
    torch.testing.assert_close(answers(engine), head_only, atol=1e-4, rtol=0)
    assert not torch.allclose(expected, head_only, atol=1e-3)  # the memory changed something


def test_memory_vectors_are_those_the_loaded_engine_computes(with_memory) -> None:
    trainer, _, out = with_memory
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    fitted, val = split(memorised(), 0.25, seed=0)  # the trainer's split
    stored = trainer.memory.questions[trainer.fps["route"]].vectors
    # The training states, then (memory_add_validation, the default) the validation states.
    texts = [ex.state for ex in fitted.examples + val.examples]
    torch.testing.assert_close(stored, engine.backbone.encode(texts).pooled, atol=1e-5, rtol=0)
    # A state longer than the training max_length (32 tokens) is not truncated for it.
    long = " ".join(["refund payment login error"] * 30)
    assert engine.backbone.count_tokens([long])[0] > 32
    whole = engine.backbone.encode([long]).pooled
    torch.testing.assert_close(trainer._engine_vectors([long]), whole, atol=1e-5, rtol=0)
    assert not torch.allclose(trainer._encode([long]), whole, atol=1e-3)  # truncated


def test_memory_round_trips_and_is_part_of_the_version(with_memory, tmp_path) -> None:
    _, _, out = with_memory
    engine = DecisionEngine.from_pretrained(out, device="cpu")
    engine.save_pretrained(tmp_path / "copy")
    again = DecisionEngine.from_pretrained(tmp_path / "copy", device="cpu")
    assert (tmp_path / "copy" / MEMORY_FILE).is_file()
    state, qs = memorised(n=1).examples[0].state, dict(QUESTIONS)
    a, b = engine.decide(state, qs), again.decide(state, qs)
    assert a.to_wire()["answers"] == b.to_wire()["answers"]
    assert a.x_model_version == b.x_model_version
    # The same dir without its memory entry: the head alone, under another version.
    shutil.copytree(out, tmp_path / "bare")
    config = json.loads((tmp_path / "bare" / "config.json").read_text())
    del config["head"]["memory"]
    (tmp_path / "bare" / "config.json").write_text(json.dumps(config))
    bare = DecisionEngine.from_pretrained(tmp_path / "bare", device="cpu")
    assert bare.head.memory is None
    assert bare.model_version != engine.model_version
    route = {"route": QUESTIONS["route"]}
    assert bare.decide(state, route).answers != engine.decide(state, route).answers


def route_probabilities(engine: DecisionEngine, texts: list[str]) -> torch.Tensor:
    results = engine.decide_batch(texts, {"route": QUESTIONS["route"]})
    names = ["billing", "tech", "sales"]
    rows = [[r.answers["route"].probabilities[n] for n in names] for r in results]
    return torch.tensor(rows, dtype=torch.float64)


def test_int8_mixes_its_own_head_with_the_memory(with_memory) -> None:
    _, _, out = with_memory
    int8 = DecisionEngine.from_pretrained(out, device="cpu", quantize="int8")
    memory = int8.head.memory
    assert memory is not None
    texts = [ex.state for ex in memorised(n=12, seed=0).examples]
    mixed = route_probabilities(int8, texts)
    with_version = int8.model_version
    int8.head.memory = None
    alone = route_probabilities(int8, texts)
    assert int8.model_version != with_version  # answers from the head alone say so
    route = memory.get("choice", ["billing", "tech", "sales"])
    expected = route.mix(alone, int8.backbone.encode(texts).pooled, route.names)
    torch.testing.assert_close(mixed, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(mixed, alone, atol=1e-3)
    int8.head.memory = memory
    assert int8.model_version == with_version


def test_memory_off(backbone_dir, tmp_path) -> None:
    off = Trainer(config(epochs=1, memory=False), backbone=str(backbone_dir))
    result = off.fit(memorised(), tmp_path / "off")
    assert result.memory == {} and off.memory is None
    assert not (tmp_path / "off" / MEMORY_FILE).exists()
    with pytest.raises(ValueError, match="memory_max_states must be at least 1"):
        TrainConfig(memory_max_states=0).check()


def two_choice_questions(bags: TrainingSet) -> TrainingSet:
    """The word bags as two choice questions over one option set (one fingerprint: a
    choice is known by its options, whatever its wording), each asked of every other
    state."""
    levels = ["low", "medium", "high"]
    questions = {
        "urgency": Choice(instructions="urgency", criteria=levels),
        "severity": Choice(instructions="how severe?", criteria=levels),
    }
    examples = [
        Example(ex.state, {"urgency" if i % 2 else "severity": ex.labels["route"]})
        for i, ex in enumerate(bags.examples)
    ]
    return TrainingSet(questions, examples, "bags")


def test_questions_with_one_fingerprint_share_one_memory(backbone_dir, tmp_path) -> None:
    """Two choice questions over one option set have the same fingerprint, so the head
    gives them one option bank; their memory is one too, fitted on both."""
    trainer = Trainer(config(epochs=1), backbone=str(backbone_dir))
    result = trainer.fit(two_choice_questions(memorised()), tmp_path)
    assert trainer.fps["urgency"] == trainer.fps["severity"]
    assert result.memory["urgency"] == result.memory["severity"]
    assert result.memory["urgency"]["states"] == 180  # both questions' training states
    assert result.memory["urgency"]["held_out"] == 60
    described = json.loads((tmp_path / "config.json").read_text())["head"]["memory"]
    assert list(described) == [trainer.fps["urgency"]]


def test_memory_max_states_samples_the_training_states(backbone_dir, tmp_path) -> None:
    trainer = Trainer(config(epochs=1, memory_max_states=40), backbone=str(backbone_dir))
    result = trainer.fit(memorised(), tmp_path)
    assert result.memory["route"]["states"] == 40
    assert trainer.memory is not None
    # 40 training states; the 60 validation states join them after the fit (the default).
    assert [len(m) for m in trainer.memory.questions.values()] == [100]


def test_the_validation_states_join_the_memory_after_the_fit(backbone_dir, tmp_path) -> None:
    class TrainingStatesOnly(Trainer):  # how a probe keeps the validation states out
        ADD_VALIDATION_TO_MEMORY = False

    runs = {}
    for add, kind in ((False, TrainingStatesOnly), (True, Trainer)):
        trainer = kind(config(epochs=1), backbone=str(backbone_dir))
        runs[add] = trainer, trainer.fit(memorised(), tmp_path / str(add))
    (off, off_result), (on, on_result) = runs[False], runs[True]
    settings = ("k", "tau", "lam", "temperature", "nll_memory", "states", "held_out")
    # The same model chooses the same settings; only the stored states differ.
    assert {k: on_result.memory["route"][k] for k in settings} == {
        k: off_result.memory["route"][k] for k in settings
    }
    assert on_result.memory["route"]["validation_states"] == 60
    assert "validation_states" not in off_result.memory["route"]
    assert off.memory is not None and on.memory is not None
    before = off.memory.questions[off.fps["route"]]
    after = on.memory.questions[on.fps["route"]]
    assert (len(before), len(after)) == (180, 240)
    torch.testing.assert_close(after.vectors[:180], before.vectors, atol=1e-6, rtol=0)
    assert torch.equal(after.labels[:180], before.labels)
    _, val = split(memorised(), 0.25, seed=0)  # the trainer's split: the held-out states
    assert after.labels[180:].tolist() == [ex.labels["route"] for ex in val.examples]
    engine = DecisionEngine.from_pretrained(tmp_path / "True", device="cpu")
    texts = [ex.state for ex in val.examples]
    torch.testing.assert_close(
        after.vectors[180:], engine.backbone.encode(texts).pooled, atol=1e-5, rtol=0
    )
    loaded = engine.head.memory.questions[on.fps["route"]]  # type: ignore[union-attr]
    assert len(loaded) == 240 and loaded.settings == after.settings


def test_int8_loads_and_answers(trained) -> None:
    _, _, out = trained
    engine = DecisionEngine.from_pretrained(out, device="cpu", quantize="int8")
    probs = engine.decide("refund", {"r": QUESTIONS["route"]}).answers["r"].probabilities
    assert sum(probs.values()) == pytest.approx(1.0)


def interrupt_at_second_evaluation(monkeypatch):
    """Make the 2nd ``Trainer.evaluate`` call (epoch 2's) raise; returns the real method."""
    calls = {"n": 0}
    original = Trainer.evaluate

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", flaky)
    return original


def test_resume_continues_from_the_last_checkpoint(backbone_dir, tmp_path, monkeypatch) -> None:
    data = dataset(n=12)
    original = interrupt_at_second_evaluation(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(epochs=2), backbone=str(backbone_dir)).fit(data, tmp_path)
    meta = json.loads((tmp_path / "checkpoint" / "meta.json").read_text())
    assert meta["epoch"] == 1
    monkeypatch.setattr(Trainer, "evaluate", original)
    result = Trainer(config(epochs=2), backbone=str(backbone_dir)).fit(data, tmp_path, resume=True)
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert result.history[0] == meta["history"][0]
    assert not (tmp_path / "checkpoint").exists()


def test_resume_starts_again_on_other_states(backbone_dir, tmp_path, monkeypatch, caplog):
    original = interrupt_at_second_evaluation(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(epochs=2), backbone=str(backbone_dir)).fit(dataset(n=12), tmp_path)
    meta = json.loads((tmp_path / "checkpoint" / "meta.json").read_text())
    monkeypatch.setattr(Trainer, "evaluate", original)
    other = dataset(n=12, seed=1)  # as many states, other words
    assert other.digest() != dataset(n=12).digest() == dataset(n=12).digest()
    with caplog.at_level("WARNING", logger="clef_engine.train.trainer"):
        result = Trainer(config(epochs=2), backbone=str(backbone_dir)).fit(
            other, tmp_path, resume=True
        )
    assert "other training or validation states; training from the start" in caplog.text
    assert [h["epoch"] for h in result.history] == [1, 2]
    # Epoch 1 ran again on the new states (a resumed run copies it from the checkpoint).
    assert result.history[0]["train_loss"] != meta["history"][0]["train_loss"]


def test_a_later_epoch_within_one_standard_error_is_kept(backbone_dir, tmp_path, monkeypatch):
    # 10 validation states x 3 questions: the standard error of 0.9 is sqrt(.09 / 30) = 0.055.
    scripted = iter([0.90, 0.86, 0.70, 0.69])
    original = Trainer.evaluate

    def scored(self, *args, **kwargs):
        metrics, *rest = original(self, *args, **kwargs)
        return ({**metrics, "accuracy": next(scripted, metrics["accuracy"])}, *rest)

    monkeypatch.setattr(Trainer, "evaluate", scored)
    result = Trainer(config(epochs=6), backbone=str(backbone_dir)).fit(dataset(n=40), tmp_path)
    # 0.86 is within 0.055 of 0.90 and comes later: kept. 0.70 and 0.69 are not: patience 2
    # ends the run after epoch 4 of 6.
    assert result.best_epoch == 2
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4]


def test_bad_configs_and_missing_peft(backbone_dir, tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"lora_rank must be in 0\.\.256"):
        TrainConfig(lora_rank=300).check()
    with pytest.raises(ValueError, match="epochs"):
        Trainer(TrainConfig(epochs=0))
    with pytest.raises(ValueError, match="head must be one of option_evidence, prototype"):
        TrainConfig(head="linear").check()
    with pytest.raises(ValueError, match="contrastive_steps trains the LoRA adapters"):
        TrainConfig(contrastive_steps=5, lora_rank=0).check()
    with pytest.raises(ValueError, match="contrastive_per_label must be at least 2"):
        TrainConfig(contrastive_per_label=1).check()
    with pytest.raises(ValueError, match="contrastive_steps must be >= 0; got -1"):
        TrainConfig(contrastive_steps=-1).check()
    with pytest.raises(ValueError, match="head='prototype' has none"):
        TrainConfig(head="prototype", rl_epochs=1).check()
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'clef-agents\[train\]'"):
        Trainer(config(), backbone=str(backbone_dir)).fit(dataset(n=6), tmp_path)


def test_rl_stage_runs_with_partial_credit(backbone_dir, tmp_path) -> None:
    sim = [[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]]
    cfg = config(epochs=1, lora_rank=0, rl_epochs=1, similarity={"route": sim})
    result = Trainer(cfg, backbone=str(backbone_dir)).fit(dataset(n=30), tmp_path)
    rl = [h for h in result.history if "rl_loss" in h]
    assert len(rl) == 1 and rl[0]["epoch"] == 2
    assert "val_accuracy" in rl[0]
    engine = DecisionEngine.from_pretrained(tmp_path, device="cpu")
    probs = engine.decide("refund", {"r": QUESTIONS["route"]}).answers["r"].probabilities
    assert sum(probs.values()) == pytest.approx(1.0)


def test_rl_stage_encodes_each_state_once_while_the_adapters_are_fixed(backbone_dir, tmp_path):
    cfg = config(epochs=1, rl_epochs=2)  # LoRA rank 2: the adapters trained before RL
    trainer = Trainer(cfg, backbone=str(backbone_dir))
    during_rl: list[str] = []
    forward = trainer._forward

    def counting(texts: list[str]):
        if trainer._frozen:
            during_rl.extend(texts)
        return forward(texts)

    trainer._forward = counting  # type: ignore[method-assign]
    data = dataset(n=24)
    result = trainer.fit(data, tmp_path)
    assert len([h for h in result.history if "rl_loss" in h]) == 2
    # Two RL epochs over the training states, a validation pass after each: every state
    # went through the backbone once, then came from the cache.
    assert sorted(during_rl) == sorted(ex.state for ex in data.examples)
    assert trainer._cache == {} and not trainer._frozen  # dropped once RL is over
    # Cached features are those of an uncached forward in eval mode.
    texts = [ex.state for ex in data.examples[:5]]
    with torch.no_grad():
        trainer.model.eval()
        plain = trainer.features(texts)
        with trainer.fixed_adapters():
            trainer.features(texts[:2])  # cached alone, padded to their own length
            cached = trainer.features(texts)
    for a, b in zip(plain, cached, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-5, rtol=0)


def _separation(trainer: Trainer, data: TrainingSet) -> float:
    """Mean cosine of same-route pairs minus that of different-route pairs."""
    with torch.no_grad():
        pooled = trainer.features([ex.state for ex in data.examples])[2]
    labels = torch.tensor([ex.labels["route"] for ex in data.examples])
    sim = pooled @ pooled.T
    same = labels[:, None] == labels[None, :]
    off = ~torch.eye(len(labels), dtype=torch.bool)
    return float(sim[same & off].mean() - sim[~same].mean())


def route_only(data: TrainingSet) -> TrainingSet:
    examples = [Example(ex.state, {"route": ex.labels["route"]}) for ex in data.examples]
    return TrainingSet({"route": QUESTIONS["route"]}, examples, data.source)


def test_contrastive_stage_then_prototype_head(backbone_dir, tmp_path) -> None:
    data = route_only(dataset(n=30))
    cfg = config(head="prototype", contrastive_steps=30, val_fraction=0.2)
    base = Trainer(cfg, backbone=str(backbone_dir))
    base.build(data)
    trainer = Trainer(cfg, backbone=str(backbone_dir))
    result = trainer.fit(data, tmp_path)
    stage = result.history[0]
    assert stage["contrastive_steps"] == 30
    assert stage["contrastive_loss_last"] < stage["contrastive_loss_first"]
    assert _separation(trainer, data) > _separation(base, data) + 0.1
    # No option-evidence epochs ran; every question got a prototype head.
    assert not any("train_loss" in h for h in result.history) and result.best_epoch == 0
    description = json.loads((tmp_path / "config.json").read_text())["head"]
    assert [q["prototype"] for q in description["questions"].values()] == [True]
    assert (tmp_path / "adapter").is_dir()
    # The engine answers with the stored prototype head on the adapted vectors.
    engine = DecisionEngine.from_pretrained(tmp_path, device="cpu")
    probe = route_only(dataset(n=6, seed=5))
    texts = [ex.state for ex in probe.examples]
    names = ["billing", "tech", "sales"]
    with torch.no_grad():
        pooled = trainer.features(texts)[2]
        raw = trainer.head.prototype_logits("choice", names, pooled)
    expected = torch.softmax(engine.calibrator.scale(raw.double(), "choice", 3), -1)
    results = engine.decide_batch(texts, {"route": QUESTIONS["route"]})
    got = torch.tensor(
        [[r.answers["route"].probabilities[n] for n in names] for r in results], dtype=torch.float64
    )
    assert torch.allclose(got, expected, atol=1e-4)
    # Trained on separable words, it gets most of the held-out probes right.
    hits = sum(int(row.argmax()) == ex.labels["route"] for row, ex in zip(got, probe.examples))
    assert hits >= 5


def test_prototype_heads_for_every_question_of_a_multi_question_set(backbone_dir, tmp_path):
    cfg = config(head="prototype", contrastive_steps=3, val_fraction=0.0)
    result = Trainer(cfg, backbone=str(backbone_dir)).fit(dataset(n=12), tmp_path)
    assert result.history[0]["contrastive_steps"] == 3  # the questions took turns
    description = json.loads((tmp_path / "config.json").read_text())["head"]
    assert sorted(q["type"] for q in description["questions"].values() if q["prototype"]) == [
        "choice",
        "noul",
        "score",
    ]
    engine = DecisionEngine.from_pretrained(tmp_path, device="cpu")
    answers = engine.decide("refund my payment", dict(QUESTIONS)).answers
    assert set(answers) == set(QUESTIONS)
    for qid in ("route", "urgency"):
        assert sum(answers[qid].probabilities.values()) == pytest.approx(1.0)
    assert 0.0 <= answers["human"].noul <= 1.0


def test_prototype_head_without_validation_cross_fits_its_memory(backbone_dir, tmp_path) -> None:
    """The few-shot recipe (``val_fraction=0``): the memory is chosen on the prototype
    head's own folds and holds every example it was fitted on, option texts included."""
    data = memorised(n=120)
    cfg = config(head="prototype", contrastive_steps=3, val_fraction=0.0)
    trainer = Trainer(cfg, backbone=str(backbone_dir))
    result = trainer.fit(data, tmp_path / "on")
    report = result.memory["route"]
    assert report["cross_fitted"] == 1.0
    assert report["states"] == report["held_out"] == 123  # 120 states + 3 option texts
    assert report["nll_memory"] < report["nll_head"]
    assert (tmp_path / "on" / MEMORY_FILE).is_file()
    assert json.loads((tmp_path / "on" / "training.json").read_text())["memory"] == result.memory
    engine = DecisionEngine.from_pretrained(tmp_path / "on", device="cpu")
    stored = engine.head.memory.questions[trainer.fps["route"]]  # type: ignore[union-attr]
    texts = [ex.state for ex in data.examples] + ["billing", "tech", "sales"]
    torch.testing.assert_close(
        stored.vectors, engine.backbone.encode(texts).pooled, atol=1e-5, rtol=0
    )
    # The engine answers with the prototype head mixed with the memory's vote.
    probe = [ex.state for ex in memorised(n=12, seed=0).examples]
    names = ["billing", "tech", "sales"]
    with torch.no_grad():
        pooled = trainer._engine_vectors(probe)
        alone = torch.softmax(trainer.head.prototype_logits("choice", names, pooled).double(), -1)
    results = engine.decide_batch(probe, {"route": QUESTIONS["route"]})
    got = torch.tensor(
        [[r.answers["route"].probabilities[n] for n in names] for r in results], dtype=torch.float64
    )
    torch.testing.assert_close(got, stored.mix(alone, pooled, names), atol=1e-4, rtol=0)
    assert not torch.allclose(got, alone, atol=1e-3)
    # memory=False keeps the head alone.
    off = Trainer(
        config(head="prototype", contrastive_steps=3, val_fraction=0.0, memory=False),
        backbone=str(backbone_dir),
    )
    assert off.fit(data, tmp_path / "off").memory == {} and off.memory is None
    assert not (tmp_path / "off" / MEMORY_FILE).exists()
    # Too few examples for the 50 held-out states a fit needs: none kept, and the report
    # says why.
    small = Trainer(cfg, backbone=str(backbone_dir)).fit(memorised(n=30), tmp_path / "small")
    assert small.memory["route"]["held_out"] == 33 and "lam" not in small.memory["route"]
    assert not (tmp_path / "small" / MEMORY_FILE).exists()
    # 6 states + 3 option texts: too few for the head's 5 folds, so nothing to cross-fit.
    tiny = Trainer(cfg, backbone=str(backbone_dir)).fit(memorised(n=6), tmp_path / "tiny")
    assert {k: tiny.memory["route"][k] for k in ("states", "held_out", "cross_fitted")} == {
        "states": 9.0,
        "held_out": 0.0,
        "cross_fitted": 1.0,
    }


def test_prototype_questions_with_one_fingerprint_share_one_head(backbone_dir, tmp_path) -> None:
    """Two choice questions over one option set: one prototype head, fitted on the examples
    of both (it used to be the second question's alone), and one memory."""
    data = two_choice_questions(memorised(n=120))
    cfg = config(head="prototype", contrastive_steps=0, lora_rank=0, val_fraction=0.0)
    trainer = Trainer(cfg, backbone=str(backbone_dir))
    result = trainer.fit(data, tmp_path)
    assert trainer.fps["urgency"] == trainer.fps["severity"]
    assert result.memory["urgency"] == result.memory["severity"]
    # 120 states + the 3 option texts, which both questions share and which count once.
    assert result.memory["urgency"]["states"] == 123
    pairs: dict[tuple[str, int], None] = {}
    for qid in ("urgency", "severity"):  # each question's states, then its option texts
        q_texts, members = trainer._members(data, qid)
        labels = [next(c for c, m in enumerate(members) if i in m) for i in range(len(q_texts))]
        pairs.update(dict.fromkeys(zip(q_texts, labels, strict=True)))
    texts = [text for text, _ in pairs]
    y = torch.tensor([label for _, label in pairs])
    names = data.names("urgency")
    with torch.no_grad():
        pooled = trainer._encode(texts)
        stored = trainer.head.prototype_logits("choice", names, pooled)
    both = PrototypeClassifier.fit(pooled, y, 3, seed=0)
    torch.testing.assert_close(stored, both.logits(pooled), atol=1e-4, rtol=0)
    alone = PrototypeClassifier.fit(pooled[63:], y[63:], 3, seed=0)  # severity's states
    assert not torch.allclose(stored, alone.logits(pooled), atol=1e-3)
    # A state both questions label alike is one example, not two.
    twice = TrainingSet(
        data.questions,
        [
            Example(ex.state, dict.fromkeys(data.questions, next(iter(ex.labels.values()))))
            for ex in data.examples
        ],
        "bags, both questions",
    )
    again = Trainer(cfg, backbone=str(backbone_dir)).fit(twice, tmp_path / "twice")
    assert again.memory["urgency"]["states"] == 123


def test_unlabelled_states_join_the_prototype_heads_with_pseudo_labels(backbone_dir, tmp_path):
    data = dataset(n=12)
    labelled = [ex.state for ex in data.examples]
    pool = [f"unlabelled {ex.state}" for ex in dataset(n=20, seed=1).examples]
    # Repeats and states that are already labelled are dropped before pseudo-labelling.
    unlabeled = pool + pool[:4] + labelled[:3]
    cfg = config(head="prototype", contrastive_steps=3, val_fraction=0.0)
    semi = Trainer(cfg, backbone=str(backbone_dir))
    result = semi.fit(data, tmp_path / "semi", unlabeled=unlabeled)
    # Every unlabelled state joins each of the 3 questions with its predicted option.
    assert result.history[-1] == {"unlabeled_states": 20.0, "pseudo_labels": 60.0}
    plain = Trainer(cfg, backbone=str(backbone_dir))
    plain.fit(data, tmp_path / "plain")
    names = ["billing", "tech", "sales"]
    with torch.no_grad():
        pooled = semi.features(pool)[2]
        assert not torch.allclose(
            semi.head.prototype_logits("choice", names, pooled),
            plain.head.prototype_logits("choice", names, pooled),
        )
    report = json.loads((tmp_path / "semi" / "training.json").read_text())
    assert report["history"][-1]["pseudo_labels"] == 60
    # The model dir answers with the semi-supervised head on the adapted vectors.
    engine = DecisionEngine.from_pretrained(tmp_path / "semi", device="cpu")
    with torch.no_grad():
        raw = semi.head.prototype_logits("choice", names, semi.features(pool[:6])[2])
    expected = torch.softmax(engine.calibrator.scale(raw.double(), "choice", 3), -1)
    results = engine.decide_batch(pool[:6], {"route": QUESTIONS["route"]})
    got = torch.tensor(
        [[r.answers["route"].probabilities[n] for n in names] for r in results], dtype=torch.float64
    )
    assert torch.allclose(got, expected, atol=1e-4)
    # A cap keeps at most that many per option: 2 x (3 routes + 3 levels + 2 answers); each
    # question has an option predicted for at least 2 of the 20 states.
    cap = config(head="prototype", val_fraction=0.0, pseudo_per_label=2)
    capped = Trainer(cap, backbone=str(backbone_dir))
    result = capped.fit(data, tmp_path / "capped", unlabeled=pool)
    assert 6 <= result.history[-1]["pseudo_labels"] <= 16


def test_validation_states_are_not_pseudo_labelled(backbone_dir, tmp_path) -> None:
    data = route_only(dataset(n=16))
    cfg = config(head="prototype", val_fraction=0.25)
    trainer = Trainer(cfg, backbone=str(backbone_dir))
    labelled = [ex.state for ex in data.examples]
    result = trainer.fit(data, tmp_path, unlabeled=["a new state", *labelled])
    # The 4 validation states (and the 12 training states) are labelled: only 1 is left,
    # and the validation split still calibrates the head.
    semi = next(h for h in result.history if "pseudo_labels" in h)
    assert semi == {"unlabeled_states": 1.0, "pseudo_labels": 1.0}
    assert "accuracy" in result.validation


def test_unlabelled_states_need_the_prototype_head(backbone_dir, tmp_path) -> None:
    trainer = Trainer(config(), backbone=str(backbone_dir))
    with pytest.raises(TrainingDataError, match="they need head='prototype'") as info:
        trainer.fit(dataset(n=12), tmp_path, unlabeled=["a new state"])
    assert info.value.field == "unlabeled"
    assert not (tmp_path / "config.json").exists()
    prototype = Trainer(config(head="prototype", val_fraction=0.0), backbone=str(backbone_dir))
    data = dataset(n=12)
    for bad, field, message in [
        ("one state", "unlabeled", "not one string"),
        (["fine", ""], "unlabeled[1]", "state 1 must be a non-empty string"),
        (["fine", 7], "unlabeled[1]", "got 7"),
        ([data.examples[0].state], "unlabeled", "none of the 1 unlabelled states is left"),
        ([], "unlabeled", "none of the 0 unlabelled states is left"),
    ]:
        with pytest.raises(TrainingDataError, match=message) as info:
            prototype.fit(data, tmp_path / "p", unlabeled=bad)  # type: ignore[arg-type]
        assert info.value.field == field
    assert not (tmp_path / "p").exists()  # refused before any training
    with pytest.raises(ValueError, match="pseudo_per_label must be at least 1"):
        TrainConfig(head="prototype", pseudo_per_label=0).check()
    with pytest.raises(ValueError, match="it needs head='prototype'"):
        TrainConfig(pseudo_per_label=5).check()


def test_attaching_lora_raises_no_peft_deprecation_warning(backbone_dir) -> None:
    import warnings

    trainer = Trainer(config(), backbone=str(backbone_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # peft 0.21 + transformers 5 warn here
        trainer.build(dataset(n=6))
    assert any("lora_" in n for n, _ in trainer.model.named_parameters())


@pytest.mark.parametrize("ratio", [1.0, 4.0])
def test_param_groups_hook_sets_the_b_matrices_rate(backbone_dir, tmp_path, ratio) -> None:
    # How a probe (LoRA+, benchmarks/probe_trainer.py) changes the optimizer's groups. One
    # optimizer step (24 states, one batch, no warm-up left): Adam's first update moves
    # every weight with a gradient by its learning rate, so the B matrices (zero at the
    # start) end at most lr * ratio from zero, and the A matrices have not moved yet.
    class FasterB(Trainer):
        def _param_groups(self, params):
            groups = super()._param_groups(params)
            groups[2]["lr"] = self.config.lr * ratio
            return groups

    cfg = config(epochs=1, val_fraction=0.0, batch_size=24, weight_decay=0.0)
    trainer = FasterB(cfg, backbone=str(backbone_dir))
    trainer.fit(dataset(n=24), tmp_path)
    start = Trainer(cfg, backbone=str(backbone_dir))
    start.build(dataset(n=24))
    before = {n: p.detach() for n, p in start._trainable().items()}
    after = {n: p.detach() for n, p in trainer._trainable().items()}
    b = [n for n in after if ".lora_B." in n]
    a = [n for n in after if ".lora_A." in n]
    assert b and len(a) == len(b)
    moved = max(float((after[n] - before[n]).abs().max()) for n in b)
    assert moved == pytest.approx(cfg.lr * ratio, rel=1e-3)
    assert all(torch.equal(after[n], before[n]) for n in a)


def test_dora_adapters_train_and_merge_into_the_loaded_engine(backbone_dir, tmp_path) -> None:
    # DoRA is a probe (benchmarks/probe_trainer.py), through the _lora_options hook; model
    # dirs trained with it load as before.
    class DoRA(Trainer):
        def _lora_options(self):
            return {**super()._lora_options(), "use_dora": True}

    trainer = DoRA(config(epochs=2), backbone=str(backbone_dir))
    trainer.fit(dataset(n=40), tmp_path)
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["use_dora"] is True
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    magnitudes = [k for k in weights if k.endswith("lora_magnitude_vector")]
    assert magnitudes and len(magnitudes) == sum(k.endswith("lora_A.weight") for k in weights)
    assert_engine_answers_as_the_trainer(trainer, tmp_path)


def test_the_epochs_follow_transformers_linear_schedule(backbone_dir, tmp_path, monkeypatch):
    """24 states in batches of 8 for 2 epochs: 6 steps, int(0.34 * 6) = 2 of warm-up. Each
    step's rate is the group's rate times 0, 1/2, 1, 3/4, 1/2, 1/4 (the head and the
    adapters alike), as get_linear_schedule_with_warmup gives it."""
    import clef_engine.train.trainer as trainer_module

    used: list[list[float]] = []
    real = trainer_module.linear_schedule

    def recording(optimizer, warmup, total):
        scheduler = real(optimizer, warmup, total)
        step = scheduler.step

        def step_and_record(*args, **kwargs):
            used.append([g["lr"] for g in optimizer.param_groups])  # the rates just used
            return step(*args, **kwargs)

        scheduler.step = step_and_record
        return scheduler

    monkeypatch.setattr(trainer_module, "linear_schedule", recording)
    cfg = config(epochs=2, val_fraction=0.0, warmup_ratio=0.34, memory=False, lr=5e-3)
    Trainer(cfg, backbone=str(backbone_dir)).fit(dataset(n=24), tmp_path)
    shape = [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    assert [
        [round(r / base, 6) for r, base in zip(rates, (cfg.head_lr, cfg.lr, cfg.lr))]
        for rates in used
    ] == [[f] * 3 for f in shape]


def test_a_subclass_changes_the_head_the_bank_and_the_loss(backbone_dir, tmp_path) -> None:
    """The protected steps a probe overrides (benchmarks/probe_trainer.py) are the ones the
    run uses: the head's architecture, the option bank's start and each step's loss."""
    from clef_engine.train.losses import decision_loss

    losses: list[float] = []

    class Probe(Trainer):
        GROUP_BY_LENGTH = False

        def _head_config(self):
            return replace(super()._head_config(), evidence=False)

        def _bank_vectors(self, train, qid):
            return torch.nn.functional.normalize(-super()._bank_vectors(train, qid), dim=-1)

        def _batch_loss(self, train, batch):
            loss = super()._batch_loss(train, batch)
            losses.append(float(loss.detach()))
            return loss * 0.0  # nothing trains

    data = dataset(n=24)
    plain = Trainer(config(), backbone=str(backbone_dir))
    plain.build(data)
    cfg = config(epochs=1, val_fraction=0.0, memory=False, weight_decay=0.0)
    probe = Probe(cfg, backbone=str(backbone_dir))
    probe.fit(data, tmp_path)
    assert probe.head.config.evidence is False and plain.head.config.evidence is True
    fp = probe.fps["route"]
    expected = torch.nn.functional.normalize(-plain.head.bank[fp].detach(), dim=-1)
    torch.testing.assert_close(probe.head.bank[fp].detach().cpu(), expected.cpu())
    assert len(losses) == 3 and all(loss > 0 for loss in losses)  # 24 states, batches of 8
    # The library's loss of one batch: every question's decision loss by its share.
    batch = list(range(8))
    tokens, mask, pooled = plain.features([data.examples[i].state for i in batch])
    cfg = plain.config
    expected_loss = sum(
        decision_loss(
            logits,
            target,
            str(data.questions[qid].type),
            label_smoothing=cfg.label_smoothing,
            brier_weight=cfg.brier_weight,
            ordinal_weight=cfg.ordinal_weight,
        )
        * (len(target) / len(batch))
        for qid, logits, target in plain._question_logits(data, batch, tokens, mask, pooled)
    )
    plain.model.eval()
    plain.head.eval()
    torch.testing.assert_close(plain._batch_loss(data, batch), expected_loss)


def test_model_dirs_of_earlier_versions_load_and_their_config_reads(trained, tmp_path) -> None:
    """training.json of a version with the options since removed (refit, DoRA, R-Drop...)."""
    _, _, out = trained
    old = tmp_path / "old"
    shutil.copytree(out, old)
    report = json.loads((old / "training.json").read_text())
    removed = {
        "rdrop_weight": 0.0,
        "ema_decay": 0.0,
        "use_dora": False,
        "lora_plus_ratio": 1.0,
        "refit": False,
        "bank_init": "text",
        "contrastive_weight": 0.0,
        "shared_split": None,
        "split_seed": None,
        "ensemble_temperature": False,
        "evidence": True,
        "option_bank": True,
        "group_by_length": True,
        "memory_add_validation": True,
    }
    report["config"].update(removed)
    (old / "training.json").write_text(json.dumps(report))
    config_again = TrainConfig.from_dict(report["config"])
    config_again.check()
    assert config_again == TrainConfig.from_dict(
        json.loads((out / "training.json").read_text())["config"]
    )
    assert not hasattr(config_again, "rdrop_weight")
    state = dataset(n=1, seed=5).examples[0].state
    answers = DecisionEngine.from_pretrained(old, device="cpu").decide(state, dict(QUESTIONS))
    expected = DecisionEngine.from_pretrained(out, device="cpu").decide(state, dict(QUESTIONS))
    assert answers.to_wire()["answers"] == expected.to_wire()["answers"]
