"""clef-agents: calibrated decisions for agent graphs.

Re-exports the engine's public API, so ``from clef_agents import DecisionEngine, Choice``
is all most users need. Framework layers live in submodules (``clef_agents.langchain``,
``clef_agents.llama_index``, ...) and import their framework only when used.
"""

from __future__ import annotations

from engine import *  # noqa: F403 - the engine's public API is ours
from engine import __all__ as _engine_all
from engine import __version__

__all__ = [*_engine_all]
_ = __version__
