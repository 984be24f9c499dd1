"""Out of scope: ``Choice(none_of_these=...)``, the margin rule and fitting its margin."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from clef_agents.fake import FakeEngine
from clef_engine import Choice
from clef_engine.errors import InvalidRequestError
from clef_engine.runtime.none_of_these import apply_margin, fit_none_below, margin_for_cost
from clef_engine.schema.answers import ChoiceAnswer, choice_confidence
from clef_engine.schema.questions import NONE_OF_THESE, NONE_OF_THESE_DESCRIPTION

NONE = NONE_OF_THESE


def test_the_option_is_added_with_its_examples() -> None:
    plain = Choice(criteria=["a", "b"])
    assert [s.name for s in plain.option_specs()] == ["a", "b"]
    described = Choice(criteria=["a", "b"], none_of_these=True).option_specs()[-1]
    assert (described.name, described.description) == (NONE, NONE_OF_THESE_DESCRIPTION)
    taught = Choice(criteria=["a", "b"], none_of_these=["the weather", "a joke"]).option_specs()
    assert taught[-1].examples == ("the weather", "a joke")
    own = Choice(criteria=["a", "b"], none_of_these={"description": "off topic"}).option_specs()
    assert own[-1].description == "off topic"
    # The wire form parses too.
    wire = Choice.model_validate(
        {"type": "choice", "criteria": ["a", "b"], "none_of_these": ["x"], "none_below": 0.4}
    )
    assert wire.none_below == 0.4 and wire.option_specs()[-1].examples == ("x",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"criteria": ["a", NONE], "none_of_these": True}, "already has one"),
        ({"criteria": ["a", "b"], "none_below": 0.3}, "none_below needs none_of_these"),
        ({"criteria": ["a", "b"], "none_of_these": True, "none_below": 1.0}, r"in \(0, 1\)"),
        ({"criteria": [f"o{i}" for i in range(255)], "none_of_these": True}, "at most 255"),
        ({"criteria": ["a", "b"], "none_of_these": {"examples": [1]}}, "list of strings"),
    ],
)
def test_bad_out_of_scope_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Choice(**kwargs)


def _answer(probabilities: dict[str, float]) -> ChoiceAnswer:
    best = max(probabilities, key=probabilities.__getitem__)
    return ChoiceAnswer(
        choice=best,
        probabilities=probabilities,
        confidence=choice_confidence(list(probabilities.values())),
    )


def test_margin_picks_none_of_these_below_it_and_keeps_a_distribution() -> None:
    answer = _answer({"a": 0.4, "b": 0.35, NONE: 0.25})
    assert apply_margin(answer, 0.5)
    p = answer.probabilities
    assert answer.choice == NONE and max(p, key=p.__getitem__) == NONE
    assert sum(p.values()) == pytest.approx(1.0)
    # none_of_these gets the margin, then everything is renormalised: 0.5 / (0.75 + 0.5).
    assert p[NONE] == pytest.approx(0.4) and p["a"] == pytest.approx(0.32)
    assert p["a"] / p["b"] == pytest.approx(0.4 / 0.35)  # the others keep their ratios
    assert answer.confidence == pytest.approx(choice_confidence(list(p.values())))


def test_margin_leaves_confident_and_already_out_of_scope_answers_alone() -> None:
    confident = _answer({"a": 0.7, "b": 0.2, NONE: 0.1})
    assert not apply_margin(confident, 0.5) and confident.probabilities["a"] == 0.7
    already = _answer({"a": 0.2, "b": 0.2, NONE: 0.6})
    assert not apply_margin(already, 0.5) and already.probabilities[NONE] == 0.6
    plain = _answer({"a": 0.4, "b": 0.6})  # no none_of_these option: nothing to do
    assert not apply_margin(plain, 0.9)


def test_margin_overrules_none_of_these_when_another_option_reaches_it() -> None:
    answer = _answer({"a": 0.4, "b": 0.1, NONE: 0.5})
    assert apply_margin(answer, 0.3)
    p = answer.probabilities
    # none_of_these is capped at the margin, then renormalised: 0.3 / (0.5 + 0.3).
    assert answer.choice == "a" and max(p, key=p.__getitem__) == "a"
    assert p[NONE] == pytest.approx(0.375) and p["a"] == pytest.approx(0.5)
    assert sum(p.values()) == pytest.approx(1.0)


def test_margin_for_cost_takes_the_largest_margin_within_budget() -> None:
    def row(best: float, label: str) -> tuple[dict[str, float], str]:
        # "a" is the most probable option, with ``best``; the rest share what is left.
        rest = (1 - best) / 3
        return {"a": best, "b": rest, "c": rest, NONE: rest}, label

    rows = [row(p, "a") for p in (0.3, 0.5, 0.7, 0.9)] + [row(p, NONE) for p in (0.2, 0.35)]
    # No loss allowed: just below the least confident right row (0.3) -> 0.3 flips none.
    assert margin_for_cost(rows, max_in_scope_cost=0.0) == pytest.approx(0.3)
    # One of four in-scope rows may flip (25 %): up to 0.5.
    assert margin_for_cost(rows, max_in_scope_cost=0.25) == pytest.approx(0.5)
    # Everything may flip: a margin above all of them.
    assert margin_for_cost(rows, max_in_scope_cost=1.0) > 0.9
    assert margin_for_cost([row(0.2, NONE)]) is None  # no in-scope rows


def test_engine_applies_the_margin_and_the_answer_is_valid(tiny_engine: Any) -> None:
    question = Choice(criteria=["billing", "tech"], none_of_these=True)
    base = tiny_engine.decide("refund my invoice", {"q": question}).answers["q"]
    assert set(base.probabilities) == {"billing", "tech", NONE}
    strict = question.model_copy(update={"none_below": 0.99})
    answer = tiny_engine.decide("refund my invoice", {"q": strict}).answers["q"]
    assert answer.choice == NONE
    assert sum(answer.probabilities.values()) == pytest.approx(1.0)
    result = tiny_engine.decide("refund my invoice", {"q": strict})
    assert result.x_top_probability["q"] == pytest.approx(answer.probabilities[NONE])


def test_fit_none_below_on_labelled_states() -> None:
    fake = FakeEngine(sharpness=1.0)
    question = Choice(
        criteria={"billing": "refund invoice", "tech": "bug crash"},
        none_of_these=["weather forecast", "football score"],
    )
    states = ["refund invoice please", "bug crash again", "refund", "crash", "hello there"]
    labels = ["billing", "tech", "billing", "tech", NONE]
    fitted = fit_none_below(fake, states, labels, question, max_in_scope_cost=0.0)
    assert fitted.none_below is not None
    # Within the budget: every in-scope row the bare question got right is still right.
    for state, label in zip(states[:4], labels[:4], strict=True):
        bare = fake.decide(state, {"q": question}).answers["q"]
        if bare.choice == label:
            assert fake.decide(state, {"q": fitted}).answers["q"].choice == label
    with pytest.raises(InvalidRequestError, match="none_of_these"):
        fit_none_below(fake, states, labels, Choice(criteria=["billing", "tech"]))
    with pytest.raises(InvalidRequestError, match="not options"):
        fit_none_below(fake, ["x"], ["nope"], question)
