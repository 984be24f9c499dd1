"""A choice's own calibration: ``Choice(temperature=...)`` and fitting it on labelled states."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from clef_agents.page_types import PAGE_TYPE_TEMPERATURE, PAGE_TYPES
from clef_agents.vision import page_type_question
from clef_engine import Choice, DecisionRequest
from clef_engine.calibration.fit import fit_choice_temperature
from clef_engine.errors import InvalidRequestError

ROUTE = Choice(
    instructions="Which team should take this ticket?",
    criteria={"billing": "payments and invoices", "tech": "bugs and crashes", "sales": "pricing"},
)
TICKETS = [
    "I was charged twice on my invoice",
    "the app crashes on login",
    "how much is the enterprise plan?",
    "refund my last payment",
    "error 500 when I upload a file",
    "can I get a discount for 50 seats?",
]


@pytest.mark.parametrize("bad", [0.0, -1.0, 1e-3, 1e3, math.inf, math.nan])
def test_a_temperature_out_of_range_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValidationError, match=r"temperature must be between 0\.01 and 100"):
        Choice(criteria=["a", "b"], temperature=bad)
    # On the wire, the same refusal names the field.
    with pytest.raises(InvalidRequestError) as err:
        DecisionRequest.parse(
            {"state": "x", "questions": {"q": {**ROUTE.model_dump(), "temperature": bad}}}
        )
    assert "temperature" in str(err.value)


def test_the_engine_applies_the_questions_temperature(tiny_engine: Any) -> None:
    plain = tiny_engine.decide(TICKETS[0], {"q": ROUTE}).answers["q"].probabilities
    for t in (0.5, 2.0):
        tempered = tiny_engine.decide(
            TICKETS[0], {"q": ROUTE.model_copy(update={"temperature": t})}
        ).answers["q"]
        weights = {k: v ** (1.0 / t) for k, v in plain.items()}
        total = sum(weights.values())
        assert tempered.probabilities == pytest.approx(
            {k: w / total for k, w in weights.items()}, abs=1e-6
        )
        assert tempered.choice == max(plain, key=plain.__getitem__)  # the order is kept
    sharp = tiny_engine.decide(TICKETS[0], {"q": ROUTE.model_copy(update={"temperature": 0.5})})
    assert max(sharp.answers["q"].probabilities.values()) > max(plain.values())


def test_fit_choice_temperature_on_labelled_states(tiny_engine: Any) -> None:
    states = TICKETS * 2
    # Labels that are the tiny random model's last option 10 times in 12 make its answers
    # overconfident, so the fit flattens them.
    answers = [r.answers["q"].probabilities for r in tiny_engine.decide_batch(states, {"q": ROUTE})]
    predicted = [max(p, key=p.__getitem__) for p in answers]
    wrong = [min(p, key=p.__getitem__) for p in answers]  # the least likely option
    labels = [p if i in (0, 7) else w for i, (p, w) in enumerate(zip(predicted, wrong))]
    fitted = fit_choice_temperature(tiny_engine, states, labels, ROUTE)
    assert fitted.temperature is not None and fitted.temperature > 1.0
    assert fitted.criteria == ROUTE.criteria and ROUTE.temperature is None
    # All right: it sharpens.
    sharp = fit_choice_temperature(tiny_engine, states, predicted, ROUTE)
    assert sharp.temperature is not None and sharp.temperature < 1.0
    # A temperature already set is not fitted on top of.
    again = fit_choice_temperature(tiny_engine, states, predicted, sharp)
    assert again.temperature == pytest.approx(sharp.temperature, rel=1e-3)


@pytest.mark.parametrize(
    ("states", "labels", "field", "match"),
    [
        (TICKETS * 2, ["billing"] * 11, "labels", "12 states but 11 labels"),
        (TICKETS[:3], ["billing"] * 3, "states", "at least 10"),
        (TICKETS * 2, ["billing"] * 11 + ["legal"], "labels", "not options"),
    ],
)
def test_fit_choice_temperature_refuses_bad_data(
    tiny_engine: Any, states: list[str], labels: list[str], field: str, match: str
) -> None:
    with pytest.raises(InvalidRequestError, match=match) as err:
        fit_choice_temperature(tiny_engine, states, labels, ROUTE)
    assert err.value.field == field


def test_the_page_type_question_carries_its_fitted_temperature() -> None:
    assert PAGE_TYPE_TEMPERATURE is not None and 0.0 < PAGE_TYPE_TEMPERATURE < 1.0
    assert page_type_question().temperature == PAGE_TYPE_TEMPERATURE
    # All of them, in another order or as the mapping itself, are the same question.
    assert page_type_question(sorted(PAGE_TYPES)).temperature == PAGE_TYPE_TEMPERATURE
    assert page_type_question(PAGE_TYPES).temperature == PAGE_TYPE_TEMPERATURE
    # A subset of them carries it too (docs/vision.md measures it there); types of one's
    # own, even built from them, answer as the engine does.
    assert page_type_question(["login", "registration"]).temperature == PAGE_TYPE_TEMPERATURE
    assert page_type_question({"a": "x", "b": "y"}).temperature is None
    assert page_type_question({"login": PAGE_TYPES["login"], "x": "y"}).temperature is None
    assert list(page_type_question().criteria) == list(PAGE_TYPES)


def test_a_temperature_set_past_validation_is_refused_by_name(tiny_engine: Any) -> None:
    broken = ROUTE.model_copy(update={"temperature": 0.0})  # model_copy does not validate
    with pytest.raises(InvalidRequestError, match="temperature must be a positive") as err:
        tiny_engine.decide(TICKETS[0], {"q": broken})
    assert err.value.field == "temperature"


def test_fitting_leaves_out_a_margin_and_reuses_the_prepared_question() -> None:
    from clef_agents.fake import FakeEngine
    from clef_engine.runtime.thresholds import question_key
    from clef_engine.schema.render import question_cache_key

    fake = FakeEngine()  # word-overlap scores: "discount for 50 seats" is a near tie
    criteria = {"billing": "billing invoice payment", "tech": "app crash error"}
    question = Choice(criteria=criteria, none_of_these=True, none_below=0.6)
    bare = question.model_copy(update={"none_below": None})
    states = TICKETS * 2
    labels = [r.answers["q"].choice for r in fake.decide_batch(states, {"q": bare})]
    margined = [r.answers["q"].choice for r in fake.decide_batch(states, {"q": question})]
    assert margined != labels  # the margin moves some answers to none_of_these...
    fitted = fit_choice_temperature(fake, states, labels, question)
    # ...but the engine tempers before it applies the margin, so the fit leaves it out.
    assert fitted.temperature == fit_choice_temperature(fake, states, labels, bare).temperature
    assert fitted.none_below == 0.6
    # The prepared form (option vectors, prototypes) is the same question's...
    assert question_cache_key(fitted) == question_cache_key(question)
    # ...but a saved threshold fitted on its untempered answers is not applied to it.
    assert question_key(fitted) != question_key(question)
    assert question_key(question.model_copy(update={"temperature": None})) == question_key(question)


def test_the_fake_engine_applies_the_temperature_too() -> None:
    from clef_agents.fake import FakeEngine

    fake = FakeEngine()
    plain = fake.decide(TICKETS[1], {"q": ROUTE}).answers["q"].probabilities
    sharp = (
        fake.decide(TICKETS[1], {"q": ROUTE.model_copy(update={"temperature": 0.5})})
        .answers["q"]
        .probabilities
    )
    weights = {k: v**2 for k, v in plain.items()}
    assert sharp == pytest.approx({k: w / sum(weights.values()) for k, w in weights.items()})


def test_answers_all_right_give_a_sharp_but_finite_temperature() -> None:
    import torch

    from clef_engine.calibration.fit import temperature_of_answers

    log_probs = torch.log(torch.tensor([[0.6, 0.3, 0.1]] * 10, dtype=torch.float64))
    all_right = temperature_of_answers(log_probs, [0] * 10)
    # Ten right answers are evidence for about 11/12, not for certainty: no 0.01 floor.
    assert 0.1 < all_right < 1.0
    top = torch.softmax(log_probs[0] / all_right, dim=0)[0]
    assert 0.8 < float(top) < 0.95
    # One wrong answer in ten: the NLL minimum itself, unsmoothed, puts the top at 0.9.
    one_wrong = temperature_of_answers(log_probs, [0] * 9 + [1])
    top = torch.softmax(log_probs[0] / one_wrong, dim=0)[0]
    assert float(top) == pytest.approx(0.9, abs=0.01)
