"""LangChain and LangGraph adapters (extra ``[langchain]``).

- :class:`ClefDecision`: a Runnable from a state to a :class:`DecisionResult`.
- :class:`ClefRouter`: decide, then run the chosen route with the original input.
- :func:`clef_path` / :func:`add_clef_edges`: LangGraph conditional-edge path functions.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> from langchain_core.runnables import RunnableLambda
    >>> router = ClefRouter({"billing": "refunds and invoices", "technical": "bugs"},
    ...     routes={"billing": RunnableLambda(lambda x: "to billing"),
    ...             "technical": RunnableLambda(lambda x: "to tech")},
    ...     engine=FakeEngine())
    >>> router.invoke("my invoice is wrong")
    'to billing'
"""

from __future__ import annotations

from clef_engine.errors import require

require(
    "langchain_core",
    package="langchain-core",
    extra="langchain",
    feature="clef_agents.langchain",
)

from clef_agents.langchain.decision import ClefDecision  # noqa: E402
from clef_agents.langchain.graph import add_clef_edges, clef_path  # noqa: E402
from clef_agents.langchain.router import ClefRouter, Routed  # noqa: E402

__all__ = ["ClefDecision", "ClefRouter", "Routed", "add_clef_edges", "clef_path"]
