"""Zero-shot head: score options by cosine similarity to the state, then calibrate.

Each option is embedded once (and cached by text); a request's state vector meets every
option of every question in one matrix product. The calibrator turns similarities into
logits with a temperature per (question type, option-count bucket):

- ``choice`` and ``score``: ``softmax(cos / T)`` over the options (levels);
- ``noul`` with both sides described: ``softmax([cos_true, cos_false] / T)``;
- ``noul`` with one side (or instructions only): ``sigmoid((cos - b) / T)`` with a fitted
  threshold ``b``, taken as P(yes) for the ``true`` side and 1 - that for ``false``.

Options with ``examples`` switch the question to a :class:`PrototypeClassifier` fitted on
the example embeddings; it carries its own cross-validated temperature. When there are
enough examples (:data:`clef_engine.heads.memory.MIN_HELD_OUT`), the same folds also fit an
example memory (:mod:`clef_engine.heads.memory`, cross-fitted): the nearest examples of a
state vote, and the vote is mixed with the classifier's probabilities where that lowered
the examples' out-of-fold NLL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from clef_engine.calibration.temperature import Calibrator
from clef_engine.heads.base import PreparedQuestion, Scored, ScoringContext
from clef_engine.heads.memory import FLOOR
from clef_engine.schema.questions import Choice, Noul, Score, _Question

if TYPE_CHECKING:
    from clef_engine.schema.request import DecisionRequest

NOUL_ONE_SIDED = "noul/one_sided"


def option_texts(question: _Question, *, prompted: bool = False) -> list[str]:
    """The text embedded for each option of ``question`` (see module docstring).

    ``prompted`` (the general decision model, :data:`PROMPTED`): every option is read with
    the question's instructions in front of it ("How urgent is it? high"), and a yes/no
    question always has two sides, ``"<instructions> yes"`` and ``"<instructions> no"``
    unless the criteria describe a side. The model was trained on texts made this way.
    """
    specs = question.option_specs()
    if prompted:
        instructions = question.instructions_text()
        if isinstance(question, Noul):
            return [
                _join(instructions, s.description or default)
                for s, default in zip(specs, ("yes", "no"), strict=True)
            ]
        if isinstance(question, Score):
            return [_join(instructions, s.description or s.name) for s in specs]
        if isinstance(question, Choice):
            return [_join(instructions, s.text()) for s in specs]
        raise TypeError(f"no option texts for question type {type(question).__name__}")
    if isinstance(question, Noul):
        instructions = question.instructions_text()
        return [s.description or instructions or s.name for s in specs]
    if isinstance(question, Score):
        return [s.description or s.name for s in specs]
    if isinstance(question, Choice):
        return [s.text() for s in specs]
    raise TypeError(f"no option texts for question type {type(question).__name__}")


def _join(instructions: str, text: str) -> str:
    return f"{instructions} {text}" if instructions else text


def prepare(question: _Question, *, prompted: bool = False) -> PreparedQuestion:
    """Everything about a question that does not need the backbone."""
    specs = question.option_specs()
    prepared = PreparedQuestion(
        type=str(question.type),  # type: ignore[attr-defined]
        names=[s.name for s in specs],
        texts=option_texts(question, prompted=prompted),
    )
    if isinstance(question, Noul):
        # Prompted texts give a yes/no question both sides, whatever its criteria say.
        prepared.sides = (True, True) if prompted else question.sides()
    if isinstance(question, Score):
        prepared.legend = question.legend()
    return prepared


class ZeroShotHead:
    """Cosine similarity, calibrated per (type, option-count bucket).

    Args:
        calibrator: Temperatures; default: the similarity scorer's bundled ones.
        prompted: Option texts carry the question's instructions (:func:`option_texts`);
            set for the general decision model, whose backbone was trained on such texts.
        fingerprint: Identity of the adapter merged into the backbone, if any.
    """

    needs_token_states = False
    fine_tuned: ClassVar[bool] = False

    def __init__(
        self,
        calibrator: Calibrator | None = None,
        *,
        prompted: bool = False,
        fingerprint: str | None = None,
    ) -> None:
        self.calibrator = calibrator or Calibrator.bundled()
        self.prompted = prompted
        self.fingerprint = fingerprint
        """Identity of adapted weights under this head (part of the model version)."""

    def knows(self, question: _Question) -> bool:
        """No trained weights: every question is answered zero-shot."""
        return False

    def to(self, device: str | torch.device) -> None:
        """Nothing to move: the head has no weights of its own."""

    def score_requests(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> list[Scored]:
        """Encode each state once, then score every option of every question of a request
        in one product with its state vector (:meth:`logits` calibrates)."""
        encoded = context.backbone.encode(texts, return_tokens=self.needs_token_states)
        out = []
        for i, request in enumerate(requests):
            qids = list(request.questions)
            prepared = {q: context.prepare(request.questions[q]) for q in qids}
            state = encoded.pooled[i].float().unsqueeze(0)
            # Every option of every question in one product with the state.
            matrix = torch.cat([prepared[q].vectors for q in qids])  # type: ignore[misc]
            sims = (state.to(matrix.dtype) @ matrix.T).float()
            probabilities = {}
            offset = 0
            for qid in qids:
                n = len(prepared[qid].names)
                logits = self.logits(prepared[qid], sims[:, offset : offset + n], state)
                offset += n
                probabilities[qid] = torch.softmax(logits.double(), dim=-1)[0]
            tokens = encoded.tokens[i] + sum(p.tokens for p in prepared.values())
            out.append(Scored(probabilities, prepared, encoded.windows[i], tokens))
        return out

    def logits(
        self, prepared: PreparedQuestion, similarity: torch.Tensor, state: torch.Tensor
    ) -> torch.Tensor:
        """Calibrated logits ``[B, n]`` from raw similarities ``[B, n]``.

        For ``noul`` the two columns are (yes, no).
        """
        if prepared.classifier is not None:
            logits = prepared.classifier.logits(state)
            if prepared.memory is None:
                return logits
            probabilities = torch.softmax(logits.double(), dim=-1)
            mixed = prepared.memory.mix(probabilities, state, prepared.names)
            return mixed.clamp(min=FLOOR).log()  # softmax gives the mixture back
        cal = self.calibrator
        n = len(prepared.names)
        if prepared.type != "noul":
            return cal.scale(similarity, prepared.type, n)
        has_true, has_false = prepared.sides
        if has_true and has_false:
            return cal.scale(similarity, "noul", 2)
        t = cal.temperature(NOUL_ONE_SIDED, 2)
        b = cal.bias(NOUL_ONE_SIDED)
        zeros = torch.zeros_like(similarity[:, :1])
        if has_false and not has_true:
            return torch.cat([zeros, (similarity[:, 1:2] - b) / t], dim=1)
        return torch.cat([(similarity[:, :1] - b) / t, zeros], dim=1)
