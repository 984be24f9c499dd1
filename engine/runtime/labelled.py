"""A question's answers on labelled states: what fitting a question's own setting reads.

:func:`~clef_engine.runtime.none_of_these.fit_none_below` (a margin) and
:func:`~clef_engine.calibration.fit.fit_choice_temperature` (a temperature) both ask one
question of labelled states, in batches, and fit on the answers' probabilities; the
checks on the labels and the batching are here once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.questions import Choice


def labelled_answers(
    engine: Any,
    states: Sequence[Any],
    labels: Sequence[str],
    question: Choice,
    *,
    batch_size: int = 64,
) -> list[Mapping[str, float]]:
    """The probabilities of ``question``'s answer on each state (``engine.decide_batch``,
    ``batch_size`` states a call).

    Raises:
        InvalidRequestError: The lengths differ, or a label is not an option.
    """
    if len(states) != len(labels):
        raise InvalidRequestError(f"{len(states)} states but {len(labels)} labels", field="labels")
    names = {s.name for s in question.option_specs()}
    unknown = sorted(set(labels) - names)
    if unknown:
        raise InvalidRequestError(
            f"labels {unknown[:3]} are not options of the question", field="labels"
        )
    rows: list[Mapping[str, float]] = []
    for start in range(0, len(states), max(1, batch_size)):
        chunk = list(states[start : start + batch_size])
        for result in engine.decide_batch(chunk, {"q": question}):
            rows.append(result.answers["q"].probabilities)
    return rows
