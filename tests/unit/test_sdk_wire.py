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

from engine.backbones.vision import requests as vision_requests
from engine.backbones.vision.images import ImageRef
from engine.backbones.vision.layout import Element, ImageEvidence
from engine.backbones.vision.pipeline import VisionPipeline

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

    vision_requests.attach(tiny_engine, StubPipeline())
    yield create_app(tiny_engine, ServerConfig())
    tiny_engine.__dict__.pop("_vision_pipeline", None)


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
