"""ClefDecision: a LangChain Runnable from a state to a calibrated :class:`DecisionResult`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig, RunnableSerializable
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import ConfigDict, Field, SkipValidation

from clef_agents._shared import StateFrom, decision_record, default_engine, extract_state
from clef_agents.langchain._events import acall_as_run, aemit, call_as_run, emit
from clef_engine.protocol import Engine
from clef_engine.schema.answers import DecisionResult
from clef_engine.schema.questions import readable
from clef_engine.schema.render import render_value
from clef_engine.schema.request import questions_from
from clef_engine.slots import Slots

EVENT = "clef_decision"
"""Name of the custom callback event every decision emits (data: probabilities etc.)."""


class ClefDecision(RunnableSerializable[Any, DecisionResult]):
    """Answer bound questions about the input; output is the :class:`DecisionResult`.

    The input is a state (string, JSON object, chat messages) or a whole request dict
    with its own ``questions``. ``batch``/``abatch`` run one engine batch (tensor
    batching, not a thread pool) and keep ``return_exceptions``; ``ainvoke`` runs in the
    engine's worker thread. Each run emits a ``clef_decision`` custom event with the
    probabilities, source and model version.

    Args:
        questions: Questions keyed by id (question objects or wire dicts).
        engine: A ``DecisionEngine``, ``FakeEngine`` or ``ResilientEngine``; default: the
            shared engine on the embedded model.
        state_from: Take the state from this key of a dict input (or a function of it).

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> from clef_engine.schema import Noul
        >>> urgent = ClefDecision(questions={"urgent": Noul(instructions="Is it urgent?",
        ...     criteria={"true": "urgent asap"})}, engine=FakeEngine())
        >>> urgent.invoke("asap please, urgent!")["urgent"].noul > 0.5
        True
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    questions: dict[str, Any]
    engine: Annotated[Engine, SkipValidation] = Field(default=None, exclude=True)
    state_from: StateFrom = Field(default=None, exclude=True)

    def __init__(self, questions: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if questions is not None:
            kwargs["questions"] = questions
        kwargs["questions"] = dict(questions_from(kwargs["questions"]))
        super().__init__(**kwargs)
        if self.engine is None:
            self.engine = default_engine()

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return False

    # -- conversion --------------------------------------------------------------------

    def _item(self, value: Any) -> Any:
        if self.state_from is None and isinstance(value, Mapping) and "questions" in value:
            return value  # a whole request
        return {"state": extract_state(value, self.state_from), "questions": self.questions}

    def _items(self, inputs: list[Any]) -> Slots[Any]:
        """Engine items for the inputs that convert; failures stay in their slots."""
        return Slots.parse(inputs, self._item)

    # -- runs --------------------------------------------------------------------------

    def _decide(self, value: Any, config: RunnableConfig) -> DecisionResult:
        result: DecisionResult = self.engine.decide(self._item(value))
        emit(EVENT, lambda: decision_record(result), config)
        return result

    async def _adecide(self, value: Any, config: RunnableConfig) -> DecisionResult:
        result: DecisionResult = await self.engine.adecide(self._item(value))
        await aemit(EVENT, lambda: decision_record(result), config)
        return result

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> DecisionResult:
        return call_as_run(self, self._decide, input, config)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> DecisionResult:
        return await acall_as_run(self, self._adecide, input, config)

    def _decide_batch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        items = self._items(inputs)
        results = (
            self.engine.decide_batch(items.pending, return_exceptions=True) if items.pending else []
        )
        slots = items.fill(results)
        for i in items.indexes:
            if isinstance(slots[i], DecisionResult):
                emit(EVENT, partial(decision_record, slots[i]), config[i])
        return slots

    async def _adecide_batch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        items = self._items(inputs)
        results = (
            await self.engine.adecide_batch(items.pending, return_exceptions=True)
            if items.pending
            else []
        )
        slots = items.fill(results)
        for i in items.indexes:
            if isinstance(slots[i], DecisionResult):
                await aemit(EVENT, partial(decision_record, slots[i]), config[i])
        return slots

    def batch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """One engine batch for all inputs; errors per item with ``return_exceptions``."""
        return self._batch_with_config(
            self._decide_batch,  # type: ignore[arg-type]
            inputs,
            config,
            return_exceptions=return_exceptions,  # type: ignore[arg-type]
        )

    async def abatch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Async :meth:`batch` (one engine batch in the engine's worker thread)."""
        return await self._abatch_with_config(
            self._adecide_batch,  # type: ignore[arg-type]
            inputs,
            config,
            return_exceptions=return_exceptions,  # type: ignore[arg-type]
        )

    # -- tools -------------------------------------------------------------------------

    def as_tool(  # type: ignore[override]
        self, *, name: str | None = None, description: str | None = None, **_: Any
    ) -> BaseTool:
        """A tool an agent can call with ``{"state": "..."}``; it returns the answers as JSON.

        Example:
            >>> from clef_agents.fake import FakeEngine
            >>> tool = ClefDecision(questions={"q": {"type": "choice", "instructions":
            ...     "Route", "criteria": ["billing", "tech"]}}, engine=FakeEngine()).as_tool()
            >>> tool.invoke({"state": "billing question"})["answers"]["q"]["choice"]
            'billing'
        """

        def run(state: str) -> dict[str, Any]:
            return decision_record(self.invoke(state))

        async def arun(state: str) -> dict[str, Any]:
            return decision_record(await self.ainvoke(state))

        return StructuredTool.from_function(
            func=run,
            coroutine=arun,
            name=name or "clef_decide",
            description=description or self._describe(),
        )

    def _describe(self) -> str:
        parts = []
        for qid, q in self.questions.items():
            text = render_value(getattr(q, "instructions", None) or readable(qid), qid)
            options = [o.name for o in q.option_specs()]
            listed = f" (options: {', '.join(options)})" if options else ""
            parts.append(f"{qid}: {text}{listed}")
        return (
            "Answer typed questions about a state with calibrated probabilities. "
            "Pass the text to judge as 'state'. Questions: " + "; ".join(parts)
        )
