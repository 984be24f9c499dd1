"""Custom callback events, dispatched only when some handler listens (they cost ~50 us)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.runnables import RunnableConfig


def listening(config: RunnableConfig) -> bool:
    callbacks = config.get("callbacks")
    if callbacks is None:
        return False
    if isinstance(callbacks, list):
        return bool(callbacks)
    return bool(getattr(callbacks, "handlers", None))


def emit(name: str, data: Callable[[], Any], config: RunnableConfig) -> None:
    if listening(config):
        dispatch_custom_event(name, data(), config=config)


async def aemit(name: str, data: Callable[[], Any], config: RunnableConfig) -> None:
    if listening(config):
        await adispatch_custom_event(name, data(), config=config)
