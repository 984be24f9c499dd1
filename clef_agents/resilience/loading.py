"""Lazy engine loading that survives failures and retries with exponential backoff.

A model dir that is missing, corrupt or half-copied must not take the service down: the
fallback answers meanwhile, and the load is tried again later (after ``retry_s``, then
twice as long each time up to ``max_retry_s``), so a dir fixed later is picked up
without a restart.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> attempts = []
    >>> def factory():
    ...     attempts.append(1)
    ...     if len(attempts) < 2:
    ...         raise OSError("model dir is being copied")
    ...     return FakeEngine()
    >>> now = [0.0]
    >>> loader = EngineLoader(factory, retry_s=1.0, max_retry_s=8.0, clock=lambda: now[0])
    >>> loader.get() is None, loader.next_attempt_at
    (True, 1.0)
    >>> now[0] = 1.0
    >>> type(loader.get()).__name__, loader.error
    ('FakeEngine', None)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine

logger = logging.getLogger(__name__)


def _check_delay(value: float | None, name: str, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise InvalidRequestError(
            f"{name} must be a finite number of seconds > 0; got {value!r}", field=name, limit=0
        )
    return number


class EngineLoader:
    """Calls ``factory`` for the engine; after a failure, tries again with backoff.

    Any exception from ``factory`` (``ModelLoadError``, ``OSError``, ``ImportError``, or
    the ``ValueError``/``TypeError`` of a corrupt file) counts as a failed load, and so
    does a factory that returns something without ``decide``. The first load blocks
    concurrent callers until it ends; a retry runs in one caller while the others go on
    without an engine.

    Args:
        factory: Builds the engine (no arguments).
        retry_s: Wait after the first failure; it doubles after each further failure.
            ``None``: a failed load is final.
        max_retry_s: The longest wait between two attempts.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        retry_s: float | None = 1.0,
        max_retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factory = factory
        self.retry_s = _check_delay(retry_s, "load_retry_s", allow_none=True)
        max_retry = _check_delay(max_retry_s, "max_load_retry_s", allow_none=False)
        assert max_retry is not None
        self.max_retry_s = max_retry
        if self.retry_s is not None and self.max_retry_s < self.retry_s:
            raise InvalidRequestError(
                f"max_load_retry_s ({max_retry_s}) must be >= load_retry_s ({retry_s})",
                field="max_load_retry_s",
                limit=self.retry_s,
            )
        self.clock = clock
        self.engine: Engine | None = None
        self.error: BaseException | None = None
        """Why the last attempt failed; ``None`` once an attempt succeeds."""
        self.failures = 0
        """Failed attempts since the last success."""
        self.next_attempt_at: float | None = None
        """``clock()`` time from which the next attempt may run; ``None``: never."""
        self._lock = threading.Lock()

    def _due(self) -> bool:
        if self.error is None:
            return True
        return self.next_attempt_at is not None and self.clock() >= self.next_attempt_at

    def get(self) -> Any:
        """The engine, loading it when due; ``None`` while it cannot load."""
        if self.engine is not None:
            return self.engine
        if self.error is None:
            self._lock.acquire()  # the first load: wait for it
        elif not self._due() or not self._lock.acquire(blocking=False):
            return None  # not due yet, or another caller is retrying right now
        try:
            if self.engine is None and self._due():
                self._attempt()
        finally:
            self._lock.release()
        return self.engine

    def _attempt(self) -> None:
        try:
            engine = self.factory()
            if not hasattr(engine, "decide"):
                raise TypeError(
                    f"the engine factory returned a {type(engine).__name__}, which has no decide()"
                )
        except Exception as exc:
            self.failures += 1
            self.error = exc
            if self.retry_s is None:
                self.next_attempt_at = None
                when = "no retry (load_retry_s=None)"
            else:
                delay = min(self.retry_s * 2.0 ** min(self.failures - 1, 60), self.max_retry_s)
                self.next_attempt_at = self.clock() + delay
                when = f"next try in {delay:.3g} s"
            logger.warning(
                "the engine failed to load (attempt %d: %s: %s); the fallback answers, %s",
                self.failures,
                type(exc).__name__,
                exc,
                when,
            )
            return
        if self.failures:
            logger.info("the engine loaded after %d failed attempts", self.failures)
        self.engine, self.error, self.failures, self.next_attempt_at = engine, None, 0, None
