"""Retry and rule-based fallback around any engine (framework-neutral).

:class:`ResilientEngine` wraps a :class:`~engine.DecisionEngine` (or a
:class:`~clef_agents.fake.FakeEngine`) and keeps its ``decide`` surface, so every adapter
takes it in place of the engine; :class:`RuleFallback` answers when the model cannot.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> safe = ResilientEngine(FakeEngine(), fallback=RuleFallback(default="human"),
    ...                        min_confidence=0.6, timeout_s=2.0)
    >>> safe.counters.as_dict()["calls"]
    0
"""

from __future__ import annotations

from clef_agents.resilience.rules import Rule, RuleFallback
from clef_agents.resilience.wrapper import (
    REASONS,
    CallTimeout,
    Counters,
    ResilientEngine,
    is_out_of_memory,
    is_transient,
    move_to_cpu,
)

__all__ = [
    "REASONS",
    "CallTimeout",
    "Counters",
    "ResilientEngine",
    "Rule",
    "RuleFallback",
    "is_out_of_memory",
    "is_transient",
    "move_to_cpu",
]
