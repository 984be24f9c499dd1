"""Answers and the response envelope of ``/v1/systemone``.

Wire fields are exactly the reference API's; our extras carry an ``x_`` prefix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["model", "rules", "default"]


def choice_confidence(probabilities: Sequence[float]) -> float:
    """Reference confidence of a choice: ``(p_max - 1/n) / (1 - 1/n)``, clipped to [0, 1]."""
    n = len(probabilities)
    if n < 2:
        return 1.0
    p_max = max(probabilities)
    return min(1.0, max(0.0, (p_max - 1.0 / n) / (1.0 - 1.0 / n)))


def score_confidence(probabilities: Sequence[float]) -> float:
    """Reference confidence of a score: ``max(0, 1 - D(p) / D(uniform))``.

    ``D(p) = sum_i p_i * |i - mode|`` with ``mode = argmax p``; ``D(uniform)`` is the same
    sum for the uniform distribution around the centre of the scale (as TypeSafe's docs
    and the ``jevcompat`` conformance suite define it).
    """
    n = len(probabilities)
    mode = max(range(n), key=lambda i: probabilities[i])
    spread = sum(p * abs(i - mode) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - (n - 1) / 2) / n for i in range(n))
    if uniform <= 0:
        return 1.0
    return max(0.0, min(1.0, 1.0 - spread / uniform))


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")

    x_abstained: bool | None = None
    """Whether the answer is below its saved threshold (``x_threshold``): the model's best
    guess, not a decision to act on; routers and selectors take their default route. Set
    only by an engine with saved thresholds (:mod:`clef_engine.runtime.thresholds`)."""
    x_threshold: float | None = None
    """The saved threshold this answer was held to (least top probability to decide)."""

    def top_probability(self) -> float:
        """The calibrated probability of the answer given (used for confidence gates)."""
        raise NotImplementedError


class ChoiceAnswer(_Answer):
    type: Literal["choice"] = "choice"
    """The answer's type tag; the wire format (and the official SDK) requires it."""
    choice: str
    probabilities: dict[str, float]
    confidence: float

    def top_probability(self) -> float:
        return self.probabilities[self.choice]


class NoulAnswer(_Answer):
    type: Literal["noul"] = "noul"
    noul: float = Field(ge=0.0, le=1.0)
    """P(yes)."""

    def top_probability(self) -> float:
        return max(self.noul, 1.0 - self.noul)


class ScoreAnswer(_Answer):
    type: Literal["score"] = "score"
    score: float
    legend: dict[str, str]
    probabilities: dict[str, float]
    confidence: float

    def top_probability(self) -> float:
        return max(self.probabilities.values())


class BoxCoords(BaseModel):
    """A box's edges as fractions (0-1) of the image's height and width, as on the wire.

    Example:
        >>> box = BoxCoords(top=0.5, bottom=0.625, left=0.25, right=0.5)
        >>> box.to_pixels(1280, 800)
        BoxCoords(top=400.0, bottom=500.0, left=320.0, right=640.0)
        >>> box.center(1280, 800)  # where to click
        (480.0, 450.0)
    """

    top: float
    """Top edge, as a fraction of the image height from the top."""
    bottom: float
    """Bottom edge, as a fraction of the image height from the top."""
    left: float
    """Left edge, as a fraction of the image width from the left."""
    right: float
    """Right edge, as a fraction of the image width from the left."""

    def to_pixels(self, width: float, height: float) -> BoxCoords:
        """The same box in pixels of an image ``width`` x ``height``."""
        return BoxCoords(
            top=self.top * height,
            bottom=self.bottom * height,
            left=self.left * width,
            right=self.right * width,
        )

    def center(self, width: float = 1.0, height: float = 1.0) -> tuple[float, float]:
        """``(x, y)`` of the box's centre, in pixels of a ``width`` x ``height`` image
        (in fractions without them)."""
        return (self.left + self.right) / 2 * width, (self.top + self.bottom) / 2 * height


WHOLE_IMAGE = BoxCoords(top=0.0, bottom=1.0, left=0.0, right=1.0)
"""The box that covers the whole image."""


class BoxAnswer(_Answer):
    type: Literal["box"] = "box"
    box: BoxCoords | None
    """Fractions of the image height and width; ``None`` when the image has no text."""
    confidence: float | None = None

    def top_probability(self) -> float:
        return 0.0 if self.confidence is None else self.confidence

    def to_wire(self) -> dict[str, Any]:
        """The answer as the wire schema has it: ``box`` and ``confidence`` always present.

        The schema (typesafe-sdk's ``BoxAnswer``) requires both; ``confidence`` may be null,
        ``box`` may not. So a box that was not found (``box=None``) goes out as the whole
        image with ``confidence: null`` and ``x_found: false``, and a null confidence is
        sent as ``null`` instead of being left out.
        """
        extras = self.model_dump(
            mode="json", exclude_none=True, exclude={"type", "box", "confidence"}
        )
        box = (self.box or WHOLE_IMAGE).model_dump(mode="json")
        wire = {"type": "box", "box": box, "confidence": self.confidence, **extras}
        if self.box is None:
            wire["x_found"] = False
        return wire


Answer = ChoiceAnswer | NoulAnswer | ScoreAnswer | BoxAnswer


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0


class DecisionResult(BaseModel):
    """The response envelope: ``{"model", "answers", "usage"}`` plus ``x_`` extensions."""

    model_config = ConfigDict(extra="allow")

    model: str
    answers: dict[str, Answer]
    usage: Usage = Field(default_factory=Usage)
    x_model_version: str | None = None
    """Which weights and calibration produced the answers."""
    x_source: Source = "model"
    """``model``, ``rules`` (a fallback rule answered) or ``default``. Which head of the
    model answered is per answer: a fine-tuned model tags each answer ``x_head``
    (``trained``, or ``zero_shot`` for a question its head was not trained on)."""
    x_latency_ms: float | None = None
    """Wall time spent in the engine for this request (batch time shared evenly)."""
    x_windows: int = 1
    """How many backbone windows the state was split into."""
    x_top_probability: dict[str, float] = Field(default_factory=dict)
    """Per question, the calibrated probability of the answer given."""

    def to_wire(self) -> dict[str, Any]:
        """The exact JSON object the HTTP API returns (``None`` extensions left out; a box
        answer always has ``box`` and ``confidence``, see :meth:`BoxAnswer.to_wire`)."""
        wire = self.model_dump(mode="json", exclude_none=True)
        for qid, answer in self.answers.items():
            if isinstance(answer, BoxAnswer):
                wire["answers"][qid] = answer.to_wire()
        return wire

    def __getitem__(self, question_id: str) -> Answer:
        return self.answers[question_id]


def finite_probabilities(probabilities: Mapping[str, float]) -> bool:
    """True when every probability is finite and in [0, 1] (used by resilience checks)."""
    return all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probabilities.values())
