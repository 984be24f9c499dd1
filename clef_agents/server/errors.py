"""HTTP error shapes of ``/v1/systemone``.

Validation failures answer 422 ``{"detail": [{"loc": ["body", ...], "msg", "type"}]}``;
everything else answers ``{"detail": {"error_type", "message"}}``. Bad requests always get
a 4xx; a 5xx means a bug on our side.
"""

from __future__ import annotations

import json
from typing import Any

from clef_engine.errors import ClefError, InvalidRequestError, UnsupportedQuestionError


class HTTPError(Exception):
    """An error response: status, ``error_type``, message and extra headers."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"detail": {"error_type": self.error_type, "message": self.message}}


CLIENT_CLOSED = 499
"""Status recorded (nginx's convention) when the client went away before its answer: it is
counted in ``clef_requests_total{status="499"}``, never as a 5xx; nothing reaches the client."""


def client_closed(when: str) -> HTTPError:
    """The error for a client that disconnected ``when`` (for example "while sending its body")."""
    return HTTPError(
        CLIENT_CLOSED,
        "client_closed_request",
        f"the client closed the connection {when}",
        headers={"Connection": "close"},
    )


class ValidationFailed(Exception):
    """A 422 with pydantic-shaped ``detail[]`` entries (``loc`` starts with ``"body"``)."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail[0]["msg"] if detail else "invalid request")
        self.detail = detail

    @classmethod
    def one(cls, loc: list[Any], msg: str, type_: str = "value_error") -> ValidationFailed:
        return cls([{"loc": ["body", *loc], "msg": msg, "type": type_}])

    @classmethod
    def from_engine(
        cls, exc: InvalidRequestError, prefix: tuple[Any, ...] = ()
    ) -> ValidationFailed:
        entries = []
        for err in exc.errors or []:
            loc = ["body", *prefix, *(_loc_part(p) for p in err.get("loc", ()))]
            entries.append(
                {
                    "loc": loc,
                    "msg": str(err.get("msg", exc)),
                    "type": str(err.get("type", "value_error")),
                }
            )
        if not entries:
            entries = [{"loc": ["body", *prefix], "msg": str(exc), "type": "value_error"}]
        return cls(entries)


def _loc_part(part: Any) -> Any:
    return part if isinstance(part, int) else str(part)


def engine_error(exc: BaseException, prefix: tuple[Any, ...] = ()) -> HTTPError | ValidationFailed:
    """Map an engine exception to the HTTP error it means (4xx for anything the caller did)."""
    if isinstance(exc, InvalidRequestError):
        return ValidationFailed.from_engine(exc, prefix)
    if isinstance(exc, UnsupportedQuestionError):
        return HTTPError(400, exc.error_type, str(exc))
    if isinstance(exc, ClefError):
        return HTTPError(500, exc.error_type, str(exc))
    return HTTPError(500, "internal_error", f"{type(exc).__name__}: the server failed this request")


def error_payload(error: HTTPError | ValidationFailed) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error, for single answers and batch items alike."""
    if isinstance(error, ValidationFailed):
        return 422, {"detail": error.detail}
    return error.status, error.body()


def dumps(value: Any) -> bytes:
    """Strict JSON bytes: NaN and infinity are bugs, never sent."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
