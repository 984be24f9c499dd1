"""A bounded worker pool that runs sync engine calls under a time budget.

Python cannot kill a thread, so a call that outlives its budget keeps its worker until
the engine returns. :class:`TimeoutPool` therefore never queues: when every worker is
still busy (with calls that hang, or are merely slow), :meth:`TimeoutPool.run` raises
:class:`WorkersBusy` at once, and the caller answers from its fallback instead of
waiting out a budget behind calls that may never end.

Example:
    >>> pool = TimeoutPool(2)
    >>> pool.run(lambda: 41 + 1, timeout=1.0), pool.busy
    (42, 0)
    >>> pool.close()
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from clef_engine.errors import InvalidRequestError


class CallTimeout(TimeoutError):
    """A call to the engine took longer than the wrapper's ``timeout_s``."""


class WorkersBusy(RuntimeError):
    """Every timeout worker is still running an earlier call; the call was not queued."""


class TimeoutPool:
    """``size`` worker threads; a call runs only when one is free.

    Args:
        size: How many engine calls may run at once under a budget, hung ones included.
    """

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidRequestError(
                f"timeout_workers must be an integer >= 1; got {size!r}",
                field="timeout_workers",
                limit=1,
            )
        self.size = size
        self._busy = 0
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def busy(self) -> int:
        """Workers running a call now (calls past their budget count until they return)."""
        with self._lock:
            return self._busy

    def run(self, fn: Callable[[], Any], timeout: float) -> Any:
        """``fn()`` in a worker, waiting at most ``timeout`` seconds for it.

        Raises:
            WorkersBusy: All ``size`` workers are busy; ``fn`` did not run.
            CallTimeout: ``fn`` did not return in time (it keeps its worker until it does).
        """
        with self._lock:
            if self._busy >= self.size:
                raise WorkersBusy(
                    f"all {self.size} timeout workers are still running earlier calls "
                    "(a hung or slow engine); answered without queueing"
                )
            self._busy += 1
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.size, thread_name_prefix="clef-resilient"
                )
            pool = self._pool

        def job() -> Any:
            try:
                return fn()
            finally:
                self._release()

        try:
            future = pool.submit(job)
        except BaseException:
            self._release()
            raise
        # A job cancelled before it started (close(), or a timeout that won the race)
        # never reaches its ``finally``: release its worker here instead.
        future.add_done_callback(lambda f: self._release() if f.cancelled() else None)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CallTimeout(f"the call did not return within {timeout:.3g} s") from None

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1

    def close(self) -> None:
        """Stop the idle workers; calls still running finish in their own time."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
