"""ClefDecision, ClefRouter and the LangGraph path helper, on FakeEngine (no model)."""

from __future__ import annotations

import asyncio
import importlib
import operator
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langgraph")

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph

from clef_agents.fake import FakeEngine
from clef_agents.langchain import ClefDecision, ClefRouter, add_clef_edges, clef_path
from clef_engine.errors import InvalidRequestError, MissingDependencyError
from clef_engine.schema.answers import DecisionResult

ROUTES = {
    "billing": "refund invoice payment charge",
    "technical": "bug error crash login",
    "sales": "pricing demo plan upgrade",
}
QUESTIONS = {"route": {"type": "choice", "instructions": "Route", "criteria": ROUTES}}


class CountingEngine(FakeEngine):
    """A FakeEngine that records how it was called."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_sizes: list[int] = []
        self.single = 0

    def decide(self, state: Any, questions: Any = None, **kw: Any) -> DecisionResult:
        self.single += 1
        return super().decide(state, questions, **kw)

    def decide_batch(self, states: Any, questions: Any = None, **kw: Any) -> list[Any]:
        self.batch_sizes.append(len(states))
        return super().decide_batch(states, questions, **kw)


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.metadata: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.metadata.append(dict(kwargs.get("metadata") or {}))


def tag(name: str) -> RunnableLambda[Any, str]:
    return RunnableLambda(lambda x: f"{name}:{x if isinstance(x, str) else x['ticket']}")


def make_router(engine: Any = None, **kwargs: Any) -> ClefRouter:
    kwargs.setdefault("default", tag("human"))
    return ClefRouter(
        ROUTES,
        routes={k: tag(k) for k in ROUTES},
        engine=engine or FakeEngine(),
        **kwargs,
    )


# -- ClefDecision ---------------------------------------------------------------------


def test_decision_accepts_strings_dicts_messages_and_requests() -> None:
    fake = FakeEngine()
    decide = ClefDecision(QUESTIONS, engine=fake)
    assert decide.invoke("refund my invoice")["route"].choice == "billing"
    messages = [HumanMessage("the login page shows an error"), AIMessage("sorry!")]
    assert decide.invoke(messages)["route"].choice == "technical"
    assert decide.invoke({"plan": "upgrade", "ask": "pricing"})["route"].choice == "sales"
    other = {"q": {"type": "noul", "instructions": "is it about money?"}}
    assert set(decide.invoke({"state": "cash", "questions": other}).answers) == {"q"}
    keyed = ClefDecision(QUESTIONS, engine=fake, state_from="ticket")
    assert keyed.invoke({"ticket": "crash bug", "user": 1}) == fake.decide("crash bug", QUESTIONS)


def test_decision_batch_is_one_engine_batch_with_errors_in_slots() -> None:
    engine = CountingEngine()
    decide = ClefDecision(QUESTIONS, engine=engine)
    inputs = ["refund please", "", "crash bug", "pricing plan"]
    out = decide.batch(inputs, return_exceptions=True)
    assert engine.batch_sizes == [4] and engine.single == 0
    assert isinstance(out[1], InvalidRequestError)
    assert [r["route"].choice for r in (out[0], out[2], out[3])] == [
        "billing",
        "technical",
        "sales",
    ]
    with pytest.raises(InvalidRequestError):
        decide.batch(inputs)
    out = asyncio.run(decide.abatch(inputs, return_exceptions=True))
    assert engine.batch_sizes[-1] == 4
    assert isinstance(out[1], InvalidRequestError) and out[3]["route"].choice == "sales"


def test_decision_emits_probabilities_through_callbacks() -> None:
    recorder = Recorder()
    ClefDecision(QUESTIONS, engine=FakeEngine()).invoke("refund", config={"callbacks": [recorder]})
    (name, data), *_ = recorder.events
    assert name == "clef_decision"
    probabilities = data["answers"]["route"]["probabilities"]
    assert set(probabilities) == set(ROUTES)
    assert sum(probabilities.values()) == pytest.approx(1.0)
    assert data["source"] == "model" and data["model_version"] == "fake@0"


class BlockingEngine(FakeEngine):
    """decide() blocks until released; adecide runs it in a thread like the real engine."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def decide(self, state: Any, questions: Any = None, **kw: Any) -> DecisionResult:
        assert self.release.wait(5), "the event loop was blocked"
        return super().decide(state, questions, **kw)

    async def adecide(self, state: Any, questions: Any = None, **kw: Any) -> DecisionResult:
        return await asyncio.to_thread(self.decide, state, questions)


@pytest.mark.parametrize("kind", ["decision", "router"])
def test_ainvoke_does_not_block_the_event_loop(kind: str) -> None:
    engine = BlockingEngine()
    runnable: Any = (
        ClefDecision(QUESTIONS, engine=engine) if kind == "decision" else make_router(engine)
    )

    async def main() -> Any:
        async def release() -> None:
            await asyncio.sleep(0.01)
            engine.release.set()  # only runs if ainvoke yielded the loop

        result, _ = await asyncio.gather(runnable.ainvoke("refund invoice"), release())
        return result

    result = asyncio.run(main())
    assert (result["route"].choice if kind == "decision" else result) in (
        "billing",
        "billing:refund invoice",
    )


def test_as_tool() -> None:
    tool = ClefDecision(QUESTIONS, engine=FakeEngine()).as_tool(name="triage")
    assert tool.name == "triage"
    assert "billing" in tool.description
    assert set(tool.args) == {"state"}
    out = tool.invoke({"state": "my invoice charge is wrong"})
    assert out["answers"]["route"]["choice"] == "billing"
    assert asyncio.run(tool.ainvoke({"state": "crash bug"}))["answers"]["route"]["choice"] == (
        "technical"
    )


# -- ClefRouter -----------------------------------------------------------------------


def test_router_runs_the_chosen_route_with_the_original_input() -> None:
    router = make_router(state_from="ticket")
    ticket = {"ticket": "the app has a crash bug", "id": 7}
    assert router.invoke(ticket) == "technical:the app has a crash bug"
    assert asyncio.run(router.ainvoke({"ticket": "refund"})) == "billing:refund"


def test_router_takes_default_below_threshold_and_for_unrouted_options() -> None:
    pinned = FakeEngine(fixed={"route": "billing"}, fixed_probability=0.5)
    assert make_router(pinned, min_confidence=0.6).invoke("x") == "human:x"
    assert make_router(pinned, min_confidence=0.4).invoke("x") == "billing:x"
    partial = ClefRouter(
        ROUTES, routes={"billing": tag("billing")}, default=tag("human"), engine=FakeEngine()
    )
    assert partial.invoke("crash bug") == "human:crash bug"
    with pytest.raises(InvalidRequestError) as info:
        ClefRouter(ROUTES, routes={"billing": tag("b")}, engine=FakeEngine())
    assert info.value.field == "default"
    with pytest.raises(InvalidRequestError) as info:
        ClefRouter(ROUTES, routes={"refunds": tag("b")}, default=tag("h"), engine=FakeEngine())
    assert info.value.field == "routes"


def test_router_exposes_its_decision() -> None:
    recorder = Recorder()
    router = make_router(return_decision=True)
    out = router.invoke("refund invoice", config={"callbacks": [recorder]})
    assert out["route"] == "billing" and out["output"] == "billing:refund invoice"
    assert isinstance(out["decision"], DecisionResult)
    [(name, data)] = recorder.events
    assert name == "clef_route" and data["route"] == "billing"
    assert data["probability"] == out["decision"]["route"].probabilities["billing"]
    route_runs = [m for m in recorder.metadata if "clef_route" in m]
    assert route_runs and route_runs[0]["clef_probability"] == data["probability"]
    assert route_runs[0]["clef_source"] == "model"


def test_router_without_listeners_still_passes_metadata_and_traces_when_asked() -> None:
    from langchain_core.tracers.context import collect_runs

    seen: list[dict[str, Any]] = []

    def route(x: str, config: RunnableConfig) -> str:
        seen.append(dict(config.get("metadata") or {}))
        return f"billing:{x}"

    router = ClefRouter(
        ROUTES, routes={"billing": route}, default=tag("human"), engine=FakeEngine()
    )
    # No callbacks: the router skips its own run, yet the route sees the decision.
    assert router.invoke("refund invoice", config={"metadata": {"user": "u1"}}) == (
        "billing:refund invoice"
    )
    assert seen[-1]["clef_route"] == "billing" and seen[-1]["user"] == "u1"
    # A handler from a configure hook (tracing, collect_runs) gets the full run tree.
    with collect_runs() as runs:
        router.invoke("refund invoice")
    [root] = runs.traced_runs
    assert root.name == "ClefRouter"
    assert [child.name for child in root.child_runs] == ["route"]
    assert root.child_runs[0].extra["metadata"]["clef_route"] == "billing"


def test_router_batch_groups_by_route_in_order() -> None:
    calls: dict[str, list[list[Any]]] = {}

    def spy(name: str) -> RunnableLambda[Any, str]:
        def run_batch(xs: list[str]) -> list[str]:
            calls.setdefault(name, []).append(list(xs))
            if "explode" in xs:
                raise RuntimeError("route failed")
            return [f"{name}:{x}" for x in xs]

        return RunnableLambda(lambda x: run_batch([x])[0]).with_config(run_name=name)

    engine = CountingEngine()
    router = ClefRouter(ROUTES, routes={k: spy(k) for k in ROUTES}, engine=engine)
    inputs = ["refund", "crash bug", "invoice charge", "pricing demo", "login error"]
    out = router.batch(inputs)
    assert out == [
        "billing:refund",
        "technical:crash bug",
        "billing:invoice charge",
        "sales:pricing demo",
        "technical:login error",
    ]
    assert engine.batch_sizes == [5] and engine.single == 0
    assert asyncio.run(router.abatch(inputs)) == out
    out = router.batch(["refund", "", "crash bug"], return_exceptions=True)
    assert out[0] == "billing:refund" and out[2] == "technical:crash bug"
    assert isinstance(out[1], InvalidRequestError)


def test_router_batch_calls_each_route_batch_once() -> None:
    class BatchSpy(RunnableLambda):  # type: ignore[type-arg]
        def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
            super().__init__(lambda x: f"{name}:{x}")
            self.log, self.route = log, name

        def batch(self, inputs: list[Any], config: Any = None, **kw: Any) -> list[Any]:
            self.log.append((self.route, len(inputs)))
            return super().batch(inputs, config, **kw)

    log: list[tuple[str, int]] = []
    router = ClefRouter(ROUTES, routes={k: BatchSpy(k, log) for k in ROUTES}, engine=FakeEngine())
    router.batch(["refund", "invoice", "crash", "bug login", "pricing"])
    assert sorted(log) == [("billing", 2), ("sales", 1), ("technical", 2)]


def test_router_streams_the_chosen_route() -> None:
    def chunks(text: str) -> Iterator[str]:
        yield from text.split()

    async def achunks(text: str) -> AsyncIterator[str]:
        for word in text.split():
            yield word

    router = ClefRouter(
        ROUTES,
        routes={
            "billing": RunnableLambda(chunks, afunc=achunks),
            "technical": tag("t"),
            "sales": tag("s"),
        },
        engine=FakeEngine(),
    )
    assert list(router.stream("refund my invoice")) == ["refund", "my", "invoice"]

    async def collect() -> list[str]:
        return [c async for c in router.astream("refund my invoice")]

    assert asyncio.run(collect()) == ["refund", "my", "invoice"]


def test_router_composes_with_retry_and_fallbacks() -> None:
    class Flaky(FakeEngine):
        def __init__(self, failures: int) -> None:
            super().__init__()
            self.failures = failures

        def decide(self, state: Any, questions: Any = None, **kw: Any) -> DecisionResult:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("engine restarting")
            return super().decide(state, questions, **kw)

    retried = make_router(Flaky(1)).with_retry(
        retry_if_exception_type=(ConnectionError,),
        stop_after_attempt=2,
        wait_exponential_jitter=False,
    )
    assert retried.invoke("refund") == "billing:refund"
    fallen = make_router(Flaky(5)).with_fallbacks([RunnableLambda(lambda x: f"rules:{x}")])
    assert fallen.invoke("refund") == "rules:refund"


# -- LangGraph ------------------------------------------------------------------------


class Ticket(TypedDict, total=False):
    ticket: str
    handled: list[str]


def _node(name: str) -> Any:
    return lambda state: {"handled": [*state.get("handled", []), name]}


def test_path_in_a_compiled_state_graph() -> None:
    graph = StateGraph(Ticket)
    for name in ["intake", *ROUTES, "human"]:
        graph.add_node(name, _node(name))
    graph.add_edge(START, "intake")
    add_clef_edges(
        graph,
        "intake",
        ROUTES,
        fallback="human",
        min_confidence=0.5,
        state_from="ticket",
        engine=FakeEngine(),
    )
    for name in [*ROUTES, "human"]:
        graph.add_edge(name, END)
    app = graph.compile()
    assert app.invoke({"ticket": "refund invoice charge"})["handled"] == ["intake", "billing"]
    assert app.invoke({"ticket": "hello there"})["handled"] == ["intake", "human"]
    out = asyncio.run(app.ainvoke({"ticket": "crash bug login error"}))
    assert out["handled"] == ["intake", "technical"]


class FanState(TypedDict, total=False):
    ticket: str
    ran: Annotated[list[str], operator.add]


def test_multi_label_path_fans_out() -> None:
    def node(name: str) -> Any:
        return lambda state: {"ran": [name]}

    path = clef_path(
        {
            "refund": "refund invoice money",
            "escalate": {"instructions": "is the customer angry?", "criteria": {"true": "angry"}},
            "translate": "spanish french language",
        },
        multi=True,
        threshold=0.6,
        fallback="triage",
        state_from="ticket",
        engine=FakeEngine(),
    )
    assert sorted(path.invoke({"ticket": "angry about my refund"})) == ["escalate", "refund"]
    graph = StateGraph(FanState)
    graph.add_node("start", lambda s: {"ran": ["start"]})
    for name in ["refund", "escalate", "translate", "triage"]:
        graph.add_node(name, node(name))
        graph.add_edge(name, END)
    graph.add_edge(START, "start")
    graph.add_conditional_edges("start", path, path.destinations)
    app = graph.compile()
    ran = app.invoke({"ticket": "angry about my refund", "ran": []})["ran"]
    assert ran[0] == "start" and sorted(ran[1:]) == ["escalate", "refund"]
    assert app.invoke({"ticket": "hello", "ran": []})["ran"] == ["start", "triage"]


def test_path_from_a_router_uses_its_question_and_threshold() -> None:
    pinned = FakeEngine(fixed={"route": "sales"}, fixed_probability=0.55)
    router = make_router(pinned, min_confidence=0.6)
    assert clef_path(router, fallback="human").invoke("x") == "human"
    assert clef_path(router, fallback="human", nodes={"sales": "sales_team"}).destinations == [
        "billing",
        "technical",
        "sales_team",
        "human",
    ]


# -- missing dependency ---------------------------------------------------------------


def test_missing_langchain_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name.startswith("clef_agents.langchain"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "langchain_core", None)
    with pytest.raises(MissingDependencyError) as info:
        importlib.import_module("clef_agents.langchain")
    assert "pip install 'clef-agents[langchain]'" in str(info.value)
    assert info.value.package == "langchain-core"
