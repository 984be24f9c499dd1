"""No readable content: blank, tiny and text-free images get flat, flagged answers."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw, ImageFont

from clef_engine import Box, Choice, Noul, Score

pytest.importorskip("rapidocr_onnxruntime")

QUESTIONS = {
    "page": Choice(
        instructions="What is this page?", criteria=["login", "captcha", "article", "error"]
    ),
    "ready": Noul(instructions="Has the page finished loading?"),
    "busy": Score(instructions="How busy is the page?", criteria=["empty", "some", "full"]),
    "button": Box(instructions="the sign-in button"),
}


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def loading_page() -> Image.Image:
    """A page still loading: a skeleton of grey bars and a spinner ring, no text."""
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, 1280, 56), fill="#0f172a")
    for i in range(4):
        d.rounded_rectangle((200, 140 + 60 * i, 900 - 90 * i, 170 + 60 * i), 8, fill="#e5e7eb")
    d.ellipse((610, 500, 670, 560), outline="#94a3b8", width=6)
    return img


@pytest.mark.parametrize(
    "image",
    [Image.new("RGB", (1280, 800), "white"), Image.new("RGB", (6, 4), "black"), loading_page()],
    ids=["blank", "tiny", "loading"],
)
def test_no_readable_content_is_flat_and_flagged(tiny_engine, image: Image.Image) -> None:
    answers = tiny_engine.decide(png(image), QUESTIONS).answers
    page = answers["page"]
    assert set(page.probabilities.values()) == {0.25} and page.confidence == 0.0
    assert answers["ready"].noul == 0.5
    assert answers["busy"].score == 1.0 and answers["busy"].confidence == 0.0
    assert answers["button"].box is None and answers["button"].confidence is None
    assert all(getattr(a, "x_no_content", False) for a in answers.values())


def test_a_page_with_text_is_not_flagged(tiny_engine) -> None:
    img = Image.new("RGB", (640, 200), "white")
    ImageDraw.Draw(img).text(
        (40, 60), "Sign in to Acme", fill="black", font=ImageFont.load_default(size=32)
    )
    answers = tiny_engine.decide(png(img), QUESTIONS).answers
    assert not any(hasattr(a, "x_no_content") for a in answers.values())
    assert answers["button"].box is not None


def test_text_beside_a_blank_image_is_still_decided_on(tiny_engine) -> None:
    state = {"task": "error: page not found", "screen": png(Image.new("RGB", (64, 64), "white"))}
    answers = tiny_engine.decide(state, {"page": QUESTIONS["page"]}).answers
    assert not hasattr(answers["page"], "x_no_content")
