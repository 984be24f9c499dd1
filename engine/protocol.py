"""The engine surface that the framework layers program against.

:class:`Engine` is what routers, selectors, workflow nodes, the CLI and the server call:
:class:`~clef_engine.runtime.engine.DecisionEngine` satisfies it, and so do the
torch-free :class:`clef_agents.fake.FakeEngine` and the
:class:`clef_agents.resilience.ResilientEngine` wrapper, so each can stand in for the
others. Importing this module does not import torch.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> from clef_engine import Engine
    >>> isinstance(FakeEngine(), Engine)
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from clef_engine.schema.questions import _Question

if TYPE_CHECKING:
    from clef_engine.schema.answers import DecisionResult

Questions = Mapping[str, _Question | Mapping[str, Any]]
"""Questions keyed by id: question objects or wire-format dicts."""


@runtime_checkable
class Engine(Protocol):
    """What a decision engine offers its callers (sync and async, single and batch).

    ``decide_batch`` answers every item in order; with ``return_exceptions=True`` an item
    that fails holds its exception in its slot instead of raising.
    """

    @property
    def model_name(self) -> str:
        """Name reported as ``model`` when a request names none."""
        ...

    @property
    def model_version(self) -> str | None:
        """Version reported as ``x_model_version`` (``None``: no model loaded yet)."""
        ...

    def decide(
        self,
        state: Any,
        questions: Questions | None = None,
        *,
        assets: Mapping[str, Any] | None = None,
    ) -> DecisionResult:
        """Answer ``questions`` about ``state`` (or a whole request when ``questions`` is
        omitted)."""
        ...

    def decide_batch(
        self,
        states: Sequence[Any],
        questions: Questions | None = None,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Answer many states, in order: a result (or, with ``return_exceptions``, an
        exception) per item."""
        ...

    async def adecide(
        self,
        state: Any,
        questions: Questions | None = None,
        *,
        assets: Mapping[str, Any] | None = None,
    ) -> DecisionResult:
        """Async :meth:`decide`."""
        ...

    async def adecide_batch(
        self,
        states: Sequence[Any],
        questions: Questions | None = None,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Async :meth:`decide_batch`."""
        ...


__all__ = ["Engine", "Questions"]
