"""DecisionLog: record every decision to one SQLite file, off the hot path.

``record`` only appends a reference to an in-memory queue and returns; a background
writer thread turns queued decisions into rows (redaction, state policy, JSON) and
commits them in batches. The queue is bounded: when it is full, ``record`` drops the
decision, counts it in ``stats["dropped"]`` and returns at once; it never blocks the
caller. ``flush()``, ``close()``, the context manager and an ``atexit`` hook write
everything queued, so a clean shutdown loses nothing.

Durability bound (kill -9): a decision is on disk once the writer has committed its
batch. The writer commits at most ``flush_interval_s`` after a decision was recorded
(sooner when ``batch_size`` decisions are waiting), and a committed batch survives the
process being killed (WAL, ``synchronous=NORMAL``). So a SIGKILL loses at most the
decisions recorded in the last ``flush_interval_s`` plus the time to write one batch:
the last unflushed batch. It never leaves a half-written row or a corrupt file.

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "decisions.sqlite")
    >>> with DecisionLog(path, state="hash") as log:
    ...     engine = log.wrap(FakeEngine())
    ...     _ = engine.decide("refund please", {"route": {"type": "choice",
    ...         "instructions": "Route", "criteria": ["billing", "tech"]}})
    >>> log.stats["written"]
    1
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import logging
import math
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clef_agents.decision_log.store import INSERT, DecisionLogError, apply_retention, connect
from clef_engine.protocol import Engine
from clef_engine.schema.answers import BoxAnswer, DecisionResult
from clef_engine.schema.render import canonical_json
from clef_engine.schema.request import DecisionRequest

logger = logging.getLogger(__name__)

STATE_POLICIES = ("full", "hash", "none")
"""What is stored of each state: ``full`` (the state, after ``redact``), ``hash`` (a
SHA-256, or an HMAC with ``hash_key``, of the redacted state) or ``none``."""

Redactor = Callable[[Any], Any]
"""A function of the state that returns what may be stored (``None``: store nothing)."""


class _Flush:
    """A marker in the queue: set once every decision queued before it is committed."""

    def __init__(self) -> None:
        self.done = threading.Event()


class _Entry:
    """Decisions queued by one call: the raw objects, serialised later by the writer."""

    __slots__ = ("latencies", "questions", "request_ids", "results", "states", "ts")

    def __init__(
        self,
        ts: float,
        states: Sequence[Any],
        questions: Any,
        results: Sequence[Any],
        request_ids: Sequence[str | None],
        latencies: Sequence[float | None],
    ) -> None:
        self.ts = ts
        self.states = states
        self.questions = questions
        self.results = results
        self.request_ids = request_ids
        self.latencies = latencies


class DecisionLog:
    """An opt-in log of decisions in one SQLite file (WAL mode), written in the background.

    Args:
        path: The SQLite file (created with its folder if missing; an existing log is
            appended to).
        state: ``"full"``, ``"hash"`` or ``"none"`` (see :data:`STATE_POLICIES`).
        redact: Applied to each state before the policy sees it (in the writer thread),
            e.g. to mask e-mail addresses; if it raises, that decision is not stored
            (counted in ``stats["errors"]``), never stored unredacted.
        hash_key: With ``state="hash"`` (and for ``state_hash`` under ``full``), an HMAC
            key, so a hash cannot be matched against guessed states without it.
        max_rows: Keep at most this many decisions (the oldest are deleted).
        max_age_s: Delete decisions older than this many seconds.
        queue_size: Decisions held in memory waiting for the writer; past it ``record``
            drops (and counts) instead of blocking.
        batch_size: Decisions per committed transaction, at most.
        flush_interval_s: The longest a recorded decision waits before its batch is
            committed (the kill -9 loss bound, see the module docstring).

    Raises:
        DecisionLogError: The path is a directory or a file that is not a decision log,
            or an argument is out of range (names which).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        state: str = "full",
        redact: Redactor | None = None,
        hash_key: bytes | str | None = None,
        max_rows: int | None = None,
        max_age_s: float | None = None,
        queue_size: int = 100_000,
        batch_size: int = 2_000,
        flush_interval_s: float = 0.2,
    ) -> None:
        if state not in STATE_POLICIES:
            raise DecisionLogError(f"state must be one of {list(STATE_POLICIES)}; got {state!r}")
        if redact is not None and not callable(redact):
            raise DecisionLogError("redact must be a function of the state")
        _check_positive("max_rows", max_rows, integer=True)
        _check_positive("max_age_s", max_age_s)
        _check_positive("queue_size", queue_size, integer=True)
        _check_positive("batch_size", batch_size, integer=True)
        _check_positive("flush_interval_s", flush_interval_s)
        self.path = Path(path)
        self.state_policy = state
        self.redact = redact
        self._key = hash_key.encode() if isinstance(hash_key, str) else hash_key
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.queue_size = int(queue_size)
        self.batch_size = int(batch_size)
        self.flush_interval_s = float(flush_interval_s)
        self._conn = connect(self.path)
        self._known_questions: set[str] = {
            r[0] for r in self._conn.execute("SELECT hash FROM questions")
        }
        self._question_cache: dict[int, tuple[Any, str, str]] = {}
        self._pending: deque[_Entry | _Flush] = deque()
        self._pending_count = 0
        self._cond = threading.Condition()
        self._closed = False
        self._stats = {"recorded": 0, "written": 0, "dropped": 0, "errors": 0, "deleted": 0}
        self._last_retention = 0.0
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._write_loop, name="clef-decision-log", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    # -- the hot path ------------------------------------------------------------------

    def record(
        self,
        state: Any,
        questions: Any,
        result: DecisionResult,
        *,
        request_id: str | None = None,
        latency_ms: float | None = None,
    ) -> bool:
        """Queue one decision; returns ``False`` when it was dropped (queue full, closed).

        ``state`` and ``questions`` are what the engine was given: a state and its
        questions, or a :class:`DecisionRequest` (or wire dict) with ``questions=None``.
        The objects are serialised later, in the writer thread: do not mutate them after
        recording.
        """
        return self.record_many([state], questions, [result], [request_id], [latency_ms]) == 1

    def record_many(
        self,
        states: Sequence[Any],
        questions: Any,
        results: Sequence[Any],
        request_ids: Sequence[str | None] | None = None,
        latencies_ms: Sequence[float | None] | None = None,
    ) -> int:
        """Queue a batch's decisions (items whose result is an exception are skipped);
        returns how many were queued. Never blocks: what does not fit is dropped."""
        keep = [i for i, r in enumerate(results) if isinstance(r, DecisionResult)]
        if not keep:
            return 0
        if len(keep) < len(results):
            states = [states[i] for i in keep]
            results = [results[i] for i in keep]
            request_ids = None if request_ids is None else [request_ids[i] for i in keep]
            latencies_ms = None if latencies_ms is None else [latencies_ms[i] for i in keep]
        n = len(results)
        with self._cond:
            room = 0 if self._closed else self.queue_size - self._pending_count
            take = min(n, room)
            self._stats["dropped"] += n - take
            if take <= 0:
                return 0
            if take < n:
                states, results = states[:take], results[:take]
            self._pending.append(
                _Entry(
                    time.time(),
                    states,
                    questions,
                    results,
                    request_ids[:take] if request_ids is not None else [None] * take,
                    latencies_ms[:take] if latencies_ms is not None else [None] * take,
                )
            )
            self._pending_count += take
            self._stats["recorded"] += take
            if self._pending_count >= self.batch_size:
                self._cond.notify()
            elif len(self._pending) == 1:
                self._cond.notify()  # the writer starts its flush interval
        return take

    # -- control -----------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """``recorded``, ``written``, ``dropped`` (queue full or closed), ``errors``
        (not stored: a redactor or a write failed), ``deleted`` (retention) and ``queued``."""
        with self._cond:
            return {**self._stats, "queued": self._pending_count}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every decision recorded so far is committed; ``False`` on timeout."""
        marker = _Flush()
        with self._cond:
            if self._closed or not self._thread.is_alive():
                return self._pending_count == 0
            self._pending.append(marker)
            self._cond.notify()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write everything queued, stop the writer and close the file (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if os.getpid() == self._pid:
            self._thread.join(timeout)
        atexit.unregister(self.close)

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wrap(self, engine: Engine) -> Engine:
        """``engine`` (a ``DecisionEngine``, ``ResilientEngine``, ``FakeEngine``...) with
        every decision it makes recorded here; pass the wrapped engine to routers and
        selectors. See :class:`~clef_agents.decision_log.engine.LoggedEngine`."""
        from clef_agents.decision_log.engine import LoggedEngine

        return LoggedEngine(engine, self)

    # -- the writer thread -------------------------------------------------------------

    def _take(self) -> tuple[list[_Entry], list[_Flush], bool]:
        """Wait for work, linger up to ``flush_interval_s`` to fill a batch, then take it."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            deadline = time.monotonic() + self.flush_interval_s
            while (
                not self._closed
                and self._pending_count < self.batch_size
                and not any(isinstance(e, _Flush) for e in self._pending)
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            entries: list[_Entry] = []
            markers: list[_Flush] = []
            taken = 0
            while self._pending and taken < self.batch_size:
                item = self._pending.popleft()
                if isinstance(item, _Flush):
                    markers.append(item)  # set once what came before it is committed
                    break
                entries.append(item)
                taken += len(item.results)
            self._pending_count -= taken
            stop = self._closed and not self._pending
            return entries, markers, stop

    def _write_loop(self) -> None:
        try:
            while True:
                entries, markers, stop = self._take()
                if entries:
                    self._write(entries)
                for marker in markers:
                    marker.done.set()
                if stop:
                    break
        finally:
            self._retention(force=True)
            self._conn.close()
            with self._cond:
                for item in self._pending:  # flushes asked after close
                    if isinstance(item, _Flush):
                        item.done.set()

    def _write(self, entries: list[_Entry]) -> None:
        rows: list[tuple[Any, ...]] = []
        new_questions: list[tuple[str, str]] = []
        errors = 0
        for entry in entries:
            for state, result, rid, latency in zip(
                entry.states, entry.results, entry.request_ids, entry.latencies, strict=True
            ):
                try:
                    row, question = self._row(
                        entry.ts, state, entry.questions, result, rid, latency
                    )
                except Exception:
                    logger.exception("decision log: a decision could not be serialised")
                    errors += 1
                    continue
                rows.append(row)
                if question is not None:
                    new_questions.append(question)
        try:
            with self._conn:
                if new_questions:
                    self._conn.executemany(
                        "INSERT OR IGNORE INTO questions (hash, json) VALUES (?, ?)",
                        new_questions,
                    )
                self._conn.executemany(INSERT, rows)
        except sqlite3.Error as exc:
            logger.error("decision log %s: %d decisions not written: %s", self.path, len(rows), exc)
            for h, _ in new_questions:
                self._known_questions.discard(h)
            errors += len(rows)
            rows = []
        with self._cond:
            self._stats["written"] += len(rows)
            self._stats["errors"] += errors
        self._retention()

    def _retention(self, force: bool = False) -> None:
        if self.max_rows is None and self.max_age_s is None:
            return
        now = time.monotonic()
        if not force and now - self._last_retention < 1.0:
            return
        self._last_retention = now
        try:
            deleted = apply_retention(self._conn, max_rows=self.max_rows, max_age_s=self.max_age_s)
        except sqlite3.Error as exc:
            logger.error("decision log %s: retention failed: %s", self.path, exc)
            return
        with self._cond:
            self._stats["deleted"] += deleted

    # -- serialisation (writer thread) --------------------------------------------------

    def _row(
        self,
        ts: float,
        state: Any,
        questions: Any,
        result: DecisionResult,
        request_id: str | None,
        latency_ms: float | None,
    ) -> tuple[tuple[Any, ...], tuple[str, str] | None]:
        state, questions = _split(state, questions)
        qhash, qjson = self._questions(questions)
        new = None
        if qhash not in self._known_questions:
            self._known_questions.add(qhash)
            new = (qhash, qjson)
        stored, digest = self._state(state)
        parts: list[str] = []
        tops: list[float] = []
        abstained = bool(getattr(result, "x_abstained", False))
        for qid, answer in result.answers.items():
            # pydantic's own JSON encoder: several times faster than json.dumps of a dict.
            if isinstance(answer, BoxAnswer):
                text = json.dumps(answer.to_wire(), ensure_ascii=False, separators=(",", ":"))
            else:
                text = answer.model_dump_json(exclude_none=True)
                top = result.x_top_probability.get(qid)
                tops.append(float(answer.top_probability() if top is None else top))
            if getattr(answer, "x_source", None) is None:  # which layer answered, per answer
                text = f'{text[:-1]},"x_source":{json.dumps(result.x_source)}}}'
            abstained = abstained or bool(getattr(answer, "x_abstained", False))
            parts.append(f"{json.dumps(qid, ensure_ascii=False)}:{text}")
        source = str(result.x_source)
        if source == "model" and abstained:
            source = "abstained"
        latency = latency_ms if latency_ms is not None else result.x_latency_ms
        row = (
            ts,
            request_id or f"log_{uuid.uuid4().hex}",
            result.model,
            result.x_model_version,
            source,
            getattr(result, "x_fallback_reason", None),
            None if latency is None or not math.isfinite(latency) else float(latency),
            stored,
            digest,
            qhash,
            "{" + ",".join(parts) + "}",
            min(tops) if tops else None,
        )
        return row, new

    def _questions(self, questions: Any) -> tuple[str, str]:
        cached = self._question_cache.get(id(questions))
        if cached is not None and cached[0] is questions:
            return cached[1], cached[2]
        wire = {
            str(qid): q.model_dump(mode="json", exclude_none=True)
            if hasattr(q, "model_dump")
            else q
            for qid, q in dict(questions or {}).items()
        }
        text = canonical_json(wire)
        digest = hashlib.sha256(text.encode()).hexdigest()[:32]
        if len(self._question_cache) > 256:
            self._question_cache.clear()
        self._question_cache[id(questions)] = (questions, digest, text)  # holds a reference
        return digest, text

    def _state(self, state: Any) -> tuple[str | None, str | None]:
        """``(stored JSON or None, hash or None)`` under the redactor and the policy."""
        if self.state_policy == "none":
            return None, None
        if self.redact is not None:
            state = self.redact(state)
            if state is None:
                return None, None
        text = canonical_json(_jsonable(state))
        if self._key is not None:
            digest = "hmac-sha256:" + hmac.new(self._key, text.encode(), "sha256").hexdigest()
        else:
            digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return (text if self.state_policy == "full" else None), digest


def _split(state: Any, questions: Any) -> tuple[Any, Any]:
    """The state and questions of what an engine was given (a whole request or not)."""
    if questions is None:
        if isinstance(state, DecisionRequest):
            return state.state, state.questions
        if isinstance(state, Mapping) and "questions" in state and "state" in state:
            return state["state"], state["questions"]
    if isinstance(state, DecisionRequest):
        return state.state, questions
    return state, questions


def _jsonable(value: Any, depth: int = 0) -> Any:
    """The state as JSON: images and bytes become their SHA-256, paths their text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if depth > 64:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"x_bytes_sha256": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "save") and hasattr(value, "size"):  # a PIL image
        return {"x_image": f"{value.size[0]}x{value.size[1]}"}
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump(mode="json"), depth + 1)
    return str(value)


def _check_positive(name: str, value: float | None, *, integer: bool = False) -> None:
    if value is None:
        return
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "an integer" if integer else "a number"
        raise DecisionLogError(f"{name} must be {kind} > 0; got {value!r}")
