"""ScreenshotClassifier's inputs: URLs (refused, or fetched by a fetcher you give), threads."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from clef_agents.vision import ScreenshotClassifier
from clef_engine import DecisionEngine
from clef_engine.errors import InvalidRequestError
from clef_engine.testing import tiny_encoder

URL = "https://example.com/login"


def blank_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), "white").save(buf, "PNG")
    return buf.getvalue()


def test_a_url_is_refused_without_a_fetcher(tiny_engine) -> None:
    classifier = ScreenshotClassifier(tiny_engine)
    for call in (classifier.classify, lambda s: classifier.locate(s, "the sign-in button")):
        with pytest.raises(InvalidRequestError, match="never fetched") as err:
            call(URL)
        assert err.value.field == "screenshot"
    [error] = classifier.classify_batch([URL], return_exceptions=True)
    assert isinstance(error, InvalidRequestError)
    with pytest.raises(InvalidRequestError, match="never fetched"):
        asyncio.run(classifier.aclassify(URL))


def test_a_fetcher_is_called_with_the_url(tiny_engine) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        return blank_png()

    async def afetch(url: str) -> bytes:
        fetched.append(url)
        return blank_png()

    answer = ScreenshotClassifier(tiny_engine, fetcher=fetch).classify(URL)
    assert fetched == [URL]
    assert answer.x_no_content  # a blank page: read, and nothing on it
    asyncio.run(ScreenshotClassifier(tiny_engine, fetcher=afetch).aclassify(URL))
    assert fetched == [URL, URL]


def test_threads_sets_the_ocr_threads_of_the_engine() -> None:
    engine = DecisionEngine(tiny_encoder(max_length=32))
    before = engine.vision
    classifier = ScreenshotClassifier(engine, threads=1)
    assert classifier.engine.vision.ocr.threads == 1
    assert classifier.engine.vision.ocr.config() == {**before.ocr.config()}
    again = ScreenshotClassifier(engine, threads=1).engine.vision
    assert again is classifier.engine.vision  # the same count: the reader is kept
    with pytest.raises(InvalidRequestError) as err:
        ScreenshotClassifier(engine, threads=0)
    assert err.value.field == "threads"
