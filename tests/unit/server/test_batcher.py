"""MicroBatcher: how batches fill, and the bounded queue (no model, no HTTP)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from clef_agents.server.batcher import FILL_CAP_S, MicroBatcher, Overloaded, ShuttingDown


class Recorder:
    """A run_batch that records each batch and answers every item with itself."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[Any]] = []
        self.delay_s = delay_s

    def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        time.sleep(self.delay_s)
        return [f"answer {item}" for item in items]


async def _trickle(batcher: MicroBatcher, n: int, gap_s: float) -> list[Any]:
    """Submit ``n`` single items ``gap_s`` apart; return their answers in order."""
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(batcher.submit([i])))
        await asyncio.sleep(gap_s)
    return [r for [r] in await asyncio.gather(*tasks)]


async def test_a_batch_keeps_filling_while_requests_keep_arriving() -> None:
    # 12 arrivals 10 ms apart take 110 ms, twice one 50 ms wait (a window counted from the
    # first arrival would split them); every gap is shorter than the wait: one batch.
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=64, max_wait_ms=50)
    await batcher.start()
    answers = await _trickle(batcher, 12, 0.01)
    await batcher.stop()
    assert answers == [f"answer {i}" for i in range(12)]
    assert [len(b) for b in run.batches] == [12]


async def test_a_gap_longer_than_the_wait_closes_the_batch() -> None:
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=64, max_wait_ms=5)
    await batcher.start()
    first = asyncio.gather(*(batcher.submit([i]) for i in range(3)))
    await asyncio.sleep(0.1)  # 20x the wait: the first three must already be answered
    assert first.done()
    await batcher.submit([3])
    await batcher.stop()
    assert [len(b) for b in run.batches] == [3, 1]


async def test_a_steady_stream_is_cut_at_the_fill_cap() -> None:
    # Arrivals every 2 ms for ~3x the cap never leave a 10 ms gap, yet no batch may wait
    # longer than the cap to start: there must be several batches, none lost.
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=10_000, max_wait_ms=10)
    await batcher.start()
    n = int(3 * max(FILL_CAP_S, 0.1) / 0.002)
    answers = await _trickle(batcher, n, 0.002)
    await batcher.stop()
    assert answers == [f"answer {i}" for i in range(n)]
    assert len(run.batches) >= 2
    assert sum(len(b) for b in run.batches) == n


async def test_max_batch_bounds_every_batch() -> None:
    run = Recorder(delay_s=0.01)
    batcher = MicroBatcher(run, max_batch=4, max_wait_ms=50)
    await batcher.start()
    answers = await asyncio.gather(*(batcher.submit([i]) for i in range(10)))
    await batcher.stop()
    assert [a for [a] in answers] == [f"answer {i}" for i in range(10)]
    assert max(len(b) for b in run.batches) == 4


async def test_a_full_queue_refuses_with_a_retry_hint() -> None:
    run = Recorder(delay_s=0.2)
    batcher = MicroBatcher(run, max_batch=1, max_wait_ms=0, max_queue=2)
    await batcher.start()
    busy = asyncio.create_task(batcher.submit(["running"]))
    await asyncio.sleep(0.05)  # the model thread has taken it
    queued = [asyncio.create_task(batcher.submit([f"q{i}"])) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as info:
        await batcher.submit(["one too many"])
    assert info.value.retry_after_s > 0 and info.value.depth == 2
    assert await busy == ["answer running"]
    assert [await q for q in queued] == [["answer q0"], ["answer q1"]]
    await batcher.stop()


async def test_stop_answers_running_and_queued_work_at_its_deadline() -> None:
    run = Recorder(delay_s=1.0)
    batcher = MicroBatcher(run, max_batch=1, max_wait_ms=0)
    await batcher.start()
    jobs = [asyncio.create_task(batcher.submit([i])) for i in range(3)]
    while not run.batches:  # item 0 runs, items 1 and 2 wait
        await asyncio.sleep(0.01)
    started = time.monotonic()
    await batcher.stop(0.2)
    results = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 2)
    assert time.monotonic() - started < 0.6, "nobody waits for the running forward"
    assert all(isinstance(r, ShuttingDown) for r in results)
    assert run.batches == [[0]], "the queued items never ran"
    # The model thread is a daemon: a forward still running cannot hold the process open.
    assert all(t.daemon for t in threading.enumerate() if t.name == "clef-server-model")


async def test_stopping_runs_a_filling_batch_at_once() -> None:
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=64, max_wait_ms=5000)
    await batcher.start()
    jobs = asyncio.gather(*(batcher.submit([i]) for i in range(2)))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await batcher.stop(3.0)
    assert [r for [r] in await jobs] == ["answer 0", "answer 1"]
    assert time.monotonic() - started < 0.5, "a 5 s filling window is not waited out"


async def test_a_cancelled_wait_drops_the_job_from_the_queue() -> None:
    run = Recorder(delay_s=0.3)
    batcher = MicroBatcher(run, max_batch=1, max_wait_ms=0)
    await batcher.start()
    first = asyncio.create_task(batcher.submit(["first"]))
    while not run.batches:
        await asyncio.sleep(0.01)
    left = asyncio.create_task(batcher.submit(["left"]))
    await asyncio.sleep(0.05)
    left.cancel()  # what a disconnected HTTP client's handler does
    assert await first == ["answer first"]
    await asyncio.sleep(0.1)
    await batcher.stop()
    assert run.batches == [["first"]]
