"""The ``/v1/systemone`` HTTP app: a thin FastAPI adapter over one decision engine.

Routes: ``POST /v1/systemone``, ``POST /v1/systemone/batch``, ``GET /v1/models``,
``GET /healthz``, ``GET /readyz``, ``GET /metrics``. Every response carries an
``x-typesafe-request-id`` header; every bad request gets a 4xx with the documented shape.

Example:
    In process, with FastAPI's test client (``clef-agents serve``, or
    ``uvicorn.run(app, port=8000)``, serves the app on a port):

    >>> from fastapi.testclient import TestClient
    >>> from clef_engine import DecisionEngine
    >>> from clef_agents.server import create_app, ServerConfig
    >>> app = create_app(DecisionEngine(), ServerConfig(max_batch=32))
    >>> route = {"type": "choice", "instructions": "Route the ticket", "criteria": {
    ...     "refund": "the customer wants money back",
    ...     "delivery": "a parcel or card that has not arrived"}}
    >>> with TestClient(app) as client:
    ...     ok = client.post("/v1/systemone", json={"model": "jev-latest",
    ...         "state": "My card still hasn't arrived", "questions": {"route": route}})
    ...     bad = client.post("/v1/systemone", json={"model": "jev-latest",
    ...         "state": "hi", "questions": {"route": {**route, "criteria": {"refund": None}}}})
    >>> ok.status_code, ok.json()["model"], ok.json()["answers"]["route"]["choice"]
    (200, 'clef-general-minilm', 'delivery')
    >>> bad.status_code, bad.json()["detail"][0]["msg"]
    (422, 'a choice needs 2..255 options; got 1')
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clef_agents.server import budget
from clef_agents.server.batcher import MicroBatcher, Overloaded, ShuttingDown
from clef_agents.server.body import (
    attach_parts,
    check_assets,
    decompress,
    parse_json,
    parse_multipart,
    read_body,
    until_disconnected,
)
from clef_agents.server.config import ServerConfig
from clef_agents.server.errors import (
    HTTPError,
    ValidationFailed,
    dumps,
    engine_error,
    error_payload,
)
from clef_agents.server.metrics import Metrics
from clef_agents.server.openapi import openapi
from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.request import DecisionRequest, questions_from
from clef_engine.slots import Slots

logger = logging.getLogger("clef_agents.server")

REQUEST_ID_HEADER = "x-typesafe-request-id"
ROUTES = ("/v1/systemone", "/v1/systemone/batch", "/v1/models", "/healthz", "/readyz", "/metrics")
_ALWAYS_OPEN = ("/healthz", "/readyz", "/metrics")
JEV_VERSIONED = re.compile(r"jev-\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?", re.ASCII)
"""Jev's pinned model names (``jev-1.13.0``), accepted unless ``jev_versions=False``."""

Submit = Callable[[Sequence[Any]], Awaitable[list[Any]]]


class ServerState:
    """What the routes share: the engine, settings, metrics, batcher and drain state."""

    def __init__(self, engine: Engine, config: ServerConfig, batcher: Any | None = None) -> None:
        self.engine = engine
        self.config = config
        self.metrics = Metrics()
        self.model_name: str = str(getattr(engine, "model_name", "clef"))
        self.batcher = batcher or MicroBatcher(
            lambda items: engine.decide_batch(items, return_exceptions=True),
            max_batch=config.max_batch,
            max_wait_ms=config.max_wait_ms,
            max_queue=config.max_queue,
            observer=self.metrics,
        )
        self.decision_log: Any | None = None
        self.draining = False
        self.inflight = 0
        self.admitted = 0  # in flight with their whole body received (the admission count)
        self._idle = asyncio.Event()
        self._idle.set()
        self._start_lock: asyncio.Lock | None = None
        self.started = False

    @property
    def model_version(self) -> str | None:
        try:
            return str(self.engine.model_version)
        except Exception:  # a stub engine without a version
            return None

    @property
    def admit_limit(self) -> int:
        """Requests past their body on ``/v1/systemone*`` beyond which new ones get 503 at
        once. Requests still receiving their body do not count: slow senders, bounded by
        the body deadline and the connection cap, cannot lock valid clients out."""
        return self.config.max_queue + self.config.max_batch

    def accepts(self, model: str) -> bool:
        return (
            self.config.any_model
            or model == self.model_name
            or model in self.config.aliases
            or (self.config.jev_versions and JEV_VERSIONED.fullmatch(model) is not None)
        )

    async def ensure_started(self) -> None:
        """Start the batcher on first use (ASGI servers without lifespan, e.g. tests)."""
        if self.started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self.started:
                await self.batcher.start()
                self.started = True

    async def stop(self) -> None:
        if self.started:
            await self.batcher.stop(self.config.drain_timeout_s)
            self.started = False

    # -- draining ----------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Refuse new ``/v1`` requests with 503; in-flight ones finish."""
        self.draining = True

    async def wait_drained(self, timeout_s: float) -> bool:
        """Wait until no ``/v1`` request is in flight; ``False`` on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()
        self.metrics.inflight.set(self.inflight)

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self._idle.set()
        self.metrics.inflight.set(self.inflight)


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    try:
        content = dumps(body)
    except UnicodeEncodeError:
        # A lone surrogate echoed from the request (an object key in an error's loc) has no
        # UTF-8 form: send it as a \ud800 escape rather than fail with a 500.
        text = json.dumps(body, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        content = text.encode()
    return Response(
        content, status_code=status, headers=dict(headers or {}), media_type="application/json"
    )


def _error_response(error: HTTPError | ValidationFailed) -> Response:
    status, body = error_payload(error)
    headers = error.headers if isinstance(error, HTTPError) else None
    return _json(status, body, headers)


def _overloaded(retry_after_s: float, message: str) -> HTTPError:
    return HTTPError(
        503,
        "overloaded_error",
        message,
        headers={
            "Retry-After": str(max(1, int(retry_after_s + 0.999))),
            "retry-after-ms": str(int(retry_after_s * 1000)),
        },
    )


class _Frame:
    """Pure ASGI middleware: request id, draining, in-flight count, metrics, last-resort 500."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state
        request_id = f"req_{uuid.uuid4().hex}"
        scope["clef_request_id"] = request_id  # the decision log records it
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        started = time.perf_counter()
        status_seen: list[int] = []

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(int(message["status"]))
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                for key, value in state.config.extra_headers.items():
                    headers.append((key.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        counted = route.startswith("/v1/")
        if counted and state.draining:
            state.metrics.shed.labels(reason="draining").inc()
            response = _error_response(
                _overloaded(1.0, "the server is shutting down; retry on another replica")
            )
            response.headers["Connection"] = "close"
            await response(scope, receive, send_with_id)
        elif route.startswith("/v1/systemone") and state.admitted >= state.admit_limit:
            # Shed before reading the body: under overload the event loop must not spend
            # itself on requests that would only wait for the full queue to refuse them.
            state.metrics.shed.labels(reason="inflight").inc()
            retry = state.batcher.retry_after_s() if hasattr(state.batcher, "retry_after_s") else 1
            response = _error_response(
                _overloaded(
                    retry, f"the server is overloaded ({state.inflight} requests in flight)"
                )
            )
            # The body stays unread, so the connection cannot carry another request.
            response.headers["Connection"] = "close"
            await response(scope, receive, send_with_id)
        else:
            if counted:
                state.enter()
            body_done = False

            async def receive_counted() -> Message:
                nonlocal body_done
                message = await receive()
                if counted and not body_done and not message.get("more_body", False):
                    body_done = True  # whole body in (or the client gone): now admitted
                    state.admitted += 1
                return message

            try:
                await self.app(scope, receive_counted, send_with_id)
            except Exception:
                logger.exception("unhandled error on %s", path)
                if not status_seen:
                    response = _error_response(
                        HTTPError(500, "internal_error", "the server failed this request")
                    )
                    await response(scope, receive, send_with_id)
            finally:
                if counted:
                    state.leave()
                if body_done:
                    state.admitted -= 1
        status = status_seen[0] if status_seen else 500
        state.metrics.observe_request(route, status, time.perf_counter() - started)


def _guarded(
    fn: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """Turn raised HTTP errors, validation failures and surprises into JSON responses."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except (HTTPError, ValidationFailed) as error:
            return _error_response(error)
        except Overloaded as exc:
            request.app.state.clef.metrics.shed.labels(reason="queue_full").inc()
            return _error_response(_overloaded(exc.retry_after_s, str(exc)))
        except ShuttingDown as exc:
            return _error_response(_overloaded(1.0, str(exc)))
        except Exception as exc:
            logger.exception("error answering %s", request.url.path)
            return _error_response(engine_error(exc))

    return wrapper


def _authorize(state: ServerState, request: Request) -> None:
    key = state.config.api_key
    if not key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if not header:
        raise HTTPError(
            401,
            "authentication_error",
            "missing API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": 'Bearer realm="clef-agents"'},
        )
    # Compare in constant time, on bytes, whatever the scheme said.
    ok = hmac.compare_digest(given.strip().encode(), key.encode())
    if scheme.lower() != "bearer" or not ok:
        raise HTTPError(
            401,
            "authentication_error",
            "invalid API key",
            headers={"WWW-Authenticate": 'Bearer realm="clef-agents", error="invalid_token"'},
        )


async def _read_payload(state: ServerState, request: Request) -> Any:
    cfg = state.config
    body = await read_body(request, cfg.max_body_bytes, cfg.body_timeout_s)
    body = decompress(body, request.headers.get("content-encoding"), cfg.max_body_bytes)
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("multipart/"):
        payload, parts = await parse_multipart(request.headers, body, cfg.max_body_bytes)
        payload = attach_parts(payload, parts)
    else:
        payload = parse_json(body)
    if not isinstance(payload, dict):
        raise ValidationFailed.one(
            [],
            f"the request must be a JSON object; got {type(payload).__name__}",
            "model_attributes_type",
        )
    check_assets(payload)
    return payload


def _check_model(state: ServerState, payload: Mapping[str, Any]) -> None:
    model = payload.get("model")
    if isinstance(model, str) and not state.accepts(model):
        names = ", ".join(repr(n) for n in (state.model_name, *state.config.aliases))
        raise HTTPError(
            404, "not_found_error", f"model {model!r} is not served here; use one of {names}"
        )


def _request_id(request: Request) -> str | None:
    rid = request.scope.get("clef_request_id")
    return None if rid is None else str(rid)


def _wire(state: ServerState, result: Any) -> dict[str, Any]:
    wire: dict[str, Any] = result.to_wire()
    wire["model"] = state.model_name
    source = getattr(result, "x_source", "model")
    if source != "model":
        state.metrics.fallbacks.labels(source=str(source)).inc()
    return wire


def create_app(
    engine: Engine,
    config: ServerConfig | None = None,
    *,
    batcher: Any | None = None,
    decision_log: Any | None = None,
) -> FastAPI:
    """Build the HTTP app around ``engine`` (a :class:`~engine.DecisionEngine` or lookalike).

    Args:
        engine: Anything with ``decide_batch(items, return_exceptions=True)`` and
            ``model_name``.
        config: Batching, admission and auth settings.
        batcher: Replaces the micro-batcher (Ray Serve passes its own); needs
            ``start()``, ``stop(timeout_s)``, ``submit(items)`` and ``depth``.
        decision_log: A :class:`~clef_agents.decision_log.DecisionLog` that records each
            answered request with its ``x-typesafe-request-id`` (``#i`` per batch item).
    """
    cfg = (config or ServerConfig()).validate()
    state = ServerState(engine, cfg, batcher)
    state.decision_log = decision_log
    app = FastAPI(
        title="clef-agents decision server",
        description="TypeSafe /v1/systemone on a local decision engine.",
        lifespan=_lifespan(state),
        # A redirect would build its Location from the client's Host header.
        redirect_slashes=False,
    )
    app.state.clef = state
    app.openapi = functools.partial(openapi, app)  # type: ignore[method-assign]
    app.exception_handler(StarletteHTTPException)(_http_exception)
    _add_decision_routes(app, state)
    _add_info_routes(app, state)
    app.add_middleware(_Frame, state=state)
    return app


def _lifespan(state: ServerState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the batcher with the app; stop it (draining its queue) when the app stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.ensure_started()
        try:
            yield
        finally:
            await state.stop()

    return lifespan


async def _http_exception(request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's own 404 and 405 (an unknown path or method) in the documented shape."""
    kinds = {404: "not_found_error", 405: "method_not_allowed"}
    error = HTTPError(
        exc.status_code,
        kinds.get(exc.status_code, "http_error"),
        str(exc.detail),
        headers=dict(exc.headers or {}),  # 405 carries Allow
    )
    return _error_response(error)


def _add_decision_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/systemone`` (one state) and ``POST /v1/systemone/batch`` (many)."""

    @app.post("/v1/systemone")
    @_guarded
    async def systemone(request: Request) -> Response:
        _authorize(state, request)
        payload = await _read_payload(state, request)
        try:
            # Over HTTP a path-like string is text: the server never opens its own files.
            decision = DecisionRequest.parse(payload).without_paths()
        except InvalidRequestError as exc:
            raise ValidationFailed.from_engine(exc) from None
        _check_model(state, payload)
        budget.check_questions(decision.questions, state.config)
        budget.check_state(decision.state, state.config)
        await state.ensure_started()
        [slot] = await until_disconnected(state.batcher.submit([decision]), request)
        if isinstance(slot, BaseException):
            raise engine_error(slot)
        if state.decision_log is not None:
            state.decision_log.record(decision, None, slot, request_id=_request_id(request))
        state.metrics.decisions.inc()
        return _json(200, _wire(state, slot))

    @app.post("/v1/systemone/batch")
    @_guarded
    async def systemone_batch(request: Request) -> Response:
        _authorize(state, request)
        payload = await _read_payload(state, request)
        items = _batch_items(state, payload)
        await state.ensure_started()
        answered = (
            await until_disconnected(state.batcher.submit(items.pending), request)
            if items.pending
            else []
        )
        slots = items.fill(answered)
        if state.decision_log is not None and items.pending:
            rid = _request_id(request)
            state.decision_log.record_many(
                items.pending, None, answered, [f"{rid}#{i}" for i in items.indexes]
            )
        return _json(200, _batch_answer(state, slots))


def _batch_items(state: ServerState, payload: Mapping[str, Any]) -> Slots[DecisionRequest]:
    """The batch's decision requests, one slot per state.

    The request as a whole is refused (raised) for a bad ``states`` or ``questions``, an
    unknown model or questions over budget; a bad state is refused in its own slot (422 or
    413 there), so that the others are still answered.
    """
    cfg = state.config
    states = payload.get("states")
    if not isinstance(states, list) or not states:
        raise ValidationFailed.one(["states"], "states must be a non-empty array", "missing")
    if len(states) > cfg.max_batch_items:
        raise ValidationFailed.one(
            ["states"],
            f"{len(states)} states; the limit is {cfg.max_batch_items}",
            "too_long",
        )
    questions = payload.get("questions")
    if not isinstance(questions, dict):
        raise ValidationFailed.one(["questions"], "questions must be an object", "dict_type")
    try:
        parsed = questions_from(questions)
    except InvalidRequestError as exc:
        raise ValidationFailed.from_engine(exc) from None
    _check_model(state, payload)
    budget.check_questions(parsed, cfg)
    budget.check_batch_states(states, cfg)

    def item_request(indexed: tuple[int, Any]) -> DecisionRequest:
        i, item = indexed
        item_payload: dict[str, Any] = {"state": item, "questions": parsed}
        if payload.get("assets") is not None:
            item_payload["assets"] = payload["assets"]
        try:
            decision = DecisionRequest.parse(item_payload).without_paths()
            budget.check_state(decision.state, cfg, i)
        except InvalidRequestError as exc:
            raise ValidationFailed.from_engine(exc, ("states", i)) from None
        return decision

    return Slots.parse(enumerate(states), item_request, catch=(HTTPError, ValidationFailed))


def _batch_answer(state: ServerState, slots: Sequence[Any]) -> dict[str, Any]:
    """The batch response body: per state its answer or its own error, in order."""
    results: list[dict[str, Any]] = []
    tokens = 0
    for i, slot in enumerate(slots):
        if isinstance(slot, (ValidationFailed, HTTPError)):
            error = slot
        elif isinstance(slot, BaseException):
            error = engine_error(slot, ("states", i))
        else:
            wire = _wire(state, slot)
            tokens += int(wire.get("usage", {}).get("input_tokens", 0))
            state.metrics.decisions.inc()
            results.append(wire)
            continue
        status, body = error_payload(error)
        results.append({"error": {"status": status, **body}})
    return {
        "model": state.model_name,
        "results": results,
        "usage": {"input_tokens": tokens, "output_tokens": 0},
    }


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    """``GET /v1/models``, ``/healthz``, ``/readyz`` and ``/metrics``."""
    cfg = state.config

    @app.get("/v1/models")
    @_guarded
    async def models(request: Request) -> Response:
        _authorize(state, request)
        entries = [
            {
                "name": state.model_name,
                "description": "Local clef-agents decision engine"
                + (f" ({state.model_version})" if state.model_version else ""),
                "release_date": cfg.release_date,
            }
        ]
        for alias in cfg.aliases:
            if alias != state.model_name:
                entries.append(
                    {
                        "name": alias,
                        "description": f"Alias of {state.model_name}",
                        "release_date": cfg.release_date,
                    }
                )
        return _json(200, {"models": entries})

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if state.draining:
            return _json(503, {"detail": {"error_type": "not_ready", "message": "draining"}})
        return _json(
            200,
            {
                "status": "ready",
                "model": state.model_name,
                "model_version": state.model_version,
                "queue_depth": state.batcher.depth,
                "inflight": state.inflight,
            },
        )

    @app.get("/metrics")
    @_guarded
    async def metrics(request: Request) -> Response:
        if not cfg.metrics_public:
            _authorize(state, request)  # a no-op without a key
        return Response(state.metrics.render(), media_type=state.metrics.content_type)
