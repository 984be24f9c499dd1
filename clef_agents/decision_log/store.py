"""The decision log's SQLite file: schema, connections, retention and reading.

One file, WAL mode. A decision is one row of ``decisions``; the questions it answered are
stored once per distinct definition in ``questions`` (keyed by a hash), so a router that
asks the same 77-option question a million times stores it once. Labels from a reviewer
live in the decision's ``labels`` column (``{question id: label}``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_engine.errors import ClefError

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS questions (hash TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    request_id TEXT,
    model TEXT,
    model_version TEXT,
    source TEXT NOT NULL,
    fallback_reason TEXT,
    latency_ms REAL,
    state TEXT,
    state_hash TEXT,
    questions_hash TEXT NOT NULL,
    answers TEXT NOT NULL,
    min_probability REAL,
    labels TEXT
);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
CREATE INDEX IF NOT EXISTS decisions_min_probability ON decisions (min_probability);
"""

COLUMNS = (
    "id",
    "ts",
    "request_id",
    "model",
    "model_version",
    "source",
    "fallback_reason",
    "latency_ms",
    "state",
    "state_hash",
    "questions_hash",
    "answers",
    "min_probability",
    "labels",
)
"""The columns of ``decisions``, in order (``answers`` and ``labels`` are JSON text)."""

INSERT = (
    "INSERT INTO decisions (ts, request_id, model, model_version, source, fallback_reason, "
    "latency_ms, state, state_hash, questions_hash, answers, min_probability) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class DecisionLogError(ClefError):
    """A decision log file that cannot be used, or a bad argument to one (names which)."""

    error_type = "decision_log_error"


def connect(path: str | Path, *, create: bool = True) -> sqlite3.Connection:
    """Open (and with ``create`` set up) a log file in WAL mode.

    ``synchronous=NORMAL``: a committed transaction survives the process being killed (the
    WAL is written before the commit returns); only an OS crash or power loss can lose the
    last commits. ``check_same_thread=False``: the writer thread owns its own connection,
    readers open theirs.
    """
    file = Path(path)
    if not create and not file.is_file():
        raise DecisionLogError(f"{file}: no such decision log")
    if file.exists() and file.is_dir():
        raise DecisionLogError(f"{file}: is a directory; name a file for the decision log")
    if create:
        file.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(file), timeout=30.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if create:
            with conn:
                conn.executescript(SCHEMA)
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
        else:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "decisions" not in tables:
                conn.close()
                raise DecisionLogError(f"{file}: not a decision log (no decisions table)")
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{file}: not a decision log ({exc})") from None
    return conn


def apply_retention(
    conn: sqlite3.Connection,
    *,
    max_rows: int | None,
    max_age_s: float | None,
    now: float | None = None,
) -> int:
    """Delete the oldest decisions past ``max_rows`` and those older than ``max_age_s``;
    returns how many were deleted (labels go with their decisions)."""
    deleted = 0
    with conn:
        if max_age_s is not None:
            cutoff = (time.time() if now is None else now) - max_age_s
            deleted += conn.execute("DELETE FROM decisions WHERE ts < ?", (cutoff,)).rowcount
        if max_rows is not None:
            row = conn.execute("SELECT max(id) FROM decisions").fetchone()
            top = row[0] if row else None
            if top is not None:
                deleted += conn.execute(
                    "DELETE FROM decisions WHERE id <= ?", (top - max_rows,)
                ).rowcount
    return deleted


@dataclass
class Decision:
    """One logged decision, as read back."""

    id: int
    ts: float
    request_id: str | None
    model: str | None
    model_version: str | None
    source: str
    fallback_reason: str | None
    latency_ms: float | None
    state: Any
    """The stored state (after redaction): a string, or a JSON object or array; ``None``
    when the policy kept no state. Images are kept as a hash only."""
    state_hash: str | None
    questions_hash: str
    answers: dict[str, Any]
    """Per question id, the answer as on the wire, plus ``x_source`` (which layer answered
    this question) and ``x_abstained`` where it was set."""
    min_probability: float | None
    labels: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Decision:
        values = dict(zip(COLUMNS, row, strict=True))
        values["answers"] = json.loads(values["answers"])
        values["state"] = None if values["state"] is None else json.loads(values["state"])
        values["labels"] = json.loads(values["labels"]) if values["labels"] else {}
        return cls(**values)

    def question_source(self, qid: str) -> str:
        """Which layer answered question ``qid``: ``model``, ``rules``, ``default`` or
        ``abstained``."""
        answer = self.answers.get(qid, {})
        if answer.get("x_abstained"):
            return "abstained"
        return str(answer.get("x_source") or self.source)


def read_decisions(
    conn: sqlite3.Connection, where: str = "", params: Sequence[Any] = ()
) -> Iterator[Decision]:
    """Decisions in id order, optionally filtered by an SQL ``where`` clause."""
    sql = f"SELECT {', '.join(COLUMNS)} FROM decisions {where} ORDER BY id"
    for row in conn.execute(sql, tuple(params)):
        yield Decision.from_row(row)


def read_questions(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """Every stored question set, by hash: ``{hash: {question id: wire question}}``."""
    return {h: json.loads(j) for h, j in conn.execute("SELECT hash, json FROM questions")}
