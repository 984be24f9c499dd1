"""The decoder backbone on tiny random Qwen3 and Llama models built in code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from clef_engine import Choice, DecisionEngine, ModelLoadError, Noul, Score
from clef_engine.backbones.decoder import DecoderBackbone, ModelTooLargeError
from clef_engine.backbones.decoder import memory as memory_mod
from clef_engine.backbones.decoder.prompt import AUTO_ROTATE_MAX, plan
from clef_engine.backbones.decoder.testing import write_tiny_causal_lm
from clef_engine.errors import InvalidRequestError, MissingDependencyError, UnsupportedQuestionError
from clef_engine.schema.questions import Box
from clef_engine.testing import write_tiny_bert

STATES = [
    "my card has not arrived, please help",
    "I was charged twice for one payment and I am angry",
    "login page shows an error",
]
QUESTIONS: dict[str, Any] = {
    "route": Choice(
        instructions="Which team handles this ticket?",
        criteria={"billing": "money and refunds", "bug": None, "shipping": "card delivery"},
    ),
    "angry": Noul(instructions="Is the customer angry?"),
    "urgency": Score(instructions="How urgent is it?", criteria=["low", "medium", "high"]),
    "intent": Choice(
        instructions="Customer intent",
        criteria={
            "card_arrival": None,
            "exchange_rate": None,
            "lost_or_stolen_card": {"description": "lost card", "examples": ["I lost my card"]},
            "refund": None,
            "top_up": None,
            "transfer": None,
        },
    ),
}


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_causal_lm(tmp_path_factory.mktemp(request.param), arch=request.param)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_causal_lm(tmp_path_factory.mktemp("qwen3-single"), arch="qwen3")


@pytest.fixture(scope="module")
def dec_engine(model_dir: Path) -> DecisionEngine:
    return DecisionEngine.from_pretrained(model_dir, device="cpu")


def _requests(engine: DecisionEngine, states: list[str], questions: dict[str, Any]) -> list[Any]:
    return [engine._as_request(s, questions, None) for s in states]


def test_bare_dir_loads_as_decoder_both_ways(qwen_dir: Path) -> None:
    a = DecisionEngine.from_pretrained(qwen_dir, device="cpu")
    b = DecisionEngine(backbone="decoder", path=qwen_dir, device="cpu")
    assert isinstance(a.backbone, DecoderBackbone) and isinstance(b.backbone, DecoderBackbone)
    ra = a.decide(STATES[0], QUESTIONS).answers["route"].probabilities  # type: ignore[union-attr]
    rb = b.decide(STATES[0], QUESTIONS).answers["route"].probabilities  # type: ignore[union-attr]
    assert ra == pytest.approx(rb, abs=1e-6)
    assert a.calibrator.source.startswith("identity: decoder")


def test_shared_prefix_equals_naive_per_option_scores(dec_engine: DecisionEngine) -> None:
    bb = dec_engine.backbone
    assert isinstance(bb, DecoderBackbone)
    requests = _requests(dec_engine, STATES, QUESTIONS)
    shared = bb.raw_scores(STATES, requests, strategy="shared")
    naive = bb.raw_scores(STATES, requests, strategy="naive")
    spread = 0.0
    for s, n in zip(shared, naive, strict=True):
        assert s.keys() == n.keys() == QUESTIONS.keys()
        for qid in s:
            assert torch.allclose(s[qid], n[qid], atol=1e-4, rtol=0), qid
            spread = max(spread, float(s[qid].max() - s[qid].min()))
    # The comparison is not vacuous: the random model tells options apart.
    assert spread > 1e-2


def test_answers_are_probabilities_for_every_type(dec_engine: DecisionEngine) -> None:
    result = dec_engine.decide(STATES[1], QUESTIONS)
    route = result.answers["route"]
    assert set(route.probabilities) == {"billing", "bug", "shipping"}  # type: ignore[union-attr]
    assert sum(route.probabilities.values()) == pytest.approx(1.0)  # type: ignore[union-attr]
    assert 0.0 <= result.answers["angry"].noul <= 1.0  # type: ignore[union-attr]
    assert result.answers["urgency"].legend == {"0": "low", "1": "medium", "2": "high"}  # type: ignore[union-attr]
    assert result.usage.input_tokens > 20
    assert result.x_source == "model"


def test_answers_do_not_depend_on_option_order(dec_engine: DecisionEngine) -> None:
    names = ["refund", "top_up", "card_arrival", "exchange_rate", "transfer", "pin_blocked"]
    for n in (3, len(names)):  # rotated (n <= 4) and single-listing policies
        forward = Choice(instructions="Customer intent", criteria=names[:n])
        backward = Choice(instructions="Customer intent", criteria=list(reversed(names[:n])))
        a = dec_engine.decide(STATES[0], {"q": forward}).answers["q"]
        b = dec_engine.decide(STATES[0], {"q": backward}).answers["q"]
        for name in names[:n]:
            assert a.probabilities[name] == pytest.approx(b.probabilities[name], abs=1e-5)  # type: ignore[union-attr]


def test_rotations_list_every_option_at_every_position() -> None:
    q = Choice(instructions="pick", criteria=["d", "b", "a", "c"])
    p = plan(q, "auto")
    assert len(p.blocks) == 4 == AUTO_ROTATE_MAX
    firsts = [b.split("Options:\n- ")[1].split("\n")[0] for b in p.blocks]
    assert sorted(firsts) == ["a", "b", "c", "d"]
    assert len(plan(Choice(instructions="pick", criteria=list("abcdef")), "auto").blocks) == 1
    assert len(plan(Choice(instructions="pick", criteria=list("abcdef")), 3).blocks) == 3
    assert len(plan(Score(instructions="s", criteria=["x", "y"]), 5).blocks) == 1


def test_rotation_average_is_the_mean_of_single_listings(qwen_dir: Path) -> None:
    full = DecoderBackbone(qwen_dir, device="cpu", rotations="auto", prior=None)
    q = Choice(instructions="Which team?", criteria=["billing", "bug", "shipping"])
    request = DecisionEngine(full, warmup=False)._as_request(STATES[0], {"q": q}, None)
    averaged = full.raw_scores([STATES[0]], [request])[0]["q"]
    _, blocks, answers = full._plan(q)
    from clef_engine.backbones.decoder.tree import Group, Row

    head = full._head + full._ids(STATES[0])
    singles = full.scorer.score_naive([Row(head, [Group(b, answers)]) for b in blocks])
    assert torch.allclose(averaged, torch.stack([s[0] for s in singles]).mean(0), atol=1e-4)


def test_batch_equals_one_at_a_time(dec_engine: DecisionEngine) -> None:
    batch = dec_engine.decide_batch(STATES, QUESTIONS)
    reordered = dict(reversed(list(QUESTIONS.items())))
    for state, together in zip(STATES, batch, strict=True):
        alone = dec_engine.decide(state, reordered)
        for qid in QUESTIONS:
            x, y = together.answers[qid], alone.answers[qid]
            if hasattr(x, "probabilities"):
                assert x.probabilities == pytest.approx(y.probabilities, abs=1e-4)
            else:
                assert x.noul == pytest.approx(y.noul, abs=1e-4)


def test_long_prompt_matches_naive(dec_engine: DecisionEngine) -> None:
    long_state = " ".join(f"line {i}: the card payment was blocked again." for i in range(120))
    bb = dec_engine.backbone
    assert isinstance(bb, DecoderBackbone)
    assert bb.count_tokens([long_state])[0] > 1000
    few = {k: QUESTIONS[k] for k in ("route", "angry")}
    requests = _requests(dec_engine, [long_state, STATES[0]], few)
    shared = bb.raw_scores([long_state, STATES[0]], requests)
    naive = bb.raw_scores([long_state, STATES[0]], requests, strategy="naive")
    for s, n in zip(shared, naive, strict=True):
        for qid in s:
            assert torch.allclose(s[qid], n[qid], atol=1e-4, rtol=0), qid


def test_state_longer_than_the_window_is_cut_in_the_middle(qwen_dir: Path) -> None:
    bb = DecoderBackbone(qwen_dir, device="cpu", max_length=256)
    engine = DecisionEngine(bb)
    state = "START " + "filler words here " * 200 + " END"
    result = engine.decide(state, {"q": QUESTIONS["route"]})
    assert result.usage.input_tokens < bb.count_tokens([state])[0]
    row = bb._row(state, [bb._plan(QUESTIONS["route"])])
    text = bb.tokenizer.decode(row.prefix)
    assert "START" in text and "END" in text and "[...]" in text
    depth = len(row.prefix) + max(len(g.block) + max(map(len, g.options)) for g in row.groups)
    assert depth <= 256
    with pytest.raises(InvalidRequestError) as err:
        many = {f"q{i}": Choice(instructions="word " * 150, criteria=["a", "b"]) for i in range(2)}
        engine.decide("short", many)
    assert err.value.limit == 256


def test_box_questions_are_unsupported(dec_engine: DecisionEngine) -> None:
    with pytest.raises(UnsupportedQuestionError):
        dec_engine.decide("state", {"b": Box(instructions="find the button")})


def test_encode_and_count_tokens(dec_engine: DecisionEngine) -> None:
    bb = dec_engine.backbone
    out = bb.encode(["hello world", "a much longer text about a card payment"])
    assert out.pooled.shape == (2, bb.hidden_size)
    assert torch.allclose(out.pooled.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert bb.count_tokens(["hello world"])[0] == out.tokens[0]


def test_not_a_causal_lm_is_refused_clearly(tmp_path: Path) -> None:
    bert = write_tiny_bert(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match=r"not a causal LM.*BertModel"):
        DecisionEngine(backbone="decoder", path=bert, device="cpu")
    with pytest.raises(ModelLoadError, match="not a directory"):
        DecoderBackbone(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        DecoderBackbone(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="local causal-LM directory is required"):
        DecoderBackbone(None)


def test_model_too_large_is_refused_before_loading(
    qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_mod, "available_bytes", lambda device: 1024)
    with pytest.raises(ModelTooLargeError, match=r"needs about .* GiB .* only 0.0 GiB is free"):
        DecoderBackbone(qwen_dir, device="cpu")
    bb = DecoderBackbone(qwen_dir, device="cpu", check_memory=False)
    params = sum(p.numel() for p in bb.model.parameters())
    assert bb.memory.parameters == params


def _randomize_lora(model: Any, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_adapter_save_and_load_round_trip(qwen_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    engine = DecisionEngine(backbone="decoder", path=qwen_dir, device="cpu")
    base = engine.decide(STATES[0], QUESTIONS)
    bb = engine.backbone
    assert isinstance(bb, DecoderBackbone)
    bb.add_adapter(rank=8)
    _randomize_lora(bb.model)
    engine._version = None
    tuned = engine.decide(STATES[0], QUESTIONS)
    assert tuned.answers["route"].probabilities != pytest.approx(  # type: ignore[union-attr]
        base.answers["route"].probabilities,
        abs=1e-4,  # type: ignore[union-attr]
    )
    assert tuned.x_model_version != base.x_model_version
    engine.save_pretrained(tmp_path / "tuned")
    assert (tmp_path / "tuned" / "adapter" / "adapter_config.json").is_file()
    assert list((tmp_path / "tuned" / "adapter").glob("*.safetensors"))
    loaded = DecisionEngine.from_pretrained(tmp_path / "tuned", device="cpu")
    again = loaded.decide(STATES[0], QUESTIONS)
    for qid in ("route", "intent", "urgency"):
        assert again.answers[qid].probabilities == pytest.approx(  # type: ignore[union-attr]
            tuned.answers[qid].probabilities,
            abs=1e-5,  # type: ignore[union-attr]
        )
    assert again.x_model_version == tuned.x_model_version
    with pytest.raises(ValueError, match="rank"):
        DecoderBackbone(qwen_dir, device="cpu").add_adapter(rank=512)


def test_adapter_scores_carry_gradients_for_a_trainer(qwen_dir: Path) -> None:
    pytest.importorskip("peft")
    bb = DecoderBackbone(qwen_dir, device="cpu")
    bb.add_adapter(rank=4)
    _randomize_lora(bb.model)
    request = DecisionEngine(bb, warmup=False)._as_request(STATES[0], QUESTIONS, None)
    scores = bb.raw_scores([STATES[0]], [request], grad=True)[0]
    loss = -torch.log_softmax(scores["route"], dim=-1)[0]
    loss.backward()
    grads = [p.grad for n, p in bb.model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_missing_peft_names_the_install_line(
    qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bb = DecoderBackbone(qwen_dir, device="cpu")
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'clef-agents\[train\]'"):
        bb.add_adapter(rank=4)


def test_saved_options_come_back(qwen_dir: Path, tmp_path: Path) -> None:
    bb = DecoderBackbone(qwen_dir, device="cpu", rotations=2, prior=None)
    engine = DecisionEngine(bb)
    engine.save_pretrained(tmp_path / "m")
    loaded = DecisionEngine.from_pretrained(tmp_path / "m", device="cpu")
    assert isinstance(loaded.backbone, DecoderBackbone)
    assert loaded.backbone.rotations == 2 and loaded.backbone.prior is None
    assert loaded.model_version == engine.model_version


@pytest.mark.parametrize(
    ("damage", "field"),
    [({"r": "eight"}, "r"), ({"lora_alpha": [16]}, "lora_alpha"), (None, None)],
    ids=["rank-string", "alpha-list", "not-json"],
)
def test_a_corrupt_decoder_adapter_is_a_model_load_error(
    qwen_dir: Path, tmp_path: Path, damage: dict[str, Any] | None, field: str | None
) -> None:
    pytest.importorskip("peft")
    import json

    engine = DecisionEngine(backbone="decoder", path=qwen_dir, device="cpu", warmup=False)
    engine.backbone.add_adapter(rank=2)  # type: ignore[attr-defined]
    engine.save_pretrained(tmp_path / "tuned")
    config = tmp_path / "tuned" / "adapter" / "adapter_config.json"
    if damage is None:
        config.write_text("{not json")
    else:
        config.write_text(json.dumps({**json.loads(config.read_text()), **damage}))
    with pytest.raises(ModelLoadError, match=r"adapter_config\.json") as caught:
        DecisionEngine.from_pretrained(tmp_path / "tuned", device="cpu", warmup=False)
    assert type(caught.value) is ModelLoadError
    assert caught.value.field == field


def test_a_decoder_dir_with_auto_map_is_refused(qwen_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    evil = shutil.copytree(qwen_dir, tmp_path / "evil")
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling.Evil"}
    (evil / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="auto_map"):
        DecisionEngine.from_pretrained(evil, device="cpu", warmup=False)
