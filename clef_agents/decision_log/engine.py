"""LoggedEngine: any engine, with every decision it makes recorded in a DecisionLog."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clef_agents.decision_log.log import DecisionLog
from clef_engine.protocol import Engine
from clef_engine.schema.answers import DecisionResult


class LoggedEngine:
    """Wraps an engine and records each result in ``log``; keeps the engine's surface.

    Works on a ``DecisionEngine``, a ``ResilientEngine`` (wrap it, not the engine inside
    it, so fallback answers are logged with their source), a ``FakeEngine`` or anything
    with ``decide``/``decide_batch``; routers and selectors take it as their ``engine``.
    Recording only queues references (see :class:`DecisionLog`), so the wrapped calls
    cost what the engine's do. Items that fail are not logged.

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> import tempfile, os
        >>> log = DecisionLog(os.path.join(tempfile.mkdtemp(), "d.sqlite"))
        >>> engine = LoggedEngine(FakeEngine(), log)
        >>> engine.decide_batch(["refund", "crash"], {"q": {"type": "noul",
        ...     "instructions": "Is it about money?"}})[0].x_source
        'model'
        >>> log.close(); log.stats["written"]
        2
    """

    def __init__(self, engine: Engine, log: DecisionLog) -> None:
        self.engine = engine
        self.log = log

    def __getattr__(self, name: str) -> Any:
        # model_version, model_name, counters, device, to(), save_pretrained...
        if name.startswith("_") or name in ("engine", "log"):
            raise AttributeError(name)
        return getattr(self.engine, name)

    @staticmethod
    def _assets(assets: Mapping[str, Any] | None) -> dict[str, Any]:
        return {} if assets is None else {"assets": assets}

    def decide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        result: DecisionResult = self.engine.decide(state, questions, **self._assets(assets))
        self.log.record(state, questions, result)
        return result

    async def adecide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        result: DecisionResult = await self.engine.adecide(state, questions, **self._assets(assets))
        self.log.record(state, questions, result)
        return result

    def decide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        results: list[Any] = self.engine.decide_batch(
            states, questions, return_exceptions=return_exceptions
        )
        self.log.record_many(states, questions, results)
        return results

    async def adecide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        results: list[Any] = await self.engine.adecide_batch(
            states, questions, return_exceptions=return_exceptions
        )
        self.log.record_many(states, questions, results)
        return results

    def close(self) -> None:
        """Close the wrapped engine (the log stays open: it may be shared)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
