"""Counters of what :class:`~clef_agents.resilience.ResilientEngine` did, by reason.

Example:
    >>> counters = Counters()
    >>> counters.fallback("timeout")
    >>> counters.as_dict()["fallbacks"]["timeout"]
    1
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

REASONS = ("error", "timeout", "busy", "low_confidence", "invalid_output", "unavailable")
"""Why a fallback answered; the keys of :attr:`Counters.fallbacks`."""


@dataclass
class Counters:
    """What the wrapper did; read them, log them, export them.

    ``calls`` counts method calls, ``items`` the requests in them; ``model`` the answers
    the model gave; ``fallbacks`` the answers rules gave, by reason (:data:`REASONS`).
    """

    calls: int = 0
    items: int = 0
    model: int = 0
    retries: int = 0
    oom_splits: int = 0
    cpu_moves: int = 0
    errors: int = 0
    """Items returned as errors (bad input, or failures with no fallback configured)."""
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def fallback(self, reason: str) -> None:
        with self._lock:
            self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """A plain snapshot, e.g. for ``logger.info("%s", counters.as_dict())``."""
        with self._lock:
            return {
                "calls": self.calls,
                "items": self.items,
                "model": self.model,
                "retries": self.retries,
                "oom_splits": self.oom_splits,
                "cpu_moves": self.cpu_moves,
                "errors": self.errors,
                "fallbacks": dict(self.fallbacks),
            }
