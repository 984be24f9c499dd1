"""FakeEngine: deterministic, torch-free, the same surface and outputs as DecisionEngine."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from clef_agents.fake import FakeEngine
from clef_engine.errors import InvalidRequestError
from clef_engine.schema.answers import ChoiceAnswer, DecisionResult, NoulAnswer, ScoreAnswer

QUESTIONS = {
    "route": {
        "type": "choice",
        "instructions": "Route",
        "criteria": {
            "billing": "refund invoice payment",
            "technical": {"description": "bug crash", "examples": ["the app freezes"]},
        },
    },
    "urgent": {"type": "noul", "instructions": "urgent?", "criteria": {"true": "urgent now"}},
    "anger": {"type": "score", "instructions": "anger", "criteria": ["calm", "annoyed", "furious"]},
}


def test_answers_are_well_formed_and_follow_the_words() -> None:
    result = FakeEngine().decide("the app freezes, urgent, I am furious", QUESTIONS)
    assert isinstance(result, DecisionResult)
    route, urgent, anger = result["route"], result["urgent"], result["anger"]
    assert isinstance(route, ChoiceAnswer) and route.choice == "technical"
    assert sum(route.probabilities.values()) == pytest.approx(1.0)
    assert isinstance(urgent, NoulAnswer) and urgent.noul > 0.5
    assert isinstance(anger, ScoreAnswer)
    assert max(anger.probabilities, key=anger.probabilities.__getitem__) == "2"
    assert anger.legend == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert result.x_source == "model"
    assert result.x_top_probability["route"] == route.probabilities["technical"]
    assert set(result.to_wire()) >= {"model", "answers", "usage"}


def test_deterministic_across_instances_and_batching() -> None:
    states = ["refund my invoice", "crash on start", {"msg": "payment failed"}]
    one = [FakeEngine().decide(s, QUESTIONS) for s in states]
    batch = FakeEngine().decide_batch(states, QUESTIONS)
    assert [r.answers for r in one] == [r.answers for r in batch]


def test_fixed_answers() -> None:
    fake = FakeEngine(fixed={"route": "billing", "urgent": 0.2, "anger": 0}, fixed_probability=0.7)
    result = fake.decide("crash", QUESTIONS)
    assert result["route"].choice == "billing"
    assert result["route"].probabilities["billing"] == pytest.approx(0.7)
    assert result["urgent"].noul == pytest.approx(0.2)
    assert result["anger"].probabilities["0"] == pytest.approx(0.7)
    with pytest.raises(InvalidRequestError, match="nope"):
        FakeEngine(fixed={"route": "nope"}).decide("x", QUESTIONS)


def test_batch_keeps_errors_in_their_slots() -> None:
    fake = FakeEngine()
    out = fake.decide_batch(
        ["refund", "", {"state": "x", "questions": {}}], QUESTIONS, return_exceptions=True
    )
    assert isinstance(out[0], DecisionResult)
    assert isinstance(out[1], InvalidRequestError) and out[1].field == "state"
    with pytest.raises(InvalidRequestError):
        fake.decide_batch(["refund", ""], QUESTIONS)
    requests = [{"state": "refund", "questions": QUESTIONS}, {"state": "x", "questions": {}}]
    out = fake.decide_batch(requests, return_exceptions=True)
    assert isinstance(out[0], DecisionResult)
    assert isinstance(out[1], InvalidRequestError) and out[1].field == "questions"


def test_async_forms_match_sync() -> None:
    fake = FakeEngine()
    sync = fake.decide("refund", QUESTIONS)
    assert asyncio.run(fake.adecide("refund", QUESTIONS)).answers == sync.answers
    batch = asyncio.run(fake.adecide_batch(["refund", "crash"], QUESTIONS))
    assert batch[0].answers == sync.answers


def test_surface_matches_the_real_engine() -> None:
    from clef_engine import DecisionEngine

    for name in ("decide", "adecide", "decide_batch", "adecide_batch"):
        real = inspect.signature(getattr(DecisionEngine, name))
        fake = inspect.signature(getattr(FakeEngine, name))
        assert list(real.parameters) == list(fake.parameters), name
