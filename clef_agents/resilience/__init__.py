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

from clef_agents.resilience.checks import InvalidOutputError, result_problem
from clef_agents.resilience.counters import REASONS, Counters
from clef_agents.resilience.rules import MIN_PROBABILITY, Rule, RuleFallback
from clef_agents.resilience.workers import CallTimeout, WorkersBusy
from clef_agents.resilience.wrapper import (
    ResilientEngine,
    is_out_of_memory,
    is_transient,
    move_to_cpu,
)

__all__ = [
    "MIN_PROBABILITY",
    "REASONS",
    "CallTimeout",
    "Counters",
    "InvalidOutputError",
    "ResilientEngine",
    "Rule",
    "RuleFallback",
    "WorkersBusy",
    "is_out_of_memory",
    "is_transient",
    "move_to_cpu",
    "result_problem",
]
