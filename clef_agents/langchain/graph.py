"""LangGraph path functions: route a graph on calibrated probabilities.

:func:`clef_path` turns a question (or a :class:`ClefRouter`) into a ``path`` for
``StateGraph.add_conditional_edges``: graph state in, node name(s) out.

- A ``choice`` (a ``Choice`` or ``{node: description}``) goes to the chosen option's
  node, or to ``fallback`` when the option's probability is below ``min_confidence``
  (the same gate as :class:`ClefRouter`: equal passes, ``0.0`` always follows, ``None``
  uses the model's saved threshold).
- Several ``noul`` questions (``{node: Noul or "description"}``, ``multi=True``) fan out
  to every node whose P(yes) is at least ``threshold`` (LangGraph runs them in
  parallel), or to ``fallback`` when none is.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> path = clef_path({"billing": "refund invoice", "technical": "bug crash"},
    ...                  fallback="human", min_confidence=0.6, state_from="ticket",
    ...                  engine=FakeEngine())
    >>> path.invoke({"ticket": "the app has a crash bug"})
    'technical'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableLambda

from clef_agents._gate import ConfidenceGate, engine_thresholds
from clef_agents._shared import StateFrom, as_choice, default_engine, extract_state
from clef_agents.langchain.router import ClefRouter
from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.answers import ChoiceAnswer, DecisionResult, NoulAnswer
from clef_engine.schema.questions import Noul


def _nouls(question: Mapping[str, Any]) -> dict[str, Noul]:
    out = {}
    for node, q in question.items():
        if isinstance(q, Noul):
            out[node] = q
        elif isinstance(q, Mapping):
            out[node] = Noul.model_validate({k: v for k, v in q.items() if k != "type"})
        else:
            out[node] = Noul(instructions=f"Does this need {node}?", criteria={"true": q})
    return out


def clef_path(
    question: Any,
    *,
    fallback: str,
    min_confidence: float | None = None,
    threshold: float = 0.5,
    multi: bool = False,
    nodes: Mapping[str, str] | None = None,
    engine: Engine | None = None,
    state_from: StateFrom = None,
    on_decision: Callable[[DecisionResult], None] | None = None,
) -> RunnableLambda[Any, Any]:
    """A LangGraph ``path`` that picks the next node(s) from a decision.

    Args:
        question: A ``Choice`` or ``{node: description}`` (one node), a
            :class:`ClefRouter` (its question, engine and threshold), or with
            ``multi=True`` a mapping ``{node: Noul or description}`` (fan-out).
        fallback: The node to take below the threshold.
        min_confidence: For a choice: least calibrated probability to follow it, in
            [0, 1] (``0.0``: always follow). ``None``: a router's own threshold, else the
            engine's saved threshold for the question, else ``0.0``.
        threshold: For ``multi``: least P(yes) for a node to run.
        nodes: Option name to node name, where they differ.
        engine: ``DecisionEngine``, ``FakeEngine`` or ``ResilientEngine``.
        state_from: Decide on this key of the graph state (or a function of it).
        on_decision: Called with every :class:`DecisionResult` (logging, metrics).

    Returns:
        A Runnable with sync and async forms; pass it to ``add_conditional_edges``.
    """
    nodes = dict(nodes or {})
    inherited: ConfidenceGate | None = None
    qid = "route"  # the question's id where saved thresholds are looked up
    if isinstance(question, ClefRouter):
        qid = question.question_id
        engine = engine if engine is not None else question.engine
        state_from = state_from if state_from is not None else question.state_from
        if min_confidence is None:
            inherited = question.gate
        question = question.question
    engine = engine if engine is not None else default_engine()
    gate = inherited or ConfidenceGate(min_confidence, saved=engine_thresholds(engine))

    if multi:
        questions, choose = _fan_out(question, threshold, nodes, fallback)
    else:
        questions, choose = _route(question, gate, qid, nodes, fallback)

    def path(state: Any) -> Any:
        result = engine.decide(extract_state(state, state_from), questions)
        if on_decision is not None:
            on_decision(result)
        return choose(result)

    async def apath(state: Any) -> Any:
        result = await engine.adecide(extract_state(state, state_from), questions)
        if on_decision is not None:
            on_decision(result)
        return choose(result)

    runnable: RunnableLambda[Any, Any] = RunnableLambda(path, afunc=apath, name="clef_path")
    destinations = [nodes.get(n, n) for n in _options(questions, multi)] + [fallback]
    runnable.destinations = list(dict.fromkeys(destinations))  # type: ignore[attr-defined]
    return runnable


_Chooser = Callable[[DecisionResult], Any]
"""Decision in, next node name(s) out."""


def _fan_out(
    question: Any, threshold: float, nodes: Mapping[str, str], fallback: str
) -> tuple[dict[str, Any], _Chooser]:
    """The ``multi=True`` questions (one ``noul`` per node) and a chooser that runs every
    node whose P(yes) passes ``threshold``, or ``fallback`` when none does."""
    if not isinstance(question, Mapping) or not question:
        raise InvalidRequestError(
            "multi=True needs a mapping {node: Noul or description}", field="question"
        )
    questions: dict[str, Any] = dict(_nouls(question))
    fan_out = ConfidenceGate(threshold, field="threshold")

    def choose(result: DecisionResult) -> Any:
        picked = []
        for node in questions:
            answer = result.answers[node]
            assert isinstance(answer, NoulAnswer)
            if fan_out.passes(answer.noul, node, questions[node]):
                picked.append(nodes.get(node, node))
        return picked or fallback

    return questions, choose


def _route(
    question: Any, gate: ConfidenceGate, qid: str, nodes: Mapping[str, str], fallback: str
) -> tuple[dict[str, Any], _Chooser]:
    """The one ``choice`` question (id ``route``) and a chooser that follows the chosen
    option's node when ``gate`` passes it, else ``fallback``."""
    questions: dict[str, Any] = {"route": as_choice(question)}
    options = [o.name for o in questions["route"].option_specs()]

    def choose(result: DecisionResult) -> Any:
        answer = result.answers["route"]
        assert isinstance(answer, ChoiceAnswer)
        pick = gate.pick(answer, options, qid, questions["route"])
        return fallback if pick.route is None else nodes.get(pick.route, pick.route)

    return questions, choose


def _options(questions: Mapping[str, Any], multi: bool) -> list[str]:
    if multi:
        return list(questions)
    return [o.name for o in questions["route"].option_specs()]


def add_clef_edges(graph: Any, source: str, question: Any, **kwargs: Any) -> Any:
    """``graph.add_conditional_edges(source, clef_path(question, ...), path_map=...)``.

    The path map lists every reachable node, so the compiled graph draws correctly.
    """
    path = clef_path(question, **kwargs)
    return graph.add_conditional_edges(source, path, path.destinations)  # type: ignore[attr-defined]
