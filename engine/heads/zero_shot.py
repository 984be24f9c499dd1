"""Zero-shot head: score options by cosine similarity to the state, then calibrate.

Each option is embedded once (and cached by text); a request's state vector meets every
option of every question in one matrix product. The calibrator turns similarities into
logits with a temperature per (question type, option-count bucket):

- ``choice`` and ``score``: ``softmax(cos / T)`` over the options (levels);
- ``noul`` with both sides described: ``softmax([cos_true, cos_false] / T)``;
- ``noul`` with one side (or instructions only): ``sigmoid((cos - b) / T)`` with a fitted
  threshold ``b``, taken as P(yes) for the ``true`` side and 1 - that for ``false``.

A question-aware model (the general model, :data:`clef_engine.runtime.general.QUESTION_AWARE`)
reads each yes/no question's state with the question in front of it
(``[CLS] question [SEP] state [SEP]``), so the encoder sees both at once; its other
questions share the state's own vector.

Options with ``examples`` switch the question to a :class:`PrototypeClassifier` fitted on
the example embeddings; it carries its own cross-validated temperature. When there are
enough examples (:data:`clef_engine.heads.memory.MIN_HELD_OUT`), the same folds also fit an
example memory (:mod:`clef_engine.heads.memory`, cross-fitted): the nearest examples of a
state vote, and the vote is mixed with the classifier's probabilities where that lowered
the examples' out-of-fold NLL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from clef_engine.backbones.base import Encoded
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


def question_prefix(question: _Question) -> str | None:
    """What a question-aware model (:data:`clef_engine.runtime.general.QUESTION_AWARE`)
    reads in front of the state for ``question``: a yes/no question's instructions.

    ``None`` for other questions and for a yes/no question without instructions: they
    read the state alone, one encoding shared by all of a request's questions.
    """
    if not isinstance(question, Noul):
        return None
    return question.instructions_text() or None


def question_state(question: _Question, text: str) -> str | None:
    """``"<instructions> [SEP] <state>"``: the text a question-aware model was trained on
    (the tokens of :func:`encode_with_questions`' first window), or ``None``
    (:func:`question_prefix`)."""
    prefix = question_prefix(question)
    return None if prefix is None else f"{prefix} [SEP] {text}"


def encode_with_questions(backbone: Any, questions: list[str], texts: list[str]) -> Encoded:
    """Each state read with its question in front of every window (an encoder's
    ``encode_pairs``; other backbones read ``"<question> [SEP] <state>"``)."""
    pairs = getattr(backbone, "encode_pairs", None)
    if pairs is not None:
        return pairs(questions, texts)  # type: ignore[no-any-return]
    return backbone.encode([f"{q} [SEP] {t}" for q, t in zip(questions, texts, strict=True)])  # type: ignore[no-any-return]


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


@dataclass
class QuestionState:
    """A state read with one question in front (:meth:`ZeroShotHead.question_states`)."""

    vector: torch.Tensor
    """``[1, H]`` pooled vector."""
    tokens: int
    windows: int


class ZeroShotHead:
    """Cosine similarity, calibrated per (type, option-count bucket).

    Args:
        calibrator: Temperatures; default: the similarity scorer's bundled ones.
        prompted: Option texts carry the question's instructions (:func:`option_texts`);
            set for the general decision model, whose backbone was trained on such texts.
        fingerprint: Identity of the adapter merged into the backbone, if any.
        question_aware: Yes/no questions read the state with the question in front
            (:func:`question_state`); set for a general model trained that way.
    """

    needs_token_states = False
    fine_tuned: ClassVar[bool] = False

    def __init__(
        self,
        calibrator: Calibrator | None = None,
        *,
        prompted: bool = False,
        fingerprint: str | None = None,
        question_aware: bool = False,
    ) -> None:
        self.calibrator = calibrator or Calibrator.bundled()
        self.prompted = prompted
        self.question_aware = question_aware
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
        in one product with its state vector (:meth:`logits` calibrates). A question-aware
        model also reads each yes/no question with its state (one more encoding each)."""
        aware = self.question_states(context, texts, requests)
        # A request whose questions all read the state with their question skips the
        # state's own encoding (a single yes/no decision costs one forward, as before).
        shared = [
            i for i, r in enumerate(requests) if any((i, q) not in aware for q in r.questions)
        ]
        encoded = (
            context.backbone.encode(
                [texts[i] for i in shared], return_tokens=self.needs_token_states
            )
            if shared
            else None
        )
        row = {i: j for j, i in enumerate(shared)}
        out = []
        for i, request in enumerate(requests):
            qids = list(request.questions)
            prepared = {q: context.prepare(request.questions[q]) for q in qids}
            probabilities = {}
            if i in row:
                assert encoded is not None
                state = encoded.pooled[row[i]].float().unsqueeze(0)
                tokens, windows = encoded.tokens[row[i]], encoded.windows[row[i]]
                # Every option of every question in one product with the state.
                matrix = torch.cat([prepared[q].vectors for q in qids])  # type: ignore[misc]
                sims = (state.to(matrix.dtype) @ matrix.T).float()
            else:
                tokens, windows = 0, max(aware[(i, q)].windows for q in qids)
            offset = 0
            for qid in qids:
                n = len(prepared[qid].names)
                own = aware.get((i, qid))
                if own is None:
                    logits = self.logits(prepared[qid], sims[:, offset : offset + n], state)
                else:
                    vectors = prepared[qid].vectors
                    assert vectors is not None
                    sim = (own.vector.to(vectors.dtype) @ vectors.T).float()
                    logits = self.logits(prepared[qid], sim, own.vector)
                    tokens += own.tokens
                offset += n
                probabilities[qid] = torch.softmax(logits.double(), dim=-1)[0]
            tokens += sum(p.tokens for p in prepared.values())
            out.append(Scored(probabilities, prepared, windows, tokens))
        return out

    def question_states(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> dict[tuple[int, str], QuestionState]:
        """``{(request index, question id): state read with that question}`` for the
        questions a question-aware model reads so (:func:`question_prefix`), all in one
        batch; empty unless :attr:`question_aware`."""
        if not self.question_aware:
            return {}
        keys: list[tuple[int, str]] = []
        prefixes: list[str] = []
        for i, request in enumerate(requests):
            for qid, question in request.questions.items():
                prefix = question_prefix(question)
                if prefix is not None:
                    keys.append((i, qid))
                    prefixes.append(prefix)
        if not keys:
            return {}
        encoded = encode_with_questions(context.backbone, prefixes, [texts[i] for i, _ in keys])
        return {
            key: QuestionState(
                encoded.pooled[j].float().unsqueeze(0), encoded.tokens[j], encoded.windows[j]
            )
            for j, key in enumerate(keys)
        }

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
