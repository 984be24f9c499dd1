"""The scoring seam: what a head is, and what it may use of the engine that runs it.

The engine's pipeline renders each request's state to text, then hands the texts and the
requests to one :class:`Scorer` (the engine's head, or a backbone that scores by itself,
such as the ``decoder``), which returns calibrated probabilities per question as
:class:`Scored`. A scorer never sees the engine: it gets a :class:`ScoringContext` (the
backbone, the engine's cached ``embed`` and ``prepare`` functions, the calibrator). That
keeps heads and backbones free of :mod:`clef_engine.runtime`.

Example:
    >>> from clef_engine.heads.base import Head, Scorer
    >>> from clef_engine.heads.zero_shot import ZeroShotHead
    >>> head = ZeroShotHead()
    >>> isinstance(head, Head), isinstance(head, Scorer)
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from clef_engine.heads.memory import QuestionMemory
from clef_engine.heads.prototype import PrototypeClassifier

if TYPE_CHECKING:
    from clef_engine.backbones.base import Backbone
    from clef_engine.calibration.temperature import Calibrator
    from clef_engine.schema.answers import Answer
    from clef_engine.schema.questions import _Question
    from clef_engine.schema.request import DecisionRequest


@dataclass
class PreparedQuestion:
    """A question turned into tensors; cached by the question's content."""

    type: str
    names: list[str]
    texts: list[str]
    vectors: torch.Tensor | None = None
    """``[n, H]`` normalised option embeddings (``None`` until encoded)."""
    classifier: PrototypeClassifier | None = None
    memory: QuestionMemory | None = None
    """The examples' memory, mixed with the classifier's answers (``None``: none kept)."""
    sides: tuple[bool, bool] = (True, True)
    legend: dict[str, str] | None = None
    tokens: int = 0
    """Tokens of the question's texts, for usage accounting."""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass
class Scored:
    """What scoring one request yields, before answers are built."""

    probabilities: dict[str, torch.Tensor]
    """Per question id, probabilities over its options (``noul``: ``[P(yes), P(no)]``)."""
    prepared: dict[str, PreparedQuestion]
    windows: int
    tokens: int
    answers: dict[str, Answer] = field(default_factory=dict)
    """Answers made without the head (``box`` questions, from the vision evidence)."""


Embed = Callable[[Sequence[str]], torch.Tensor]
"""Pooled vectors ``[n, H]`` of texts (option texts, box candidates), from the engine's
cache: a text is encoded once however often it is asked for."""


@dataclass(frozen=True)
class ScoringContext:
    """What a scorer may use of the engine that runs it.

    Attributes:
        backbone: The engine's backbone (encode, count tokens).
        embed: Cached pooled vectors of texts (:data:`Embed`).
        prepare: The engine's cached :class:`PreparedQuestion` of a question (option
            vectors embedded, prototypes fitted when its options carry examples).
        calibrator: The engine's calibrator (a backbone that scores by itself uses it).
    """

    backbone: Backbone
    embed: Embed
    prepare: Callable[[_Question], PreparedQuestion]
    calibrator: Calibrator


@runtime_checkable
class Scorer(Protocol):
    """Scores whole requests: calibrated probabilities for every question of each.

    The engine's head is one; a backbone that scores by itself (the ``decoder``: a causal
    LM scoring option continuations) is another, and takes over from the head.
    """

    def score_requests(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> list[Scored]:
        """One :class:`Scored` per request, in order; ``texts`` are the rendered states."""
        ...


class RequestScorer(Protocol):
    """An engine's scoring stage (``DecisionEngine.score``): what a fine-tuned head falls
    back to for the questions it was not trained on, and what ensemble members are."""

    def score(self, texts: list[str], requests: list[DecisionRequest]) -> list[Scored]:
        """As :meth:`Scorer.score_requests`, with the engine's own context."""
        ...

    def to(self, device: str | torch.device) -> object:
        """Move it to ``device``."""
        ...


@runtime_checkable
class Head(Scorer, Protocol):
    """The engine's head: a :class:`Scorer` with the calibration it applies.

    Attributes:
        calibrator: Turns the head's raw scores into calibrated logits.
        fingerprint: Identity of trained weights under this head (adapter, head weights,
            example memory), part of the engine's model version; ``None``: none.
        prompted: Option texts carry the question's instructions (the general model).
        fine_tuned: Answers say which head gave them (``x_head``: ``trained`` when
            :meth:`knows` the question, else ``zero_shot``).
    """

    calibrator: Calibrator

    @property
    def fingerprint(self) -> str | None: ...

    @property
    def prompted(self) -> bool: ...

    @property
    def fine_tuned(self) -> bool: ...

    def knows(self, question: _Question) -> bool:
        """Whether trained weights answer ``question`` (else it is answered zero-shot)."""
        ...

    def to(self, device: str | torch.device) -> None:
        """Move the head's own weights (if any) to ``device``."""
        ...


__all__ = [
    "Embed",
    "Head",
    "PreparedQuestion",
    "RequestScorer",
    "Scored",
    "Scorer",
    "ScoringContext",
]
