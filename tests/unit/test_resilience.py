"""Fault injection for ResilientEngine: nothing lost, order preserved, tags correct."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from faulty import ROUTE, FaultyEngine

from clef_agents.fake import FakeEngine
from clef_agents.resilience import (
    CallTimeout,
    InvalidOutputError,
    ResilientEngine,
    Rule,
    RuleFallback,
    WorkersBusy,
    is_transient,
    result_problem,
)
from clef_engine.errors import InvalidRequestError, ModelLoadError
from clef_engine.schema.answers import (
    BoxCoords,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
)
from clef_engine.schema.request import DecisionRequest

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
    from clef_engine import DecisionEngine

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


# -- D1: a result must answer the request validly ---------------------------------------

QUESTIONS = {
    **ROUTE,
    "urgent": {"type": "noul", "instructions": "urgent?"},
    "mood": {"type": "score", "instructions": "anger", "criteria": ["calm", "meh", "angry"]},
    "button": {"type": "box", "instructions": "the OK button"},
}


class Replace:
    """Returned by a mutation: the engine returns ``value`` instead of its result."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Mangled(FakeEngine):
    """A FakeEngine whose results ``mutate`` spoils after they were built."""

    def __init__(self, mutate: Callable[[DecisionResult], Any]) -> None:
        super().__init__()
        self.mutate = mutate

    def _run(self, request: DecisionRequest) -> DecisionResult:
        result = super()._run(request)
        replaced = self.mutate(result)
        return replaced.value if isinstance(replaced, Replace) else result


def _route(result: DecisionResult) -> ChoiceAnswer:
    answer = result.answers["route"]
    assert isinstance(answer, ChoiceAnswer)
    return answer


def _mood(result: DecisionResult) -> ScoreAnswer:
    answer = result.answers["mood"]
    assert isinstance(answer, ScoreAnswer)
    return answer


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


def _scale(result: DecisionResult, factor: float) -> None:
    route = _route(result)
    route.probabilities = {k: v * factor for k, v in route.probabilities.items()}


def _least_likely(result: DecisionResult) -> None:
    route = _route(result)
    route.choice = min(route.probabilities, key=route.probabilities.__getitem__)


def _off_expected_level(result: DecisionResult) -> None:
    mood = _mood(result)
    mood.score = 0.0 if mood.score > 1.0 else 2.0


MUTATIONS: list[tuple[str, Callable[[DecisionResult], Any], str]] = [
    ("missing", lambda r: r.answers.pop("route"), "no answer to the questions ['route']"),
    (
        "not_asked",
        lambda r: r.answers.__setitem__("other", NoulAnswer(noul=0.5)),
        "questions not asked ['other']",
    ),
    ("not_an_option", lambda r: _set(_route(r), "choice", "refunds"), "not one of the options"),
    ("not_the_top", _least_likely, "below the highest"),
    (
        "option_missing",
        lambda r: _route(r).probabilities.pop("human"),
        "missing ['human']",
    ),
    ("sum_half", lambda r: _scale(r, 0.5), "not 1"),
    ("sum_double", lambda r: _scale(r, 2.0), "outside [0, 1]"),
    (
        "negative",
        lambda r: _route(r).probabilities.update(billing=1.1, technical=-0.1, human=0.0),
        "outside [0, 1]",
    ),
    ("inf", lambda r: _route(r).probabilities.update(human=math.inf), "not finite"),
    ("confidence", lambda r: _set(_route(r), "confidence", 1.5), "confidence: 1.5"),
    ("noul_high", lambda r: _set(r.answers["urgent"], "noul", 1.5), "noul: 1.5"),
    ("noul_nan", lambda r: _set(r.answers["urgent"], "noul", math.nan), "noul: nan"),
    ("noul_negative", lambda r: _set(r.answers["urgent"], "noul", -0.2), "noul: -0.2"),
    ("score_range", lambda r: _set(_mood(r), "score", 7.0), "outside the level range [0, 2]"),
    ("score_level", _off_expected_level, "is not the expected level"),
    (
        "score_keys",
        lambda r: _set(_mood(r), "probabilities", {"calm": 0.5, "meh": 0.3, "angry": 0.2}),
        "keys must be the options ['0', '1', '2']",
    ),
    (
        "wrong_type",
        lambda r: r.answers.__setitem__("route", NoulAnswer(noul=0.5)),
        "a choice question got a NoulAnswer",
    ),
    (
        "box_outside",
        lambda r: _set(r.answers["button"], "box", BoxCoords(top=0, bottom=1.5, left=0, right=1)),
        "box.bottom: 1.5",
    ),
    (
        "box_inverted",
        lambda r: _set(r.answers["button"], "box", BoxCoords(top=0.6, bottom=0.2, left=0, right=1)),
        "top <= bottom",
    ),
    ("not_a_result", lambda r: Replace({"answers": {}}), "returned a dict, not a DecisionResult"),
]


@pytest.mark.parametrize("mode", ["sync", "async", "batch", "abatch"])
@pytest.mark.parametrize(
    ("mutate", "problem"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_invalid_model_answer_is_answered_by_the_fallback(
    mode: str, mutate: Callable[[DecisionResult], Any], problem: str
) -> None:
    # A gate every valid answer passes: bad answers must not slip past it either.
    safe = wrap(Mangled(mutate), min_confidence=0.01)
    state = "refund please"
    if mode == "sync":
        result = safe.decide(state, QUESTIONS)
    elif mode == "async":
        result = asyncio.run(safe.adecide(state, QUESTIONS))
    elif mode == "batch":
        (result,) = safe.decide_batch([state], QUESTIONS)
    else:
        (result,) = asyncio.run(safe.adecide_batch([state], QUESTIONS))
    assert result.x_source == "rules"
    assert result.x_fallback_reason == "invalid_output"
    assert result.x_fallback_error.startswith("InvalidOutputError: ")
    assert problem in result.x_fallback_error
    assert result["route"].choice == "billing"
    assert {a.x_source for a in result.answers.values()} <= {"rules", "default"}
    request = DecisionRequest.parse({"state": state, "questions": QUESTIONS})
    assert result_problem(request, result) is None  # the fallback itself answers validly
    assert safe.counters.fallbacks["invalid_output"] == 1
    assert safe.counters.model == 0


def test_invalid_model_answer_without_fallback_is_a_typed_error() -> None:
    safe = ResilientEngine(Mangled(lambda r: _set(_route(r), "choice", "refunds")))
    with pytest.raises(InvalidOutputError, match=r"answers\.route\.choice: 'refunds'"):
        safe.decide("refund please", ROUTE)
    out = safe.decide_batch(["refund please"], ROUTE, return_exceptions=True)
    assert isinstance(out[0], InvalidOutputError)
    assert isinstance(out[0], ValueError)
    assert safe.counters.errors == 2


@pytest.mark.parametrize("mode", MODES)
def test_batch_with_a_result_missing_is_invalid_output(mode: str) -> None:
    class ShortBatch(FakeEngine):
        def decide_batch(self, *args: Any, **kwargs: Any) -> list[Any]:
            return super().decide_batch(*args, **kwargs)[:-1]

    out = run_batch(wrap(ShortBatch()), ["refund please", "crash bug"], mode)
    assert [r.x_fallback_reason for r in out] == ["invalid_output"] * 2
    assert [r["route"].choice for r in out] == ["billing", "human"]
    assert "returned 1 results for 2 requests" in out[0].x_fallback_error


def test_valid_answers_of_every_type_pass_the_checks() -> None:
    safe = wrap(FakeEngine(), min_confidence=0.01)
    for state in ["refund please", "crash bug on login", "hello there"]:
        result = safe.decide(state, QUESTIONS)
        assert result.x_source == "model"
        request = DecisionRequest.parse({"state": state, "questions": QUESTIONS})
        assert result_problem(request, result) is None
    assert safe.counters.model == 3


# -- D2: the default option's probability ------------------------------------------------


@pytest.mark.parametrize("value", [0.2, 0.49, 1.5, -0.2, 0.0, math.nan, math.inf, "0.6", None])
def test_default_probability_out_of_range_is_refused(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(default="human", default_probability=value)
    assert info.value.field == "default_probability"
    assert info.value.limit == (0.5, 1.0)
    assert "[0.5, 1]" in str(info.value)


@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("p", [0.5, 0.51, 0.8, 1.0])
def test_default_option_is_the_answer_for_every_allowed_probability(n: int, p: float) -> None:
    names = [f"o{i}" for i in range(n)]
    questions = {
        "c": {"type": "choice", "instructions": "pick", "criteria": names},
        "s": {"type": "score", "instructions": "rate", "criteria": names},
        "yes": {"type": "noul", "instructions": "yes?"},
    }
    request = DecisionRequest.parse({"state": "nothing matches", "questions": questions})
    for default in (names[-1], names[0]):
        result = RuleFallback(default=default, default_probability=p).answer(request, reason="x")
        assert result_problem(request, result) is None
        assert result["c"].choice == default
        assert result["c"].probabilities[default] == pytest.approx(p)
    level = str(n - 1)
    result = RuleFallback(default=level, default_probability=p).answer(request, reason="x")
    assert result_problem(request, result) is None
    score = result["s"]
    assert isinstance(score, ScoreAnswer)
    assert score.probabilities[level] == max(score.probabilities.values())
    for side, expected in (("true", p), ("false", 1.0 - p)):
        result = RuleFallback(default=side, default_probability=p).answer(request, reason="x")
        assert result["yes"].noul == pytest.approx(expected)


def test_fallback_arguments_are_checked() -> None:
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(default=1)  # type: ignore[arg-type]
    assert info.value.field == "default"
    with pytest.raises(InvalidRequestError) as info:
        RuleFallback(["refund"])  # type: ignore[list-item]
    assert info.value.field == "rules.0"


# -- D3/D4: loading fails, then is retried with backoff ---------------------------------


class FlakyFactory:
    """Fails ``failures`` times with ``exc``, then builds a FakeEngine."""

    def __init__(self, failures: int, exc: BaseException | None) -> None:
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            if self.exc is None:
                return None  # a factory that returns no engine at all
            raise self.exc
        return FakeEngine()


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("config.json: temperature must be a number"),
        TypeError("unsupported operand"),
        KeyError("head.weight"),
        ModelLoadError("head.safetensors: truncated"),
        None,
    ],
    ids=["ValueError", "TypeError", "KeyError", "ModelLoadError", "returns_None"],
)
@pytest.mark.parametrize("mode", ["sync", "async", "batch"])
def test_any_load_failure_answers_from_rules(mode: str, exc: BaseException | None) -> None:
    safe = wrap(FlakyFactory(10, exc))
    if mode == "batch":
        (result,) = safe.decide_batch(["refund please"], ROUTE)
    else:
        result = run_one(safe, "refund please", mode)
    assert result.x_source == "rules"
    assert result.x_fallback_reason == "unavailable"
    expected = "TypeError" if exc is None else type(exc).__name__
    assert result.x_fallback_error.startswith(expected)
    assert safe.load_error is not None


def test_corrupt_model_dir_answers_from_rules(tmp_path: Any) -> None:
    from clef_engine import DecisionEngine

    (tmp_path / "config.json").write_text("{not json")
    safe = wrap(lambda: DecisionEngine(path=tmp_path))
    result = safe.decide("my invoice", ROUTE)
    assert (result.x_source, result.x_fallback_reason) == ("rules", "unavailable")
    assert "config.json" in result.x_fallback_error


@pytest.mark.parametrize("mode", MODES)
def test_failed_load_is_retried_with_backoff_until_it_loads(mode: str) -> None:
    now = [100.0]
    factory = FlakyFactory(3, ModelLoadError("config.json: format_version '2'"))
    safe = wrap(factory, load_retry_s=1.0, max_load_retry_s=3.0, clock=lambda: now[0])

    def at(t: float) -> DecisionResult:
        now[0] = t
        return run_one(safe, "refund please", mode)

    # Waits of 1 s, then 2 s, then 3 s (4 s capped by max_load_retry_s).
    schedule = [(100.0, 1), (100.9, 1), (101.0, 2), (102.9, 2), (103.0, 3), (105.9, 3)]
    for t, calls in schedule:
        result = at(t)
        assert (result.x_source, result.x_fallback_reason) == ("rules", "unavailable"), t
        assert factory.calls == calls, t
    result = at(106.0)
    assert result.x_source == "model"
    assert factory.calls == 4
    assert safe.load_error is None
    assert at(500.0).x_source == "model"
    assert factory.calls == 4
    assert safe.counters.fallbacks["unavailable"] == len(schedule)


def test_load_retry_can_be_turned_off() -> None:
    now = [0.0]
    factory = FlakyFactory(1, OSError("no such dir"))
    safe = wrap(factory, load_retry_s=None, clock=lambda: now[0])
    for t in (0.0, 10.0, 1e6):
        now[0] = t
        assert safe.decide("refund", ROUTE).x_fallback_reason == "unavailable"
    assert factory.calls == 1


def test_a_load_retry_in_progress_does_not_block_other_callers() -> None:
    entered, gate = threading.Event(), threading.Event()
    calls: list[int] = []

    def factory() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the model dir is still being copied")
        entered.set()
        gate.wait(5)
        return FakeEngine()

    now = [0.0]
    safe = wrap(factory, load_retry_s=1.0, clock=lambda: now[0])
    assert safe.decide("refund", ROUTE).x_fallback_reason == "unavailable"
    now[0] = 1.0
    results: list[DecisionResult] = []
    loading = threading.Thread(target=lambda: results.append(safe.decide("crash bug", ROUTE)))
    loading.start()
    try:
        assert entered.wait(2), "the retry did not start"
        started = time.perf_counter()
        result = safe.decide("refund", ROUTE)
        assert time.perf_counter() - started < 1.0
        assert result.x_fallback_reason == "unavailable"
    finally:
        gate.set()
        loading.join(5)
    assert results[0].x_source == "model"
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"load_retry_s": 0}, "load_retry_s"),
        ({"load_retry_s": math.nan}, "load_retry_s"),
        ({"max_load_retry_s": -1}, "max_load_retry_s"),
        ({"load_retry_s": 5.0, "max_load_retry_s": 1.0}, "max_load_retry_s"),
        ({"timeout_workers": 0}, "timeout_workers"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
    ],
)
def test_wrapper_arguments_are_checked(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        wrap(FlakyFactory(0, None), **kwargs)
    assert info.value.field == field


# -- the timeout workers never queue ----------------------------------------------------


def _wait_idle(safe: ResilientEngine) -> None:
    deadline = time.monotonic() + 5
    while safe.busy_workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert safe.busy_workers == 0


@pytest.mark.parametrize("workers", [4, 1])
def test_hung_workers_answer_later_calls_at_once_from_rules(workers: int) -> None:
    engine = FaultyEngine()
    budget = 0.3
    kwargs = {} if workers == 4 else {"timeout_workers": workers}  # 4 is the default
    safe = wrap(engine, timeout_s=budget, max_attempts=1, **kwargs)
    try:
        for i in range(workers):
            assert safe.decide(f"hang {i}", ROUTE).x_fallback_reason == "timeout"
        assert safe.busy_workers == workers
        started = time.perf_counter()
        result = safe.decide("refund please", ROUTE)
        elapsed = time.perf_counter() - started
        assert (result.x_source, result.x_fallback_reason) == ("rules", "busy")
        assert result["route"].choice == "billing"
        assert result.x_fallback_error.startswith("WorkersBusy: ")
        assert elapsed < budget  # answered at once, not after waiting out the budget
        out = safe.decide_batch(["invoice", "crash bug"], ROUTE)
        assert [r.x_fallback_reason for r in out] == ["busy", "busy"]
        assert engine.seen["refund please"] == engine.seen["invoice"] == 0
        assert safe.counters.fallbacks["busy"] == 3
        # Without a fallback the caller gets the typed error, as fast.
        bare = ResilientEngine(engine, timeout_s=budget, timeout_workers=1, max_attempts=1)
        with pytest.raises(CallTimeout):
            bare.decide("hang again", ROUTE)
        with pytest.raises(WorkersBusy, match="all 1 timeout workers"):
            bare.decide("refund please", ROUTE)
    finally:
        engine.release.set()
    _wait_idle(safe)
    assert safe.decide("refund please", ROUTE).x_source == "model"
    safe.close()
