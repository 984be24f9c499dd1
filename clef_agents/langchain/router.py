"""ClefRouter: decide with calibrated probabilities, then run the chosen route."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from functools import partial
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.base import coerce_to_runnable
from langchain_core.runnables.config import ensure_config
from pydantic import ConfigDict, Field, PrivateAttr, SkipValidation

from clef_agents._gate import ConfidenceGate, LowConfidenceError, check_threshold, engine_thresholds
from clef_agents._shared import (
    StateFrom,
    as_choice,
    decision_record,
    default_engine,
    extract_state,
)
from clef_agents.langchain._events import acall_as_run, aemit, call_as_run, emit
from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.answers import ChoiceAnswer, DecisionResult
from clef_engine.schema.questions import Choice
from clef_engine.slots import Slots

EVENT = "clef_route"
"""Custom callback event emitted for every routing decision."""

DEFAULT_ROUTE = "default"
"""The route name reported when ``default`` ran."""


class Routed(TypedDict):
    """What ``ClefRouter`` returns with ``return_decision=True``."""

    route: str
    output: Any
    decision: DecisionResult


class ClefRouter(RunnableSerializable[Any, Any]):
    """Route an input to one of several Runnables by a calibrated ``choice``.

    ``invoke`` decides, then runs the chosen route with the original input; below
    ``min_confidence`` (the calibrated probability of the chosen option; equal passes),
    or for an option with no route, it runs ``default``. ``batch`` decides all inputs in one engine
    batch, then calls each route's ``batch`` once with its inputs. ``stream``/``astream``
    stream the chosen route's output. The decision reaches callers three ways: the
    ``clef_route`` custom callback event, the chosen route's run metadata (``clef_route``,
    ``clef_probability``, ``clef_source``), and, with ``return_decision=True``, the output
    itself (a :class:`Routed` dict). ``with_retry``/``with_fallbacks`` compose as usual.

    Args:
        question: A :class:`Choice`, or a plain ``{option: description}`` mapping.
        routes: A Runnable (or function) per option.
        default: Runs below ``min_confidence`` and for options without a route.
        min_confidence: Threshold on the chosen option's calibrated probability, in
            [0, 1]; ``0.0`` always follows the choice. ``None`` (the default): the
            threshold saved with the engine's model for this question, else ``0.0``.
        engine: ``DecisionEngine``, ``FakeEngine`` or ``ResilientEngine``; default: the
            shared engine on the embedded model.
        state_from: Decide on this key of a dict input (or a function of the input);
            the route still gets the whole input.
        return_decision: Return ``{"route", "output", "decision"}`` instead of the output.

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> router = ClefRouter({"billing": "refund invoice", "sales": "pricing demo"},
        ...     routes={"billing": lambda x: "B", "sales": lambda x: "S"},
        ...     default=lambda x: "human", min_confidence=0.6, engine=FakeEngine(),
        ...     return_decision=True)
        >>> out = router.invoke("I want a refund for this invoice")
        >>> out["route"], out["output"]
        ('billing', 'B')
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    question: Choice
    routes: dict[str, Runnable[Any, Any]]
    default: Runnable[Any, Any] | None = None
    min_confidence: float | None = None
    engine: Annotated[Engine, SkipValidation] = Field(default=None, exclude=True)
    state_from: StateFrom = Field(default=None, exclude=True)
    return_decision: bool = False
    question_id: str = "route"
    _gate: ConfidenceGate = PrivateAttr()

    def __init__(
        self,
        question: Any = None,
        routes: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if question is not None:
            kwargs["question"] = question
        if routes is not None:
            kwargs["routes"] = routes
        kwargs["question"] = as_choice(kwargs.get("question"))
        kwargs["min_confidence"] = check_threshold(kwargs.get("min_confidence"))
        kwargs["routes"] = {k: coerce_to_runnable(v) for k, v in dict(kwargs["routes"]).items()}
        if kwargs.get("default") is not None:
            kwargs["default"] = coerce_to_runnable(kwargs["default"])
        super().__init__(**kwargs)
        options = [o.name for o in self.question.option_specs()]
        unknown = sorted(set(self.routes) - set(options))
        if unknown:
            raise InvalidRequestError(
                f"routes {unknown} are not options of the question ({options})", field="routes"
            )
        if self.engine is None:
            self.engine = default_engine()
        self._gate = ConfidenceGate(self.min_confidence, saved=engine_thresholds(self.engine))
        if self.default is None and self._gate.needs_default(
            options, self.routes, self.question_id, self.question
        ):
            raise InvalidRequestError(
                "a default route is required with min_confidence > 0 or options without a route",
                field="default",
            )

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return False

    @property
    def questions(self) -> dict[str, Choice]:
        return {self.question_id: self.question}

    # -- picking -----------------------------------------------------------------------

    @property
    def gate(self) -> ConfidenceGate:
        """The confidence gate (``min_confidence``, or the engine's saved threshold)."""
        return self._gate

    def choose_route(self, decision: DecisionResult) -> tuple[str, Runnable[Any, Any]]:
        """The route name and Runnable a decision selects (``"default"`` below threshold).

        Raises:
            LowConfidenceError: Below a saved threshold, with no ``default`` route.
        """
        answer = decision.answers[self.question_id]
        assert isinstance(answer, ChoiceAnswer)
        pick = self._gate.pick(answer, self.routes, self.question_id, self.question)
        if pick.route is not None:
            return pick.route, self.routes[pick.route]
        if self.default is None:  # only a threshold saved after construction gets here
            raise LowConfidenceError([pick.probability], pick.threshold)
        return DEFAULT_ROUTE, self.default

    def _record(self, name: str, decision: DecisionResult) -> dict[str, Any]:
        record = decision_record(decision, self.question_id)
        record["route"] = name
        record["min_confidence"] = self._gate.threshold(self.question_id, self.question)
        return record

    def _child_config(self, config: RunnableConfig, record: dict[str, Any]) -> RunnableConfig:
        config = ensure_config(config)
        metadata = {
            **config.get("metadata", {}),
            "clef_route": record["route"],
            "clef_choice": record["choice"],
            "clef_probability": record["probability"],
            "clef_probabilities": record["probabilities"],
            "clef_source": record["source"],
            "clef_model_version": record["model_version"],
        }
        return {**config, "metadata": metadata}

    def _wrap(self, name: str, output: Any, decision: DecisionResult) -> Any:
        if self.return_decision:
            return Routed(route=name, output=output, decision=decision)
        return output

    def _decide(self, value: Any) -> DecisionResult:
        return self.engine.decide(extract_state(value, self.state_from), self.questions)  # type: ignore[no-any-return]

    async def _adecide(self, value: Any) -> DecisionResult:
        return await self.engine.adecide(extract_state(value, self.state_from), self.questions)  # type: ignore[no-any-return]

    # -- invoke ------------------------------------------------------------------------

    def _invoke(self, value: Any, config: RunnableConfig) -> Any:
        decision = self._decide(value)
        name, route = self.choose_route(decision)
        record = self._record(name, decision)
        emit(EVENT, lambda: record, config)
        return self._wrap(name, route.invoke(value, self._child_config(config, record)), decision)

    async def _ainvoke(self, value: Any, config: RunnableConfig) -> Any:
        decision = await self._adecide(value)
        name, route = self.choose_route(decision)
        record = self._record(name, decision)
        await aemit(EVENT, lambda: record, config)
        output = await route.ainvoke(value, self._child_config(config, record))
        return self._wrap(name, output, decision)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return call_as_run(self, self._invoke, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await acall_as_run(self, self._ainvoke, input, config)

    # -- batch -------------------------------------------------------------------------

    def _plan(
        self, inputs: list[Any], decisions: list[Any], configs: list[RunnableConfig]
    ) -> tuple[list[Any], dict[str, list[int]], dict[int, RunnableConfig], dict[str, Any]]:
        slots: list[Any] = [None] * len(inputs)
        groups: dict[str, list[int]] = {}
        child: dict[int, RunnableConfig] = {}
        records: dict[str, Any] = {}
        for i, decision in enumerate(decisions):
            if isinstance(decision, BaseException):
                slots[i] = decision
                continue
            try:
                name, _ = self.choose_route(decision)
            except LowConfidenceError as exc:
                slots[i] = exc
                continue
            record = self._record(name, decision)
            records[str(i)] = record
            groups.setdefault(name, []).append(i)
            child[i] = self._child_config(configs[i], record)
        return slots, groups, child, records

    def _route(self, name: str) -> Runnable[Any, Any]:
        if name == DEFAULT_ROUTE:
            assert self.default is not None
            return self.default
        return self.routes[name]

    def _states(self, inputs: list[Any]) -> Slots[Any]:
        """States to decide on; an input whose state cannot be pulled out keeps its error."""
        return Slots.parse(inputs, partial(extract_state, state_from=self.state_from))

    def _batch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        states = self._states(inputs)
        decisions = states.fill(
            self.engine.decide_batch(states.pending, self.questions, return_exceptions=True)
            if states.pending
            else []
        )
        slots, groups, child, records = self._plan(inputs, decisions, config)
        for name, idx in groups.items():
            outputs = self._route(name).batch(
                [inputs[i] for i in idx], [child[i] for i in idx], return_exceptions=True
            )
            for i, out in zip(idx, outputs, strict=True):
                emit(EVENT, partial(records.__getitem__, str(i)), config[i])
                slots[i] = (
                    out if isinstance(out, BaseException) else self._wrap(name, out, decisions[i])
                )
        return slots

    async def _abatch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        states = self._states(inputs)
        decisions = states.fill(
            await self.engine.adecide_batch(states.pending, self.questions, return_exceptions=True)
            if states.pending
            else []
        )
        slots, groups, child, records = self._plan(inputs, decisions, config)
        for name, idx in groups.items():
            outputs = await self._route(name).abatch(
                [inputs[i] for i in idx], [child[i] for i in idx], return_exceptions=True
            )
            for i, out in zip(idx, outputs, strict=True):
                await aemit(EVENT, partial(records.__getitem__, str(i)), config[i])
                slots[i] = (
                    out if isinstance(out, BaseException) else self._wrap(name, out, decisions[i])
                )
        return slots

    def batch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Decide all inputs in one engine batch, then one ``batch`` call per route."""
        return self._batch_with_config(
            self._batch,  # type: ignore[arg-type]
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
        """Async :meth:`batch`."""
        return await self._abatch_with_config(
            self._abatch,  # type: ignore[arg-type]
            inputs,
            config,
            return_exceptions=return_exceptions,  # type: ignore[arg-type]
        )

    # -- stream ------------------------------------------------------------------------

    def _transform(self, chunks: Iterator[Any], config: RunnableConfig) -> Iterator[Any]:
        value = _single(chunks)
        decision = self._decide(value)
        name, route = self.choose_route(decision)
        record = self._record(name, decision)
        emit(EVENT, lambda: record, config)
        yield from route.stream(value, self._child_config(config, record))

    async def _atransform(
        self, chunks: AsyncIterator[Any], config: RunnableConfig
    ) -> AsyncIterator[Any]:
        values = [c async for c in chunks]
        value = _single(iter(values))
        decision = await self._adecide(value)
        name, route = self.choose_route(decision)
        record = self._record(name, decision)
        await aemit(EVENT, lambda: record, config)
        async for chunk in route.astream(value, self._child_config(config, record)):
            yield chunk

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Decide, then stream the chosen route's output."""
        yield from self._transform_stream_with_config(iter([input]), self._transform, config)  # type: ignore[arg-type]

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Async :meth:`stream`."""

        async def one() -> AsyncIterator[Any]:
            yield input

        async for chunk in self._atransform_stream_with_config(one(), self._atransform, config):  # type: ignore[arg-type]
            yield chunk


def _single(chunks: Iterator[Any]) -> Any:
    values = list(chunks)
    if len(values) != 1:
        raise InvalidRequestError("ClefRouter streams one input at a time", field="input")
    return values[0]
