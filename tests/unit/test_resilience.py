"""Fault injection for ResilientEngine: nothing lost, order preserved, tags correct."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from typing import Any

import pytest
from faulty import ROUTE, FaultyEngine

from clef_agents.fake import FakeEngine
from clef_agents.resilience import ResilientEngine, Rule, RuleFallback, is_transient
from engine.errors import InvalidRequestError, ModelLoadError
from engine.schema.answers import ChoiceAnswer, DecisionResult
from engine.schema.request import DecisionRequest

RULES = RuleFallback(
    [
        Rule.keywords(["refund", "invoice"], "billing", 0.85),
        Rule.regex(r"error \d{3}", "technical", 0.75),
    ],
    default="human",
    default_probability=0.6,
)


def wrap(engine: Any, **kwargs: Any) -> ResilientEngine:
    kwargs.setdefault("fallback", RULES)
    kwargs.setdefault("backoff_s", 0.001)
    kwargs.setdefault("max_backoff_s", 0.002)
    return ResilientEngine(engine, **kwargs)


def run_batch(safe: ResilientEngine, states: list[Any], mode: str, **kw: Any) -> list[Any]:
    if mode == "sync":
        return safe.decide_batch(states, ROUTE, **kw)
    return asyncio.run(safe.adecide_batch(states, ROUTE, **kw))


def run_one(safe: ResilientEngine, state: Any, mode: str) -> DecisionResult:
    if mode == "sync":
        return safe.decide(state, ROUTE)
    return asyncio.run(safe.adecide(state, ROUTE))


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_raising_engine_falls_back_per_item_in_order(mode: str) -> None:
    engine = FaultyEngine()
    safe = wrap(engine)
    states = ["my invoice is wrong boom", "app crash bug login", "boom", "error 500 boom"]
    out = run_batch(safe, states, mode)
    assert len(out) == len(states)
    assert [r.x_source for r in out] == ["rules", "model", "default", "rules"]
    assert [r["route"].choice for r in out] == ["billing", "technical", "human", "technical"]
    assert out[0]["route"].probabilities["billing"] == pytest.approx(0.85)
    assert out[2]["route"].probabilities["human"] == pytest.approx(0.6)
    assert all(r.x_fallback_reason == "error" for r in out if r.x_source != "model")
    assert all(r.x_model_version == engine.model_version for r in out)
    # A non-transient error is not retried.
    assert engine.seen["boom"] == 1
    counters = safe.counters.as_dict()
    assert counters["fallbacks"]["error"] == 3
    assert counters["model"] == 1
    assert counters["items"] == 4


@pytest.mark.parametrize("mode", MODES)
def test_single_call_falls_back_and_tags(mode: str) -> None:
    safe = wrap(FaultyEngine())
    result = run_one(safe, "refund my invoice boom", mode)
    assert result.x_source == "rules"
    assert result["route"].choice == "billing"
    assert result["route"].x_source == "rules"
    assert "kaput" in result.x_fallback_error


@pytest.mark.parametrize("mode", MODES)
def test_hang_past_budget_is_a_timeout_fallback(mode: str) -> None:
    engine = FaultyEngine()
    safe = wrap(engine, timeout_s=0.2)
    try:
        result = run_one(safe, "hang on, refund me", mode)
    finally:
        engine.release.set()
    assert result.x_source == "rules"
    assert result.x_fallback_reason == "timeout"
    assert safe.counters.fallbacks["timeout"] == 1
    safe.close()


@pytest.mark.parametrize("mode", MODES)
def test_hanging_batch_times_out_without_losing_items(mode: str) -> None:
    engine = FaultyEngine()
    safe = wrap(engine, timeout_s=0.2)
    states = ["refund please", "hang", "error 404 on login"]
    try:
        out = run_batch(safe, states, mode)
    finally:
        engine.release.set()
    assert len(out) == 3
    assert [r.x_fallback_reason for r in out] == ["timeout"] * 3
    assert [r["route"].choice for r in out] == ["billing", "human", "technical"]
    safe.close()


@pytest.mark.parametrize("mode", MODES)
def test_nan_output_is_replaced(mode: str) -> None:
    safe = wrap(FaultyEngine())
    out = run_batch(safe, ["nan refund", "invoice payment charge"], mode)
    assert out[0].x_source == "rules"
    assert out[0].x_fallback_reason == "invalid_output"
    assert out[1].x_source == "model"
    assert safe.counters.fallbacks["invalid_output"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_halves_the_batch_and_keeps_order(mode: str) -> None:
    engine = FaultyEngine(max_batch=2)
    safe = wrap(engine)
    states = [f"ticket {i} about refund" if i % 2 else f"ticket {i} crash bug" for i in range(8)]
    out = run_batch(safe, states, mode)
    reference = FakeEngine().decide_batch(states, ROUTE)
    assert [r.x_source for r in out] == ["model"] * 8
    assert [r["route"].probabilities for r in out] == [r["route"].probabilities for r in reference]
    # 8 runs out, its halves of 4 run out, the quarters of 2 fit.
    assert [len(b) for b in engine.batches] == [8, 4, 2, 2, 4, 2, 2]
    assert safe.counters.oom_splits == 3
    assert engine.device == "cuda:0"  # halving was enough; no CPU move


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_at_batch_of_one_moves_to_cpu(mode: str) -> None:
    engine = FaultyEngine(oom_on_gpu=True)
    safe = wrap(engine)
    out = run_batch(safe, ["refund", "crash bug"], mode)
    assert [r.x_source for r in out] == ["model", "model"]
    assert engine.device == "cpu"
    assert safe.counters.cpu_moves == 1
    single = run_one(wrap(FaultyEngine(oom_on_gpu=True)), "crash bug", mode)
    assert single.x_source == "model"


@pytest.mark.parametrize("mode", MODES)
def test_batch_retries_only_failed_items(mode: str) -> None:
    engine = FaultyEngine(flaky_failures=2)
    safe = wrap(engine, max_attempts=3)
    states = ["refund a", "flaky crash", "invoice b"]
    out = run_batch(safe, states, mode)
    assert [r.x_source for r in out] == ["model"] * 3
    assert engine.batches[0] == states
    assert engine.batches[1:] == [["flaky crash"], ["flaky crash"]]
    assert engine.seen["refund a"] == 1
    assert safe.counters.retries == 2


@pytest.mark.parametrize("mode", MODES)
def test_retries_give_up_then_fall_back(mode: str) -> None:
    engine = FaultyEngine(flaky_failures=10)
    safe = wrap(engine, max_attempts=2)
    result = run_one(safe, "flaky refund", mode)
    assert engine.seen["flaky refund"] == 2
    assert result.x_source == "rules"
    assert result.x_fallback_reason == "error"


@pytest.mark.parametrize("mode", MODES)
def test_bad_input_keeps_its_error_and_its_slot(mode: str) -> None:
    safe = wrap(FaultyEngine())
    out = run_batch(safe, ["refund", "", "crash bug"], mode, return_exceptions=True)
    assert out[0].x_source == "model"
    assert isinstance(out[1], InvalidRequestError)
    assert out[1].field == "state"
    assert out[2].x_source == "model"
    with pytest.raises(InvalidRequestError):
        run_batch(safe, ["refund", ""], mode)
    assert sum(safe.counters.fallbacks.values()) == 0


def test_no_fallback_reraises_engine_errors() -> None:
    safe = ResilientEngine(FaultyEngine(), backoff_s=0.001)
    with pytest.raises(RuntimeError, match="kaput"):
        safe.decide("boom", ROUTE)
    out = safe.decide_batch(["boom", "refund"], ROUTE, return_exceptions=True)
    assert isinstance(out[0], RuntimeError)
    assert out[1].x_source == "model"


@pytest.mark.parametrize("mode", MODES)
def test_low_confidence_replaces_only_unsure_questions(mode: str) -> None:
    questions = {
        **ROUTE,
        "urgent": {"type": "noul", "instructions": "urgent?", "criteria": {"true": "urgent"}},
    }
    fake = FakeEngine(fixed={"route": "technical", "urgent": 0.97}, fixed_probability=0.4)
    safe = wrap(fake, min_confidence={"route": 0.7, "urgent": 0.7})
    if mode == "sync":
        result = safe.decide("refund now, urgent", questions)
    else:
        result = asyncio.run(safe.adecide("refund now, urgent", questions))
    assert result.x_source == "rules"
    assert result.x_fallback_reason == "low_confidence"
    assert result["route"].choice == "billing"
    assert result["route"].x_source == "rules"
    assert result["urgent"].noul == pytest.approx(0.97)
    assert result["urgent"].x_source == "model"
    assert result.x_model_probabilities == {"route": pytest.approx(0.4)}
    assert safe.counters.fallbacks["low_confidence"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_engine_that_cannot_load_answers_from_rules(mode: str) -> None:
    def broken() -> Any:
        raise ImportError("No module named 'torch'")

    safe = wrap(broken)
    out = run_batch(safe, ["refund", "hello"], mode)
    assert [r.x_source for r in out] == ["rules", "default"]
    assert [r.x_fallback_reason for r in out] == ["unavailable", "unavailable"]
    assert isinstance(safe.load_error, ImportError)
    assert run_one(safe, "error 502", mode)["route"].choice == "technical"


def test_missing_model_dir_is_unavailable(tmp_path: Any) -> None:
    from engine import DecisionEngine

    safe = wrap(lambda: DecisionEngine(path=tmp_path / "missing"))
    result = safe.decide("invoice", ROUTE)
    assert result.x_fallback_reason == "unavailable"
    assert isinstance(safe.load_error, (ModelLoadError, OSError))


def test_rules_match_keywords_regex_and_predicates() -> None:
    fallback = RuleFallback(
        [
            Rule.when(lambda s: isinstance(s, dict) and s.get("plan") == "enterprise", "sales"),
            Rule.keywords(["card"], "billing", question="route"),
            Rule.regex(r"^urgent", "true", 0.9),
            Rule.keywords(["angry"], "2", 0.7),
        ],
        default="human",
    )
    questions = {
        "route": {"type": "choice", "instructions": "r", "criteria": ["billing", "sales", "human"]},
        "urgent": {"type": "noul", "instructions": "urgent?"},
        "mood": {"type": "score", "instructions": "anger", "criteria": ["calm", "meh", "angry"]},
    }
    req = DecisionRequest.parse(
        {"state": {"plan": "enterprise", "msg": "x"}, "questions": questions}
    )
    res = fallback.answer(req, reason="error")
    assert res["route"].choice == "sales"
    assert res["urgent"].noul == pytest.approx(0.5)
    req = DecisionRequest.parse(
        {"state": "Urgent: my cardboard box, angry", "questions": questions}
    )
    res = fallback.answer(req, reason="error")
    assert res["route"].choice == "human"  # "card" is a word rule; "cardboard" does not match
    assert res["urgent"].noul == pytest.approx(0.9)
    assert res["mood"].probabilities["2"] == pytest.approx(0.7)
    assert res.x_source == "rules"
    assert sum(res["route"].probabilities.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("probability", [1.5, 0.3, 0.0, float("nan")])
def test_rule_probability_is_checked(probability: float) -> None:
    # Under 0.5 the rule's own option may not be the answer (0.3 among three options
    # leaves 0.35 to each of the others), so the rule would contradict itself.
    with pytest.raises(InvalidRequestError) as info:
        Rule.keywords(["x"], "a", probability)
    assert info.value.field == "probability"
    assert info.value.limit == (0.5, 1.0)


def test_transient_classification() -> None:
    assert is_transient(TimeoutError())
    assert is_transient(ConnectionError())
    assert is_transient(RuntimeError("CUDA out of memory"))
    assert not is_transient(RuntimeError("kaput"))
    assert not is_transient(InvalidRequestError("bad", field="state"))


def test_wrapper_keeps_the_engine_surface() -> None:
    fake = FakeEngine()
    safe = wrap(fake)
    assert safe.model_version == fake.model_version
    assert safe.model_name == fake.model_name
    direct = fake.decide("crash", ROUTE)
    assert isinstance(safe.decide("crash", ROUTE)["route"], ChoiceAnswer)
    assert safe.decide({"state": "crash", "questions": ROUTE}) == direct.model_copy(
        update={"x_latency_ms": 0.0}
    )


def test_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from clef_agents.resilience import ResilientEngine, RuleFallback\n"
        "from clef_agents.fake import FakeEngine\n"
        "def load():\n"
        "    from clef_agents import DecisionEngine\n"
        "    return DecisionEngine()\n"
        "safe = ResilientEngine(load, fallback=RuleFallback(default='b'))\n"
        "q = {'q': {'type': 'choice', 'instructions': 'x', 'criteria': ['a', 'b']}}\n"
        "r = safe.decide('hi', q)\n"
        "assert r.x_fallback_reason == 'unavailable' and r['q'].choice == 'b', r\n"
        "assert FakeEngine().decide('a', q).x_source == 'model'\n"
        "assert sys.modules['torch'] is None\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- D2: the default option's probability ------------------------------------------------


@pytest.mark.parametrize("value", [0.2, 0.49, 1.5, -0.2, 0.0, math.nan, math.inf, "0.6", None])
def test_default_probability_out_of_range_is_refused(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(default="human", default_probability=value)
    assert info.value.field == "default_probability"
    assert info.value.limit == (0.5, 1.0)
    assert "[0.5, 1]" in str(info.value)


def test_fallback_arguments_are_checked() -> None:
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(default=1)  # type: ignore[arg-type]
    assert info.value.field == "default"
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(["refund"])  # type: ignore[list-item]
    assert info.value.field == "rules.0"
