"""The connection layer on a real uvicorn server (loopback, raw sockets, a fake engine).

Slow bodies, huge headers, idle connections and too many connections, each with limits
small enough that the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from clef_agents.fake import FakeEngine
from clef_agents.server import ServerConfig, create_app
from clef_agents.server.transport import accept_pending, build_server, refuse_new_handshakes

REQUEST = {
    "model": "jev-latest",
    "state": "my card never arrived",
    "questions": {"refund": {"type": "noul", "instructions": "Refund wanted?"}},
}
BODY = json.dumps(REQUEST).encode()


@contextmanager
def serving(engine: Any = None, **settings: Any) -> Iterator[tuple[str, int, Any]]:
    """A real uvicorn server on 127.0.0.1 in a thread; yields (host, port, app state)."""
    app = create_app(engine or FakeEngine(), ServerConfig(**settings))
    server, sock = build_server(app, "127.0.0.1", 0, log_level="error")
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield "127.0.0.1", port, app.state.clef
    finally:
        server.should_exit = True
        thread.join(10)
        server.spare.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(length: int, extra: str = "") -> bytes:
    return (
        "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response: status, lower-cased headers, body ((0, {}, b"") if closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, b""
        data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_trickling_bodies_get_408_and_do_not_lock_out_valid_clients() -> None:
    # An in-flight limit of 2 (max_queue 1 + max_batch 1); three clients trickle their
    # bodies a byte at a time. They used to count as in flight and lock everyone out.
    with serving(max_queue=1, max_batch=1, body_timeout_s=0.8) as (_, port, _state):
        tricklers = [connect(port) for _ in range(3)]
        started = time.monotonic()
        for sock in tricklers:
            sock.sendall(head(len(BODY)) + BODY[:1])
        for i in range(1, 6):
            time.sleep(0.1)
            for sock in tricklers:
                sock.sendall(BODY[i : i + 1])
        valid = httpx.post(f"http://127.0.0.1:{port}/v1/systemone", json=REQUEST, timeout=5)
        assert valid.status_code == 200, valid.text
        for sock in tricklers:
            status, headers, body = read_response(sock)
            assert status == 408
            assert json.loads(body)["detail"]["error_type"] == "request_timeout"
            assert headers["connection"] == "close"
            sock.close()
        # The deadline counts from the first read; the trickle never pushed it back.
        assert time.monotonic() - started < 0.8 + 1.0


def test_oversized_headers_get_431_and_the_connection_closed() -> None:
    with serving(max_header_bytes=4096) as (_, port, state):
        sock = connect(port)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        try:
            for _ in range(64):  # 64 x 16 KiB of one header, far past the cap
                sock.sendall(b"X-Big: " + b"a" * 16384 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = read_response(sock)
        sock.close()
        assert status == 431
        assert json.loads(body)["detail"]["error_type"] == "request_header_fields_too_large"
        assert "4096 bytes" in json.loads(body)["detail"]["message"]
        # Headers under the cap are fine.
        ok = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"x-ok": "a" * 2000})
        assert ok.status_code == 200
        assert 'status="431"' in state.metrics.render().decode()


def test_idle_and_slow_head_connections_are_closed() -> None:
    with serving(keep_alive_timeout_s=0.3, header_timeout_s=0.5) as (_, port, _state):
        # A keep-alive connection idle after its answer is closed after the keep-alive timeout.
        kept = connect(port)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(kept)[0] == 200
        started = time.monotonic()
        assert closed_by_peer(kept, 3.0)
        assert time.monotonic() - started < 1.5
        # A connection that never sends anything is closed after the header timeout.
        silent = connect(port)
        started = time.monotonic()
        assert closed_by_peer(silent, 3.0)
        assert time.monotonic() - started < 2.0
        # A head sent a byte at a time gets 408 at the header timeout, however it trickles.
        slow = connect(port)
        started = time.monotonic()
        for byte in b"GET /healthz HTTP/1.1\r\n"[:8]:
            slow.sendall(bytes([byte]))
            time.sleep(0.1)
        status, _, body = read_response(slow)
        assert status == 408
        assert json.loads(body)["detail"]["error_type"] == "request_timeout"
        assert time.monotonic() - started < 2.0
        for sock in (kept, silent, slow):
            sock.close()


def test_connections_past_the_cap_get_503() -> None:
    with serving(max_connections=4, header_timeout_s=5.0) as (_, port, state):
        held = [connect(port) for _ in range(4)]
        time.sleep(0.1)  # let the server take them in
        extra = connect(port)
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, body = read_response(extra)
        assert status == 503
        assert headers["retry-after"] == "1"
        assert json.loads(body)["detail"]["error_type"] == "overloaded_error"
        assert closed_by_peer(extra, 3.0)
        # Freeing a slot lets the next client in.
        held.pop().close()
        time.sleep(0.1)
        again = connect(port)
        again.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(again)[0] == 200
        assert 'clef_shed_total{reason="connections"} 1.0' in state.metrics.render().decode()
        for sock in (*held, extra, again):
            sock.close()


def test_a_client_gone_mid_body_is_499_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serving(body_timeout_s=5.0) as (_, port, state):
        sock = connect(port)
        sock.sendall(head(len(BODY)) + BODY[:10])
        time.sleep(0.2)
        sock.close()
        deadline = time.monotonic() + 3
        metrics = ""
        while 'status="499"' not in metrics and time.monotonic() < deadline:
            time.sleep(0.05)
            metrics = state.metrics.render().decode()
    assert 'clef_requests_total{route="/v1/systemone",status="499"} 1.0' in metrics
    assert 'status="500"' not in metrics
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux socket filters")
def test_a_draining_listener_lets_no_new_handshake_complete() -> None:
    """Draining takes in every connection the kernel accepted, then closes the listener. A
    connection completing in between was reset (1 run in 3 of the shutdown test); with
    new SYNs dropped first, a connection made before is still taken in and a new one never
    completes (the client retries its SYN; after the close it is refused)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
    early = socket.create_connection(listener.getsockname(), timeout=2)
    try:
        if not refuse_new_handshakes(listener):
            pytest.skip("this kernel has no TCP socket filters (a sandbox such as gVisor)")
        late = socket.socket()
        late.settimeout(0.3)
        with pytest.raises(TimeoutError):
            late.connect(listener.getsockname())
        late.close()
        listener.setblocking(False)
        taken = accept_pending(listener)  # the earlier connection is still there to take in
        assert len(taken) == 1
        taken[0].setblocking(True)
        early.sendall(b"ping")
        assert taken[0].recv(4) == b"ping"
        taken[0].close()
    finally:
        early.close()
        listener.close()
