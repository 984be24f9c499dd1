"""Server settings, in one place so the CLI, Ray Serve and tests agree."""

from __future__ import annotations

from dataclasses import dataclass, field

from clef_engine.schema.limits import (
    SERVER_MAX_BATCH_STATE_CHARS,
    SERVER_MAX_EXAMPLE_TEXTS,
    SERVER_MAX_OPTION_TEXTS,
    SERVER_MAX_STATE_CHARS,
)

DEFAULT_ALIASES = ("jev-latest",)
"""Model names accepted besides the served model's own (the official SDKs send ``jev-latest``)."""


@dataclass
class ServerConfig:
    """How the decision server batches, admits and limits requests.

    Example:
        >>> cfg = ServerConfig(max_batch=32, max_wait_ms=2.0, api_key="s3cret")
        >>> cfg.batching
        True
    """

    max_batch: int = 64
    """Most requests in one padded forward; ``1`` turns micro-batching off."""
    max_wait_ms: float = 2.0
    """A gap this long between arrivals closes a filling batch (see ``batcher.FILL_CAP_S``)."""
    max_queue: int = 256
    """Requests waiting for the model before new ones are shed with 503 + ``Retry-After``.
    At most ``max_queue + max_batch`` requests are in flight on ``/v1/systemone*``; past
    that a request gets its 503 before its body is read, so overload costs little."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Cap on a request body, compressed and decompressed (413 above it)."""
    body_timeout_s: float = 10.0
    """A body that has not fully arrived this long after it was first read gets 408: one
    deadline for the whole body, which a trickle of bytes cannot push back. Requests still
    receiving their body do not count toward the in-flight limit below."""
    max_header_bytes: int = 64 * 1024
    """Cap on a request's line and headers together: 431 and the connection closed above it
    (``clef-agents serve`` only; the ASGI app itself never sees headers that large)."""
    header_timeout_s: float = 10.0
    """A request's line and headers must arrive within this long of the connection opening or
    of their first byte; otherwise 408 (or, if nothing was sent, the connection is closed)."""
    keep_alive_timeout_s: float = 5.0
    """An idle keep-alive connection is closed after this long without a new request."""
    max_connections: int = 1024
    """Open connections past which a new one gets 503 + ``Retry-After`` and is closed at once,
    before it can hold a file descriptor (keep it below ``ulimit -n``)."""
    metrics_public: bool = False
    """When ``api_key`` is set, ``GET /metrics`` needs the key too unless this is ``True``
    (a scraper that cannot send headers). Without a key ``/metrics`` is always open."""
    max_batch_items: int = 256
    """Most states in one ``/v1/systemone/batch`` request."""
    api_key: str | None = None
    """When set, ``/v1/*`` needs ``Authorization: Bearer <key>`` (401 otherwise)."""
    aliases: tuple[str, ...] = DEFAULT_ALIASES
    """Extra model names accepted in requests; the served model's name is always accepted."""
    any_model: bool = False
    """Accept any ``model`` name (answers still come from the served model)."""
    drain_timeout_s: float = 30.0
    """On shutdown, how long in-flight and queued requests may take to finish; what is
    still queued or running then gets 503 JSON with ``Retry-After``, and the process exits
    about a second later."""
    release_date: str = "2026-01-01"
    """Reported by ``GET /v1/models``."""
    extra_headers: dict[str, str] = field(default_factory=dict)
    jev_versions: bool = True
    """Also accept Jev's versioned model names (``jev-1.13.0``, ``jev-<semver>``) that
    some clients pin."""
    max_state_chars: int = SERVER_MAX_STATE_CHARS
    """Compute budget: longest rendered state of one request, images left out (413)."""
    max_batch_state_chars: int = SERVER_MAX_BATCH_STATE_CHARS
    """Compute budget: rendered state characters of one batch request, all states (413)."""
    max_option_texts: int = SERVER_MAX_OPTION_TEXTS
    """Compute budget: distinct option texts over all questions of one request (422)."""
    max_example_texts: int = SERVER_MAX_EXAMPLE_TEXTS
    """Compute budget: option examples over all questions of one request (422)."""

    @property
    def batching(self) -> bool:
        return self.max_batch > 1

    def validate(self) -> ServerConfig:
        """Raise :class:`ValueError` naming the first setting out of range."""
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {self.max_batch}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0; got {self.max_wait_ms}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1; got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024; got {self.max_body_bytes}")
        if self.body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be > 0; got {self.body_timeout_s}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max_header_bytes must be >= 1024; got {self.max_header_bytes}")
        if self.header_timeout_s <= 0:
            raise ValueError(f"header_timeout_s must be > 0; got {self.header_timeout_s}")
        if self.keep_alive_timeout_s <= 0:
            raise ValueError(f"keep_alive_timeout_s must be > 0; got {self.keep_alive_timeout_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1; got {self.max_connections}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0; got {self.drain_timeout_s}")
        if self.max_batch_items < 1:
            raise ValueError(f"max_batch_items must be >= 1; got {self.max_batch_items}")
        for name in (
            "max_state_chars",
            "max_batch_state_chars",
            "max_option_texts",
            "max_example_texts",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        return self
