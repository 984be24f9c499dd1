"""DecisionLog: what is stored, state policies and redaction, never blocking, retention,
clean shutdown, and the kill -9 loss bound."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from clef_agents.decision_log import DecisionLog, DecisionLogError, LoggedEngine, read_decisions
from clef_agents.decision_log.store import connect
from clef_agents.fake import FakeEngine
from clef_agents.resilience import ResilientEngine, RuleFallback

ROOT = Path(__file__).resolve().parents[2]

ROUTE = {
    "route": {
        "type": "choice",
        "instructions": "Route the ticket",
        "criteria": {"billing": "refund invoice payment", "technical": "bug error crash"},
    }
}


def _rows(path: Path) -> list[Any]:
    conn = connect(path, create=False)
    try:
        return list(read_decisions(conn))
    finally:
        conn.close()


def test_wrapped_engine_records_every_decision(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with DecisionLog(path) as log:
        engine = log.wrap(FakeEngine())
        one = engine.decide("please refund my invoice", ROUTE)
        many = engine.decide_batch(["app crash bug", "refund payment"], ROUTE)
        asyncio.run(engine.adecide("error on login", ROUTE))
        asyncio.run(engine.adecide_batch(["invoice", "crash"], ROUTE))
        assert engine.model_version == FakeEngine().model_version  # the surface is kept
    rows = _rows(path)
    assert [r.state for r in rows] == [
        "please refund my invoice",
        "app crash bug",
        "refund payment",
        "error on login",
        "invoice",
        "crash",
    ]
    first = rows[0]
    assert first.answers["route"]["choice"] == one["route"].choice
    assert first.answers["route"]["probabilities"] == pytest.approx(
        one["route"].probabilities  # type: ignore[union-attr]
    )
    assert first.source == "model" and first.answers["route"]["x_source"] == "model"
    assert first.model_version == one.x_model_version
    assert first.min_probability == pytest.approx(one["route"].top_probability())
    assert rows[1].answers["route"]["choice"] == many[0]["route"].choice
    assert len({r.request_id for r in rows}) == len(rows)
    assert all(r.state_hash and r.state_hash.startswith("sha256:") for r in rows)
    # The question set is stored once, whatever the number of decisions.
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM questions").fetchone()[0] == 1
    stored = json.loads(conn.execute("SELECT json FROM questions").fetchone()[0])
    assert stored["route"]["criteria"]["billing"] == "refund invoice payment"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_whole_request_and_a_failed_item(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with DecisionLog(path) as log:
        engine = log.wrap(FakeEngine())
        engine.decide({"state": {"ticket": "refund"}, "questions": ROUTE})
        out = engine.decide_batch(["crash", "   ", "refund"], ROUTE, return_exceptions=True)
        assert isinstance(out[1], Exception)
    rows = _rows(path)
    assert [r.state for r in rows] == [{"ticket": "refund"}, "crash", "refund"]


def test_state_policies_and_redaction(tmp_path: Path) -> None:
    engine = FakeEngine()
    result = engine.decide("mail bob@example.com about the refund", ROUTE)
    state = "mail bob@example.com about the refund"

    def mask(s: Any) -> Any:
        return s.replace("bob@example.com", "<email>")

    stored = {}
    for name, kwargs in {
        "full": {},
        "redacted": {"redact": mask},
        "hash": {"state": "hash"},
        "keyed": {"state": "hash", "hash_key": "secret"},
        "none": {"state": "none"},
    }.items():
        path = tmp_path / f"{name}.sqlite"
        with DecisionLog(path, **kwargs) as log:
            assert log.record(state, ROUTE, result)
        [row] = _rows(path)
        stored[name] = row
    assert stored["full"].state == state
    assert stored["redacted"].state == "mail <email> about the refund"
    assert "bob@" not in Path(tmp_path / "redacted.sqlite").read_bytes().decode("latin-1")
    assert stored["hash"].state is None and stored["hash"].state_hash == stored["full"].state_hash
    assert stored["keyed"].state_hash.startswith("hmac-sha256:")
    assert stored["keyed"].state_hash != stored["hash"].state_hash
    assert stored["none"].state is None and stored["none"].state_hash is None
    assert stored["none"].answers == stored["full"].answers


def test_a_redactor_that_fails_stores_nothing(tmp_path: Path) -> None:
    def broken(state: Any) -> Any:
        raise ValueError("no")

    result = FakeEngine().decide("secret text", ROUTE)
    path = tmp_path / "log.sqlite"
    with DecisionLog(path, redact=broken) as log:
        log.record("secret text", ROUTE, result)
    assert log.stats["errors"] == 1 and log.stats["written"] == 0
    assert _rows(path) == []


def test_fallback_and_abstained_sources(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    safe = ResilientEngine(
        FakeEngine(), fallback=RuleFallback(default="technical"), min_confidence=0.999
    )
    abstained = FakeEngine().decide("refund", ROUTE)
    abstained.answers["route"].x_abstained = True  # type: ignore[attr-defined]
    with DecisionLog(path) as log:
        log.wrap(safe).decide("refund my invoice", ROUTE)
        log.record("refund", ROUTE, abstained)
    fallback, abst = _rows(path)
    assert fallback.source == "default" and fallback.fallback_reason == "low_confidence"
    assert fallback.answers["route"]["choice"] == "technical"
    assert fallback.question_source("route") == "default"
    assert abst.source == "abstained" and abst.question_source("route") == "abstained"


def test_record_never_blocks_and_counts_drops(tmp_path: Path, monkeypatch) -> None:
    release = threading.Event()
    log = DecisionLog(tmp_path / "log.sqlite", queue_size=5, flush_interval_s=0.01)
    real_write = log._write

    def stalled(entries: Any) -> None:
        release.wait(10)
        real_write(entries)

    monkeypatch.setattr(log, "_write", stalled)
    result = FakeEngine().decide("refund", ROUTE)
    log.record("first", ROUTE, result)
    time.sleep(0.1)  # the writer has taken "first" and is stuck writing it
    started = time.perf_counter()
    accepted = [log.record(f"s{i}", ROUTE, result) for i in range(8)]
    assert time.perf_counter() - started < 0.5  # never waited for the stuck writer
    assert accepted == [True] * 5 + [False] * 3
    assert log.stats["dropped"] == 3 and log.stats["queued"] == 5
    release.set()
    log.close()
    assert log.stats["written"] == 6
    assert not log.record("late", ROUTE, result)  # closed: dropped, not raised
    assert len(_rows(tmp_path / "log.sqlite")) == 6


def test_clean_shutdown_writes_everything(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    result = FakeEngine().decide("refund", ROUTE)
    log = DecisionLog(path, batch_size=100, flush_interval_s=5.0)
    results = [result] * 5000
    log.record_many([f"s{i}" for i in range(5000)], ROUTE, results)
    log.close()  # long before the 5 s flush interval
    assert len(_rows(path)) == 5000
    # And at interpreter exit without close(): the atexit hook writes what is queued.
    code = f"""
        from clef_agents.decision_log import DecisionLog
        from clef_agents.fake import FakeEngine
        route = {ROUTE!r}
        log = DecisionLog({str(tmp_path / "exit.sqlite")!r}, flush_interval_s=30.0)
        result = FakeEngine().decide("refund", route)
        for i in range(1000):
            log.record(f"s{{i}}", route, result)
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, cwd=ROOT)
    assert len(_rows(tmp_path / "exit.sqlite")) == 1000


def test_flush_waits_for_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    result = FakeEngine().decide("refund", ROUTE)
    with DecisionLog(path, flush_interval_s=30.0) as log:
        log.record("a", ROUTE, result)
        assert log.flush(timeout=10)
        assert len(_rows(path)) == 1  # readable from another connection while open


def test_retention_by_rows_and_age(tmp_path: Path) -> None:
    result = FakeEngine().decide("refund", ROUTE)
    path = tmp_path / "rows.sqlite"
    with DecisionLog(path, max_rows=10) as log:
        log.record_many([f"s{i}" for i in range(25)], ROUTE, [result] * 25)
    assert [r.state for r in _rows(path)] == [f"s{i}" for i in range(15, 25)]
    assert log.stats["deleted"] == 15
    path = tmp_path / "age.sqlite"
    with DecisionLog(path) as log:
        log.record("old", ROUTE, result)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE decisions SET ts = ts - 7200")
    conn.close()
    with DecisionLog(path, max_age_s=3600) as log:
        log.record("new", ROUTE, result)
    assert [r.state for r in _rows(path)] == ["new"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"state": "all"}, "state must be one of"),
        ({"max_rows": 0}, "max_rows must be an integer > 0"),
        ({"max_age_s": float("nan")}, "max_age_s must be a number > 0"),
        ({"queue_size": 1.5}, "queue_size must be an integer > 0"),
        ({"redact": "mask"}, "redact must be a function"),
    ],
)
def test_bad_arguments_name_the_field(tmp_path: Path, kwargs: dict[str, Any], message: str):
    with pytest.raises(DecisionLogError, match=message):
        DecisionLog(tmp_path / "log.sqlite", **kwargs)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(DecisionLogError, match="is a directory"):
        DecisionLog(tmp_path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DecisionLogError, match="not a decision log"):
        DecisionLog(junk)
    with pytest.raises(DecisionLogError, match="no such decision log"):
        connect(tmp_path / "missing.sqlite", create=False)


def test_real_engine_batch(tmp_path: Path, tiny_engine: Any) -> None:
    path = tmp_path / "log.sqlite"
    questions = {"q": {"type": "choice", "instructions": "Topic", "criteria": ["card", "cash"]}}
    with DecisionLog(path) as log:
        logged = LoggedEngine(tiny_engine, log)
        out = logged.decide_batch(["my card", "top up cash"], questions)
    rows = _rows(path)
    assert [r.answers["q"]["choice"] for r in rows] == [o["q"].choice for o in out]
    assert all(r.model_version == tiny_engine.model_version for r in rows)
    assert all(r.latency_ms is not None and r.latency_ms >= 0 for r in rows)


# -- kill -9 ------------------------------------------------------------------------------

_CHILD = """
import sys, time
from clef_agents.decision_log import DecisionLog
from clef_agents.fake import FakeEngine
route = {route!r}
log = DecisionLog(sys.argv[1], flush_interval_s=0.1)
result = FakeEngine().decide("refund", route)
for i in range(3000):
    log.record(f"s{{i}}", route, result, request_id=str(i))
print("recorded", flush=True)
time.sleep(0.6)  # longer than the flush interval: the 3,000 must be on disk, no flush() called
i = 3000
if sys.argv[2] == "burst":
    for i in range(3000, 3200):
        log.record(f"s{{i}}", route, result, request_id=str(i))
    print("burst", flush=True)
    time.sleep(60)
else:  # keep logging until killed
    print("logging", flush=True)
    while True:
        log.record(f"s{{i}}", route, result, request_id=str(i))
        i += 1
        if i % 500 == 0:
            time.sleep(0.001)
"""


@pytest.mark.parametrize("mode", ["burst", "continuous"])
def test_kill_9_loses_at_most_the_last_unflushed_batch(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "log.sqlite"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(route=ROUTE), str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "recorded"
        assert child.stdout.readline().strip() in ("burst", "logging")
        if mode == "continuous":
            time.sleep(0.35)  # a few batches in, mid-write most likely
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    ids = sorted(int(r.request_id) for r in _rows(path))
    # Committed batches are whole and in order: the rows are a prefix of what was recorded,
    assert ids == list(range(len(ids)))
    # everything recorded more than a flush interval before the kill is there,
    assert len(ids) >= 3000
    if mode == "burst":  # and what is lost is at most the batch recorded last.
        assert len(ids) <= 3200
