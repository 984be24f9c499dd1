"""The hostile-request suite: 5,000+ generated requests through the ASGI app, no 5xx.

Valid-ish requests with mutations (lone surrogates in states, options and instructions,
wrong types, huge numbers, deep nesting), random and mutated bytes of valid bodies, bad
content encodings and bad multipart bodies go to ``/v1/systemone`` and its batch route on a
tiny engine. Every answer must be below 500, a lone surrogate must be a 422, and the model
worker must still answer a valid request as before. Hypothesis runs derandomized (the same
requests on every run) with no example database.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

SINGLE, BATCH = "/v1/systemone", "/v1/systemone/batch"
SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff"]
QUESTIONS: dict[str, Any] = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments", "tech": "Bugs and outages", "sales": None},
    },
    "refund": {"type": "noul", "instructions": "Refund wanted?", "criteria": {"true": "yes"}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "furious"]},
}
VALID = {"model": "jev-latest", "state": "I was charged twice, refund me", "questions": QUESTIONS}
# Examples fit a prototype head per new question (about 0.7 s on a CPU): generated requests
# take theirs from these few, which the engine then has cached.
EXAMPLE_QUESTIONS = [
    {
        "type": "choice",
        "instructions": f"Route {i}",
        "criteria": {
            "billing": {"description": "Payments", "examples": ["charged twice", "refund"]},
            "tech": {"examples": ["app crashes", "error 500"]},
            "other": None,
        },
    }
    for i in range(3)
]


def _settings(n: int) -> Any:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buf, "PNG")
    return buf.getvalue()


PNG = _png()
PNG_B64 = base64.b64encode(PNG).decode()
DATA_URL = "data:image/png;base64," + PNG_B64


class Harness:
    """One app on one event loop; every request's status is counted."""

    def __init__(self, engine: Any) -> None:
        from clef_agents.server import ServerConfig, create_app

        self.loop = asyncio.new_event_loop()
        self.app = create_app(
            engine, ServerConfig(max_wait_ms=0, max_body_bytes=1 << 20, body_timeout_s=30)
        )
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://clef.test", timeout=60
        )
        self.statuses: Counter[int] = Counter()

    def send(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        response = self.loop.run_until_complete(
            self.client.post(path, content=body, headers=headers or {})
        )
        self.statuses[response.status_code] += 1
        return response

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.app.state.clef.stop())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tiny_engine: Any) -> Iterator[Harness]:
    h = Harness(tiny_engine)
    h.reference = h.send(SINGLE, json.dumps(VALID).encode())  # type: ignore[attr-defined]
    assert h.reference.status_code == 200  # type: ignore[attr-defined]
    yield h
    h.close()


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        detail = r.json()["detail"]
        if r.status_code == 422:
            assert isinstance(detail, list) and detail
            assert all(d["loc"][0] == "body" and isinstance(d["msg"], str) for d in detail)
        else:
            assert isinstance(detail["error_type"], str) and isinstance(detail["message"], str)


def _encode(obj: Any, ascii_only: bool) -> bytes:
    """JSON bytes; lone surrogates become ``\\ud800`` escapes, or CESU bytes (not UTF-8)."""
    if ascii_only:
        return json.dumps(obj, ensure_ascii=True).encode()
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")


# -- strategies: valid-ish requests --------------------------------------------------------

weird = st.sampled_from(
    [*SURROGATES, "\x00", "\ufeff", "\u202e", "\U0010ffff", "\uffff", "😀", "\r", "\\", '"']
)
text = st.one_of(
    st.text(max_size=16),
    st.text(st.one_of(st.characters(max_codepoint=0x7F), weird), max_size=12),
    st.sampled_from(["", " ", "refund", "~/x.png", "/etc/x.png", DATA_URL, PNG_B64]),
)
number = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 1e308, 2**53 + 1]),
)
surrogate_text = st.tuples(st.text(max_size=8), st.sampled_from(SURROGATES), st.text(max_size=8))
leaf = st.one_of(st.none(), st.booleans(), number, text)
json_value = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=6,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool"]) | text,
        "content": st.one_of(
            text,
            st.lists(
                st.one_of(
                    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                    st.fixed_dictionaries(
                        {
                            "type": st.just("image_url"),
                            "image_url": st.fixed_dictionaries(
                                {"url": st.sampled_from([DATA_URL, "/tmp/x.png", "x"]) | text}
                            ),
                        }
                    ),
                ),
                max_size=3,
            ),
        ),
    }
)
state = st.one_of(text, json_value, st.lists(message, min_size=1, max_size=3))
criterion = st.one_of(
    st.none(),
    text,
    json_value,
    st.fixed_dictionaries(
        {},
        optional={
            "description": st.one_of(text, st.none()),
            "examples": st.lists(text, max_size=3),
        },
    ),
)


@st.composite
def question(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["choice", "noul", "score", "box"]) | text)
    out: dict[str, Any] = {"type": kind}
    if draw(st.booleans()):
        out["instructions"] = draw(st.one_of(text, json_value))
    if kind == "choice":
        out["criteria"] = draw(
            st.one_of(
                st.dictionaries(text, criterion, min_size=0, max_size=5),
                st.lists(text, max_size=5),
                json_value,
            )
        )
    elif kind == "noul" and draw(st.booleans()):
        out["criteria"] = draw(
            st.dictionaries(st.sampled_from(["true", "false"]) | text, criterion, max_size=2)
        )
    elif kind == "score":
        out["criteria"] = draw(st.one_of(st.lists(criterion, max_size=11), json_value))
    if draw(st.integers(0, 9)) == 0:
        out = draw(json_value)  # a question of the wrong shape altogether
    return out


plain = st.text(st.characters(min_codepoint=32, max_codepoint=0x24F), max_size=16).map(
    lambda t: "w" + t
)
"""Valid text: never empty, no surrogates."""


@st.composite
def valid_question(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["choice", "noul", "score", "examples"]))
    out: dict[str, Any] = {"type": kind, "instructions": draw(plain)}
    if kind == "examples":
        return json.loads(json.dumps(draw(st.sampled_from(EXAMPLE_QUESTIONS))))
    if kind == "choice":
        names = draw(st.lists(plain, min_size=2, max_size=6, unique=True))
        out["criteria"] = {n: draw(st.one_of(st.none(), plain)) for n in names}
    elif kind == "score":
        out["criteria"] = draw(st.lists(plain, min_size=2, max_size=10))
    elif draw(st.booleans()):
        out["criteria"] = {"true": draw(plain)}
    return out


valid_state = st.one_of(
    plain,
    st.dictionaries(plain, st.one_of(plain, st.integers(), st.booleans()), min_size=1, max_size=4),
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": plain}),
        min_size=1,
        max_size=3,
    ),
)


def _slots(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) inside a JSON value, to mutate one of them."""
    if isinstance(value, dict):
        for key, item in value.items():
            out.append((value, key))
            _slots(item, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.append((value, i))
            _slots(item, out)
    return out


@st.composite
def decision(draw: st.DrawFn) -> tuple[str, Any]:
    """A valid request, then 0-3 mutations: wrong types, surrogates, dropped or odd fields."""
    questions = draw(st.dictionaries(plain, valid_question(), min_size=1, max_size=3))
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["jev-latest", "jev-1.13.0"])),
        "questions": questions,
    }
    path = draw(st.sampled_from([SINGLE, SINGLE, BATCH]))
    if path == BATCH:
        body["states"] = draw(st.lists(valid_state, min_size=1, max_size=4))
    else:
        body["state"] = draw(st.one_of(valid_state, state))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["type", "type", "surrogate", "drop", "question", "assets"]))
        slots = _slots(body, [])
        container, key = slots[draw(st.integers(0, len(slots) - 1))]
        if kind == "type":
            container[key] = draw(json_value)
        elif kind == "surrogate":
            container[key] = "".join(draw(surrogate_text))
        elif kind == "drop" and isinstance(container, dict):
            container.pop(key)
        elif kind == "question" and isinstance(body.get("questions"), dict):
            body["questions"][draw(text)] = draw(question())
        elif kind == "assets":
            body["assets"] = draw(
                st.dictionaries(
                    text,
                    st.fixed_dictionaries(
                        {
                            "type": st.sampled_from(["image"]) | text,
                            "format": st.sampled_from(["png", "jpg", "gif"]) | text,
                            "data_base64": st.sampled_from([PNG_B64, DATA_URL, "!!"]) | text,
                        }
                    )
                    | json_value,
                    max_size=2,
                )
            )
    return path, body


# -- strategies: bytes ----------------------------------------------------------------------


def _valid_bodies() -> list[bytes]:
    batch = {"states": ["charged twice", {"order": 7, "note": "late"}], "questions": QUESTIONS}
    messages = [{"role": "user", "content": "my card failed"}]
    return [
        json.dumps(VALID).encode(),
        json.dumps({**VALID, "state": messages}).encode(),
        json.dumps(batch).encode(),
    ]


VALID_BODIES = _valid_bodies()


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "truncate", "duplicate"]))
        i = draw(st.integers(0, max(0, len(out) - 1)))
        if op == "flip" and out:
            out[i] = draw(st.integers(0, 255))
        elif op == "delete":
            del out[i : i + draw(st.integers(1, 8))]
        elif op == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=8) | st.sampled_from([b"\\ud800", b"["]))
        elif op == "truncate":
            del out[i:]
        else:
            out[i:i] = out[i : i + draw(st.integers(1, 32))]
    return bytes(out)


def _multipart(parts: list[tuple[str, bytes, str | None]], boundary: str) -> bytes:
    chunks = []
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n"
        chunks.append(head.encode("utf-8", "surrogatepass") + data + b"\r\n")
    return b"".join(chunks) + f"--{boundary}--\r\n".encode()


@st.composite
def multipart(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    asset = {"shot": {"type": "image", "part": draw(st.sampled_from(["img", "nope"]) | text)}}
    request = {**VALID, "state": "see shot", "assets": asset}
    names = draw(
        st.lists(st.sampled_from(["request", "img", "extra"]) | text, min_size=0, max_size=4)
    )
    parts = []
    for name in names:
        if name == "request":
            data = draw(st.sampled_from([json.dumps(request).encode(), b"{", b""]))
        else:
            data = draw(st.sampled_from([PNG, b"GIF89a", b""]) | st.binary(max_size=40))
        parts.append((name, data, draw(st.sampled_from([None, "a.png", '"', ""]))))
    boundary = draw(st.sampled_from(["b0undary", "x", "-" * 70]))
    body = _multipart(parts, boundary)
    if draw(st.booleans()):
        body = draw(mutated(body))
    ctype = draw(
        st.sampled_from(
            [
                f"multipart/form-data; boundary={boundary}",
                "multipart/form-data",
                "multipart/form-data; boundary=other",
                f"multipart/mixed; boundary={boundary}",
            ]
        )
    )
    return SINGLE, body, {"Content-Type": ctype}


@st.composite
def encoded(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    raw = draw(st.sampled_from(VALID_BODIES))
    codec = draw(st.sampled_from(["gzip", "zstd", "gzip-gzip", "none"]))
    if codec == "gzip":
        body = gzip.compress(raw)
    elif codec == "zstd":
        body = zstandard.ZstdCompressor().compress(raw)
    elif codec == "gzip-gzip":
        body = gzip.compress(gzip.compress(raw))
    else:
        body = raw
    if draw(st.booleans()):
        body = draw(mutated(body))
    header = draw(
        st.sampled_from(
            ["gzip", "zstd", "GZIP", "gzip, gzip", "identity", "", "br", "deflate", "x-gzip"]
        )
        | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
    )
    return BATCH if raw is VALID_BODIES[2] else SINGLE, body, {"Content-Encoding": header}


@st.composite
def raw_bytes(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["random", "mutated", "mutated", "mutated"]))
    if kind == "random":
        body = draw(st.binary(max_size=300))
    else:
        base = draw(st.sampled_from(VALID_BODIES))
        body = draw(mutated(base))
    path = draw(st.sampled_from([SINGLE, BATCH]))
    return path, body, {"Content-Type": draw(st.sampled_from(["application/json", "text/x"]))}


@st.composite
def numbers_and_nesting(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    marker = "__HOLE__"
    where = draw(
        st.sampled_from(
            [
                ("state",),
                ("model",),
                ("questions", "team", "instructions"),
                ("questions", "team", "criteria", "tech"),
                ("questions", "anger", "criteria"),
                ("questions", "refund", "criteria", "true"),
                ("questions",),
            ]
        )
    )
    literal = draw(
        st.one_of(
            st.sampled_from(["1" + "0" * 5000, "-" + "9" * 4301, "1e999999", "-1e400", "1.5e-400"]),
            st.integers(1, 5000).map(lambda n: "1" + "0" * n),
            st.sampled_from([31, 32, 33, 34, 200, 5_000, 60_000]).flatmap(
                lambda depth: st.sampled_from(
                    [
                        "[" * depth + "1" + "]" * depth,
                        '{"a":' * depth + "1" + "}" * depth,
                        '[{"role":"user","content":' * depth + '"x"' + "}]" * depth,
                    ]
                )
            ),
        )
    )
    body = json.loads(json.dumps(VALID))
    cur = body
    for key in where[:-1]:
        cur = cur[key]
    cur[where[-1]] = marker
    text = json.dumps(body).replace(f'"{marker}"', literal)
    return draw(st.sampled_from([SINGLE, BATCH])), text.encode(), {}


# -- the suite ------------------------------------------------------------------------------


def test_generated_requests_never_get_5xx(harness: Harness, record_property: Any) -> None:
    sent: Counter[int] = Counter()

    @_settings(1600)
    @given(case=decision(), ascii_only=st.booleans())
    def run(case: tuple[str, Any], ascii_only: bool) -> None:
        path, body = case
        r = harness.send(path, _encode(body, ascii_only))
        sent[r.status_code] += 1
        _check(r)

    run()
    record_property("statuses", dict(sorted(sent.items())))
    assert sum(sent.values()) >= 1600
    assert sent[200] > 0 and sent[422] > 0, sent


def test_bytes_encodings_and_multipart_never_get_5xx(
    harness: Harness, record_property: Any
) -> None:
    sent: Counter[int] = Counter()

    @_settings(1700)
    @given(case=st.one_of(raw_bytes(), encoded(), multipart()))
    def run(case: tuple[str, bytes, dict[str, str]]) -> None:
        path, body, headers = case
        r = harness.send(path, body, headers)
        sent[r.status_code] += 1
        _check(r)

    run()
    record_property("statuses", dict(sorted(sent.items())))
    assert sum(sent.values()) >= 1700
    assert {200, 400, 415, 422} <= set(sent), sent


def test_huge_numbers_and_deep_nesting_never_get_5xx(
    harness: Harness, record_property: Any
) -> None:
    sent: Counter[int] = Counter()

    @_settings(500)
    @given(case=numbers_and_nesting())
    def run(case: tuple[str, bytes, dict[str, str]]) -> None:
        path, body, headers = case
        r = harness.send(path, body, headers)
        sent[r.status_code] += 1
        _check(r)

    run()
    record_property("statuses", dict(sorted(sent.items())))
    assert sum(sent.values()) >= 500
    assert sent[422] > 0, sent


@st.composite
def with_surrogate(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    bad = "".join(draw(surrogate_text))
    body = json.loads(json.dumps(VALID))
    where = draw(
        st.sampled_from(
            [
                "state",
                "state-key",
                "message",
                "instructions",
                "option",
                "description",
                "example",
                "level",
                "noul",
                "qid",
                "model",
                "asset-key",
            ]
        )
    )
    body["questions"]["team"] = team = json.loads(json.dumps(EXAMPLE_QUESTIONS[0]))
    if where == "state":
        body["state"] = bad
    elif where == "state-key":
        body["state"] = {"ticket": {bad: "x"}}
    elif where == "message":
        body["state"] = [{"role": "user", "content": [{"type": "text", "text": bad}]}]
    elif where == "instructions":
        team["instructions"] = bad
    elif where == "option":
        team["criteria"][bad] = None
    elif where == "description":
        team["criteria"]["other"] = bad
    elif where == "example":
        team["criteria"]["billing"]["examples"].append(bad)
    elif where == "level":
        body["questions"]["anger"]["criteria"][1] = bad
    elif where == "noul":
        body["questions"]["refund"]["criteria"]["true"] = bad
    elif where == "qid":
        body["questions"][bad] = body["questions"].pop("refund")
    elif where == "model":
        body["model"] = bad
    else:
        body["assets"] = {bad: {"type": "image", "format": "png", "data_base64": PNG_B64}}
    return where, body


def test_lone_surrogates_get_422(harness: Harness, record_property: Any) -> None:
    sent: Counter[int] = Counter()

    @_settings(1200)
    @given(case=with_surrogate(), ascii_only=st.booleans(), batch=st.booleans())
    def run(case: tuple[str, dict[str, Any]], ascii_only: bool, batch: bool) -> None:
        where, body = case
        in_state = where in ("state", "state-key", "message")
        if batch and in_state:
            body = {**body, "states": ["fine", body.pop("state")]}
            r = harness.send(BATCH, _encode(body, ascii_only))
        else:
            r = harness.send(SINGLE, _encode(body, ascii_only))
        sent[r.status_code] += 1
        _check(r)
        if batch and in_state and ascii_only:
            # One bad state fails alone; the other is answered.
            assert r.status_code == 200, r.text[:300]
            first, second = r.json()["results"]
            assert "answers" in first and second["error"]["status"] == 422, second
        else:
            # Escaped (\ud800) it is a schema error; raw (CESU bytes) the body is not UTF-8.
            assert r.status_code == 422, (where, r.status_code, r.text[:300])

    run()
    record_property("statuses", dict(sorted(sent.items())))
    assert sum(sent.values()) >= 1200


def test_the_worker_survives_and_answers_as_before(harness: Harness) -> None:
    task = harness.app.state.clef.batcher._task
    assert task is None or not task.done(), "the model worker died"
    again = harness.send(SINGLE, json.dumps(VALID).encode())
    assert again.status_code == 200
    reference = harness.reference.json()["answers"]  # type: ignore[attr-defined]
    answers = again.json()["answers"]
    assert answers["team"]["probabilities"] == pytest.approx(
        reference["team"]["probabilities"], abs=1e-5
    )
    assert answers["refund"]["noul"] == pytest.approx(reference["refund"]["noul"], abs=1e-5)
    assert all(status < 500 for status in harness.statuses), harness.statuses
