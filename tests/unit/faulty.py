"""A fault-injecting engine for resilience tests: behaviour chosen by words in the state.

- ``boom``: raises a non-transient ``RuntimeError``;
- ``flaky``: raises ``ConnectionError`` the first ``flaky_failures`` times it is seen;
- ``hang``: blocks until the test releases it (or 5 s);
- ``nan``: returns NaN probabilities;
- batches larger than ``max_batch`` raise an ``OutOfMemoryError`` (named like torch's)
  while the engine is "on the GPU"; ``oom_on_gpu`` makes every GPU call run out.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from clef_agents.fake import FakeEngine
from clef_engine.schema.answers import ChoiceAnswer, DecisionResult
from clef_engine.schema.request import DecisionRequest

ROUTE = {
    "route": {
        "type": "choice",
        "instructions": "Route the support ticket",
        "criteria": {
            "billing": "refund invoice payment charge",
            "technical": "bug error crash login",
            "human": "anything else",
        },
    }
}


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.cuda.OutOfMemoryError``, which is what the wrapper looks for."""


class FaultyEngine:
    def __init__(
        self,
        *,
        max_batch: int | None = None,
        oom_on_gpu: bool = False,
        flaky_failures: int = 1,
    ) -> None:
        self.inner = FakeEngine()
        self.model_version = self.inner.model_version
        self.model_name = self.inner.model_name
        self.device = "cuda:0"
        self.max_batch = max_batch
        self.oom_on_gpu = oom_on_gpu
        self.flaky_failures = flaky_failures
        self.seen: Counter[str] = Counter()
        self.batches: list[list[str]] = []
        self.release = threading.Event()

    def to(self, device: str) -> FaultyEngine:
        self.device = device
        return self

    def _on_gpu(self) -> bool:
        return not self.device.startswith("cpu")

    def _one(self, item: Any) -> DecisionResult:
        request = DecisionRequest.parse(item)
        text = str(request.state)
        self.seen[text] += 1
        if self.oom_on_gpu and self._on_gpu():
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if "hang" in text:
            self.release.wait(5)
        if "boom" in text:
            raise RuntimeError("kaput")
        if "flaky" in text and self.seen[text] <= self.flaky_failures:
            raise ConnectionError("worker went away")
        result = self.inner.decide(request)
        if "nan" in text:
            answer = result.answers["route"]
            assert isinstance(answer, ChoiceAnswer)
            answer.probabilities = dict.fromkeys(answer.probabilities, float("nan"))
        return result

    def decide(self, state: Any, questions: Any = None, **_: Any) -> DecisionResult:
        self.batches.append([str(getattr(state, "state", state))])
        return self._one(state if questions is None else {"state": state, "questions": questions})

    def decide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        items = [s if questions is None else {"state": s, "questions": questions} for s in states]
        self.batches.append([str(DecisionRequest.parse(i).state) for i in items])
        if self.max_batch is not None and self._on_gpu() and len(items) > self.max_batch:
            raise OutOfMemoryError("CUDA out of memory (batch too large)")
        out: list[Any] = []
        for item in items:
            try:
                out.append(self._one(item))
            except Exception as exc:
                if not return_exceptions:
                    raise
                out.append(exc)
        return out

    async def adecide(self, state: Any, questions: Any = None, **_: Any) -> DecisionResult:
        if "hang" in str(getattr(state, "state", state)):
            await asyncio.sleep(5)
        return self.decide(state, questions)

    async def adecide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        if any("hang" in str(getattr(s, "state", s)) for s in states):
            await asyncio.sleep(5)
        return self.decide_batch(states, questions, return_exceptions=return_exceptions)
