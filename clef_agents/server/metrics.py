"""Prometheus metrics of one server (its own registry, so several apps can coexist)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Requests by status, latency, batch sizes, queue depth, fallbacks.

    Example:
        >>> m = Metrics()
        >>> m.observe_request("/v1/systemone", 200, 0.012)
        >>> b"clef_requests_total" in m.render()
        True
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "clef_requests",
            "HTTP requests by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "clef_request_latency_seconds",
            "Wall time from request start to response, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "clef_batch_size",
            "Requests per model forward (micro-batch size).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.forward_seconds = Histogram(
            "clef_forward_seconds",
            "Wall time of one batched model call.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue = Gauge(
            "clef_queue_depth", "Requests waiting for the model.", registry=self.registry
        )
        self.inflight = Gauge(
            "clef_inflight_requests", "Requests being handled.", registry=self.registry
        )
        self.fallbacks = Counter(
            "clef_fallbacks",
            "Answers not produced by the model (x_source rules or default).",
            ["source"],
            registry=self.registry,
        )
        self.shed = Counter(
            "clef_shed",
            "Requests refused with 503 because the queue was full or the server draining.",
            ["reason"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "clef_decisions",
            "Decisions answered (batch items count one each).",
            registry=self.registry,
        )

    # -- BatchObserver ----------------------------------------------------------------

    def batch_done(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.forward_seconds.observe(seconds)

    def queue_depth(self, depth: int) -> None:
        self.queue.set(depth)

    # -- requests -----------------------------------------------------------------------

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
