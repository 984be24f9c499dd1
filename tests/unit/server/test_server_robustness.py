"""Hostile input against the ASGI app: >= 1000 hypothesis-generated bad requests.

Wrong types, huge strings, deep nesting, 10,000 options, NaN in JSON, bad base64, bad
compression, wrong auth, garbage multipart. No response may be a 5xx, every error must have
the documented shape, the model worker must survive, and a valid request afterwards must get
the same answer it got before the storm.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEY = "robust-key"
VALID = {
    "model": "jev-latest",
    "state": "my card payment failed twice",
    "questions": {
        "q": {
            "type": "choice",
            "instructions": "route",
            "criteria": {"billing": None, "tech": "bugs"},
        },
        "n": {"type": "noul", "instructions": "refund?"},
        "s": {"type": "score", "instructions": "anger", "criteria": ["calm", "angry"]},
    },
}
AUTH = {"Authorization": f"Bearer {KEY}"}


class Harness:
    def __init__(self, engine: Any) -> None:
        from clef_agents.server import ServerConfig, create_app

        self.loop = asyncio.new_event_loop()
        self.open_app = create_app(engine, ServerConfig(max_wait_ms=0, max_body_bytes=4 << 20))
        self.key_app = create_app(
            engine, ServerConfig(max_wait_ms=0, api_key=KEY, max_body_bytes=4 << 20)
        )
        self.clients = {
            name: httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://clef.test", timeout=60
            )
            for name, app in (("open", self.open_app), ("key", self.key_app))
        }

    def post(self, which: str, body: bytes, headers: dict[str, str], path: str) -> httpx.Response:
        return self.loop.run_until_complete(
            self.clients[which].post(path, content=body, headers=headers)
        )

    def close(self) -> None:
        for c in self.clients.values():
            self.loop.run_until_complete(c.aclose())
        for app in (self.open_app, self.key_app):
            self.loop.run_until_complete(app.state.clef.stop())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tiny_engine: Any) -> Iterator[Harness]:
    h = Harness(tiny_engine)
    h.reference = h.post("open", json.dumps(VALID).encode(), {}, "/v1/systemone")  # type: ignore[attr-defined]
    assert h.reference.status_code == 200  # type: ignore[attr-defined]
    yield h
    h.close()


# -- strategies ---------------------------------------------------------------------------

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_value = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
PATHS = [
    ("state",),
    ("model",),
    ("questions",),
    ("questions", "q"),
    ("questions", "q", "type"),
    ("questions", "q", "criteria"),
    ("questions", "q", "instructions"),
    ("questions", "n", "criteria"),
    ("questions", "s", "criteria"),
    ("assets",),
]


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


@st.composite
def wrong_types(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    path = draw(st.sampled_from(PATHS))
    return "open", _dump(_set(VALID, path, draw(json_value))), {}, "/v1/systemone"


@st.composite
def random_json(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    path = draw(st.sampled_from(["/v1/systemone", "/v1/systemone/batch"]))
    return "open", _dump(draw(json_value)), {}, path


@st.composite
def huge_strings(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    size = draw(st.sampled_from([20_001, 100_000, 1_000_001]))
    big = "ab " * (size // 3 + 1)
    where = draw(st.sampled_from(["state", "instructions", "option", "qid", "model", "legend"]))
    if where == "state":
        obj = _set(VALID, ("state",), big)
    elif where == "instructions":
        obj = _set(VALID, ("questions", "q", "instructions"), big)
    elif where == "option":
        obj = _set(VALID, ("questions", "q", "criteria"), {big: None, "b": None})
    elif where == "qid":
        obj = _set(VALID, ("questions",), {big: VALID["questions"]["n"]})
    elif where == "model":
        obj = _set(VALID, ("model",), big)
    else:
        obj = _set(VALID, ("questions", "s", "criteria"), ["calm", big])
    return "open", _dump(obj), {}, "/v1/systemone"


@st.composite
def many_options(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    n = draw(st.sampled_from([256, 1000, 10_000]))
    kind = draw(st.sampled_from(["choice", "score", "questions", "examples"]))
    if kind == "choice":
        obj = _set(VALID, ("questions", "q", "criteria"), {f"o{i}": None for i in range(n)})
    elif kind == "score":
        obj = _set(VALID, ("questions", "s", "criteria"), [f"l{i}" for i in range(n)])
    elif kind == "questions":
        obj = _set(VALID, ("questions",), {f"q{i}": VALID["questions"]["n"] for i in range(n)})
    else:
        crit = {"a": {"examples": ["x"] * (n + 10_000)}, "b": None}
        obj = _set(VALID, ("questions", "q", "criteria"), crit)
    return "open", _dump(obj), {}, "/v1/systemone"


@st.composite
def deep_nesting(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    depth = draw(st.sampled_from([33, 100, 900, 5_000, 100_000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    nested = opener * depth + "1" + closer * depth
    where = draw(st.sampled_from(["state", "instructions", "whole", "criteria"]))
    if where == "whole":
        return "open", nested.encode(), {}, "/v1/systemone"
    marker = "__NEST__"
    path = {
        "state": ("state",),
        "instructions": ("questions", "q", "instructions"),
        "criteria": ("questions", "q", "criteria", "billing"),
    }[where]
    text = json.dumps(_set(VALID, path, marker)).replace(f'"{marker}"', nested)
    return "open", text.encode(), {}, "/v1/systemone"


@st.composite
def non_finite(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    const = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]))
    path = draw(st.sampled_from([("state",), ("questions", "q", "instructions"), ("model",)]))
    marker = "__NUM__"
    text = json.dumps(_set(VALID, path, {"v": marker})).replace(f'"{marker}"', const)
    return "open", text.encode(), {}, "/v1/systemone"


@st.composite
def bad_assets(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    data = draw(st.one_of(st.text(max_size=30), st.binary(max_size=30).map(lambda b: b.hex())))
    asset = {
        "type": draw(st.sampled_from(["image", "video", 3])),
        "format": draw(st.sampled_from(["png", "gif", None])),
        "data_base64": data,
    }
    name = draw(st.sampled_from(["<image:" + "a" * 32 + ">", "", "x"]))
    return "open", _dump(_set(VALID, ("assets",), {name: asset})), {}, "/v1/systemone"


@st.composite
def bad_compression(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    encoding = draw(
        st.sampled_from(["gzip", "zstd", "br", "deflate", "gzip, zstd", "zstd, gzip", "x"])
    )
    raw = _dump(VALID)
    kind = draw(st.sampled_from(["random", "truncated", "wrong", "bomb", "invalid-json"]))
    if kind == "random":
        body = draw(st.binary(max_size=200))
    elif kind == "truncated":
        body = gzip.compress(raw)[: draw(st.integers(1, 30))]
    elif kind == "wrong":
        body = (
            zstandard.ZstdCompressor().compress(raw) if "gzip" in encoding else gzip.compress(raw)
        )
    elif kind == "bomb":
        body = zstandard.ZstdCompressor().compress(b"[" * (8 << 20))
    else:
        body = gzip.compress(b'{"state": "x", "questions": {')
    return "open", body, {"Content-Encoding": encoding}, "/v1/systemone"


@st.composite
def wrong_auth(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    token = draw(
        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40).filter(
            lambda t: t != KEY
        )
    )
    scheme = draw(st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]))
    headers = draw(st.sampled_from([{}, {"Authorization": scheme + token}, {"x-api-key": KEY}]))
    path = draw(st.sampled_from(["/v1/systemone", "/v1/systemone/batch"]))
    return "key", _dump(VALID), headers, path


@st.composite
def garbage_bodies(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], str]:
    ctype = draw(
        st.sampled_from(
            [
                "application/json",
                "multipart/form-data; boundary=xyz",
                "multipart/form-data",
                "text/plain",
            ]
        )
    )
    body = draw(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
    if ctype.startswith("multipart") and draw(st.booleans()):
        part = draw(st.sampled_from(["request", "asset-0", "other"]))
        body = (
            f'--xyz\r\nContent-Disposition: form-data; name="{part}"\r\n\r\n'.encode()
            + body
            + b"\r\n--xyz--\r\n"
        )
    return "open", body, {"Content-Type": ctype}, "/v1/systemone"


hostile = st.one_of(
    wrong_types(),
    random_json(),
    huge_strings(),
    many_options(),
    deep_nesting(),
    non_finite(),
    bad_assets(),
    bad_compression(),
    wrong_auth(),
    garbage_bodies(),
)


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(case=hostile)
def test_hostile_requests_never_get_5xx(
    harness: Harness, case: tuple[str, bytes, dict[str, str], str]
) -> None:
    which, body, headers, path = case
    r = harness.post(which, body, headers, path)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert r.headers.get("x-typesafe-request-id", "").startswith("req_")
    if r.status_code >= 400:
        detail = r.json()["detail"]
        if r.status_code == 422:
            assert isinstance(detail, list) and detail
            assert all(d["loc"][0] == "body" and isinstance(d["msg"], str) for d in detail)
        else:
            assert isinstance(detail["error_type"], str) and isinstance(detail["message"], str)
    if which == "key" and headers.get("Authorization") != f"Bearer {KEY}":
        assert r.status_code == 401
    for app in (harness.open_app, harness.key_app):
        task = app.state.clef.batcher._task
        assert task is None or not task.done(), "the model worker died"


def test_valid_request_answered_correctly_after_the_storm(harness: Harness) -> None:
    again = harness.post("open", _dump(VALID), {}, "/v1/systemone")
    keyed = harness.post("key", _dump(VALID), AUTH, "/v1/systemone")
    reference = harness.reference.json()["answers"]  # type: ignore[attr-defined]
    for r in (again, keyed):
        assert r.status_code == 200
        answers = r.json()["answers"]
        assert answers["q"]["probabilities"] == pytest.approx(
            reference["q"]["probabilities"], abs=1e-5
        )
        assert answers["n"]["noul"] == pytest.approx(reference["n"]["noul"], abs=1e-5)
        assert answers["s"]["score"] == pytest.approx(reference["s"]["score"], abs=1e-5)
