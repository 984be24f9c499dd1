"""Helpers for in-process server tests (httpx over ASGI, no sockets)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle this ticket?",
    "criteria": {"billing": "Payments and refunds", "tech": "Bugs and outages", "sales": None},
}
NOUL = {"type": "noul", "instructions": "Does the customer want money back?"}
SCORE = {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}


def valid_request(state: Any = "I was charged twice, refund me") -> dict[str, Any]:
    return {
        "model": "jev-latest",
        "state": state,
        "questions": {"team": dict(CHOICE), "refund": dict(NOUL), "anger": dict(SCORE)},
    }


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://clef.test")


class SlowEngine:
    """Delegates to a real engine after a delay, and records each batch size."""

    def __init__(self, engine: Any, delay_s: float) -> None:
        self.engine = engine
        self.delay_s = delay_s
        self.model_name = engine.model_name
        self.model_version = engine.model_version
        self.batches: list[int] = []
        self.lock = threading.Lock()

    def decide_batch(self, items: list[Any], return_exceptions: bool = False) -> list[Any]:
        with self.lock:
            self.batches.append(len(items))
        time.sleep(self.delay_s)
        return self.engine.decide_batch(items, return_exceptions=return_exceptions)


@pytest.fixture()
def make_app(tiny_engine: Any) -> Any:
    from clef_agents.server import ServerConfig, create_app

    def make(engine: Any = None, **settings: Any) -> Any:
        return create_app(engine or tiny_engine, ServerConfig(**settings))

    return make


class Helpers:
    CHOICE = CHOICE
    NOUL = NOUL
    SCORE = SCORE
    valid_request = staticmethod(valid_request)
    client = staticmethod(client)
    SlowEngine = SlowEngine


@pytest.fixture()
def h() -> type[Helpers]:
    """Request builders and the in-process client, as one fixture."""
    return Helpers
