"""An ensemble model dir's head: the mean of its members' calibrated answers.

A model dir trained with ``TrainConfig(ensemble=K)`` (:mod:`clef_engine.train.ensemble`) holds K
fine-tuned model dirs. For a question the members were trained on, every member answers it
as it would alone (its adapted backbone, head, temperature and example memory), the
probabilities are averaged. When the ensemble was trained with ``ensemble_temperature``,
its own temperature, fitted on the states that every member held out, calibrates the mean:
``softmax(log(mean) / T)``; by default T is 1 and the answer is the mean. Every other
question is answered zero-shot once, by the first member's base engine, as a single
fine-tuned model answers it.

Example:
    >>> from clef_engine import DecisionEngine
    >>> engine = DecisionEngine.from_pretrained("./out/tickets-ensemble")  # ensemble=2
    >>> len(engine.head.members)
    2
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from clef_engine.calibration.temperature import Calibrator
from clef_engine.heads.base import Head, RequestScorer, Scored, ScoringContext
from clef_engine.schema.questions import _Question

if TYPE_CHECKING:
    from clef_engine.schema.request import DecisionRequest


class Member(RequestScorer, Protocol):
    """An ensemble member: a fine-tuned engine loaded from its own model dir."""

    @property
    def model_version(self) -> str: ...

    @property
    def head(self) -> Head: ...


class EnsembleHead:
    """The engine's head when the model dir is an ensemble.

    Args:
        members: The members' engines (each loaded from its own model dir, all with the same
            trained questions).
        calibrator: The ensemble's temperatures, applied to the log of the members' mean.
    """

    needs_token_states = False
    fine_tuned: ClassVar[bool] = True
    prompted = False

    def __init__(self, members: list[Member], calibrator: Calibrator | None = None) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = members
        self.calibrator = calibrator or Calibrator(source="identity")

    @property
    def fingerprint(self) -> str:
        """Identity of the members (their model versions), part of the engine's version."""
        joined = "+".join(m.model_version for m in self.members)
        return "ensemble:" + hashlib.sha256(joined.encode()).hexdigest()[:12]

    @property
    def module(self) -> Any:
        """The first member's trained head module: which questions the members know
        (``clef-agents calibrate`` rebuilds them from it)."""
        return getattr(self.members[0].head, "module", None)

    def knows(self, question: _Question) -> bool:
        """Whether the members answer ``question`` with their trained heads."""
        return self.members[0].head.knows(question)

    def to(self, device: str | torch.device) -> None:
        """Move every member (:meth:`DecisionEngine.to` calls this)."""
        for member in self.members:
            member.to(device)

    def score_requests(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> list[Scored]:
        """The first member scores every question (untrained ones zero-shot); the others
        score only the trained ones; trained answers are averaged and recalibrated."""
        first = self.members[0].score(texts, requests)
        trained = [[q for q, v in r.questions.items() if self.knows(v)] for r in requests]
        rows = [i for i, qs in enumerate(trained) if qs]
        if not rows:
            return first
        sums = {(i, q): first[i].probabilities[q].double() for i in rows for q in trained[i]}
        subs = [
            requests[i].model_copy(
                update={"questions": {q: requests[i].questions[q] for q in trained[i]}}
            )
            for i in rows
        ]
        for member in self.members[1:]:
            scored = member.score([texts[i] for i in rows], subs)
            for i, answer in zip(rows, scored, strict=True):
                for q in trained[i]:
                    sums[(i, q)] = sums[(i, q)] + answer.probabilities[q].double()
        for (i, q), total in sums.items():
            prepared = first[i].prepared[q]
            n = len(prepared.names)
            mean = (total / len(self.members)).clamp(min=1e-300).unsqueeze(0)
            scaled = torch.softmax(self.calibrator.scale(mean.log(), prepared.type, n), dim=-1)
            first[i].probabilities[q] = self.calibrator.adjust(scaled, prepared.type, n)[0]
        return first


__all__ = ["EnsembleHead"]
