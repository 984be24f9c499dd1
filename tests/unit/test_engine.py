"""DecisionEngine behaviour on a tiny random encoder built in code."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import torch

from clef_engine import (
    Box,
    Choice,
    DecisionEngine,
    DeviceUnavailableError,
    InvalidRequestError,
    ModelLoadError,
    Noul,
    Score,
    StateTooLargeError,
    UnsupportedQuestionError,
)

QUESTIONS = {
    "route": Choice(
        instructions="Route the ticket",
        criteria={"billing": "refund money payment", "tech": "bug error login", "sales": None},
    ),
    "urgent": Noul(instructions="Is this urgent?"),
    "two_sided": Noul(criteria={"true": "angry customer", "false": "happy customer"}),
    "level": Score(instructions="urgency", criteria=["low", "medium", "high"]),
}
STATES = [
    "my card has not arrived and I want a refund",
    "login page error bug",
    "hello",
    "exchange rate for cash top up please help " * 3,
]


def _assert_valid(result):
    for qid, answer in result.answers.items():
        data = answer.model_dump()
        if "probabilities" in data:
            probs = list(data["probabilities"].values())
            assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs), qid
            assert sum(probs) == pytest.approx(1.0, abs=1e-9), qid
        if "noul" in data:
            assert 0.0 <= data["noul"] <= 1.0


def test_answers_are_probabilities(tiny_engine):
    for state in STATES:
        _assert_valid(tiny_engine.decide(state, QUESTIONS))


def test_choice_is_argmax_and_score_is_expectation(tiny_engine):
    result = tiny_engine.decide(STATES[0], QUESTIONS)
    route = result.answers["route"]
    assert route.choice == max(route.probabilities, key=route.probabilities.get)
    assert route.confidence == pytest.approx(
        (max(route.probabilities.values()) - 1 / 3) / (1 - 1 / 3)
    )
    level = result.answers["level"]
    assert level.score == pytest.approx(sum(int(k) * p for k, p in level.probabilities.items()))
    assert level.legend == {"0": "low", "1": "medium", "2": "high"}
    assert result.x_top_probability["route"] == pytest.approx(route.probabilities[route.choice])


def test_result_metadata(tiny_engine):
    result = tiny_engine.decide(STATES[0], QUESTIONS)
    assert result.x_source == "model"
    assert result.x_model_version == tiny_engine.model_version
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 0
    wire = result.to_wire()
    assert set(wire) >= {"model", "answers", "usage"}
    assert all(k in ("model", "answers", "usage") or k.startswith("x_") for k in wire)


def test_model_version_changes_with_the_answer_rules(tiny_engine, monkeypatch):
    # Same weights and calibration, but answers computed another way: caches, decision
    # logs and saved thresholds keyed by the version must see a new one.
    from clef_engine.runtime import engine as engine_module

    engine = DecisionEngine(tiny_engine.backbone, warmup=False, model_name="tiny")
    before = engine.model_version
    monkeypatch.setattr(engine_module, "ANSWER_RULES", engine_module.ANSWER_RULES + 1)
    again = DecisionEngine(tiny_engine.backbone, warmup=False, model_name="tiny")
    assert again.model_version.startswith("tiny@")
    assert again.model_version != before


def _flat(result):
    out = {}
    for qid, answer in result.answers.items():
        data = answer.model_dump()
        if "probabilities" in data:
            out[qid] = data["probabilities"]
        else:
            out[qid] = {"noul": data["noul"]}
    return out


def _assert_close(a, b, tol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        for opt in a[k]:
            assert a[k][opt] == pytest.approx(b[k][opt], abs=tol), (k, opt)


def test_invariant_to_question_order_and_ids(tiny_engine):
    base = _flat(tiny_engine.decide(STATES[1], QUESTIONS))
    reordered = dict(reversed(list(QUESTIONS.items())))
    _assert_close(base, _flat(tiny_engine.decide(STATES[1], reordered)))
    renamed = {f"q_{i}": q for i, q in enumerate(QUESTIONS.values())}
    mapping = dict(zip(renamed, QUESTIONS))
    got = _flat(tiny_engine.decide(STATES[1], renamed))
    _assert_close(base, {mapping[k]: v for k, v in got.items()})


def test_options_come_back_in_the_order_asked(tiny_engine):
    """Two orders of one criteria dict are two prepared questions: each is scored, and
    answered, in its own option order (a shared cache key gave the second question the
    first one's order, so a label index read against it pointed at another option)."""
    names = ["billing", "technical", "sales", "legal"]
    first = Choice(instructions="route", criteria=dict.fromkeys(names))
    second = Choice(instructions="route", criteria=dict.fromkeys(reversed(names)))
    assert tiny_engine.prepare_question(first).names == names
    assert tiny_engine.prepare_question(second).names == names[::-1]
    a = tiny_engine.decide(STATES[0], {"q": first}).answers["q"].probabilities
    b = tiny_engine.decide(STATES[0], {"q": second}).answers["q"].probabilities
    assert list(a) == names and list(b) == names[::-1]
    assert b == pytest.approx(a)


def test_invariant_to_batching(tiny_engine):
    singles = [_flat(tiny_engine.decide(s, QUESTIONS)) for s in STATES]
    batched = [_flat(r) for r in tiny_engine.decide_batch(STATES, QUESTIONS)]
    for one, many in zip(singles, batched):
        _assert_close(one, many)


def test_dict_questions_and_wire_requests(tiny_engine):
    wire = {"type": "choice", "instructions": "Route", "criteria": {"a": None, "b": "bug"}}
    r1 = tiny_engine.decide("login bug", {"q": wire})
    r2 = tiny_engine.decide({"model": "jev-latest", "state": "login bug", "questions": {"q": wire}})
    _assert_close(_flat(r1), _flat(r2))
    assert r2.model == "jev-latest"


def test_json_and_message_states(tiny_engine):
    a = tiny_engine.decide({"user": "bob", "msg": "refund"}, QUESTIONS)
    b = tiny_engine.decide({"msg": "refund", "user": "bob"}, QUESTIONS)
    _assert_close(_flat(a), _flat(b), tol=0)
    chat = [{"role": "user", "content": "my login fails"}]
    _assert_valid(tiny_engine.decide(chat, QUESTIONS))


def test_long_states_are_windowed_not_truncated(tiny_engine):
    short = tiny_engine.decide("refund please", QUESTIONS)
    assert short.x_windows == 1
    long_text = "refund payment money " * 60 + "login error bug " * 60
    result = tiny_engine.decide(long_text, QUESTIONS)
    assert result.x_windows > 1
    # The tail of the state matters: changing only the last window changes the answer.
    other = tiny_engine.decide("refund payment money " * 60 + "happy hello world " * 60, QUESTIONS)
    assert result.answers["route"].probabilities != other.answers["route"].probabilities


def test_windows_cover_every_token(tiny_engine):
    backbone = tiny_engine.backbone
    ids = list(range(100, 100 + 95))
    windows = backbone._windows(ids)
    body = [w[1:-1] for w in windows]
    assert all(len(w) <= backbone.max_length for w in windows)
    covered = {t for w in body for t in w}
    assert covered == set(ids)


def test_state_cap_is_enforced(tiny_engine):
    engine = DecisionEngine(tiny_engine.backbone, max_state_chars=50, warmup=False)
    with pytest.raises(StateTooLargeError) as info:
        engine.decide("x" * 51, QUESTIONS)
    assert info.value.field == "state" and info.value.limit == 50


def test_box_on_a_text_state_is_unsupported(tiny_engine):
    with pytest.raises(UnsupportedQuestionError, match="no image") as info:
        tiny_engine.decide("a page", {"where": Box(instructions="the sign-in button")})
    assert info.value.field == "questions.where"


def test_batch_keeps_every_item_in_order(tiny_engine):
    items = ["refund", "", "login bug", "x" * 10, "   "]
    out = tiny_engine.decide_batch(items, QUESTIONS, return_exceptions=True)
    assert len(out) == len(items)
    assert isinstance(out[1], InvalidRequestError) and out[1].field == "state"
    assert isinstance(out[4], InvalidRequestError)
    for i in (0, 2, 3):
        _assert_close(_flat(out[i]), _flat(tiny_engine.decide(items[i], QUESTIONS)))
    with pytest.raises(InvalidRequestError):
        tiny_engine.decide_batch(items, QUESTIONS)


def test_batch_of_requests_with_different_questions(tiny_engine):
    reqs = [
        {"state": "refund", "questions": {"a": {"type": "noul", "instructions": "money?"}}},
        {
            "state": "bug",
            "questions": {
                "b": {"type": "choice", "instructions": "x", "criteria": ["tech", "sales"]}
            },
        },
        {
            "state": "bug",
            "questions": {"b": {"type": "choice", "instructions": "x", "criteria": ["tech"]}},
        },
    ]
    out = tiny_engine.decide_batch(reqs, return_exceptions=True)
    assert set(out[0].answers) == {"a"} and set(out[1].answers) == {"b"}
    assert isinstance(out[2], InvalidRequestError)


async def test_async_forms_match_sync(tiny_engine):
    sync = _flat(tiny_engine.decide(STATES[0], QUESTIONS))
    got = await tiny_engine.adecide(STATES[0], QUESTIONS)
    _assert_close(sync, _flat(got))
    many = await asyncio.gather(*(tiny_engine.adecide(s, QUESTIONS) for s in STATES))
    assert len(many) == len(STATES)
    batch = await tiny_engine.adecide_batch(["ok", ""], QUESTIONS, return_exceptions=True)
    assert isinstance(batch[1], InvalidRequestError)


def test_missing_questions_is_a_typed_error(tiny_engine):
    with pytest.raises(InvalidRequestError) as info:
        tiny_engine.decide("state only")
    assert info.value.field == "questions"


def test_prototype_examples_teach_options(tiny_engine):
    q = Choice(
        instructions="x",
        criteria={
            "money": {"examples": ["refund payment", "money refund please", "payment cash"]},
            "tech": {"examples": ["login error", "bug on page", "error login bug"]},
        },
    )
    result = tiny_engine.decide("refund payment cash money", {"q": q})
    assert result.answers["q"].choice == "money"
    result = tiny_engine.decide("login bug error page", {"q": q})
    assert result.answers["q"].choice == "tech"


def test_few_examples_keep_no_memory(tiny_engine):
    # 6 examples + 2 option texts: too few held-out answers to choose a memory's settings.
    q = Choice(
        instructions="x",
        criteria={
            "money": {"examples": ["refund payment", "money refund please", "payment cash"]},
            "tech": {"examples": ["login error", "bug on page", "error login bug"]},
        },
    )
    prepared = tiny_engine.prepare_question(q)
    assert prepared.classifier is not None and prepared.memory is None
    assert prepared.classifier.folds is None and prepared.classifier.out_of_fold is None


def bag_question(n: int) -> Choice:
    """``n`` examples that repeat 15 word bags (a bag's copies share its option): the
    nearest examples know a bag at once, so an example memory pays off."""
    rng = random.Random(0)
    vocab = "refund payment money bug error login page exchange rate card fee cash pin".split()
    bags = [" ".join(rng.sample(vocab, 4)) for _ in range(15)]
    criteria: dict[str, dict[str, list[str]]] = {k: {"examples": []} for k in ("a", "b", "c")}
    for i in range(n):
        criteria["abc"[i % 15 % 3]]["examples"].append(f"{bags[i % 15]} {i}")
    return Choice(instructions="route", criteria=criteria)


def test_enough_examples_keep_a_cross_fitted_memory(tiny_engine):
    question = bag_question(60)
    prepared = tiny_engine.prepare_question(question)
    memory = prepared.memory
    assert memory is not None and len(memory) == 60 + 3  # the option texts too
    assert prepared.classifier is not None and prepared.classifier.folds is None
    state = "refund payment money fee"
    got = tiny_engine.decide(state, {"q": question}).answers["q"].probabilities
    pooled = tiny_engine.backbone.encode([state]).pooled.float()
    alone = torch.softmax(prepared.classifier.logits(pooled).double(), -1)
    mixed = memory.mix(alone, pooled, prepared.names)[0]
    assert [got[n] for n in prepared.names] == pytest.approx(mixed.tolist(), abs=1e-6)
    assert not torch.allclose(mixed, alone[0], atol=1e-3)
    # 40 examples + 3 option texts: folds for the temperature, too few to choose a memory.
    fewer = tiny_engine.prepare_question(bag_question(40))
    assert fewer.classifier is not None and fewer.memory is None


def test_a_prototype_memory_mixes_into_the_answer():
    from clef_engine.heads.memory import MemorySettings, QuestionMemory
    from clef_engine.heads.prototype import PrototypeClassifier
    from clef_engine.heads.zero_shot import PreparedQuestion, ZeroShotHead

    vectors = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=-1)
    # The classifier leans to "b"; the one memory state nearest to the state says "a".
    classifier = PrototypeClassifier(torch.zeros(2, 2), torch.tensor([0.0, 1.0]), 1.0, 2)
    memory = QuestionMemory(vectors, torch.tensor([0, 1]), ["a", "b"], MemorySettings(1, 0.1, 0.7))
    prepared = PreparedQuestion("choice", ["a", "b"], ["a", "b"], classifier=classifier)
    head = ZeroShotHead()
    state = vectors[:1]
    alone = torch.softmax(head.logits(prepared, torch.zeros(1, 2), state).double(), -1)
    assert alone.argmax().item() == 1
    prepared.memory = memory
    mixed = torch.softmax(head.logits(prepared, torch.zeros(1, 2), state).double(), -1)
    expected = 0.3 * alone + 0.7 * torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(mixed, expected)
    assert mixed.argmax().item() == 0


def test_device_and_dtype_errors(tiny_engine):
    from clef_engine.devices import select_device, select_dtype

    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="cuda"):
            select_device("cuda")
    with pytest.raises(DeviceUnavailableError):
        select_device("tpu")
    assert select_device("cpu").type == "cpu"
    assert select_dtype(torch.device("cpu")) == torch.float32
    assert select_dtype(torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        select_dtype(torch.device("cpu"), "float8")


def test_missing_model_dir_is_clear(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        DecisionEngine.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="not a directory"):
        DecisionEngine(path=tmp_path / "nope")


def test_save_load_round_trip(tiny_engine, tmp_path):
    from clef_engine.calibration import Calibrator

    engine = DecisionEngine(
        tiny_engine.backbone,
        warmup=False,
        model_name="tiny",
        calibrator=Calibrator({"choice/b2": 0.5, "noul/b1": 0.2}),
    )
    before = engine.decide(STATES[0], QUESTIONS)
    engine.save_pretrained(tmp_path / "m", copy_backbone=True)
    loaded = DecisionEngine.from_pretrained(tmp_path / "m")
    after = loaded.decide(STATES[0], QUESTIONS)
    _assert_close(_flat(before), _flat(after))
    assert loaded.model_version == engine.model_version or loaded.model_name == "tiny"
    assert loaded.calibrator.temperatures == engine.calibrator.temperatures
    assert (tmp_path / "m" / "backbone" / "model.safetensors").is_file()
    assert not list((tmp_path / "m").rglob("*.bin")) and not list((tmp_path / "m").rglob("*.pt"))


def test_int8_mode_runs_on_cpu(tiny_engine):
    from clef_engine.backbones import EncoderBackbone

    backbone = EncoderBackbone(tiny_engine.backbone.directory, quantize="int8", max_length=32)
    engine = DecisionEngine(backbone)
    _assert_valid(engine.decide(STATES[0], QUESTIONS))
    # int8 similarities are shifted; the engine picks the temperatures fitted for int8.
    assert engine.calibrator.source.endswith("--int8")
    assert tiny_engine.calibrator.source.endswith("--seed 0")
    with pytest.raises(ValueError, match="quantize"):
        EncoderBackbone(tiny_engine.backbone.directory, quantize="int4")


def test_int8_keeps_the_early_feed_forward_outputs_in_fp32(tiny_engine):
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from clef_engine.backbones import EncoderBackbone
    from clef_engine.backbones.encoder import INT8_KEEP_FP32, _vnni

    backbone = EncoderBackbone(tiny_engine.backbone.directory, quantize="int8", max_length=32)
    kept, quantized = [], []
    for name, module in backbone.model.named_modules():
        if isinstance(module, DynamicLinear):
            quantized.append(name)
        elif isinstance(module, torch.nn.Linear):
            kept.append(name)
    assert kept == ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]
    assert "encoder.layer.0.intermediate.dense" in quantized
    assert not any(INT8_KEEP_FP32.search(name) for name in quantized)
    full_range = any(type(m).__name__ == "FullRangeDynamicLinear" for m in backbone.model.modules())
    assert full_range == _vnni()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_full_range_int8_linear_is_closer_to_fp32():
    import torch
    from torch.ao.quantization import quantize_dynamic

    from clef_engine.backbones.encoder import _full_range_linear, _vnni

    if not _vnni():
        pytest.skip("8-bit activations are used only where the CPU has VNNI")

    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Linear(64, 32))
    x = torch.randn(16, 64)
    exact = dense(x)
    seven_bit = quantize_dynamic(dense, {torch.nn.Linear}, dtype=torch.qint8)
    err7 = (seven_bit(x) - exact).abs().mean()
    _, full_range = _full_range_linear()
    seven_bit[0].__class__ = full_range
    err8 = (seven_bit(x) - exact).abs().mean()
    assert err8 < err7


def test_loads_with_network_blocked(tmp_path, monkeypatch):
    import pytest_socket

    from clef_engine.testing import write_tiny_bert

    directory = write_tiny_bert(tmp_path / "tiny")
    pytest_socket.disable_socket()
    try:
        engine = DecisionEngine(path=directory)
        _assert_valid(engine.decide("refund", QUESTIONS))
    finally:
        pytest_socket.enable_socket()


def test_to_cpu_keeps_answers_and_clears_caches(tiny_engine):
    engine = DecisionEngine(tiny_engine.backbone, warmup=False)
    before = _flat(engine.decide(STATES[0], QUESTIONS))
    assert len(engine._vectors) > 0
    assert engine.to("cpu") is engine
    assert len(engine._vectors) == 0
    _assert_close(before, _flat(engine.decide(STATES[0], QUESTIONS)))
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError):
            engine.to("cuda")


def test_model_name_follows_the_backbone_and_max_length_round_trips(tiny_engine, tmp_path):
    assert tiny_engine.model_name == f"clef-{tiny_engine.backbone.name}"
    from clef_engine.backbones import EncoderBackbone

    backbone = EncoderBackbone(tiny_engine.backbone.directory, max_length=16)
    DecisionEngine(backbone, warmup=False).save_pretrained(tmp_path / "m")
    loaded = DecisionEngine.from_pretrained(tmp_path / "m", warmup=False)
    assert loaded.backbone.max_length == 16


def test_the_question_cache_is_bounded_in_bytes_too():
    from clef_engine.runtime.engine import _LRU

    cache = _LRU(10, max_bytes=100, size=len)
    cache.put("a", "x" * 60)
    cache.put("b", "x" * 30)
    assert list(cache) == ["a", "b"] and cache.bytes == 90
    cache.put("a", "x" * 10)  # replaced: its old size is forgotten
    assert cache.bytes == 40 and list(cache) == ["b", "a"]
    cache.put("c", "x" * 80)  # over the budget: the oldest goes first
    assert list(cache) == ["a", "c"] and cache.bytes == 90
    cache.put("d", "x" * 500)  # the newest always stays, even alone over the budget
    assert list(cache) == ["d"] and cache.bytes == 500
    cache.clear()
    assert cache.bytes == 0 and not cache
    counted = _LRU(2)
    for k in "abc":
        counted.put(k, k)
    assert list(counted) == ["b", "c"]
