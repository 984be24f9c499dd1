"""Graceful shutdown of the real process: in-flight requests finish, new ones get 503,
what is left at the drain deadline gets 503 JSON, and no accepted connection is reset."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

REQUEST = {
    "model": "jev-latest",
    "state": "my card never arrived",
    "questions": {"refund": {"type": "noul", "instructions": "Refund wanted?"}},
}


def test_sigterm_drains_inflight_and_refuses_new(start_server: Any) -> None:
    # A long batching window keeps the first requests in flight while we signal.
    srv = start_server("--max-wait-ms", "2500", "--max-batch", "64")
    results: list[httpx.Response] = []

    def call() -> None:
        results.append(httpx.post(f"{srv.url}/v1/systemone", json=REQUEST, timeout=30))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    kept = httpx.Client(base_url=srv.url, timeout=10)  # a keep-alive connection, open before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = kept.get("/metrics").text
        if "clef_inflight_requests 3.0" in metrics:
            break
        time.sleep(0.05)
    srv.signal(signal.SIGTERM)
    time.sleep(0.3)
    # Open connections are still served while draining; new connections are not accepted.
    ready = kept.get("/readyz")
    refused = kept.post("/v1/systemone", json=REQUEST)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.url}/healthz", timeout=5)
    for t in threads:
        t.join(30)
    code = srv.proc.wait(30)
    kept.close()

    assert [r.status_code for r in results] == [200, 200, 200]
    assert all("refund" in r.json()["answers"] for r in results)
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["detail"]["error_type"] == "overloaded_error"
    assert ready.status_code == 503
    assert code == 0


# A server process around a fake engine whose forward takes DELAY seconds: it starts in a
# few seconds (no model) and can hold its model worker for as long as a test needs.
FAKE_SERVER = """
import sys, time
from clef_agents.fake import FakeEngine
from clef_agents.server import ServerConfig, create_app
from clef_agents.server.transport import serve_app

port, drain, delay = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])

class Slow(FakeEngine):
    def decide_batch(self, items, questions=None, *, return_exceptions=False):
        time.sleep(delay)
        return super().decide_batch(items, questions, return_exceptions=return_exceptions)

cfg = ServerConfig(max_batch=1, max_wait_ms=0, drain_timeout_s=drain)
serve_app(create_app(Slow(), cfg), "127.0.0.1", port, log_level="warning")
"""


def _start_fake(tmp_path: Any, drain_s: float, delay_s: float) -> tuple[Any, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = (tmp_path / "fake-server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, str(port), str(drain_s), str(delay_s)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "fake-server.log").read_text()
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the fake server did not start")


def test_drain_timeout_answers_running_and_queued_with_503_json(tmp_path: Any) -> None:
    # One request holds the model for 60 s, two wait behind it; --drain-timeout 1.
    proc, url = _start_fake(tmp_path, drain_s=1.0, delay_s=60.0)
    results: list[httpx.Response] = []

    def call(i: int) -> None:
        results.append(httpx.post(f"{url}/v1/systemone", json=REQUEST, timeout=30))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/readyz", timeout=5).json()["queue_depth"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
        exited_after = time.monotonic() - started
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    assert exited_after < 1.0 + 2.5, f"exited {exited_after:.1f} s after SIGTERM"
    assert [r.status_code for r in results] == [503, 503, 503]
    for r in results:
        assert r.headers["content-type"] == "application/json"
        assert r.json()["detail"]["error_type"] == "overloaded_error"
        assert int(r.headers["Retry-After"]) >= 1


def _one_request(port: int) -> str:
    """One request on a new connection: 'answered', 'refused' (not accepted) or 'reset (why)'."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionRefusedError:
        return "refused"
    try:
        body = json.dumps(REQUEST).encode()
        sock.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:  # reset, broken pipe, timeout
        return f"reset ({type(exc).__name__})"
    finally:
        sock.close()
    if data.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")):
        return "answered"
    return f"reset (got {data[:40]!r})"


def test_connections_accepted_before_exit_are_answered_not_reset(tmp_path: Any) -> None:
    proc, url = _start_fake(tmp_path, drain_s=1.0, delay_s=0.0)
    port = int(url.rsplit(":", 1)[1])
    outcomes: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            outcome = _one_request(port)
            outcomes.append(outcome)
            if outcome == "refused":
                return

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    assert outcomes.count("answered") > 16
    resets = [o for o in outcomes if o.startswith("reset")]
    assert not resets, f"{len(resets)} accepted connections got no answer: {resets}"
