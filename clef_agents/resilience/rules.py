"""Rule-based fallback: ordered rules and a default option that answer without the model.

Example:
    >>> fb = RuleFallback([Rule.keywords(["refund"], "billing", 0.9)], default="human")
    >>> fb.rules[0].option
    'billing'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clef_engine.errors import ClefError, InvalidRequestError
from clef_engine.schema.answers import (
    Answer,
    BoxAnswer,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
    Source,
    choice_confidence,
    score_confidence,
)
from clef_engine.schema.questions import Box, Choice, Noul, Score, _Question
from clef_engine.schema.render import render_value
from clef_engine.schema.request import DecisionRequest


@dataclass(frozen=True)
class Rule:
    """One fallback rule: when it matches the state, ``option`` gets ``probability``.

    Build rules with :meth:`keywords`, :meth:`regex` or :meth:`when`. ``question``
    limits a rule to one question id; otherwise it applies to every question that has
    ``option`` (``"true"``/``"false"`` for ``noul``, a level index for ``score``).
    ``probability`` must be in [0.5, 1] (:data:`MIN_PROBABILITY`), so the option a rule
    names is the answer it gives.

    Example:
        >>> Rule.regex(r"error \\d+", "technical", 0.8).matches("got error 500", "got error 500")
        True
    """

    option: str
    probability: float = 0.8
    words: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    predicate: Callable[[Any], bool] | None = None
    question: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "probability", check_probability(self.probability, "probability"))

    @classmethod
    def keywords(
        cls, words: Sequence[str], option: str, probability: float = 0.8, **kwargs: Any
    ) -> Rule:
        """Match when any of ``words`` occurs in the rendered state (case-insensitive)."""
        return cls(option, probability, words=tuple(w.lower() for w in words), **kwargs)

    @classmethod
    def regex(
        cls, pattern: str, option: str, probability: float = 0.8, flags: int = re.I, **kwargs: Any
    ) -> Rule:
        """Match when ``pattern`` is found in the rendered state."""
        return cls(option, probability, pattern=re.compile(pattern, flags), **kwargs)

    @classmethod
    def when(
        cls, predicate: Callable[[Any], bool], option: str, probability: float = 0.8, **kwargs: Any
    ) -> Rule:
        """Match when ``predicate(state)`` is true (``state`` as given, not rendered)."""
        return cls(option, probability, predicate=predicate, **kwargs)

    def matches(self, state: Any, text: str) -> bool:
        """Whether the rule fires for ``state`` (``text`` is its rendering)."""
        if self.words:
            lowered = text.lower()
            if any(_has_word(lowered, w) for w in self.words):
                return True
        if self.pattern is not None and self.pattern.search(text):
            return True
        if self.predicate is not None:
            try:
                return bool(self.predicate(state))
            except Exception:  # a broken predicate must not break the safety net
                return False
        return False


MIN_PROBABILITY = 0.5
"""The lowest probability a rule or the default option may give its option.

The rest is spread evenly over the other options, so among ``n`` options the named one
is the most probable only from ``1/n`` up. One ``RuleFallback`` answers every question
it meets, two-option choices and ``noul`` (where ``default="true"`` with 0.3 would say
"no") included, so the bound that holds for all of them is 1/2. At exactly 0.5 between
two options the named option wins the tie."""


def check_probability(value: Any, name: str) -> float:
    """``value`` as a float in [:data:`MIN_PROBABILITY`, 1], or an error naming ``name``.

    Raises:
        InvalidRequestError: ``value`` is not a number, is NaN or infinite, or is out of
            range; ``field`` is ``name`` and ``limit`` the range.
    """
    number = math.nan
    if not isinstance(value, (bool, str, bytes)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if not MIN_PROBABILITY <= number <= 1.0:  # False for NaN too
        raise InvalidRequestError(
            f"{name} must be a number in [{MIN_PROBABILITY}, 1] so the option it names is "
            f"the most probable answer; got {value!r}",
            field=name,
            limit=(MIN_PROBABILITY, 1.0),
        )
    return number


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def _spread(names: list[str], chosen: str, p: float) -> dict[str, float]:
    if len(names) == 1:
        return {chosen: 1.0}
    rest = (1.0 - p) / (len(names) - 1)
    return {n: (p if n == chosen else rest) for n in names}


class RuleFallback:
    """Ordered rules plus a default option: the answer when the model cannot give one.

    The first matching rule answers a question; with none, ``default`` answers (when the
    question has that option; otherwise the distribution is uniform). A result is tagged
    ``x_source="rules"`` when any rule answered and ``"default"`` otherwise; each answer
    carries its own ``x_source`` too.

    Args:
        rules: Checked in order.
        default: The option chosen when no rule matches (e.g. ``"human_review"``).
        default_probability: Probability given to ``default``; the rest is spread evenly.
            In [0.5, 1] (:data:`MIN_PROBABILITY`), so ``default`` is the answer wherever
            it is an option; anything else raises ``InvalidRequestError``.

    Example:
        >>> fb = RuleFallback([Rule.keywords(["refund"], "billing", 0.9)], default="human")
        >>> req = DecisionRequest(state="where is my refund", questions={"q": Choice(
        ...     instructions="Route", criteria=["billing", "human"])})
        >>> fb.answer(req, reason="error")["q"].probabilities
        {'billing': 0.9, 'human': 0.09999999999999998}
    """

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        *,
        default: str | None = None,
        default_probability: float = 0.5,
    ) -> None:
        self.rules = list(rules)
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, Rule):
                raise InvalidRequestError(
                    f"rules[{i}] is a {type(rule).__name__}, not a Rule", field=f"rules.{i}"
                )
        if default is not None and not isinstance(default, str):
            raise InvalidRequestError(
                f"default must be an option name (a string) or None; got {default!r}",
                field="default",
            )
        self.default = default
        self.default_probability = check_probability(default_probability, "default_probability")

    def _rule_for(self, qid: str, names: Sequence[str], state: Any, text: str) -> Rule | None:
        for rule in self.rules:
            if rule.question not in (None, qid) or rule.option not in names:
                continue
            if rule.matches(state, text):
                return rule
        return None

    def answer_question(
        self, qid: str, question: _Question, state: Any, text: str
    ) -> tuple[Answer, Source]:
        """The fallback answer to one question, and whether a rule or the default gave it."""
        if isinstance(question, Box):
            return BoxAnswer(box=None, confidence=None), "default"
        if isinstance(question, Noul):
            rule = self._rule_for(qid, ("true", "false"), state, text)
            if rule is not None:
                p = rule.probability if rule.option == "true" else 1.0 - rule.probability
                return NoulAnswer(noul=p), "rules"
            if self.default in ("true", "false"):
                p = self.default_probability
                return NoulAnswer(noul=p if self.default == "true" else 1.0 - p), "default"
            return NoulAnswer(noul=0.5), "default"
        names = [s.name for s in question.option_specs()]
        rule = self._rule_for(qid, names, state, text)
        source: Source = "rules"
        if rule is not None:
            chosen = rule.option
            probabilities = _spread(names, chosen, rule.probability)
        elif self.default in names:
            chosen, source = str(self.default), "default"
            probabilities = _spread(names, chosen, self.default_probability)
        else:
            chosen, source = names[0], "default"
            probabilities = dict.fromkeys(names, 1.0 / len(names))
        values = list(probabilities.values())
        if isinstance(question, Score):
            return ScoreAnswer(
                score=sum(i * p for i, p in enumerate(values)),
                legend=question.legend(),
                probabilities=probabilities,
                confidence=score_confidence(values),
            ), source
        assert isinstance(question, Choice)
        # The stated option wins ties (a default of 0.5 between two options).
        best = max(names, key=lambda n: (probabilities[n], n == chosen))
        return ChoiceAnswer(
            choice=best, probabilities=probabilities, confidence=choice_confidence(values)
        ), source

    def answer(
        self,
        request: DecisionRequest,
        *,
        reason: str,
        model_version: str | None = None,
        keep: Mapping[str, Answer] | None = None,
    ) -> DecisionResult:
        """A whole result from the rules; ``keep`` holds model answers to leave in place."""
        text = _safe_text(request.state)
        answers: dict[str, Answer] = {}
        sources: set[str] = set()
        for qid, question in request.questions.items():
            if keep and qid in keep:
                answer = keep[qid]
                source: Source = "model"
            else:
                answer, source = self.answer_question(qid, question, request.state, text)
                sources.add(source)
            setattr(answer, "x_source", source)  # noqa: B010 - answers allow x_ extras
            answers[qid] = answer
        overall: Source = "rules" if "rules" in sources else "default"
        result = DecisionResult(
            model=request.model,
            answers=answers,
            x_model_version=model_version,
            x_source=overall,
            x_top_probability={q: a.top_probability() for q, a in answers.items()},
        )
        result.x_fallback_reason = reason  # type: ignore[attr-defined]  # extra="allow"
        return result


def _safe_text(state: Any) -> str:
    try:
        return render_value(state, "state")
    except ClefError:
        return str(state)
