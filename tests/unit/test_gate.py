"""The one confidence gate: its rules, and that all five adapters apply the same ones."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.runnables import RunnableLambda
from llama_index.core.tools import ToolMetadata
from llama_index.core.workflow import StopEvent, Workflow, step

from clef_agents._gate import ConfidenceGate, LowConfidenceError, check_threshold
from clef_agents.fake import FakeEngine
from clef_agents.langchain import ClefRouter, clef_path
from clef_agents.llama_index import (
    ClefMultiSelector,
    ClefRouteEvent,
    ClefSelector,
    clef_router_step,
)
from clef_agents.resilience import ResilientEngine, RuleFallback
from clef_engine.errors import InvalidRequestError
from clef_engine.schema.answers import ChoiceAnswer
from clef_engine.schema.questions import Choice

ROUTES = {"billing": "refund invoice", "technical": "crash bug"}


class Saved:
    """Thresholds saved with a model (the ``threshold_for`` surface of ``Thresholds``)."""

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.asked: list[Any] = []

    def threshold_for(self, question: Any) -> float | None:
        self.asked.append(question)
        return self.threshold


def pinned(probability: float, saved: float | None = None) -> FakeEngine:
    """An engine that always answers ``billing`` with ``probability``."""
    engine = FakeEngine(fixed={"route": "billing"}, fixed_probability=probability)
    if saved is not None:
        engine.thresholds = Saved(saved)  # type: ignore[assignment]
    return engine


def answer(choice: str, p: float) -> ChoiceAnswer:
    return ChoiceAnswer(
        choice=choice, probabilities={choice: p, "other": 1 - p}, confidence=2 * p - 1
    )


# -- the rules --------------------------------------------------------------------------


def test_threshold_must_be_a_probability_and_names_the_field() -> None:
    assert check_threshold(None) is None
    assert check_threshold(0) == 0.0 and check_threshold(1) == 1.0
    for bad in (-0.01, 1.5, math.nan, math.inf, True, "0.5"):
        with pytest.raises(InvalidRequestError) as info:
            check_threshold(bad, "threshold")
        assert info.value.field == "threshold"
    with pytest.raises(InvalidRequestError) as info:
        ClefRouter(ROUTES, routes={}, default=lambda x: x, min_confidence=2, engine=pinned(0.9))
    assert "min_confidence" in str(info.value)


def test_explicit_threshold_wins_then_saved_then_zero() -> None:
    saved = lambda qid, question: 0.8  # noqa: E731
    assert ConfidenceGate(0.0, saved=saved).threshold("route") == 0.0  # explicit 0.0 honoured
    assert ConfidenceGate(0.3, saved=saved).threshold("route") == 0.3
    assert ConfidenceGate(None, saved=saved).threshold("route") == 0.8
    assert ConfidenceGate(None, saved=lambda qid, q: None).threshold("route") == 0.0
    assert ConfidenceGate(None).threshold("route") == 0.0
    with pytest.raises(InvalidRequestError) as info:
        ConfidenceGate(None, saved=lambda qid, q: 1.2).threshold("route")
    assert info.value.field == "saved min_confidence"


def test_a_tie_with_the_threshold_passes() -> None:
    gate = ConfidenceGate(0.625)
    assert gate.passes(0.625, "q") and not gate.passes(0.624999, "q")
    assert gate.pick(answer("billing", 0.625), {"billing"}, "q").route == "billing"
    # Equal probabilities keep their order in a multi-selection.
    assert ConfidenceGate(0.3).select_all({"a": 0.4, "b": 0.4, "c": 0.2}, "q") == ["a", "b"]


def test_an_option_without_a_route_goes_to_the_default_even_when_certain() -> None:
    pick = ConfidenceGate(0.0).pick(answer("sales", 1.0), {"billing"}, "q")
    assert (pick.route, pick.reason, pick.choice) == (None, "no_route", "sales")
    low = ConfidenceGate(0.7).pick(answer("billing", 0.6), {"billing"}, "q")
    assert (low.route, low.reason, low.threshold) == (None, "low_confidence", 0.7)
    gate = ConfidenceGate(None)
    assert gate.needs_default({"billing", "sales"}, {"billing"}, "q", None)
    assert not gate.needs_default({"billing"}, {"billing"}, "q", None)
    assert ConfidenceGate(0.1).needs_default({"billing"}, {"billing"}, "q", None)


# -- the five adapters agree ---------------------------------------------------------------


def via_router(engine: Any, threshold: float | None) -> bool:
    router = ClefRouter(
        ROUTES,
        routes={k: RunnableLambda(lambda x, k=k: k) for k in ROUTES},
        default=RunnableLambda(lambda x: "default"),
        min_confidence=threshold,
        engine=engine,
    )
    return bool(router.invoke("anything") == "billing")


def via_graph(engine: Any, threshold: float | None) -> bool:
    path = clef_path(ROUTES, fallback="human", min_confidence=threshold, engine=engine)
    return bool(path.invoke("anything") == "billing")


def via_workflow(engine: Any, threshold: float | None) -> bool:
    class Billing(ClefRouteEvent): ...

    class Human(ClefRouteEvent): ...

    class Desk(Workflow):
        @step
        async def billing(self, ev: Billing) -> StopEvent:
            return StopEvent(result="billing")

        @step
        async def human(self, ev: Human) -> StopEvent:
            return StopEvent(result="default")

    clef_router_step(
        Desk,
        ROUTES,
        events={"billing": Billing, "technical": Human},
        default=Human,
        min_confidence=threshold,
        engine=engine,
    )

    async def run() -> Any:
        return await Desk(timeout=10).run(query="anything")

    return bool(asyncio.run(run()) == "billing")


def via_selector(engine: Any, threshold: float | None) -> bool:
    selector = ClefSelector(engine=engine, min_confidence=threshold, default_index=1)
    tools = [ToolMetadata(name=name, description=text) for name, text in ROUTES.items()]
    return not selector.select(tools, "anything").below_threshold


def via_resilience(engine: Any, threshold: float | None) -> bool:
    safe = ResilientEngine(
        engine,
        fallback=RuleFallback([], default="technical"),
        **({} if threshold is None else {"min_confidence": threshold}),
    )
    question = Choice(instructions="Route", criteria=ROUTES)
    return bool(safe.decide("anything", {"route": question}).x_source == "model")


ADAPTERS: list[Callable[[Any, float | None], bool]] = [
    via_router,
    via_graph,
    via_workflow,
    via_selector,
    via_resilience,
]


@pytest.mark.parametrize("follows", ADAPTERS, ids=lambda f: f.__name__)
def test_every_adapter_applies_the_same_gate(follows: Callable[[Any, float | None], bool]) -> None:
    assert follows(pinned(0.5), 0.5)  # a tie passes
    assert not follows(pinned(0.5), 0.51)
    assert follows(pinned(0.5), None)  # nothing given, nothing saved: no gate
    assert not follows(pinned(0.5, saved=0.9), None)  # nothing given: the saved threshold
    assert follows(pinned(0.5, saved=0.9), 0.0)  # an explicit 0.0 is honoured
    assert follows(pinned(0.95, saved=0.9), None)


def test_graph_honours_an_explicit_zero_over_its_routers_threshold() -> None:
    router = ClefRouter(
        ROUTES,
        routes={k: RunnableLambda(lambda x, k=k: k) for k in ROUTES},
        default=RunnableLambda(lambda x: "default"),
        min_confidence=0.9,
        engine=pinned(0.5),
    )
    assert clef_path(router, fallback="human").invoke("x") == "human"  # inherits 0.9
    assert clef_path(router, fallback="human", min_confidence=0.0).invoke("x") == "billing"


def test_saved_thresholds_are_looked_up_by_the_question_asked() -> None:
    engine = pinned(0.5, saved=0.9)
    via_router(engine, None)
    asked = engine.thresholds.asked  # type: ignore[attr-defined]
    assert asked and all(isinstance(q, Choice) and set(q.criteria) == set(ROUTES) for q in asked)


def test_a_threshold_saved_after_construction_without_a_default_is_a_typed_error() -> None:
    engine = pinned(0.5)
    router = ClefRouter(
        ROUTES, routes={k: RunnableLambda(lambda x: x) for k in ROUTES}, engine=engine
    )
    engine.thresholds = Saved(0.9)  # type: ignore[assignment]
    with pytest.raises(LowConfidenceError):
        router.invoke("x")
    out = router.batch(["x", "y"], return_exceptions=True)
    assert all(isinstance(o, LowConfidenceError) for o in out)


def test_a_saved_threshold_above_zero_needs_a_default_at_construction() -> None:
    with pytest.raises(InvalidRequestError) as info:
        ClefRouter(
            ROUTES, routes={k: RunnableLambda(lambda x: x) for k in ROUTES}, engine=pinned(0.5, 0.4)
        )
    assert info.value.field == "default"


def test_multi_selector_uses_the_gate_with_its_threshold_name() -> None:
    with pytest.raises(InvalidRequestError) as info:
        ClefMultiSelector(engine=FakeEngine(), threshold=1.5)
    assert info.value.field == "threshold"
