"""Out of scope: the ``none_of_these`` option's margin rule, and fitting its margin.

A :class:`~clef_engine.schema.questions.Choice` with ``none_of_these`` has one more option,
``"none_of_these"``, scored like the others (from its description, and from examples of
out-of-scope inputs when given: the strong signal). Its margin ``none_below`` makes the
rule explicit: the answer is ``none_of_these`` exactly when the best *other* option's
probability is below the margin (the examples still shape the probabilities; the margin
decides). The probabilities stay a distribution: ``none_of_these``'s probability is moved
to the margin before the options are renormalised, so the answer is the most probable
option; answers the rule does not change are left exactly as scored.

:func:`fit_none_below` picks the margin on labelled data (rows labelled
``"none_of_these"`` are the out-of-scope ones): the largest margin whose in-scope accuracy
cost stays within a budget, which gives the most out-of-scope recall for that cost.

Example:
    >>> from clef_engine.schema.answers import ChoiceAnswer
    >>> a = ChoiceAnswer(choice="a", confidence=0.0,
    ...                  probabilities={"a": 0.25, "b": 0.7 - 0.25, "none_of_these": 0.3})
    >>> apply_margin(a, 0.5), a.choice
    (True, 'none_of_these')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.runtime.labelled import labelled_answers
from clef_engine.schema.answers import Answer, ChoiceAnswer, choice_confidence
from clef_engine.schema.questions import NONE_OF_THESE, Choice


def apply_margin(answer: ChoiceAnswer, below: float) -> bool:
    """The margin rule, in place: the answer is ``none_of_these`` exactly when every other
    option's probability is below ``below``.

    ``none_of_these``'s probability is moved to the margin (floored at it when every other
    option is below it, capped at it when one is not) and the options are renormalised, so
    the answer stays the most probable option; the others keep their ratios.

    Returns:
        Whether the answer changed.
    """
    probabilities = answer.probabilities
    if NONE_OF_THESE not in probabilities:
        return False
    other, best = best_other(probabilities)
    own = probabilities[NONE_OF_THESE]
    if best < below:
        if own > best:  # already the answer
            return False
        moved, choice = max(own, below), NONE_OF_THESE
    else:
        if own <= best:  # already another option
            return False
        moved, choice = min(own, below), other
    total = 1.0 - own + moved
    updated = {n: (moved if n == NONE_OF_THESE else p) / total for n, p in probabilities.items()}
    answer.probabilities = updated
    answer.choice = choice
    answer.confidence = choice_confidence(list(updated.values()))
    return True


def apply_margins(questions: Mapping[str, Any], answers: Mapping[str, Answer]) -> bool:
    """:func:`apply_margin` on every answer whose question has a ``none_below``."""
    changed = False
    for qid, answer in answers.items():
        question = questions.get(qid)
        below = getattr(question, "none_below", None)
        if below is not None and isinstance(answer, ChoiceAnswer):
            changed = apply_margin(answer, float(below)) or changed
    return changed


def best_other(probabilities: Mapping[str, float]) -> tuple[str, float]:
    """The most probable option other than ``none_of_these``, and its probability."""
    name = max((n for n in probabilities if n != NONE_OF_THESE), key=probabilities.__getitem__)
    return name, probabilities[name]


def margin_for_cost(
    rows: Sequence[tuple[Mapping[str, float], str]], *, max_in_scope_cost: float = 0.01
) -> float | None:
    """The largest margin whose in-scope accuracy loss is at most ``max_in_scope_cost``.

    The loss is counted against never answering ``none_of_these`` (each in-scope row
    answered with its best other option), so the budget covers what the option costs,
    examples and margin together. Under the rule a row is ``none_of_these`` exactly when its
    best other option is below the margin, so accuracy only falls as the margin rises, and
    the largest margin within budget has the most out-of-scope recall.

    Args:
        rows: ``(probabilities without the margin, true label)``; a label of
            ``"none_of_these"`` marks an out-of-scope row (they do not move the margin).
        max_in_scope_cost: Accuracy (a fraction: 0.01 is one point) the in-scope rows may
            lose.

    Returns:
        The margin, or ``None`` when there are no in-scope rows or none is right.
    """
    inside = [(p, y) for p, y in rows if y != NONE_OF_THESE]
    if not inside:
        return None
    budget = max_in_scope_cost * len(inside)
    # The rows a margin can cost: right by their best other option; each is lost once the
    # margin passes its probability.
    flips = sorted(b for p, y in inside for name, b in [best_other(p)] if name == y)
    if not flips:
        return None
    lost = 0
    margin = None
    for value in flips:
        if lost <= budget:
            margin = value  # every row below it flips; this one does not
        lost += 1
    if lost <= budget:  # every right row may flip: any margin below 1 fits
        margin = flips[-1] + 1e-6
    if margin is None or margin <= 0.0:
        return None
    return min(float(margin), 1.0 - 1e-6)


def fit_none_below(
    engine: Any,
    states: Sequence[Any],
    labels: Sequence[str],
    question: Choice,
    *,
    max_in_scope_cost: float = 0.01,
    batch_size: int = 64,
) -> Choice:
    """``question`` with the margin :func:`margin_for_cost` picks on labelled states.

    Use held-out rows (not the examples that teach the options): in-scope rows labelled
    with their option, out-of-scope rows labelled ``"none_of_these"``.

    Raises:
        InvalidRequestError: ``question`` has no ``none_of_these``, the lengths differ, or
            a label is not an option.
    """
    if question.none_of_these in (False, None):
        raise InvalidRequestError(
            "fit_none_below needs a question with none_of_these", field="none_of_these"
        )
    bare = question.model_copy(update={"none_below": None})
    rows = labelled_answers(engine, states, labels, bare, batch_size=batch_size)
    margin = margin_for_cost(
        list(zip(rows, labels, strict=True)), max_in_scope_cost=max_in_scope_cost
    )
    return question.model_copy(update={"none_below": margin})
