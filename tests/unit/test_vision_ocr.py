"""OCR's second pass: small, light text the 0.6x detector misses is found at full size."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from clef_engine.backbones.vision.ocr import RapidOcr, ink_regions

pytest.importorskip("cv2")

CAPTION = (40, 300)


def page() -> Image.Image:
    """Large dark text, and a light-grey 10 px caption line below it."""
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    d.text(
        (40, 60), "Trailhead Supply outdoor gear", fill="#0f172a", font=ImageFont.load_default(28)
    )
    d.text(
        CAPTION,
        "1.4 kg · 4.6 stars (212) · free returns within 30 days",
        fill="#a3adb8",
        font=ImageFont.load_default(10),
    )
    d.rectangle((40, 500, 400, 540), outline="#cbd5e1")  # an empty input: hollow, not text
    return img


def _quad(left: float, top: float, right: float, bottom: float) -> np.ndarray:
    return np.array([[left, top], [right, top], [right, bottom], [left, bottom]], np.float32)


def test_ink_regions_are_the_uncovered_text_only() -> None:
    array = np.asarray(page())
    heading = _quad(36, 55, 520, 100)
    regions = ink_regions(array, [heading])
    assert len(regions) == 1, regions
    left, top, right, bottom = regions[0]
    assert left <= CAPTION[0] + 4 and top <= CAPTION[1] + 4 and bottom >= CAPTION[1] + 8
    assert right > 250  # the whole caption, joined into one line
    assert ink_regions(array, [heading, _quad(*regions[0])]) == []


def test_second_pass_reads_the_caption_the_small_copy_missed() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    img = page()
    texts = {
        flag: " ".join(line.text for line in RapidOcr(second_pass=flag, threads=1).read(img))
        for flag in (False, True)
    }
    assert "stars" not in texts[False]  # what the first pass alone loses
    assert "stars" in texts[True] and "Trailhead" in texts[True]
