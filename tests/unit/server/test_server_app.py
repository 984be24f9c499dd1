"""The /v1/systemone app in process: wire format, errors, auth, limits, batching, metrics."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import math
from typing import Any

import pytest
import zstandard


def _answers_close(a: dict[str, Any], b: dict[str, Any], tol: float = 1e-4) -> bool:
    for qid, ans in a.items():
        other = b[qid]
        if ans["type"] != other["type"]:
            return False
        if ans["type"] == "noul":
            if abs(ans["noul"] - other["noul"]) > tol:
                return False
            continue
        for k, p in ans["probabilities"].items():
            if abs(p - other["probabilities"][k]) > tol:
                return False
    return True


async def test_answers_every_type_in_wire_format(make_app: Any, h: Any) -> None:
    app = make_app()
    async with h.client(app) as c:
        r = await c.post("/v1/systemone", json=h.valid_request())
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-typesafe-request-id"].startswith("req_")
    body = r.json()
    assert set(body) - {"model", "answers", "usage"} == {k for k in body if k.startswith("x_")}, (
        "extra top-level fields must carry the x_ prefix"
    )
    assert body["model"] == app.state.clef.model_name
    team, refund, anger = (body["answers"][k] for k in ("team", "refund", "anger"))
    assert team["type"] == "choice" and set(team["probabilities"]) == {"billing", "tech", "sales"}
    assert math.isclose(sum(team["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert refund["type"] == "noul" and 0.0 <= refund["noul"] <= 1.0
    assert anger["type"] == "score" and anger["legend"] == {
        "0": "calm",
        "1": "annoyed",
        "2": "furious",
    }
    expected = sum(int(k) * p for k, p in anger["probabilities"].items())
    assert math.isclose(anger["score"], expected, abs_tol=1e-9)
    assert isinstance(body["usage"]["input_tokens"], int) and body["usage"]["output_tokens"] == 0


async def test_request_ids_are_unique_and_on_errors_too(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        ok = await c.post("/v1/systemone", json=h.valid_request())
        missing = await c.get("/no/such/route")
        bad = await c.post("/v1/systemone", content=b"{not json")
    ids = {r.headers["x-typesafe-request-id"] for r in (ok, missing, bad)}
    assert len(ids) == 3
    assert missing.status_code == 404
    assert missing.json()["detail"]["error_type"] == "not_found_error"


@pytest.mark.parametrize(
    ("payload", "loc_prefix"),
    [
        ({"questions": {"q": {"type": "noul", "instructions": "x"}}}, ["body", "state"]),
        ({"state": "x", "questions": {}}, ["body", "questions"]),
        ({"state": "x", "questions": {"q": {"type": "boolean"}}}, ["body", "questions", "q"]),
        (
            {
                "state": "x",
                "questions": {
                    "q": {"type": "choice", "instructions": "x", "criteria": {"a": None}}
                },
            },
            ["body", "questions", "q", "criteria"],
        ),
        (
            {
                "state": "x",
                "questions": {"q": {"type": "score", "instructions": "x", "criteria": {"0": "a"}}},
            },
            ["body", "questions", "q", "criteria"],
        ),
        ([1, 2, 3], ["body"]),
    ],
)
async def test_validation_errors_are_422_with_detail(
    make_app: Any, h: Any, payload: Any, loc_prefix: list[Any]
) -> None:
    async with h.client(make_app()) as c:
        r = await c.post("/v1/systemone", json=payload)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail
    assert detail[0]["loc"][: len(loc_prefix)] == loc_prefix
    assert all(isinstance(d["msg"], str) and isinstance(d["type"], str) for d in detail)


async def test_nan_and_bad_json_are_422(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        nan = await c.post("/v1/systemone", content=b'{"state": NaN, "questions": {}}')
        trunc = await c.post("/v1/systemone", content=b'{"state": "x", "questions": {')
        latin = await c.post("/v1/systemone", content=b'{"state": "\xff"}')
    for r in (nan, trunc, latin):
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"][0] == "body"


async def test_unknown_fields_ignored_unknown_model_404(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        extra = await c.post("/v1/systemone", json={**h.valid_request(), "seed": 7, "x_trace": 1})
        unknown = await c.post("/v1/systemone", json={**h.valid_request(), "model": "gpt-9"})
    assert extra.status_code == 200
    assert unknown.status_code == 404
    assert unknown.json()["detail"]["error_type"] == "not_found_error"
    assert "gpt-9" in unknown.json()["detail"]["message"]


async def test_any_model_flag_accepts_other_names(make_app: Any, h: Any) -> None:
    app = make_app(any_model=True)
    async with h.client(app) as c:
        r = await c.post("/v1/systemone", json={**h.valid_request(), "model": "gpt-9"})
    assert r.status_code == 200
    assert r.json()["model"] == app.state.clef.model_name


async def test_box_without_an_image_is_4xx(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        r = await c.post(
            "/v1/systemone",
            json={"state": "x", "questions": {"b": {"type": "box", "instructions": "the button"}}},
        )
    assert 400 <= r.status_code < 500
    assert r.json()["detail"]["error_type"] == "unsupported_question"
    assert "no image" in r.json()["detail"]["message"]


async def test_a_choice_temperature_is_applied_and_a_bad_one_is_a_422(
    make_app: Any, h: Any
) -> None:
    sharp = {**h.CHOICE, "temperature": 0.5}
    async with h.client(make_app()) as c:
        plain = await c.post("/v1/systemone", json={"state": "x", "questions": {"t": h.CHOICE}})
        tempered = await c.post("/v1/systemone", json={"state": "x", "questions": {"t": sharp}})
        bad = await c.post(
            "/v1/systemone",
            json={"state": "x", "questions": {"t": {**h.CHOICE, "temperature": 0}}},
        )
    p = plain.json()["answers"]["t"]["probabilities"]
    squared = {k: v * v / sum(u * u for u in p.values()) for k, v in p.items()}
    assert tempered.json()["answers"]["t"]["probabilities"] == pytest.approx(squared, abs=1e-6)
    assert bad.status_code == 422  # validation, as for any other field
    (error,) = bad.json()["detail"]
    assert "temperature" in error["loc"] and "between 0.01 and 100" in error["msg"]


async def test_auth_bearer_constant_time(make_app: Any, h: Any) -> None:
    app = make_app(api_key="s3cret")
    async with h.client(app) as c:
        none = await c.post("/v1/systemone", json=h.valid_request())
        wrong = await c.post(
            "/v1/systemone", json=h.valid_request(), headers={"Authorization": "Bearer nope"}
        )
        basic = await c.post(
            "/v1/systemone", json=h.valid_request(), headers={"Authorization": "Basic s3cret"}
        )
        ok = await c.post(
            "/v1/systemone", json=h.valid_request(), headers={"Authorization": "Bearer s3cret"}
        )
        models = await c.get("/v1/models")
        health = await c.get("/healthz")
    for r in (none, wrong, basic, models):
        assert r.status_code == 401
        assert r.json()["detail"]["error_type"] == "authentication_error"
    assert ok.status_code == 200
    assert health.status_code == 200


async def test_models_lists_served_model_and_alias(make_app: Any, h: Any) -> None:
    app = make_app()
    async with h.client(app) as c:
        r = await c.get("/v1/models")
    names = [m["name"] for m in r.json()["models"]]
    assert names[0] == app.state.clef.model_name and "jev-latest" in names
    assert all({"name", "description", "release_date"} <= set(m) for m in r.json()["models"])


async def test_compressed_bodies(make_app: Any, h: Any) -> None:
    raw = json.dumps(h.valid_request()).encode()
    async with h.client(make_app()) as c:
        plain = await c.post("/v1/systemone", content=raw)
        gz = await c.post(
            "/v1/systemone", content=gzip.compress(raw), headers={"Content-Encoding": "gzip"}
        )
        zs = await c.post(
            "/v1/systemone",
            content=zstandard.ZstdCompressor().compress(raw),
            headers={"Content-Encoding": "zstd"},
        )
        bad = await c.post(
            "/v1/systemone", content=b"not zstd at all", headers={"Content-Encoding": "zstd"}
        )
        br = await c.post("/v1/systemone", content=raw, headers={"Content-Encoding": "br"})
    assert plain.status_code == gz.status_code == zs.status_code == 200
    assert _answers_close(plain.json()["answers"], gz.json()["answers"])
    assert _answers_close(plain.json()["answers"], zs.json()["answers"])
    assert bad.status_code == 400 and bad.json()["detail"]["error_type"] == "invalid_request_error"
    assert br.status_code == 415


async def test_body_cap_413_also_after_decompression(make_app: Any, h: Any) -> None:
    app = make_app(max_body_bytes=4096)
    big = json.dumps({**h.valid_request(), "pad": "x" * 10_000}).encode()
    bomb = zstandard.ZstdCompressor().compress(b'{"pad": "' + b"a" * 5_000_000 + b'"}')
    assert len(bomb) < 4096
    async with h.client(app) as c:
        direct = await c.post("/v1/systemone", content=big)
        expanded = await c.post("/v1/systemone", content=bomb, headers={"Content-Encoding": "zstd"})
        gz_bomb = await c.post(
            "/v1/systemone",
            content=gzip.compress(b"a" * 5_000_000),
            headers={"Content-Encoding": "gzip"},
        )
    for r in (direct, expanded, gz_bomb):
        assert r.status_code == 413
        assert r.json()["detail"]["error_type"] == "request_too_large"


async def test_slow_body_408(make_app: Any, h: Any) -> None:
    app = make_app(body_timeout_s=0.2)

    async def trickle() -> Any:
        yield b'{"state": "x", '
        await asyncio.sleep(1.0)
        yield b'"questions": {}}'

    async with h.client(app) as c:
        r = await c.post("/v1/systemone", content=trickle())
    assert r.status_code == 408
    assert r.json()["detail"]["error_type"] == "request_timeout"


async def test_multipart_request_part_and_assets(make_app: Any, h: Any) -> None:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), "white").save(buffer, format="PNG")
    png = buffer.getvalue()
    placeholder = "<image:" + "a" * 32 + ">"
    request = {
        **h.valid_request(),
        "assets": {placeholder: {"type": "image", "part": "asset-0"}},
    }
    request["state"] = f"{request['state']} {placeholder}"
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n'
            f"Content-Type: application/json\r\n\r\n{json.dumps(request)}\r\n"
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="asset-0"; filename="asset-0"\r\n'
            f"Content-Type: image/png\r\n\r\n"
        ).encode()
        + png
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    no_assets = {**h.valid_request()}
    body_plain = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n'
        f"Content-Type: application/json\r\n\r\n{json.dumps(no_assets)}\r\n--{boundary}--\r\n"
    ).encode()
    async with h.client(make_app()) as c:
        with_image = await c.post("/v1/systemone", content=body, headers=headers)
        truncated = await c.post(
            "/v1/systemone", content=body.replace(png, png[:20]), headers=headers
        )
        plain = await c.post("/v1/systemone", content=body_plain, headers=headers)
        broken = await c.post("/v1/systemone", content=b"--nope", headers=headers)
    assert plain.status_code == 200 and set(plain.json()["answers"]) == {"team", "refund", "anger"}
    # The image part becomes the placeholder's asset; a truncated image is a 422 naming it.
    assert with_image.status_code == 200, with_image.text
    assert set(with_image.json()["answers"]) == {"team", "refund", "anger"}
    assert truncated.status_code == 422
    assert truncated.json()["detail"][0]["loc"][-1] == placeholder
    assert 400 <= broken.status_code < 500


async def test_bad_base64_asset_is_422(make_app: Any, h: Any) -> None:
    request = {
        **h.valid_request(),
        "assets": {
            "<image:" + "b" * 32 + ">": {"type": "image", "format": "png", "data_base64": "!!"}
        },
    }
    good64 = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    missing_format = {
        **h.valid_request(),
        "assets": {"<image:" + "c" * 32 + ">": {"type": "image", "data_base64": good64}},
    }
    async with h.client(make_app()) as c:
        bad = await c.post("/v1/systemone", json=request)
        nofmt = await c.post("/v1/systemone", json=missing_format)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "data_base64"
    assert nofmt.status_code == 422 and nofmt.json()["detail"][0]["loc"][-1] == "format"


async def test_batch_endpoint_keeps_every_item_in_order(make_app: Any, h: Any) -> None:
    states = ["refund please", "", {"ticket": "app crashes"}, "   ", ["a", "b"]]
    payload = {"model": "jev-latest", "states": states, "questions": {"refund": h.NOUL}}
    async with h.client(make_app()) as c:
        r = await c.post("/v1/systemone/batch", json=payload)
        singles = [
            await c.post("/v1/systemone", json={"state": s, "questions": {"refund": h.NOUL}})
            for s in states
        ]
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == len(states)
    for i, (item, single) in enumerate(zip(results, singles, strict=True)):
        if single.status_code == 200:
            assert _answers_close(item["answers"], single.json()["answers"])
        else:
            assert item["error"]["status"] == single.status_code
            assert item["error"]["detail"][0]["loc"][:3] == ["body", "states", i]


async def test_batch_endpoint_limits(make_app: Any, h: Any) -> None:
    async with h.client(make_app(max_batch_items=3)) as c:
        too_many = await c.post(
            "/v1/systemone/batch", json={"states": ["a"] * 4, "questions": {"r": h.NOUL}}
        )
        empty = await c.post("/v1/systemone/batch", json={"states": [], "questions": {"r": h.NOUL}})
        badq = await c.post("/v1/systemone/batch", json={"states": ["a"], "questions": {}})
    for r in (too_many, empty, badq):
        assert r.status_code == 422


async def test_answers_do_not_depend_on_batching_order_or_ids(
    make_app: Any, h: Any, tiny_engine: Any
) -> None:
    states = [f"ticket {i}: my card payment failed {'again ' * i}" for i in range(12)]
    batched = make_app(h.SlowEngine(tiny_engine, 0.05), max_batch=16, max_wait_ms=30)
    single = make_app(max_batch=1)

    def request(state: str, reverse: bool = False, rename: bool = False) -> dict[str, Any]:
        qs = {"team": h.CHOICE, "refund": h.NOUL, "anger": h.SCORE}
        items = list(qs.items())[::-1] if reverse else list(qs.items())
        return {"state": state, "questions": {(f"z-{k}" if rename else k): v for k, v in items}}

    async with h.client(batched) as c:
        together = await asyncio.gather(*(c.post("/v1/systemone", json=request(s)) for s in states))
    async with h.client(single) as c:
        alone = [
            await c.post("/v1/systemone", json=request(s, reverse=True, rename=True))
            for s in states
        ]
    assert max(batched.state.clef.engine.batches) > 1, "concurrent requests should share a forward"
    for a, b in zip(together, alone, strict=True):
        renamed = {k.removeprefix("z-"): v for k, v in b.json()["answers"].items()}
        assert _answers_close(a.json()["answers"], renamed)


async def _burst(client: Any, h: Any, n: int) -> list[Any]:
    """``n`` concurrent valid requests; their responses in order."""
    return list(
        await asyncio.gather(
            *(client.post("/v1/systemone", json=h.valid_request(f"state {i}")) for i in range(n))
        )
    )


def _assert_overloaded(response: Any) -> None:
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert response.json()["detail"]["error_type"] == "overloaded_error"


async def test_full_queue_sheds_with_503_and_retry_after(
    make_app: Any, h: Any, tiny_engine: Any
) -> None:
    app = make_app(h.SlowEngine(tiny_engine, 0.3), max_batch=2, max_wait_ms=0, max_queue=2)
    async with h.client(app) as c:
        responses = await _burst(c, h, 10)
        health = await c.get("/healthz")
        after = await c.post("/v1/systemone", json=h.valid_request())
    assert {r.status_code for r in responses} == {200, 503}
    for r in responses:
        if r.status_code == 503:
            _assert_overloaded(r)
    assert health.status_code == 200
    assert after.status_code == 200, "the server recovers once the load drops"


async def test_requests_past_the_inflight_limit_are_shed_before_their_body(
    make_app: Any, h: Any, tiny_engine: Any
) -> None:
    # max_queue 1 + max_batch 1: with one request running and one queued (both past their
    # body), the next ones are refused at the door.
    engine = h.SlowEngine(tiny_engine, 0.5)
    app = make_app(engine, max_batch=1, max_wait_ms=0, max_queue=1)
    state = app.state.clef
    async with h.client(app) as c:
        first = [asyncio.create_task(c.post("/v1/systemone", json=h.valid_request("first")))]
        while not engine.batches:
            await asyncio.sleep(0.01)
        first.append(asyncio.create_task(c.post("/v1/systemone", json=h.valid_request("2nd"))))
        while state.admitted < 2:
            await asyncio.sleep(0.01)
        responses = await _burst(c, h, 4)
        responses += await asyncio.gather(*first)
        metrics = (await c.get("/metrics")).text
    shed = [r for r in responses if r.status_code == 503]
    assert [r.status_code for r in responses[-2:]] == [200, 200]
    assert len(shed) == 4, "four requests past a limit of two must all be shed"
    for r in shed:
        _assert_overloaded(r)
    # The early refusals leave the body unread, so they close the connection.
    assert any(r.headers.get("connection") == "close" for r in shed)
    assert 'clef_shed_total{reason="inflight"}' in metrics


async def test_draining_refuses_new_requests_finishes_inflight(
    make_app: Any, h: Any, tiny_engine: Any
) -> None:
    app = make_app(h.SlowEngine(tiny_engine, 0.3), max_batch=4)
    state = app.state.clef
    async with h.client(app) as c:
        inflight = asyncio.create_task(c.post("/v1/systemone", json=h.valid_request()))
        while state.inflight == 0:
            await asyncio.sleep(0.01)
        state.begin_drain()
        refused = await c.post("/v1/systemone", json=h.valid_request())
        ready = await c.get("/readyz")
        assert await state.wait_drained(5.0)
        done = await inflight
    assert done.status_code == 200
    assert refused.status_code == 503 and "Retry-After" in refused.headers
    assert ready.status_code == 503


async def test_metrics_exposition(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        await c.post("/v1/systemone", json=h.valid_request())
        await c.post("/v1/systemone", json={"state": "x"})
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'clef_requests_total{route="/v1/systemone",status="200"} 1.0' in text
    assert 'clef_requests_total{route="/v1/systemone",status="422"} 1.0' in text
    for name in (
        "clef_request_latency_seconds_bucket",
        "clef_batch_size_bucket",
        "clef_queue_depth",
        "clef_fallbacks_total",
        "clef_inflight_requests",
    ):
        assert name in text


async def test_engine_runs_off_the_event_loop(make_app: Any, h: Any, tiny_engine: Any) -> None:
    app = make_app(h.SlowEngine(tiny_engine, 0.5), max_batch=1)
    async with h.client(app) as c:
        slow = asyncio.create_task(c.post("/v1/systemone", json=h.valid_request()))
        await asyncio.sleep(0.05)
        health = await c.get("/healthz")
        assert not slow.done(), "healthz must answer while the model is busy"
        assert health.status_code == 200
        assert (await slow).status_code == 200


def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    from clef_engine.errors import MissingDependencyError

    for name in list(sys.modules):
        if name == "clef_agents.server" or name.startswith("clef_agents.server."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'clef-agents\[server\]'"):
        importlib.import_module("clef_agents.server")
