"""LlamaIndex adapters (extra ``[llamaindex]``).

- :class:`ClefSelector` / :class:`ClefMultiSelector`: selectors for ``RouterQueryEngine``
  and ``RouterRetriever`` that pick tools by calibrated probability.
- :func:`clef_router_step`: a Workflows step that emits a different event per decision.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> from llama_index.core.tools import ToolMetadata
    >>> selector = ClefSelector(engine=FakeEngine())
    >>> result = selector.select([ToolMetadata(name="billing", description="refund invoice"),
    ...                           ToolMetadata(name="tech", description="bug crash")],
    ...                          "a crash bug on login")
    >>> result.ind, result.selections[0].probability > 0.5
    (1, True)
"""

from __future__ import annotations

from clef_engine.errors import require

require(
    "llama_index.core",
    package="llama-index-core",
    extra="llamaindex",
    feature="clef_agents.llama_index",
)

from clef_agents.llama_index.selector import (  # noqa: E402
    ClefMultiSelector,
    ClefSelection,
    ClefSelector,
    ClefSelectorResult,
    LowConfidenceError,
)
from clef_agents.llama_index.workflow import ClefRouteEvent, clef_router_step  # noqa: E402

__all__ = [
    "ClefMultiSelector",
    "ClefRouteEvent",
    "ClefSelection",
    "ClefSelector",
    "ClefSelectorResult",
    "LowConfidenceError",
    "clef_router_step",
]
