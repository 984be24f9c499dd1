"""The official client's own requests, in process: the real typesafe-sdk builds each body
(multipart with asset parts, questions without instructions) and the real app answers it
over ASGI, no sockets. Images are read by a stub pipeline (no OCR models).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import pytest
from PIL import Image

from clef_engine.backbones.vision.images import ImageRef
from clef_engine.backbones.vision.layout import Element, ImageEvidence
from clef_engine.backbones.vision.pipeline import VisionPipeline

sdk = pytest.importorskip("typesafe_sdk")
httpx2 = pytest.importorskip("httpx2")

BUTTON = (100.0, 50.0, 300.0, 90.0)
"""The stub's "Sign in" button, in pixels of a 400 x 200 image."""


class StubPipeline(VisionPipeline):
    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        button = Element("Sign in", (150.0, 60.0, 250.0, 80.0), BUTTON, "button")
        return [ImageEvidence(r.digest, r.width, r.height, [button]) for r in refs]


@pytest.fixture()
def app(tiny_engine: Any) -> Any:
    from clef_agents.server import ServerConfig, create_app

    tiny_engine.vision = StubPipeline()
    yield create_app(tiny_engine, ServerConfig())
    tiny_engine.vision = None


def _client(app: Any) -> Any:
    return sdk.AsyncTypeSafeClient(
        api_key="any",
        base_url="http://clef.test",
        transport=httpx2.ASGITransport(app=app),
        compression=False,
        retry=sdk.RetryPolicy(max_retries=0),
    )


def _screenshot() -> Any:
    buffer = io.BytesIO()
    Image.new("RGB", (400, 200), "white").save(buffer, format="PNG")
    return sdk.Image(buffer.getvalue())


async def test_sdk_alias_asset_and_questions_without_instructions(app: Any) -> None:
    async with _client(app) as client:
        response = await client.system_one(
            state={"task": "log in to the shop", "page": "screen"},
            questions={
                "button": sdk.Box(instructions="the sign-in button"),
                "page": sdk.Choice(criteria={"login": None, "article": None}),
                "effort": sdk.Score(criteria=["easy", "hard"]),
                "anything": sdk.Box(),
            },
            assets={"screen": _screenshot()},
        )
    # The SDK parsed every answer against its own schema: boxes are fractions (0-1).
    box = response.answers["button"].box
    assert (box.top, box.bottom, box.left, box.right) == (0.25, 0.45, 0.25, 0.75)
    assert sum(response.choices["page"].probabilities.values()) == pytest.approx(1.0)
    assert set(response.scores["effort"].probabilities) == {0, 1}
    assert response.answers["anything"].box is not None


async def test_sdk_reference_in_state(app: Any) -> None:
    image = _screenshot()
    async with _client(app) as client:
        placed = await client.system_one(
            state={"screen": image}, questions={"b": sdk.Box(instructions="sign in")}
        )
        # A reference whose image the SDK was not given is a 422 naming it, not a 500.
        with pytest.raises(sdk.TypeSafeUnprocessableEntityError, match="has no entry in assets"):
            await client.system_one(
                state=f"look at {_screenshot()}", questions={"b": sdk.Box(instructions="x")}
            )
    assert placed.answers["b"].box.right == 0.75


async def test_lone_surrogate_over_http_is_422(app: Any) -> None:
    # The SDK refuses to encode one, but a JSON escape carries it: \ud800.
    body = b'{"model": "jev-latest", "state": "hello \\ud800", "questions": {"q": '
    body += b'{"type": "choice", "criteria": {"a": null, "b\\udc00": "x"}}}}'
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://clef.test") as client:
        response = await client.post(
            "/v1/systemone", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert {tuple(d["loc"]) for d in detail} == {
        ("body", "state"),
        ("body", "questions", "q", "criteria"),
    }
    assert all("lone surrogate" in d["msg"] for d in detail)


class BlankPipeline(VisionPipeline):
    """Every image is blank: no text, so a box question finds nothing."""

    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        return [ImageEvidence(r.digest, r.width, r.height, []) for r in refs]


@pytest.mark.parametrize(
    "answer",
    [
        {"box": None, "confidence": None},
        {"box": {"top": 0.0, "bottom": 1.0, "left": 0.0, "right": 1.0}, "confidence": None},
        {"box": {"top": 0.1, "bottom": 0.2, "left": 0.3, "right": 0.4}, "confidence": 0.5},
    ],
    ids=["not-found", "null-confidence", "found"],
)
def test_every_box_answer_parses_with_the_sdks_own_model(answer: dict[str, Any]) -> None:
    from typesafe_sdk._core.response_types import SystemOneResponse

    from clef_engine.schema.answers import BoxAnswer, DecisionResult

    result = DecisionResult(model="clef", answers={"b": BoxAnswer(**answer)})
    wire = result.to_wire()["answers"]["b"]
    # The schema requires both keys; only confidence may be null.
    assert wire["box"] is not None and "confidence" in wire
    parsed = SystemOneResponse.model_validate(result.to_wire()).answers["b"]
    assert parsed.confidence == answer["confidence"]
    expected = answer["box"] or {"top": 0.0, "bottom": 1.0, "left": 0.0, "right": 1.0}
    assert parsed.box.model_dump() == expected
    assert wire.get("x_found", True) is (answer["box"] is not None)
    assert result.answers["b"].box == (answer["box"] and BoxAnswer(**answer).box)


async def test_sdk_box_on_an_image_without_text(tiny_engine: Any) -> None:
    from clef_agents.server import ServerConfig, create_app

    tiny_engine.vision = BlankPipeline()
    try:
        async with _client(create_app(tiny_engine, ServerConfig())) as client:
            response = await client.system_one(
                state="screen",
                questions={"button": sdk.Box(instructions="the sign-in button"), "any": sdk.Box()},
                assets={"screen": _screenshot()},
            )
    finally:
        tiny_engine.vision = None
    # Nothing readable: the schema still gets a box (the whole image) and a null
    # confidence, and the extras say why (docs/vision.md, "No readable content").
    raw = response.raw_http_response.json()["answers"]
    for name in ("button", "any"):
        box = response.boxes[name].box
        assert (box.top, box.bottom, box.left, box.right) == (0.0, 1.0, 0.0, 1.0)
        assert response.boxes[name].confidence is None
        assert raw[name]["x_found"] is False and raw[name]["x_no_content"] is True
