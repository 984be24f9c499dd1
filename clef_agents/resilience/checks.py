"""Checks of an engine's result against the request it answers.

A result that pydantic accepted can still be wrong: answers may be missing or belong to
no question, a ``choice`` may name no option, probabilities may not sum to 1, values may
be NaN, infinite or out of range (answers are not re-validated when mutated, and an
engine can build them with ``model_construct``). :func:`result_problem` finds the first
such defect, so :class:`~clef_agents.resilience.ResilientEngine` never passes a broken
answer on as ``x_source="model"``.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> q = {"q": {"type": "choice", "criteria": ["a", "b"]}}
    >>> result = FakeEngine().decide("a", q)
    >>> request = DecisionRequest.parse({"state": "a", "questions": q})
    >>> result_problem(request, result) is None
    True
    >>> result.answers["q"].choice = "c"
    >>> result_problem(request, result)
    "answers.q.choice: 'c' is not one of the options ['a', 'b']"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from clef_engine.errors import ClefError
from clef_engine.schema.answers import (
    BoxAnswer,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
)
from clef_engine.schema.questions import Box, Choice, Noul, Score, _Question
from clef_engine.schema.request import DecisionRequest

SUM_TOLERANCE = 1e-3
"""How far a distribution's sum may be from 1 (float32 softmax sums are within ~1e-6)."""

VALUE_TOLERANCE = 1e-6
"""How far a probability, ``noul``, confidence or box fraction may stray outside [0, 1]."""


class InvalidOutputError(ClefError, ValueError):
    """The engine returned a result that does not answer the request validly.

    Raised (or put in the item's slot) by ``ResilientEngine`` when no fallback is set;
    with a fallback, the rules answer instead with reason ``invalid_output``.
    """

    error_type = "invalid_output"


def _unit(value: Any, where: str) -> str | None:
    """Why ``value`` is not a finite number in [0, 1], or ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where}: {value!r} is not a number"
    if not math.isfinite(value):
        return f"{where}: {value} is not finite"
    if not -VALUE_TOLERANCE <= value <= 1.0 + VALUE_TOLERANCE:
        return f"{where}: {value} is outside [0, 1]"
    return None


def _distribution(probabilities: Any, names: Sequence[str], where: str) -> str | None:
    """Why ``probabilities`` is not a distribution over exactly ``names``, or ``None``."""
    if not isinstance(probabilities, Mapping):
        return f"{where}: not a mapping of option to probability"
    known = set(names)
    missing = [n for n in names if n not in probabilities]
    extra = [k for k in probabilities if k not in known]
    if missing or extra:
        return f"{where}: keys must be the options {list(names)}; missing {missing}, extra {extra}"
    for name in names:
        value = probabilities[name]
        # The cheap test first: the message is built only for a bad value.
        if not (type(value) is float and 0.0 <= value <= 1.0):
            problem = _unit(value, f"{where}.{name}")
            if problem is not None:
                return problem
    total = math.fsum(probabilities.values())  # the keys are exactly ``names`` by now
    if abs(total - 1.0) > SUM_TOLERANCE:
        return f"{where}: sums to {total:.6g}, not 1 (tolerance {SUM_TOLERANCE})"
    return None


def _choice_problem(answer: ChoiceAnswer, question: Choice, where: str) -> str | None:
    names = list(question.criteria)  # the option names (option_specs() would re-parse)
    if answer.choice not in names:
        return f"{where}.choice: {answer.choice!r} is not one of the options {names}"
    problem = _distribution(answer.probabilities, names, f"{where}.probabilities")
    if problem is None:
        top = max(answer.probabilities.values())
        if answer.probabilities[answer.choice] < top - VALUE_TOLERANCE:
            problem = (
                f"{where}.choice: {answer.choice!r} has probability "
                f"{answer.probabilities[answer.choice]:.6g}, below the highest ({top:.6g})"
            )
    return problem or _unit(answer.confidence, f"{where}.confidence")


def _score_problem(answer: ScoreAnswer, question: Score, where: str) -> str | None:
    levels = [str(i) for i in range(len(question.criteria))]
    problem = _distribution(answer.probabilities, levels, f"{where}.probabilities")
    if problem is not None:
        return problem
    top = len(levels) - 1
    score = answer.score
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return f"{where}.score: {score!r} is not a finite number"
    if not -VALUE_TOLERANCE <= score <= top + VALUE_TOLERANCE:
        return f"{where}.score: {score} is outside the level range [0, {top}]"
    expected = math.fsum(i * answer.probabilities[level] for i, level in enumerate(levels))
    if abs(score - expected) > SUM_TOLERANCE * top + VALUE_TOLERANCE:
        return f"{where}.score: {score:.6g} is not the expected level {expected:.6g}"
    return _unit(answer.confidence, f"{where}.confidence")


def _box_problem(answer: BoxAnswer, where: str) -> str | None:
    if answer.confidence is not None:
        problem = _unit(answer.confidence, f"{where}.confidence")
        if problem is not None:
            return problem
    box = answer.box
    if box is None:
        return None
    for side in ("top", "bottom", "left", "right"):
        problem = _unit(getattr(box, side), f"{where}.box.{side}")
        if problem is not None:
            return problem
    if box.top > box.bottom or box.left > box.right:
        return f"{where}.box: top <= bottom and left <= right must hold; got {box.model_dump()}"
    return None


_ANSWER_TYPES: dict[type[_Question], type] = {
    Choice: ChoiceAnswer,
    Noul: NoulAnswer,
    Score: ScoreAnswer,
    Box: BoxAnswer,
}


def answer_problem(qid: str, question: _Question, answer: Any) -> str | None:
    """Why ``answer`` is not a valid answer to ``question``, or ``None`` when it is."""
    where = f"answers.{qid}"
    expected = _ANSWER_TYPES.get(type(question))
    if expected is None:
        return f"{where}: no check for question type {type(question).__name__}"
    if not isinstance(answer, expected):
        kind = type(question).__name__.lower()
        return f"{where}: a {kind} question got a {type(answer).__name__}"
    if isinstance(answer, ChoiceAnswer) and isinstance(question, Choice):
        return _choice_problem(answer, question, where)
    if isinstance(answer, ScoreAnswer) and isinstance(question, Score):
        return _score_problem(answer, question, where)
    if isinstance(answer, NoulAnswer):
        return _unit(answer.noul, f"{where}.noul")
    assert isinstance(answer, BoxAnswer)
    return _box_problem(answer, where)


def result_problem(request: DecisionRequest, result: Any) -> str | None:
    """The first reason ``result`` does not answer ``request`` validly, or ``None``.

    Checks that every question has exactly one answer of its type and no answer belongs
    to a question not asked; that a ``choice`` is one of the options and the most
    probable one; that ``probabilities`` cover exactly the options (levels for a
    ``score``), are finite, in [0, 1] and sum to 1 within :data:`SUM_TOLERANCE`; that
    ``noul``, confidences and box fractions are in [0, 1]; and that a ``score`` lies in
    the level range and equals the expected level.
    """
    if not isinstance(result, DecisionResult):
        return f"the engine returned a {type(result).__name__}, not a DecisionResult"
    answers = result.answers
    missing = [q for q in request.questions if q not in answers]
    if missing:
        return f"answers: no answer to the questions {missing}"
    extra = [q for q in answers if q not in request.questions]
    if extra:
        return f"answers: answers to questions not asked {extra}"
    for qid, question in request.questions.items():
        problem = answer_problem(qid, question, answers[qid])
        if problem is not None:
            return problem
    return None
