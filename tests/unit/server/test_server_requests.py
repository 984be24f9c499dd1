"""Request handling fixes: clients that leave, multi-member bodies, duplicate parts, /metrics."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest
import zstandard

from clef_agents.cli import build_parser
from clef_agents.cli.serve import server_config

KEY = "s3cret"


def _scope(path: str = "/v1/systemone") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"clef.test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("clef.test", 80),
    }


async def test_a_queued_request_whose_client_left_is_not_computed(
    make_app: Any, h: Any, tiny_engine: Any
) -> None:
    engine = h.SlowEngine(tiny_engine, 0.4)
    app = make_app(engine, max_batch=1, max_wait_ms=0)
    state = app.state.clef
    body = json.dumps(h.valid_request("the second request")).encode()
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with h.client(app) as c:
        first = asyncio.create_task(c.post("/v1/systemone", json=h.valid_request()))
        while not engine.batches:  # the first request holds the model
            await asyncio.sleep(0.01)
        second = asyncio.create_task(app(_scope(), receive, send))
        while state.batcher.depth == 0:  # the second waits in the queue
            await asyncio.sleep(0.01)
        gone.set()  # ... and its client disconnects
        await asyncio.wait_for(second, 5)
        assert (await first).status_code == 200
        await asyncio.sleep(0.6)  # longer than a forward: a computed second would show
        metrics = (await c.get("/metrics")).text
    assert engine.batches == [1], "only the first request reached the engine"
    assert sent[0]["status"] == 499
    assert 'clef_requests_total{route="/v1/systemone",status="499"} 1.0' in metrics
    assert state.admitted == 0 and state.inflight == 0


async def test_gzip_members_and_zstd_frames_are_all_decoded(make_app: Any, h: Any) -> None:
    raw = json.dumps(h.valid_request()).encode()
    cut = len(raw) // 2
    two_members = gzip.compress(raw[:cut]) + gzip.compress(raw[cut:])
    zc = zstandard.ZstdCompressor()
    two_frames = zc.compress(raw[:cut]) + zc.compress(raw[cut:])
    async with h.client(make_app()) as c:
        gz = await c.post(
            "/v1/systemone", content=two_members, headers={"Content-Encoding": "gzip"}
        )
        zs = await c.post("/v1/systemone", content=two_frames, headers={"Content-Encoding": "zstd"})
    assert gz.status_code == 200, gz.text
    assert zs.status_code == 200, zs.text
    assert gz.json()["answers"].keys() == zs.json()["answers"].keys() == {"team", "refund", "anger"}


async def test_the_body_cap_holds_across_members_and_frames(make_app: Any, h: Any) -> None:
    app = make_app(max_body_bytes=4096)
    member = b"a" * 3000  # each under the cap, together over it
    zc = zstandard.ZstdCompressor()
    async with h.client(app) as c:
        gz = await c.post(
            "/v1/systemone",
            content=gzip.compress(member) * 2,
            headers={"Content-Encoding": "gzip"},
        )
        zs = await c.post(
            "/v1/systemone",
            content=zc.compress(member) * 2,
            headers={"Content-Encoding": "zstd"},
        )
        truncated = await c.post(
            "/v1/systemone",
            content=gzip.compress(b"{}") + gzip.compress(b"{}")[:8],
            headers={"Content-Encoding": "gzip"},
        )
    assert gz.status_code == zs.status_code == 413
    assert truncated.status_code == 400


async def test_a_duplicate_request_part_is_422_naming_it(make_app: Any, h: Any) -> None:
    first = json.dumps(h.valid_request("first")).encode()
    second = json.dumps(h.valid_request("second")).encode()
    async with h.client(make_app()) as c:
        r = await c.post(
            "/v1/systemone",
            files=[
                ("request", ("request.json", first, "application/json")),
                ("request", ("request.json", second, "application/json")),
            ],
        )
    assert r.status_code == 422
    [entry] = r.json()["detail"]
    assert entry["loc"] == ["body", "request"]
    assert "'request' appears twice" in entry["msg"]


@pytest.mark.parametrize("public", [False, True])
async def test_metrics_with_a_key_is_a_choice(make_app: Any, h: Any, public: bool) -> None:
    async with h.client(make_app(api_key=KEY, metrics_public=public)) as c:
        anonymous = await c.get("/metrics")
        keyed = await c.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
        health = await c.get("/healthz")
    assert keyed.status_code == 200 and b"clef_requests_total" in keyed.content
    assert health.status_code == 200
    if public:
        assert anonymous.status_code == 200
    else:
        assert anonymous.status_code == 401
        assert anonymous.json()["detail"]["error_type"] == "authentication_error"


async def test_metrics_without_a_key_stays_open(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        assert (await c.get("/metrics")).status_code == 200


def test_serve_flags_reach_the_server_config() -> None:
    parser = build_parser()
    defaults = server_config(parser.parse_args(["serve"]))
    assert defaults.metrics_public is False
    assert defaults.max_header_bytes == 64 * 1024
    assert (defaults.header_timeout_s, defaults.keep_alive_timeout_s) == (10.0, 5.0)
    assert defaults.max_connections == 1024
    args = parser.parse_args(
        [
            "serve",
            "--metrics-public",
            "--max-header-kb",
            "8",
            "--header-timeout",
            "2",
            "--keep-alive-timeout",
            "1.5",
            "--max-connections",
            "100",
            "--body-timeout",
            "3",
            "--drain-timeout",
            "4",
        ]
    )
    cfg = server_config(args)
    assert cfg.metrics_public is True
    assert cfg.max_header_bytes == 8192
    assert (cfg.header_timeout_s, cfg.keep_alive_timeout_s) == (2.0, 1.5)
    assert (cfg.max_connections, cfg.body_timeout_s, cfg.drain_timeout_s) == (100, 3.0, 4.0)
    no = server_config(parser.parse_args(["serve", "--no-metrics-public"]))
    assert no.metrics_public is False


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--max-connections", "0", "max_connections"),
        ("--header-timeout", "0", "header_timeout_s"),
        ("--keep-alive-timeout", "-1", "keep_alive_timeout_s"),
        ("--max-header-kb", "0.5", "max_header_bytes"),
    ],
)
def test_bad_serve_limits_are_usage_errors(flag: str, value: str, named: str) -> None:
    from clef_agents.cli import UsageError

    with pytest.raises(UsageError, match=named):
        server_config(build_parser().parse_args(["serve", flag, value]))
