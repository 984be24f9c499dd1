"""The confidence gate every adapter shares: when to follow a decision, when to fall back.

Routers, graph edges, workflow steps, selectors and :class:`ResilientEngine` all ask the
same two questions of a calibrated answer: which threshold applies, and does the answer
reach it. They ask this module, so the rules are the same everywhere:

- an explicit ``min_confidence`` is used as given, ``0.0`` included (``0.0`` never falls
  back);
- ``None`` means "not given": the threshold saved with the model (a
  :data:`ThresholdSource`, usually the engine's fitted per-question thresholds) when there
  is one, else ``0.0``;
- a probability equal to the threshold passes (``p >= threshold``);
- a chosen option without a route goes to the default, whatever its probability;
- a threshold outside ``[0, 1]`` (or not a finite number) is an
  :class:`~clef_engine.errors.InvalidRequestError` naming the field.

Example:
    >>> gate = ConfidenceGate(0.6)
    >>> gate.passes(0.6, "route"), gate.passes(0.59, "route")
    (True, False)
    >>> ConfidenceGate(None, saved=lambda qid, question: 0.8).threshold("route")
    0.8
    >>> ConfidenceGate(0.0, saved=lambda qid, question: 0.8).threshold("route")
    0.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from clef_engine.errors import ClefError, InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.answers import ChoiceAnswer

ThresholdSource = Callable[[str, Any], "float | None"]
"""``(question_id, question) -> threshold or None``: a threshold saved with the model
(``None`` where none was fitted for that question)."""

DEFAULT_THRESHOLD = 0.0
"""The threshold when none is given and none is saved: every answer passes."""


def check_threshold(value: Any, field: str = "min_confidence") -> float | None:
    """``value`` as a float in ``[0, 1]``, or ``None`` (not given).

    Raises:
        InvalidRequestError: ``value`` is not a finite number in ``[0, 1]``; the error
            names ``field``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidRequestError(
            f"must be a number in [0, 1] or None; got {type(value).__name__}", field=field
        )
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise InvalidRequestError(
            f"must be a probability in [0, 1]; got {value!r}", field=field, limit=[0, 1]
        )
    return number


def engine_thresholds(engine: Engine | None) -> ThresholdSource | None:
    """Where ``engine``'s saved thresholds are looked up (``None`` without an engine).

    The thresholds are the ones ``clef-agents thresholds`` / ``fit_thresholds`` fitted and
    the model dir loaded (``engine.thresholds``, a
    :class:`~clef_engine.runtime.thresholds.Thresholds`; ``ResilientEngine`` forwards its
    wrapped engine's). They are read at decision time, so thresholds attached after the
    adapter was built are used too; an engine without them gives ``None`` (no saved
    threshold), as does a question the thresholds do not cover.
    """
    if engine is None:
        return None

    def lookup(question_id: str, question: Any) -> float | None:
        saved = getattr(engine, "thresholds", None)
        if saved is None or question is None:
            return None
        return saved.threshold_for(question)  # type: ignore[no-any-return]

    return lookup


class LowConfidenceError(ClefError):
    """No choice reached the threshold and there is no default to fall back to.

    Attributes:
        probabilities: Each choice's calibrated probability, in the choices' order.
        threshold: The threshold that was not met.
    """

    error_type = "low_confidence"

    def __init__(
        self,
        probabilities: Sequence[float],
        threshold: float,
        remedy: str = "give a default to fall back to",
    ) -> None:
        self.probabilities = list(probabilities)
        self.threshold = threshold
        best = max(self.probabilities) if self.probabilities else 0.0
        super().__init__(
            f"no choice reached min_confidence={threshold} (best: {best:.3f}); {remedy}"
        )


@dataclass(frozen=True)
class Pick:
    """What the gate made of one ``choice`` answer.

    Attributes:
        route: The option to follow, or ``None`` for the default.
        choice: The option the engine chose.
        probability: Its calibrated probability.
        threshold: The threshold it was held to.
        reason: ``"confident"``, ``"low_confidence"`` or ``"no_route"``.
    """

    route: str | None
    choice: str
    probability: float
    threshold: float
    reason: str


class ConfidenceGate:
    """A threshold on calibrated probabilities, given or saved with the model.

    Args:
        min_confidence: The threshold; ``None`` asks ``saved``, then uses ``0.0``.
        saved: Where saved thresholds come from (see :func:`engine_thresholds`).
        field: The parameter's name in errors (``min_confidence``, ``threshold``).
    """

    def __init__(
        self,
        min_confidence: Any = None,
        *,
        saved: ThresholdSource | None = None,
        field: str = "min_confidence",
    ) -> None:
        self.field = field
        self.min_confidence = check_threshold(min_confidence, field)
        self.saved = saved

    def __repr__(self) -> str:
        return f"ConfidenceGate({self.field}={self.min_confidence!r})"

    def threshold(self, question_id: str, question: Any = None) -> float:
        """The threshold for one question: given, else saved, else ``0.0``."""
        if self.min_confidence is not None:
            return self.min_confidence
        if self.saved is not None:
            saved = check_threshold(self.saved(question_id, question), f"saved {self.field}")
            if saved is not None:
                return saved
        return DEFAULT_THRESHOLD

    def passes(self, probability: float, question_id: str, question: Any = None) -> bool:
        """Whether ``probability`` reaches the threshold (equal passes)."""
        return probability >= self.threshold(question_id, question)

    def pick(
        self,
        answer: ChoiceAnswer,
        routes: Collection[str],
        question_id: str,
        question: Any = None,
    ) -> Pick:
        """Follow ``answer.choice`` if it has a route and is confident; else the default."""
        probability = answer.top_probability()
        threshold = self.threshold(question_id, question)
        if answer.choice not in routes:
            return Pick(None, answer.choice, probability, threshold, "no_route")
        if probability < threshold:
            return Pick(None, answer.choice, probability, threshold, "low_confidence")
        return Pick(answer.choice, answer.choice, probability, threshold, "confident")

    def select_all(
        self, probabilities: Mapping[str, float], question_id: str, question: Any = None
    ) -> list[str]:
        """Every option that reaches the threshold, most probable first (ties keep order)."""
        threshold = self.threshold(question_id, question)
        ranked = sorted(probabilities, key=lambda name: -probabilities[name])
        return [name for name in ranked if probabilities[name] >= threshold]

    def needs_default(
        self, options: Collection[str], routes: Collection[str], question_id: str, question: Any
    ) -> bool:
        """Whether some decision could go to the default: an unrouted option, or a
        threshold above 0 (given or saved)."""
        if set(options) - set(routes):
            return True
        return self.threshold(question_id, question) > 0.0
