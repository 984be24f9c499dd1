"""LlamaIndex selectors that pick tools by calibrated probability instead of an LLM call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.base_selector import BaseSelector, MultiSelection, SingleSelection
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import QueryBundle
from llama_index.core.tools.types import ToolMetadata

from clef_agents._gate import ConfidenceGate, LowConfidenceError, engine_thresholds
from clef_agents._shared import default_engine
from clef_engine.protocol import Engine
from clef_engine.schema.answers import ChoiceAnswer, DecisionResult
from clef_engine.schema.questions import Choice

__all__ = [
    "ClefMultiSelector",
    "ClefSelection",
    "ClefSelector",
    "ClefSelectorResult",
    "LowConfidenceError",  # raised without default_index; shared with the other adapters
    "query_state",
]


class ClefSelection(SingleSelection):
    """A selection with its calibrated probability as a number."""

    probability: float


class ClefSelectorResult(MultiSelection):
    """LlamaIndex's ``SelectorResult`` plus every choice's probability and the decision."""

    probabilities: list[float]
    """Calibrated probability of each choice, in the choices' order."""
    below_threshold: bool = False
    """True when the default index was selected because no choice was confident enough."""
    source: str = "model"
    model_version: str | None = None


def _names(choices: Sequence[ToolMetadata]) -> list[str]:
    names: list[str] = []
    for i, choice in enumerate(choices):
        base = (choice.name or f"choice_{i}").strip() or f"choice_{i}"
        name = base
        while name in names:
            name = f"{base}_{i}"
        names.append(name)
    return names


class _ClefSelectorBase(BaseSelector):
    def __init__(
        self,
        engine: Engine | None = None,
        *,
        instructions: str = "Which tool is best for answering the query?",
        min_confidence: float | None = None,
        default_index: int | None = None,
        threshold_field: str = "min_confidence",
    ) -> None:
        self._engine = engine
        self.instructions = instructions
        self._gate = ConfidenceGate(min_confidence, field=threshold_field)
        self.default_index = default_index

    @property
    def min_confidence(self) -> float | None:
        """The threshold given (``None``: the engine's saved one, else 0)."""
        return self._gate.min_confidence

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = default_engine()
        if self._gate.saved is None:
            self._gate.saved = engine_thresholds(self._engine)
        return self._engine

    # The prompt-mixin surface: a selector without an LLM has no prompts to expose.
    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    def _question(self, choices: Sequence[ToolMetadata]) -> tuple[list[str], dict[str, Any]]:
        names = _names(choices)
        criteria = {n: (c.description or None) for n, c in zip(names, choices, strict=True)}
        return names, {"route": Choice(instructions=self.instructions, criteria=criteria)}

    def _probabilities(self, names: list[str], result: DecisionResult) -> list[float]:
        answer = result.answers["route"]
        assert isinstance(answer, ChoiceAnswer)
        return [float(answer.probabilities[n]) for n in names]

    def _picked(
        self, names: list[str], probabilities: list[float], question: Choice
    ) -> list[int]:  # pragma: no cover
        raise NotImplementedError

    def _result(
        self, names: list[str], questions: dict[str, Any], result: DecisionResult
    ) -> ClefSelectorResult:
        probabilities = self._probabilities(names, result)
        picked = self._picked(names, probabilities, questions["route"])
        below = not picked
        if below:
            if self.default_index is None:
                raise LowConfidenceError(
                    probabilities,
                    self._gate.threshold("route", questions["route"]),
                    "pass default_index= to fall back to a fixed choice",
                )
            picked = [self.default_index]
        summary = json.dumps({n: round(p, 4) for n, p in zip(names, probabilities, strict=True)})
        selections: list[SingleSelection] = [
            ClefSelection(
                index=i,
                probability=probabilities[i],
                reason=(
                    f"{'below threshold; default ' if below else ''}choice {names[i]!r} "
                    f"p={probabilities[i]:.3f} (calibrated probabilities: {summary})"
                ),
            )
            for i in picked
        ]
        return ClefSelectorResult(
            selections=selections,
            probabilities=probabilities,
            below_threshold=below,
            source=result.x_source,
            model_version=result.x_model_version,
        )

    def _select(self, choices: Sequence[ToolMetadata], query: QueryBundle) -> ClefSelectorResult:
        names, questions = self._question(choices)
        return self._result(names, questions, self.engine.decide(query_state(query), questions))

    async def _aselect(
        self, choices: Sequence[ToolMetadata], query: QueryBundle
    ) -> ClefSelectorResult:
        names, questions = self._question(choices)
        result = await self.engine.adecide(query_state(query), questions)
        return self._result(names, questions, result)


def query_state(query: QueryBundle) -> Any:
    """The state for a query: its text, plus its image when the bundle has ``image_path``."""
    image_path = getattr(query, "image_path", None)
    if not image_path:
        return query.query_str
    image = Path(image_path)
    if not query.query_str.strip():
        return image
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": query.query_str},
                {"type": "image", "image": image},
            ],
        }
    ]


class ClefSelector(_ClefSelectorBase):
    """Pick the one tool with the highest calibrated probability.

    Each ``ToolMetadata`` becomes an option (its name, and its description as the
    option's criterion). The selection's ``reason`` carries the probabilities; the result
    (:class:`ClefSelectorResult`) exposes them as numbers. Below ``min_confidence`` the
    ``default_index`` choice is selected, or :class:`LowConfidenceError` is raised.

    Args:
        engine: ``DecisionEngine``, ``FakeEngine`` or ``ResilientEngine``.
        instructions: The question asked about the query.
        min_confidence: Least calibrated probability of the best choice, in [0, 1]
            (equal passes; ties between choices go to the first). ``None``: the
            engine's saved threshold, else ``0.0``.
        default_index: Choice to select below the threshold (else raise).

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> s = ClefSelector(engine=FakeEngine(), min_confidence=0.99, default_index=0)
        >>> s.select(["refunds and invoices", "crashes and bugs"], "crash").below_threshold
        True
    """

    def _picked(self, names: list[str], probabilities: list[float], question: Choice) -> list[int]:
        best = max(range(len(probabilities)), key=lambda i: probabilities[i])  # first of ties
        return [best] if self._gate.passes(probabilities[best], "route", question) else []


class ClefMultiSelector(_ClefSelectorBase):
    """Pick every tool whose calibrated probability is at least ``threshold``.

    Selections come most probable first, at most ``max_outputs`` of them; with none over
    the threshold, ``default_index`` is selected or :class:`LowConfidenceError` raised.

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> s = ClefMultiSelector(engine=FakeEngine(), threshold=0.2, max_outputs=2)
        >>> len(s.select(["refund invoice", "crash bug", "pricing"], "refund crash").inds)
        2
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        threshold: float = 0.3,
        max_outputs: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(engine, min_confidence=threshold, threshold_field="threshold", **kwargs)
        self.max_outputs = max_outputs

    def _picked(self, names: list[str], probabilities: list[float], question: Choice) -> list[int]:
        index = {name: i for i, name in enumerate(names)}
        scores = dict(zip(names, probabilities, strict=True))
        chosen = self._gate.select_all(scores, "route", question)
        picked = [index[name] for name in chosen]
        return picked[: self.max_outputs] if self.max_outputs else picked
