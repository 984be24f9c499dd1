"""The same ``/v1/systemone`` app as a Ray Serve deployment, batched by Ray Serve.

Each replica loads its own engine and serves the FastAPI app from :func:`create_app`;
requests are grouped by ``@serve.batch`` (Ray Serve's request batching) instead of our
micro-batcher, and Ray's proxy does the admission control (``max_queued_requests`` → 503).

Run it with ``clef-agents serve --ray --replicas 2`` or with Ray's own CLI::

    serve run clef_agents.server.ray_serve:build_app model=/path/to/model replicas=2

On a multi-node cluster with GPUs, start Ray on every node (``ray start --head`` /
``ray start --address=HEAD:6379``) and pass ``num_gpus=1``: Ray places one replica per
GPU and its proxies spread HTTP traffic over them.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from clef_engine.errors import require

require("ray.serve", package="ray[serve]", extra="ray", feature="clef-agents serve --ray")

from ray import serve  # noqa: E402

from clef_agents.server.config import ServerConfig  # noqa: E402


def _load_engine(model: str | None, device: str, int8: bool) -> Any:
    from clef_engine import DecisionEngine

    kwargs: dict[str, Any] = {"device": device}
    if int8:
        kwargs["quantize"] = "int8"
    if model:
        return DecisionEngine.from_pretrained(model, **kwargs)
    return DecisionEngine(**kwargs)


class _RayBatcher:
    """The batcher interface of :func:`create_app`, backed by a ``@serve.batch`` method."""

    def __init__(self, batched: Any) -> None:
        self._batched = batched
        self.depth = 0

    async def start(self) -> None:
        return None

    async def stop(self, timeout_s: float = 0.0) -> None:
        return None

    async def submit(self, items: list[Any]) -> list[Any]:
        self.depth += len(items)
        try:
            boxed = await asyncio.gather(*(self._batched(item) for item in items))
        finally:
            self.depth -= len(items)
        return [box[0] for box in boxed]


@serve.ingress()
class ClefDeployment:
    """One replica: an engine, the FastAPI app, and Ray Serve's request batching."""

    def __init__(self, model: str | None, device: str, int8: bool, config: dict[str, Any]) -> None:
        self.config = ServerConfig(**config).validate()
        self.engine = _load_engine(model, device, int8)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="clef-ray-model")
        batched: Any = self._decide  # serve.batch adds the setters at run time
        batched.set_max_batch_size(self.config.max_batch)
        batched.set_batch_wait_timeout_s(self.config.max_wait_ms / 1000.0)
        self._metrics: Any = None

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
    async def _decide(self, requests: list[Any]) -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        slots = await loop.run_in_executor(
            self._pool, lambda: self.engine.decide_batch(requests, return_exceptions=True)
        )
        if self._metrics is not None:
            self._metrics.batch_done(len(requests), time.perf_counter() - started)
        return [[slot] for slot in slots]  # boxed: exceptions are values, not raised

    def __serve_build_asgi_app__(self) -> Any:
        from clef_agents.server.app import create_app

        app = create_app(self.engine, self.config, batcher=_RayBatcher(self._decide))
        self._metrics = app.state.clef.metrics
        return app


def deployment(
    *,
    model: str | None = None,
    device: str = "auto",
    int8: bool = False,
    config: ServerConfig | None = None,
    replicas: int = 1,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
) -> Any:
    """A bound Ray Serve application of the decision server."""
    cfg = (config or ServerConfig()).validate()
    options: dict[str, Any] = {
        "name": "clef",
        "num_replicas": replicas,
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max(cfg.max_batch * 2, 8),
        "max_queued_requests": cfg.max_queue,
    }
    deployed: Any = serve.deployment(ClefDeployment)
    return deployed.options(**options).bind(model, device, int8, asdict(cfg))


def build_app(args: dict[str, str]) -> Any:
    """``serve run clef_agents.server.ray_serve:build_app model=DIR replicas=2 num_gpus=1``."""
    cfg = ServerConfig(
        max_batch=int(args.get("max_batch", 64)),
        max_wait_ms=float(args.get("max_wait_ms", 2.0)),
        max_queue=int(args.get("max_queue", 256)),
    )
    return deployment(
        model=args.get("model") or None,
        device=args.get("device", "auto"),
        int8=args.get("int8", "false").lower() in ("1", "true", "yes"),
        config=cfg,
        replicas=int(args.get("replicas", 1)),
        num_cpus=float(args.get("num_cpus", 1)),
        num_gpus=float(args.get("num_gpus", 0)),
    )


def run_ray(args: argparse.Namespace, cfg: ServerConfig) -> int:
    """``clef-agents serve --ray``: start (or join) Ray, deploy, serve until a signal."""
    import ray

    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        ray.init(include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = deployment(
        model=args.model,
        device=args.device,
        int8=args.int8,
        config=cfg,
        replicas=args.replicas,
        num_gpus=args.num_gpus,
    )
    serve.run(app, name="clef", route_prefix="/")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0
