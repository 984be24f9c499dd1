"""Graceful shutdown of the real process: in-flight requests finish, new ones get 503."""

from __future__ import annotations

import signal
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
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{srv.url}/metrics", timeout=5).text
        if "clef_inflight_requests 3.0" in metrics:
            break
        time.sleep(0.05)
    srv.signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(f"{srv.url}/v1/systemone", json=REQUEST, timeout=10)
    ready = httpx.get(f"{srv.url}/readyz", timeout=10)
    for t in threads:
        t.join(30)
    code = srv.proc.wait(30)

    assert [r.status_code for r in results] == [200, 200, 200]
    assert all("refund" in r.json()["answers"] for r in results)
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["detail"]["error_type"] == "overloaded_error"
    assert ready.status_code == 503
    assert code == 0
