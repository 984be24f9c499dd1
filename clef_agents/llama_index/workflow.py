"""A LlamaIndex Workflows step that routes by a calibrated decision.

Example:
    >>> from llama_index.core.workflow import Workflow, StopEvent, step
    >>> from clef_agents.fake import FakeEngine
    >>> class Billing(ClefRouteEvent): ...
    >>> class Human(ClefRouteEvent): ...
    >>> class Desk(Workflow):
    ...     @step
    ...     async def billing(self, ev: Billing) -> StopEvent:
    ...         return StopEvent(result=f"billing p={ev.probability:.2f}")
    ...     @step
    ...     async def human(self, ev: Human) -> StopEvent:
    ...         return StopEvent(result="human")
    >>> _ = clef_router_step(Desk, {"billing": "refund invoice", "tech": "crash bug"},
    ...                      events={"billing": Billing}, default=Human, engine=FakeEngine())
    >>> import asyncio
    >>> async def main() -> str:
    ...     return await Desk(timeout=10).run(query="refund my invoice")
    >>> asyncio.run(main())[:9]
    'billing p'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from llama_index.core.workflow import Event, StartEvent, Workflow, step
from pydantic import Field

from clef_agents._gate import ConfidenceGate, LowConfidenceError, engine_thresholds
from clef_agents._shared import StateFrom, as_choice, decision_record, default_engine
from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.answers import ChoiceAnswer


class ClefRouteEvent(Event):
    """Base class of the events a router step emits; subclass it once per route.

    Fields: ``state`` (what was decided on), ``route`` (option name, or ``"default"``),
    ``probability`` (calibrated probability of the chosen option) and ``decision`` (the
    JSON summary: probabilities, source, model version).
    """

    state: Any = None
    route: str = ""
    probability: float = 0.0
    decision: dict[str, Any] = Field(default_factory=dict)


def clef_router_step(
    workflow: type[Workflow],
    question: Any,
    *,
    events: Mapping[str, type[Event]],
    default: type[Event] | None = None,
    min_confidence: float | None = None,
    engine: Engine | None = None,
    accepts: type[Event] = StartEvent,
    state_from: StateFrom = "query",
    name: str = "clef_route",
) -> Any:
    """Add a step to ``workflow`` that decides and emits the chosen option's event.

    Args:
        workflow: The ``Workflow`` subclass to add the step to.
        question: A ``Choice`` or ``{option: description}``.
        events: Event class per option (subclasses of :class:`ClefRouteEvent`, or any
            ``Event`` accepting the fields above).
        default: Event for options without one and below ``min_confidence``.
        min_confidence: Least calibrated probability to follow the chosen option, in
            [0, 1] (equal passes; ``0.0``: always follow). ``None``: the engine's saved
            threshold for the question, else ``0.0``.
        engine: ``DecisionEngine``, ``FakeEngine`` or ``ResilientEngine``.
        accepts: The event the step consumes (default ``StartEvent``).
        state_from: Field of that event to decide on (or a function of the event).
        name: The step's name.

    Returns:
        The step function (already registered on ``workflow``).
    """
    choice = as_choice(question)
    options = [o.name for o in choice.option_specs()]
    unknown = sorted(set(events) - set(options))
    if unknown:
        raise InvalidRequestError(f"events for unknown options {unknown}", field="events")
    # Without an engine the shared one is built on first use: its saved thresholds are
    # looked up then.
    gate = ConfidenceGate(min_confidence, saved=engine_thresholds(engine))
    if default is None and gate.needs_default(options, events, "route", choice):
        raise InvalidRequestError(
            "a default event is required with min_confidence > 0 or options without an event",
            field="default",
        )
    questions = {"route": choice}
    emitted = list(dict.fromkeys([*events.values(), *([default] if default else [])]))

    def state_of(ev: Event) -> Any:
        if callable(state_from):
            return state_from(ev)
        key = state_from or "query"
        value = ev.get(key) if hasattr(ev, "get") else getattr(ev, key, None)
        if value is None:
            raise InvalidRequestError(f"the event has no {state_from!r}", field="state")
        return value

    async def route(ev: Event) -> Event:
        state = state_of(ev)
        chosen_engine = engine if engine is not None else default_engine()
        result = await chosen_engine.adecide(state, questions)
        answer = result.answers["route"]
        assert isinstance(answer, ChoiceAnswer)
        live = ConfidenceGate(gate.min_confidence, saved=engine_thresholds(chosen_engine))
        pick = live.pick(answer, events, "route", choice)
        record = decision_record(result, "route")
        if pick.route is not None:
            event_cls, route_name = events[pick.route], pick.route
        elif default is not None:
            event_cls, route_name = default, "default"
        else:  # below a threshold saved with the model, and no default event
            raise LowConfidenceError([pick.probability], pick.threshold)
        return event_cls(
            state=state, route=route_name, probability=pick.probability, decision=record
        )

    route.__name__ = route.__qualname__ = name
    # The step decorator reads the accepted and emitted events from the annotations.
    route.__annotations__ = {"ev": accepts, "return": Union[tuple(emitted)]}  # noqa: UP007
    return step(workflow=workflow)(route)
