"""A LlamaIndex RouterQueryEngine whose selector is a calibrated decision, not an LLM call.

Three in-memory indexes (built with llama-index's own MockEmbedding and MockLLM, so
nothing leaves the machine) sit behind a ``RouterQueryEngine``; ``ClefSelector`` picks
the index for each query on the embedded model and reports the probabilities.

Run: python examples/llama_index_router.py
"""

from __future__ import annotations

from typing import Any

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RouterQueryEngine
from llama_index.core.tools import QueryEngineTool, ToolMetadata

from clef_agents.llama_index import ClefSelector

DOCS = {
    "billing_docs": (
        "Billing: refunds, invoices, charges and payment methods.",
        "Refunds are issued to the original payment method within five business days.",
    ),
    "api_docs": (
        "API reference: endpoints, authentication tokens, rate limits and error codes.",
        "Requests over 100 per minute receive HTTP 429; retry after the given delay.",
    ),
    "hr_policies": (
        "HR policies: vacation, parental leave, expenses and remote work.",
        "Employees get 25 vacation days a year plus public holidays.",
    ),
}

QUERIES = [
    "How long does a refund take to reach my card?",
    "What happens when I exceed the API rate limit?",
    "How many vacation days do I get?",
]


def build(engine: Any, *, min_confidence: float = 0.0) -> RouterQueryEngine:
    tools = []
    for name, (description, text) in DOCS.items():
        index = VectorStoreIndex.from_documents(
            [Document(text=text)], embed_model=MockEmbedding(embed_dim=8)
        )
        tools.append(
            QueryEngineTool(
                query_engine=index.as_query_engine(llm=MockLLM()),
                metadata=ToolMetadata(name=name, description=description),
            )
        )
    selector = ClefSelector(engine=engine, min_confidence=min_confidence, default_index=0)
    return RouterQueryEngine(selector=selector, query_engine_tools=tools, llm=MockLLM())


def main(engine: Any = None) -> list[dict[str, Any]]:
    if engine is None:
        from clef_agents import DecisionEngine

        engine = DecisionEngine()
    router = build(engine)
    names = list(DOCS)
    out = []
    for query in QUERIES:
        response = router.query(query)
        result = response.metadata["selector_result"]
        chosen = names[result.ind]
        out.append(
            {
                "query": query,
                "tool": chosen,
                "probabilities": dict(zip(names, result.probabilities, strict=True)),
                "sources": [n.node.get_content() for n in response.source_nodes],
            }
        )
        print(f"{chosen:>12} p={result.selections[0].probability:.2f}  <- {query}")
    return out


if __name__ == "__main__":
    main()
