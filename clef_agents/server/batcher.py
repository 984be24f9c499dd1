"""Micro-batching across concurrent requests on one model worker.

Requests queue up while the model is busy; when it is free, the worker takes up to
``max_batch`` of them. With fewer waiting it keeps filling while requests keep arriving:
a gap of ``max_wait_ms`` between arrivals closes the batch, and so does the fill cap
(:data:`FILL_CAP_S`). It answers them with one
``engine.decide_batch(..., return_exceptions=True)``: one padded forward, each item its
own answer or its own error, in order. The forward runs in a dedicated thread, never on
the event loop. The queue is bounded: past ``max_queue``
waiting items, :meth:`MicroBatcher.submit` raises :class:`Overloaded` at once (503).
A job whose caller stopped waiting (its task was cancelled, for example because the HTTP
client disconnected) is dropped from the queue, never computed. :meth:`MicroBatcher.stop`
answers whatever is still queued or running at its deadline with :class:`ShuttingDown`.

Example:
    >>> import asyncio
    >>> from clef_agents.fake import FakeEngine
    >>> engine, sizes = FakeEngine(), []
    >>> def run_batch(items):                       # one forward per batch
    ...     sizes.append(len(items))
    ...     return engine.decide_batch(items, return_exceptions=True)
    >>> route = {"type": "choice", "criteria": {"billing": "refund", "tech": "error"}}
    >>> async def serve(states):
    ...     batcher = MicroBatcher(run_batch, max_batch=32, max_wait_ms=2)
    ...     await batcher.start()
    ...     calls = [batcher.submit([{"state": s, "questions": {"route": route}}]) for s in states]
    ...     answers = await asyncio.gather(*calls)  # concurrent callers, one item each
    ...     await batcher.stop()
    ...     return [result["route"].choice for [result] in answers]
    >>> asyncio.run(serve(["refund me", "an error", "a refund error?"]))
    ['billing', 'tech', 'billing']
    >>> sizes                                       # three requests, one batch
    [3]
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol

FILL_CAP_S = 0.1
FILL_CAP_WAITS = 10
"""A filling batch waits through gaps of up to ``max_wait_ms`` between arrivals, but never
longer in all than ``max(FILL_CAP_S, FILL_CAP_WAITS * max_wait)`` after it opened. Under
64 closed-loop clients the replies come back over tens of milliseconds (the event loop
writes and parses them one by one); a fixed 2 ms window from the first arrival split them
into batches of ~60 and ~4, each costing a full forward."""

RunBatch = Callable[[list[Any]], Sequence[Any]]
"""Answers a list of requests in order, each slot a result or an exception."""


class Overloaded(Exception):
    """The queue is full; retry after ``retry_after_s`` seconds."""

    def __init__(self, retry_after_s: float, depth: int) -> None:
        super().__init__(f"the server is overloaded ({depth} requests queued)")
        self.retry_after_s = retry_after_s
        self.depth = depth


class ShuttingDown(Exception):
    """The batcher is stopping and takes no new work."""


class BatchObserver(Protocol):
    def batch_done(self, size: int, seconds: float) -> None: ...

    def queue_depth(self, depth: int) -> None: ...


class _DaemonWorker(Executor):
    """One daemon thread running submitted calls in order.

    A ``ThreadPoolExecutor`` thread is joined at interpreter exit, so a forward still running
    when the drain deadline passes would hold the process past ``--drain-timeout``; the
    result of such a forward is thrown away anyway.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._calls.put(None)
        if wait:
            self._thread.join()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args, kwargs = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)


@dataclass
class _Job:
    items: list[Any]
    future: asyncio.Future[list[Any]]
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    arrived: float = 0.0

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)
        self.remaining = len(self.items)


class MicroBatcher:
    """Collects requests into batches for one model worker.

    Args:
        run_batch: ``engine.decide_batch``-like callable, run in a worker thread;
            called as ``run_batch(items)`` and must return one slot per item.
        max_batch: Most items per forward; 1 disables batching.
        max_wait_ms: The gap between arrivals that closes a filling batch.
        max_queue: Most items waiting before :meth:`submit` sheds load.
        observer: Receives batch sizes, durations and the queue depth (metrics).
    """

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch: int = 64,
        max_wait_ms: float = 2.0,
        max_queue: int = 256,
        observer: BatchObserver | None = None,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch = max(1, int(max_batch))
        self.max_wait_s = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_queue = max(1, int(max_queue))
        self._observer = observer
        self._pending: deque[tuple[_Job, int]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: _DaemonWorker | None = None
        self._running: list[tuple[_Job, int]] = []
        self._closing = False
        self._busy = False
        self._free_since = 0.0
        self._item_seconds = 0.01  # running estimate of model time per item, for Retry-After

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._executor = _DaemonWorker("clef-server-model")
        self._closing = False
        self._task = asyncio.create_task(self._loop(), name="clef-micro-batcher")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking work, finish what is queued (up to ``timeout_s``), then stop.

        What is still queued or running at the deadline is answered with
        :class:`ShuttingDown` at once (a running forward finishes in its thread, unheard).
        """
        self._closing = True
        if self._task is None:
            return
        assert self._wake is not None
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        gone = ShuttingDown("the server is shutting down; retry on another replica")
        for job, _ in [*self._running, *self._pending]:
            if not job.future.done():
                job.future.set_exception(gone)
        self._running = []
        self._pending.clear()
        self._report_depth()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # -- state --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Items waiting for the model (not counting the batch being run)."""
        return len(self._pending)

    @property
    def idle(self) -> bool:
        return not self._pending and not self._busy

    def retry_after_s(self) -> float:
        """How long until the current queue has likely drained."""
        return max(0.05, min(30.0, (self.depth + self.max_batch) * self._item_seconds))

    # -- work ---------------------------------------------------------------------------

    async def submit(self, items: Sequence[Any]) -> list[Any]:
        """Answer ``items`` (results or exceptions, in order); raises :class:`Overloaded`."""
        if self._closing or self._task is None or self._wake is None:
            raise ShuttingDown("the server is shutting down")
        if not items:
            return []
        if self.depth + len(items) > self.max_queue and (self.depth > 0 or self._busy):
            raise Overloaded(self.retry_after_s(), self.depth)
        loop = asyncio.get_running_loop()
        job = _Job(list(items), loop.create_future(), arrived=time.monotonic())
        self._pending.extend((job, i) for i in range(len(items)))
        self._report_depth()
        self._wake.set()
        return await job.future

    def _report_depth(self) -> None:
        if self._observer is not None:
            self._observer.queue_depth(len(self._pending))

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            first_job, _ = self._pending[0]
            if self.max_batch > 1 and not self._closing:
                # Wait while requests keep arriving (a gap of max_wait ends it), up to a cap.
                opened = max(first_job.arrived, self._free_since)
                cap = opened + max(FILL_CAP_S, FILL_CAP_WAITS * self.max_wait_s)
                while len(self._pending) < self.max_batch and not self._closing:
                    last = self._pending[-1][0].arrived
                    remaining = min(max(last, opened) + self.max_wait_s, cap) - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), remaining)
            batch: list[tuple[_Job, int]] = []
            while self._pending and len(batch) < self.max_batch:
                job, index = self._pending.popleft()
                if job.future.done():  # the caller went away; skip its work
                    continue
                batch.append((job, index))
            self._report_depth()
            if not batch:
                continue
            self._busy = True
            self._running = batch
            started = time.perf_counter()
            try:
                slots = await loop.run_in_executor(
                    self._executor, self._run_batch, [job.items[i] for job, i in batch]
                )
                if len(slots) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(slots)} slots for {len(batch)}")
            except Exception as exc:  # the whole forward failed: every item gets the error
                slots = [exc] * len(batch)
            finally:
                self._busy = False
            seconds = time.perf_counter() - started
            self._free_since = time.monotonic()
            self._item_seconds = 0.8 * self._item_seconds + 0.2 * (seconds / len(batch))
            if self._observer is not None:
                self._observer.batch_done(len(batch), seconds)
            self._running = []  # left set when cancelled, so that stop() can answer them
            for (job, index), slot in zip(batch, slots, strict=True):
                job.results[index] = slot
                job.remaining -= 1
                if job.remaining == 0 and not job.future.done():
                    job.future.set_result(job.results)
