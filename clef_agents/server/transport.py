"""The connection layer under the app (uvicorn): limits per connection, and draining.

uvicorn leaves a server open to cheap attacks: with httptools it buffers a request head of
any size, it never times out a connection that has not finished its headers, and it caps
connections only once a request arrives (idle ones keep their file descriptor). The
protocol built by :func:`guarded_protocol` adds, per connection:

- a cap on the request line and headers (``max_header_bytes``): 431, then close;
- a deadline for the request head (``header_timeout_s``) from the connection's opening or
  the head's first byte: 408 (a connection that sent nothing is just closed);
- a cap on open connections (``max_connections``): the next one is answered 503 with
  ``Retry-After`` as soon as it opens, and closed.

Idle keep-alive connections close after ``keep_alive_timeout_s`` (uvicorn's own timer) and
the body deadline lives in :func:`~clef_agents.server.body.read_body`.

:func:`serve_app` runs the app with these limits and drains on the first SIGTERM/SIGINT:
it stops accepting (holding off new handshakes while it takes in what the kernel had
already accepted, so that the close resets no connection: :func:`refuse_new_handshakes`),
answers new ``/v1`` requests 503, lets in-flight and queued
requests finish until ``drain_timeout_s``, answers what remains 503 and exits.

Example:
    Skipped by the doctest runner, since :func:`serve_app` listens on a port and blocks
    until SIGTERM/SIGINT; ``tests/integration/server/test_server_shutdown.py`` runs this
    call in a process of its own and signals it.

    >>> from clef_engine import DecisionEngine
    >>> from clef_agents.server import ServerConfig, create_app
    >>> from clef_agents.server.transport import serve_app
    >>> app = create_app(DecisionEngine(), ServerConfig(max_connections=256))  # doctest: +SKIP
    >>> serve_app(app, "127.0.0.1", 8000, log_level="warning")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from clef_agents.server.config import ServerConfig
from clef_agents.server.errors import dumps

logger = logging.getLogger("clef_agents.server")

REFUSED_LINGER_S = 1.0
"""A refused connection is half-closed after its error response and fully closed this much
later; what the client still sends meanwhile is read and dropped, so that closing sends
FIN, not a reset that could destroy the response before the client reads it."""
ACCEPT_LINGER_S = 0.5
"""After the listening socket closes, connections it accepted last get this long (within
the drain timeout) to send their request and receive an answer before the exit."""
RESPONSE_GRACE_S = 1.0
"""After the drain deadline, how long the 503 answers to what was still queued may take."""
FD_RESERVE = 64
"""File descriptors kept for the process itself (model files, logs) below ``ulimit -n``."""

Refused = Callable[[int, str], None]
"""Told ``(status, reason)`` each time the connection layer answers by itself (metrics)."""

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpToolsBase
else:
    _HttpToolsBase = object  # uvicorn is optional; guarded_protocol adds the real base


def _refusal(status: int, error_type: str, message: str, extra: dict[str, str]) -> bytes:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE

    body = dumps({"detail": {"error_type": error_type, "message": message}})
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        "x-typesafe-request-id": f"req_{uuid.uuid4().hex}",
        **extra,
    }
    head = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
    return STATUS_LINE[status] + head + b"\r\n" + body


class _HeadLimits(_HttpToolsBase):
    """The header, head-time and connection limits, over uvicorn's httptools protocol.

    A mixin (uvicorn is an optional dependency): :func:`guarded_protocol` puts it in front
    of ``HttpToolsProtocol``, sets ``settings`` and overrides ``_report_refused``.
    """

    settings: ClassVar[ServerConfig]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # bytes arriving now belong to a request line or headers
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.settings.max_connections
        if len(self.connections) > cap:
            self._refuse(
                503,
                "overloaded_error",
                f"the server has {cap} connections open, its limit; retry later",
                {"retry-after": "1"},
            )
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return  # read and dropped, see REFUSED_LINGER_S
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_timer is None:
                self._arm_head_timer()
        super().data_received(data)
        limit = self.settings.max_header_bytes
        if self._in_head and self._head_bytes > limit and not self.transport.is_closing():
            self._refuse(
                431,
                "request_header_fields_too_large",
                f"the request line and headers are larger than the limit of {limit} bytes",
            )

    # -- httptools callbacks -----------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True

    # -- limits ------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(
            self.settings.header_timeout_s, self._head_timed_out
        )

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head waits for the answer before it; close after that answer.
            self.cycle.keep_alive = False
            return
        if self._head_bytes == 0:
            self.transport.close()  # opened and never used
            return
        timeout = self.settings.header_timeout_s
        self._refuse(
            408,
            "request_timeout",
            f"the request headers did not arrive within {timeout:g} s",
        )

    def _refuse(
        self, status: int, error_type: str, message: str, extra: dict[str, str] | None = None
    ) -> None:
        self._refused = True
        self.connections.discard(self)  # lingering, it holds no place under the cap
        self._disarm_head_timer()
        self._unset_keepalive_if_required()
        self.transport.write(_refusal(status, error_type, message, extra or {}))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)
        self._report_refused(status, error_type)

    def _report_refused(self, status: int, reason: str) -> None:
        """Told each refusal (see :data:`Refused`); nobody listens by default."""


def guarded_protocol(config: ServerConfig, on_refused: Refused | None = None) -> type[Any]:
    """uvicorn's httptools protocol with the header, head-time and connection limits."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_HeadLimits, HttpToolsProtocol):
        settings: ClassVar[ServerConfig] = config

        def _report_refused(self, status: int, reason: str) -> None:
            if on_refused is not None:
                on_refused(status, reason)

    return GuardedHttpToolsProtocol


def _fit_connection_cap(config: ServerConfig) -> int:
    """``max_connections``, lowered (with a warning) if ``ulimit -n`` cannot hold it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = config.max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        cap = max(1, soft - FD_RESERVE)
        logger.warning(
            "max_connections %d does not fit ulimit -n %d; serving at most %d connections",
            config.max_connections,
            soft,
            cap,
        )
        return cap
    return config.max_connections


def serve_app(
    app: Any,
    host: str,
    port: int,
    config: ServerConfig | None = None,
    log_level: str = "warning",
) -> None:
    """Run ``app`` (from :func:`~clef_agents.server.create_app`) with uvicorn, until a signal.

    Args:
        app: The decision server app; its ``state.clef`` carries the drain state.
        host: Bind address.
        port: Port (0 picks a free one).
        config: The limits; defaults to the app's own :class:`ServerConfig`.
        log_level: uvicorn's log level.
    """
    server, sock = build_server(app, host, port, config, log_level)
    try:
        server.run(sockets=[sock])
    finally:
        server.spare.close()


def build_server(
    app: Any,
    host: str,
    port: int,
    config: ServerConfig | None = None,
    log_level: str = "warning",
) -> tuple[Any, socket.socket]:
    """The uvicorn server of :func:`serve_app` and its bound socket, not yet running.

    ``server.run(sockets=[sock])`` serves (in any thread; signals are only handled in the
    main thread), ``server.should_exit = True`` stops it.
    """
    import dataclasses

    import uvicorn

    state = app.state.clef
    cfg = config or state.config
    cfg = dataclasses.replace(cfg, max_connections=_fit_connection_cap(cfg))

    def refused(status: int, reason: str) -> None:
        state.metrics.observe_request("other", status, 0.0)
        if status == 503:
            state.metrics.shed.labels(reason="connections").inc()

    try:
        protocol: Any = guarded_protocol(cfg, refused)
    except ImportError:  # no httptools: h11 enforces a head cap of its own (400 above it)
        protocol = "h11"
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=protocol,
        h11_max_incomplete_event_size=cfg.max_header_bytes,
        timeout_keep_alive=cfg.keep_alive_timeout_s,  # type: ignore[arg-type]
        limit_concurrency=cfg.max_connections if protocol == "h11" else None,
        timeout_graceful_shutdown=int(RESPONSE_GRACE_S) + 1,
        access_log=False,
        server_header=False,
    )
    sock = uv_config.bind_socket()
    # A second descriptor of the listening socket keeps it listening after the server's own
    # is closed, so that the connections the kernel has already accepted can be taken in.
    spare = sock.dup()
    return _draining_server_class()(uv_config, state, cfg.drain_timeout_s, spare), sock


HANDSHAKE_WINDOW_S = 0.25
"""With new handshakes refused, how long the listener keeps taking in connections whose
handshake was already answered (their last ACK can be a round trip away). A client whose
ACK takes longer can still be reset; one whose SYN was dropped retries after about 1 s
and is refused, so a longer window would refuse nobody more."""

_SO_ATTACH_FILTER, _SO_DETACH_FILTER = 26, 27  # Linux <asm-generic/socket.h>
# Classic BPF on a TCP socket sees the TCP header at offset 0; byte 13 holds the flags.
# Drop a segment whose SYN is set and ACK is not (a new connection); pass everything else.
_DROP_NEW_SYN = (
    (0x30, 0, 0, 13),  # ldb [13]
    (0x54, 0, 0, 0x12),  # and #(SYN|ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN ? drop : pass
    (0x06, 0, 0, 0),  # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: pass
)


def refuse_new_handshakes(listener: socket.socket) -> bool:
    """Make a listening socket ignore new connection attempts (Linux), so that the
    connections the kernel already accepted can be taken in before it closes, instead of
    being reset by the close. Their SYNs are dropped, the clients retry, and after the
    close they are refused. False where socket filters are unavailable (not Linux, or a
    sandbox without them): then a connection completing just before the close is reset."""
    import ctypes
    import struct
    import sys

    if not sys.platform.startswith("linux"):
        return False
    code = b"".join(struct.pack("HBBI", *insn) for insn in _DROP_NEW_SYN)
    buffer = ctypes.create_string_buffer(code)  # the kernel copies it during setsockopt
    program = struct.pack("HP", len(_DROP_NEW_SYN), ctypes.addressof(buffer))
    try:
        listener.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, program)
    except OSError:
        return False
    return True


def accept_pending(listener: socket.socket) -> list[socket.socket]:
    """Every connection waiting in ``listener``'s backlog now (the listener must be
    non-blocking), without the listener's socket filter, which an accepted socket inherits."""
    accepted: list[socket.socket] = []
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # BlockingIOError: the backlog is empty
            return accepted
        try:
            conn.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
        except OSError:
            pass  # no filter to detach
        accepted.append(conn)


def _draining_server_class() -> type[Any]:
    """uvicorn's Server with the drain (built here: uvicorn is an optional dependency)."""
    import uvicorn

    class _DrainingServer(uvicorn.Server):
        """Drain on the first signal, exit at once on the second."""

        def __init__(
            self, config: uvicorn.Config, state: Any, drain_timeout_s: float, spare: socket.socket
        ) -> None:
            super().__init__(config)
            self.state = state
            self.drain_timeout_s = drain_timeout_s
            self.spare = spare
            self.draining_task: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.state.draining or self.should_exit:
                self.force_exit = True
                self.should_exit = True
                return
            logger.warning(
                "%s: draining for up to %g s", signal.Signals(sig).name, self.drain_timeout_s
            )
            self.state.begin_drain()
            asyncio.get_event_loop().call_soon_threadsafe(self._start_drain)

        def _start_drain(self) -> None:
            self.draining_task = asyncio.ensure_future(self._drain())

        async def _drain(self) -> None:
            started = time.monotonic()
            try:
                await self._stop_accepting()
                await asyncio.sleep(min(ACCEPT_LINGER_S, self.drain_timeout_s))
                left = self.drain_timeout_s - (time.monotonic() - started)
                if not await self.state.wait_drained(max(0.0, left)):
                    logger.warning(
                        "drain timeout: answering %d unfinished request(s) with 503",
                        self.state.inflight,
                    )
                    await self.state.batcher.stop(0.0)
                    await self.state.wait_drained(RESPONSE_GRACE_S)
            finally:
                self.should_exit = True

        async def _stop_accepting(self) -> None:
            """Close the listener, taking in what the kernel accepted before it closed."""
            loop = asyncio.get_running_loop()
            for server in self.servers:
                server.close()
            self.spare.setblocking(False)
            refusing = refuse_new_handshakes(self.spare)
            deadline = loop.time() + (
                min(HANDSHAKE_WINDOW_S, self.drain_timeout_s) if refusing else 0.0
            )
            while True:
                for conn in accept_pending(self.spare):
                    await self._take(conn)
                if loop.time() >= deadline:
                    break
                await asyncio.sleep(0.01)
            self.spare.close()  # from here on, connecting is refused

        async def _take(self, conn: socket.socket) -> None:
            def factory() -> asyncio.Protocol:
                return self.config.http_protocol_class(  # type: ignore[call-arg,no-any-return]
                    config=self.config,
                    server_state=self.server_state,
                    app_state=self.lifespan.state,
                )

            conn.setblocking(False)
            try:
                await asyncio.get_running_loop().connect_accepted_socket(factory, conn)
            except OSError:
                conn.close()

    return _DrainingServer
