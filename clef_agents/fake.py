"""A deterministic stand-in for :class:`engine.DecisionEngine`, for tests and demos.

``FakeEngine`` speaks the engine's surface (``decide``, ``adecide``, ``decide_batch``,
``adecide_batch``, ``model_version``) and returns real :class:`DecisionResult` objects, but
never loads a model and never imports torch: it scores options by word overlap between the
state and each option's name, description and examples. Use it to test graphs, routers
and fallbacks without the model, or pin answers with ``fixed``.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> fake = FakeEngine()
    >>> result = fake.decide("please refund my invoice",
    ...                      {"route": {"type": "choice", "instructions": "Route",
    ...                                 "criteria": {"billing": "refund invoice payment",
    ...                                              "technical": "bug error crash"}}})
    >>> result["route"].choice
    'billing'
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from clef_engine.errors import ClefError, InvalidRequestError, UnsupportedQuestionError
from clef_engine.runtime.thresholds import Thresholds, finish
from clef_engine.schema.answers import (
    Answer,
    BoxAnswer,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
    Usage,
    choice_confidence,
    score_confidence,
)
from clef_engine.schema.questions import Box, Noul, Score, _Question
from clef_engine.schema.render import render_value
from clef_engine.schema.request import DEFAULT_MODEL, DecisionRequest, build_request
from clef_engine.slots import Slots

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower().replace("_", " ")))


def _softmax(scores: Sequence[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


class FakeEngine:
    """A deterministic, model-free engine with the :class:`DecisionEngine` surface.

    Args:
        fixed: Pinned answers by question id: an option name for ``choice``, a level
            index for ``score``, P(yes) for ``noul``. The pinned option gets
            ``fixed_probability``; the rest share what is left.
        fixed_probability: Probability given to a pinned ``choice``/``score`` option.
        sharpness: How strongly word overlap moves probability (the softmax scale).
        model_name: Reported as ``model`` in results.
        version: Reported as ``x_model_version``.

    Example:
        >>> fake = FakeEngine(fixed={"route": "human"}, fixed_probability=0.4)
        >>> fake.decide("anything", {"route": {"type": "choice", "instructions": "r",
        ...     "criteria": ["bot", "human"]}})["route"].probabilities["human"]
        0.4
    """

    def __init__(
        self,
        *,
        fixed: Mapping[str, str | int | float] | None = None,
        fixed_probability: float = 0.9,
        sharpness: float = 2.0,
        model_name: str = "clef-fake",
        version: str = "fake@0",
    ) -> None:
        self.fixed = dict(fixed or {})
        self.fixed_probability = float(fixed_probability)
        self.sharpness = float(sharpness)
        self.model_name = model_name
        self.model_version = version
        self.calls = 0
        """How many requests this engine has answered (batches count every item)."""
        self.thresholds: Thresholds | None = None
        """Saved thresholds, as on a ``DecisionEngine`` (answers get ``x_abstained``)."""

    # -- requests ----------------------------------------------------------------------

    def _as_request(self, item: Any, questions: Any) -> DecisionRequest:
        return build_request(item, questions, self.model_name)

    # -- scoring -----------------------------------------------------------------------

    def _jitter(self, state: str, option: str) -> float:
        # A small, deterministic tie-breaker so equal overlaps do not always pick option 0.
        digest = hashlib.sha256(f"{state}\x00{option}".encode()).digest()
        return digest[0] / 255.0 * 0.1

    def _scores(self, state: str, question: _Question) -> tuple[list[str], list[float]]:
        words = _words(state)
        names, scores = [], []
        for spec in question.option_specs():
            option_words = _words(spec.text())
            for example in spec.examples:
                option_words |= _words(example)
            overlap = len(words & option_words)
            names.append(spec.name)
            scores.append(self.sharpness * overlap + self._jitter(state, spec.name))
        return names, scores

    def _pinned(self, names: list[str], pinned: str) -> list[float]:
        if pinned not in names:
            raise InvalidRequestError(
                f"FakeEngine.fixed names option {pinned!r}, which is not one of {names}",
                field="fixed",
            )
        rest = (1.0 - self.fixed_probability) / (len(names) - 1)
        return [self.fixed_probability if n == pinned else rest for n in names]

    def _answer(self, qid: str, state: str, question: _Question) -> Answer:
        if isinstance(question, Box):
            return BoxAnswer(box=None, confidence=None)
        if isinstance(question, Noul):
            if qid in self.fixed:
                return NoulAnswer(noul=float(self.fixed[qid]))
            names, scores = self._scores(state, question)
            has_true, has_false = question.sides()
            yes = scores[0] if has_true else 0.0
            no = scores[1] if has_false else 0.0
            return NoulAnswer(noul=_softmax([yes, no])[0])
        names, scores = self._scores(state, question)
        if qid in self.fixed:
            probs = self._pinned(names, str(self.fixed[qid]))
        else:
            # A choice's own temperature, as the engine applies it (p^(1/T) of a softmax
            # is the softmax of the scores over T).
            temperature = getattr(question, "temperature", None) or 1.0
            probs = _softmax([s / temperature for s in scores])
        probabilities = dict(zip(names, probs, strict=True))
        if isinstance(question, Score):
            return ScoreAnswer(
                score=sum(i * p for i, p in enumerate(probs)),
                legend=question.legend(),
                probabilities=probabilities,
                confidence=score_confidence(probs),
            )
        best = max(range(len(probs)), key=lambda i: probs[i])
        return ChoiceAnswer(
            choice=names[best], probabilities=probabilities, confidence=choice_confidence(probs)
        )

    def _run(self, request: DecisionRequest) -> DecisionResult:
        if request.assets:
            raise UnsupportedQuestionError("FakeEngine does not read images", field="assets")
        state = render_value(request.state, "state")
        if not state.strip():
            raise InvalidRequestError("state renders to empty text", field="state")
        answers = {qid: self._answer(qid, state, q) for qid, q in request.questions.items()}
        self.calls += 1
        result = DecisionResult(
            model=request.model if request.model != DEFAULT_MODEL else self.model_name,
            answers=answers,
            usage=Usage(input_tokens=len(state.split()), output_tokens=0),
            x_model_version=self.model_version,
            x_source="model",
            x_latency_ms=0.0,
            x_top_probability={q: a.top_probability() for q, a in answers.items()},
        )
        finish(self, [request], [result])  # none_of_these margins, saved thresholds
        return result

    # -- public API (the DecisionEngine surface) ---------------------------------------

    def decide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        """Answer ``questions`` about ``state`` (see :meth:`DecisionEngine.decide`)."""
        request = self._as_request(state, questions)
        if assets:
            request = request.model_copy(update={"assets": assets})
        return self._run(request)

    def decide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        """Answer many requests in order; errors in their slots with ``return_exceptions``."""
        answered = Slots.parse(
            states,
            lambda item: self._run(self._as_request(item, questions)),
            catch=ClefError,
            raise_errors=not return_exceptions,
        )
        return answered.fill(answered.pending)

    async def adecide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        """Async :meth:`decide` (yields to the event loop once)."""
        await asyncio.sleep(0)
        return self.decide(state, questions, assets=assets)

    async def adecide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        """Async :meth:`decide_batch`."""
        await asyncio.sleep(0)
        return self.decide_batch(states, questions, return_exceptions=return_exceptions)
