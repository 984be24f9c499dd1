"""clef-agents: calibrated decisions for agent graphs.

Re-exports the engine's public API, so ``from clef_agents import DecisionEngine, Choice``
is all most users need. Framework layers live in submodules (``clef_agents.langchain``,
``clef_agents.llama_index``, ...) and import their framework only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import clef_engine as _engine
from clef_engine import __all__ as _engine_all
from clef_engine import __version__

if TYPE_CHECKING:
    from clef_engine import *  # noqa: F403 - the engine's public API is ours

__all__ = [*_engine_all]
_ = __version__


def __getattr__(name: str) -> Any:
    # Forwarded lazily: DecisionEngine and friends import torch only when first used.
    if name in _engine_all:
        value = getattr(_engine, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'clef_agents' has no attribute {name!r}")
