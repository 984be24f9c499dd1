"""ClefSelector / ClefMultiSelector inside real LlamaIndex routers, and the Workflows step."""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RouterQueryEngine
from llama_index.core.retrievers import RouterRetriever
from llama_index.core.tools import QueryEngineTool, RetrieverTool, ToolMetadata
from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step

from clef_agents.fake import FakeEngine
from clef_agents.llama_index import (
    ClefMultiSelector,
    ClefRouteEvent,
    ClefSelector,
    ClefSelectorResult,
    LowConfidenceError,
    clef_router_step,
)
from clef_engine.errors import InvalidRequestError, MissingDependencyError

TOPICS = {
    "billing": ("refund invoice payment charge", "Refunds take five business days."),
    "technical": ("bug error crash login", "Clear the cache and restart the app."),
    "sales": ("pricing demo plan upgrade", "The team plan costs ten dollars a seat."),
}


def _index(text: str) -> VectorStoreIndex:
    return VectorStoreIndex.from_documents([Document(text=text)], embed_model=MockEmbedding(8))


@pytest.fixture(scope="module")
def indexes() -> dict[str, VectorStoreIndex]:
    return {name: _index(doc) for name, (_, doc) in TOPICS.items()}


def query_tools(indexes: dict[str, VectorStoreIndex]) -> list[QueryEngineTool]:
    return [
        QueryEngineTool(
            query_engine=indexes[name].as_query_engine(llm=MockLLM()),
            metadata=ToolMetadata(name=name, description=TOPICS[name][0]),
        )
        for name in TOPICS
    ]


def retriever_tools(indexes: dict[str, VectorStoreIndex]) -> list[RetrieverTool]:
    return [
        RetrieverTool(
            retriever=indexes[name].as_retriever(),
            metadata=ToolMetadata(name=name, description=TOPICS[name][0]),
        )
        for name in TOPICS
    ]


def test_router_query_engine_uses_the_selector(indexes: dict[str, VectorStoreIndex]) -> None:
    router = RouterQueryEngine(
        selector=ClefSelector(engine=FakeEngine()),
        query_engine_tools=query_tools(indexes),
        llm=MockLLM(),
    )
    response = router.query("the login page shows an error")
    assert [n.node.get_content() for n in response.source_nodes] == [TOPICS["technical"][1]]
    result = response.metadata["selector_result"]
    assert isinstance(result, ClefSelectorResult)
    assert result.ind == 1
    assert len(result.probabilities) == 3 and sum(result.probabilities) == pytest.approx(1.0)
    assert result.selections[0].probability == result.probabilities[1]
    assert "technical" in result.reason and "calibrated probabilities" in result.reason
    response = asyncio.run(router.aquery("I need a refund for this charge"))
    assert [n.node.get_content() for n in response.source_nodes] == [TOPICS["billing"][1]]


def test_router_retriever_with_multi_selector(indexes: dict[str, VectorStoreIndex]) -> None:
    retriever = RouterRetriever(
        selector=ClefMultiSelector(engine=FakeEngine(), threshold=0.2, max_outputs=2),
        retriever_tools=retriever_tools(indexes),
        llm=MockLLM(),
    )
    nodes = retriever.retrieve("refund my invoice for the crash bug")
    assert sorted(n.node.get_content() for n in nodes) == sorted(
        [TOPICS["billing"][1], TOPICS["technical"][1]]
    )
    nodes = asyncio.run(retriever.aretrieve("pricing for the team plan upgrade"))
    assert TOPICS["sales"][1] in [n.node.get_content() for n in nodes]


def test_multi_selector_threshold_order_and_cap() -> None:
    choices = [ToolMetadata(name=n, description=d) for n, (d, _) in TOPICS.items()]
    result = ClefMultiSelector(engine=FakeEngine(), threshold=0.0).select(choices, "crash")
    assert len(result.inds) == 3
    probs = [result.probabilities[i] for i in result.inds]
    assert probs == sorted(probs, reverse=True)
    capped = ClefMultiSelector(engine=FakeEngine(), threshold=0.0, max_outputs=1)
    assert capped.select(choices, "crash").inds == [result.inds[0]]


def test_low_confidence_default_or_error() -> None:
    choices = ["refund invoice", "crash bug"]
    pinned = FakeEngine(fixed={"route": "choice_0"}, fixed_probability=0.55)
    fallback = ClefSelector(engine=pinned, min_confidence=0.6, default_index=1)
    result = fallback.select(choices, "anything")
    assert result.ind == 1 and result.below_threshold
    assert result.reason.startswith("below threshold")
    with pytest.raises(LowConfidenceError) as info:
        ClefSelector(engine=pinned, min_confidence=0.6).select(choices, "anything")
    assert info.value.probabilities == pytest.approx([0.55, 0.45])
    assert ClefSelector(engine=pinned, min_confidence=0.5).select(choices, "x").ind == 0


def test_selector_prompt_mixin_surface() -> None:
    selector = ClefSelector(engine=FakeEngine())
    assert selector.get_prompts() == {}
    selector.update_prompts({})


def test_duplicate_and_missing_tool_names_stay_distinct() -> None:
    choices = [
        ToolMetadata(name="docs", description="refund"),
        ToolMetadata(name="docs", description="crash"),
        ToolMetadata(description="pricing"),
    ]
    result = ClefSelector(engine=FakeEngine()).select(choices, "crash")
    assert len(result.probabilities) == 3
    assert result.ind == 1


# -- Workflows ------------------------------------------------------------------------


class Billing(ClefRouteEvent):
    pass


class Technical(ClefRouteEvent):
    pass


class Human(ClefRouteEvent):
    pass


class SupportFlow(Workflow):
    @step
    async def billing(self, ev: Billing) -> StopEvent:
        return StopEvent(result={"route": "billing", "p": ev.probability, "state": ev.state})

    @step
    async def technical(self, ev: Technical) -> StopEvent:
        return StopEvent(result={"route": "technical", "p": ev.probability, "state": ev.state})

    @step
    async def human(self, ev: Human) -> StopEvent:
        return StopEvent(result={"route": ev.route, "p": ev.probability, "state": ev.state})


clef_router_step(
    SupportFlow,
    {name: desc for name, (desc, _) in TOPICS.items()},
    events={"billing": Billing, "technical": Technical},
    default=Human,
    min_confidence=0.5,
    engine=FakeEngine(),
)


def test_workflow_router_step_emits_one_event_per_decision() -> None:
    async def run(query: str) -> Any:
        return await SupportFlow(timeout=10).run(query=query)

    billing = asyncio.run(run("refund this invoice charge"))
    assert billing["route"] == "billing" and billing["p"] >= 0.5
    assert billing["state"] == "refund this invoice charge"
    assert asyncio.run(run("crash bug on login"))["route"] == "technical"
    # "sales" has no event of its own: the default takes it.
    assert asyncio.run(run("pricing demo plan"))["route"] == "default"


def test_workflow_router_step_validates_its_events() -> None:
    class Other(Workflow):
        @step
        async def done(self, ev: Human) -> StopEvent:
            return StopEvent(result=None)

    with pytest.raises(InvalidRequestError) as info:
        clef_router_step(Other, ["a", "b"], events={"c": Human}, default=Human)
    assert info.value.field == "events"
    with pytest.raises(InvalidRequestError) as info:
        clef_router_step(Other, ["a", "b"], events={"a": Human})
    assert info.value.field == "default"
    assert StartEvent  # the step consumes StartEvent by default


def test_missing_llama_index_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name.startswith("clef_agents.llama_index"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_index.core", None)
    with pytest.raises(MissingDependencyError) as info:
        importlib.import_module("clef_agents.llama_index")
    assert "pip install 'clef-agents[llamaindex]'" in str(info.value)
    assert info.value.package == "llama-index-core"
