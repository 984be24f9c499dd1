"""``clef-agents serve``: the Jev-compatible ``/v1/systemone`` server (uvicorn, or Ray Serve).

Shutdown is graceful: the first SIGTERM/SIGINT closes the listening socket, makes new
``/v1`` requests answer 503 with ``Retry-After`` (and ``/readyz`` 503) while in-flight and
queued requests finish; at ``--drain-timeout`` what is left gets 503 and the server exits.
A second signal exits at once. Connection limits: see :mod:`clef_agents.server.transport`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import add_engine_args, build_engine, number
from clef_engine.schema.limits import (
    SERVER_MAX_BATCH_STATE_CHARS,
    SERVER_MAX_EXAMPLE_TEXTS,
    SERVER_MAX_OPTION_TEXTS,
    SERVER_MAX_STATE_CHARS,
)

EPILOG = """examples:
  clef-agents serve                                  # embedded model on 127.0.0.1:8000
  clef-agents serve --model ./my-router --port 9000 --api-key-env CLEF_KEY
  clef-agents serve --max-batch 1                    # micro-batching off
  clef-agents serve --ray --replicas 2               # Ray Serve, one engine per replica
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve /v1/systemone over HTTP",
        description="Serve the TypeSafe /v1/systemone API on a local decision engine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The helpers add their flags in the order --help lists them.
    _add_listen_args(p)
    _add_batching_args(p)
    _add_connection_args(p)
    _add_access_args(p)
    _add_budget_args(p)
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long queued requests may finish; then 503 (default 30)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    _add_decision_log_args(p)
    _add_ray_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def _add_listen_args(p: argparse.ArgumentParser) -> None:
    """Where the server listens, and the API key it asks for."""
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=number(int, low=0, high=65535),
        default=8000,
        help="port, 0..65535 (default 8000; 0 picks a free one, printed at start)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <key>' with the key read from env VAR",
    )


def _add_batching_args(p: argparse.ArgumentParser) -> None:
    """The micro-batcher: batch size, how long a batch fills, the queue before 503."""
    p.add_argument(
        "--max-batch", type=int, default=64, metavar="N", help="requests per forward (1: off)"
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        metavar="W",
        help="gap between arrivals that closes a filling batch (ms)",
    )
    p.add_argument(
        "--max-queue", type=int, default=256, metavar="Q", help="queued requests before 503"
    )


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    """Caps and deadlines per request body, request head and connection."""
    p.add_argument(
        "--max-body-mb", type=float, default=8.0, metavar="MB", help="request body cap (413)"
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="whole-body deadline from its first read; a trickle cannot extend it (408)",
    )
    p.add_argument(
        "--max-header-kb",
        type=float,
        default=64.0,
        metavar="KB",
        help="request line + headers cap (431, connection closed; default 64)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="request head must arrive within S of connecting or its first byte (408)",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="close an idle keep-alive connection after S (default 5)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="open connections past which a new one gets 503 and is closed (default 1024)",
    )


def _add_access_args(p: argparse.ArgumentParser) -> None:
    """Whether /metrics needs the key, and which model names requests may ask for."""
    p.add_argument(
        "--metrics-public",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --api-key-env, serve /metrics without the key (default: key required)",
    )
    p.add_argument(
        "--alias",
        action="append",
        default=None,
        metavar="NAME",
        help="extra accepted model name, besides jev-latest and jev-<version> (repeatable)",
    )
    p.add_argument("--any-model", action="store_true", help="accept any model name in requests")
    p.add_argument(
        "--jev-versions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="accept Jev's pinned names such as jev-1.13.0 (default: yes)",
    )


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    """How much work one request may ask for: state length, option and example texts."""
    p.add_argument(
        "--max-state-chars",
        type=int,
        default=SERVER_MAX_STATE_CHARS,
        metavar="N",
        help=f"longest rendered state per request (413; default {SERVER_MAX_STATE_CHARS})",
    )
    p.add_argument(
        "--max-batch-state-chars",
        type=int,
        default=SERVER_MAX_BATCH_STATE_CHARS,
        metavar="N",
        help="rendered state characters of one batch request, all states "
        f"(413; default {SERVER_MAX_BATCH_STATE_CHARS})",
    )
    p.add_argument(
        "--max-option-texts",
        type=int,
        default=SERVER_MAX_OPTION_TEXTS,
        metavar="N",
        help=f"distinct option texts per request (422; default {SERVER_MAX_OPTION_TEXTS})",
    )
    p.add_argument(
        "--max-example-texts",
        type=int,
        default=SERVER_MAX_EXAMPLE_TEXTS,
        metavar="N",
        help=f"option examples per request (422; default {SERVER_MAX_EXAMPLE_TEXTS})",
    )


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    """Ray Serve: replicas of the engine, the cluster, GPUs per replica."""
    p.add_argument("--ray", action="store_true", help="run as a Ray Serve deployment")
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="Ray Serve replicas")
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="Ray cluster to join (default: start a local one)",
    )
    p.add_argument("--num-gpus", type=float, default=0.0, metavar="G", help="GPUs per Ray replica")


def server_config(args: argparse.Namespace) -> Any:
    from clef_agents.server.config import DEFAULT_ALIASES, ServerConfig

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "").strip()
        if not api_key:
            raise UsageError(f"--api-key-env {args.api_key_env}: the variable is unset or empty")
    cfg = ServerConfig(
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        body_timeout_s=args.body_timeout,
        max_header_bytes=int(args.max_header_kb * 1024),
        header_timeout_s=args.header_timeout,
        keep_alive_timeout_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
        metrics_public=args.metrics_public,
        api_key=api_key,
        # --alias adds names; jev-latest stays accepted (the official SDKs send it).
        aliases=tuple(dict.fromkeys((*DEFAULT_ALIASES, *(args.alias or ())))),
        any_model=args.any_model,
        jev_versions=args.jev_versions,
        max_state_chars=args.max_state_chars,
        max_batch_state_chars=args.max_batch_state_chars,
        max_option_texts=args.max_option_texts,
        max_example_texts=args.max_example_texts,
        drain_timeout_s=args.drain_timeout,
    )
    try:
        return cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    cfg = server_config(args)
    if args.ray and args.log_decisions:
        raise UsageError("--log-decisions records one process's decisions; not with --ray")
    if args.ray:
        from clef_agents.server.ray_serve import run_ray

        sys.stderr.write(f"clef-agents: Ray Serve will listen on {url(args.host, args.port)}\n")
        return run_ray(args, cfg)
    import clef_agents.server  # noqa: F401 - fails early with the install line

    log = open_decision_log(args)
    try:
        engine = build_engine(args)
        from clef_agents.server.app import create_app

        app = create_app(engine, cfg, decision_log=log)
        # The model and libraries are long-lived: move them out of the collector's view, so
        # full collections under load walk only request garbage, not a million module objects.
        gc.collect()
        gc.freeze()
        serve_app(app, args.host, args.port, cfg, args.log_level)
    finally:
        if log is not None:
            log.close()  # what is queued is written before the process exits
    return 0


def _add_decision_log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-decisions",
        metavar="PATH",
        help="record every answered request in this SQLite decision log (docs/decision_log.md)",
    )
    p.add_argument(
        "--log-state",
        choices=["full", "hash", "none"],
        default="full",
        help="what the decision log keeps of each state (default full)",
    )
    p.add_argument(
        "--log-max-rows", type=number(int, low=1), default=None, metavar="N", help="keep N rows"
    )
    p.add_argument(
        "--log-max-age-days",
        type=number(float, low=0, low_open=True),
        default=None,
        metavar="D",
        help="delete logged decisions older than D days",
    )


def open_decision_log(args: argparse.Namespace) -> Any:
    """The :class:`DecisionLog` that ``--log-decisions`` asks for, or ``None``."""
    if not args.log_decisions:
        for flag in ("log_max_rows", "log_max_age_days"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise UsageError(f"{name} limits the decision log; give --log-decisions too")
        return None
    from clef_agents.decision_log import DecisionLog

    age = args.log_max_age_days
    return DecisionLog(
        args.log_decisions,
        state=args.log_state,
        max_rows=args.log_max_rows,
        max_age_s=None if age is None else age * 86400.0,
    )


def url(host: str, port: int) -> str:
    """``http://host:port/v1/systemone`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1/systemone"


def listening(sock: socket.socket) -> str:
    """The line ``serve`` prints once bound: the address and port (the real one, for 0)."""
    host, port = sock.getsockname()[:2]
    return f"clef-agents: listening on {host} port {port}: {url(host, port)}"


def serve_app(app: Any, host: str, port: int, cfg: Any, log_level: str) -> None:
    """Run ``app`` with uvicorn and the connection limits of ``cfg``; drain on a signal.

    Prints where it listens (stderr) once the socket is bound, before serving.
    """
    from clef_agents.server.transport import build_server

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    server, sock = build_server(app, host, port, cfg, log_level)
    sys.stderr.write(listening(sock) + "\n")
    sys.stderr.flush()
    try:
        server.run(sockets=[sock])
    finally:
        server.spare.close()
