"""OCR's second pass: small, light text the 0.6x detector misses is found at full size."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from clef_engine.backbones.vision.ocr import RapidOcr, extend_cut_lines, faint_crop, ink_regions

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


def _bounds(quad: np.ndarray) -> tuple[float, float, float, float]:
    return (quad[:, 0].min(), quad[:, 1].min(), quad[:, 0].max(), quad[:, 1].max())


def test_a_line_the_detector_cut_short_is_grown_over_the_rest() -> None:
    img = Image.new("RGB", (640, 200), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(16)
    d.text((40, 40), "Type a comment", fill="#777777", font=font)
    d.text((66, 120), "Settings", fill="#111111", font=font)
    icon = d.textbbox((66, 120), "Settings", font=font)[1]
    d.rectangle((50, icon, 62, icon + 12), fill="#334155")  # an icon right before a label
    d.text((300, 120), "Search:", fill="#111111", font=font)
    edge = d.textbbox((300, 120), "Search:", font=font)[2] + 2
    d.rectangle((edge, 116, edge + 230, 144), outline="#94a3b8")  # its input, right after
    d.text((edge + 10, 122), "Search products", fill="#999999", font=font)
    array = np.asarray(img)
    left, top, right, bottom = d.textbbox((40, 40), "Type a comment", font=font)
    cut = _quad(left - 3, top - 3, left + 0.55 * (right - left), bottom + 3)  # "Type a co"
    label = _quad(*d.textbbox((66, 120), "Settings", font=font))
    search = _quad(*d.textbbox((300, 120), "Search:", font=font))
    found, rest = extend_cut_lines([cut, label, search], ink_regions(array, [cut, label, search]))
    # The rest of the line joined its box ...
    assert _bounds(found[0])[0] == pytest.approx(left - 3)
    assert _bounds(found[0])[2] >= right
    # ... while the icon (square) and the input (taller than the label) are not text that
    # continues a line: those boxes stay as found, and those regions stay unexplained.
    assert found[1] is label and found[2] is search
    assert len(rest) == 2, rest
    assert all(r[2] <= 68 or r[0] >= edge - 6 for r in rest)


class _CutDetector:
    """A RapidOCR stand-in whose small-copy detection cuts a line short."""

    def __init__(self, cut: np.ndarray, scale: float) -> None:
        self.cut, self.scale, self.read_boxes = cut, scale, []

    def text_det(self, image: np.ndarray):
        if image.shape[1] == round(1280 * self.scale):  # the 0.6x copy
            return np.asarray([self.cut * self.scale]), 0.0
        return None, 0.0  # the second pass's mosaic: nothing new

    def sorted_boxes(self, boxes):
        return list(boxes)

    def get_crop_img_list(self, image, boxes):
        self.read_boxes = [_bounds(b) for b in boxes]
        return [
            image[int(b[:, 1].min()) : int(b[:, 1].max()), int(b[:, 0].min()) : int(b[:, 0].max())]
            for b in boxes
        ]

    def text_rec(self, crops):
        return [("Type a comment", 0.99) for _ in crops], 0.0


def test_the_recogniser_reads_the_whole_line_the_detector_cut() -> None:
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(16)
    d.text((200, 300), "Type a comment", fill="#777777", font=font)
    left, top, right, bottom = d.textbbox((200, 300), "Type a comment", font=font)
    ocr = RapidOcr(threads=1)
    stub = _CutDetector(_quad(left - 3, top - 3, left + 0.55 * (right - left), bottom + 3), 0.6)
    ocr._engine = stub
    [line] = ocr.read(img)
    assert len(stub.read_boxes) == 1
    assert stub.read_boxes[0][2] >= right  # the crop read holds the whole line
    assert line.box[2] >= right


FIELD = (120, 100, 520, 140)


def faint_form() -> Image.Image:
    """An input whose placeholder is 28 grey levels off white (#e3e3e3), and an empty one."""
    img = Image.new("RGB", (800, 300), "white")
    d = ImageDraw.Draw(img)
    d.text((120, 40), "Sign in", fill="#111111", font=ImageFont.load_default(24))
    d.rectangle(FIELD, outline="#c8ced3")
    d.text((134, 110), "Username", fill="#e3e3e3", font=ImageFont.load_default(16))
    d.rectangle((120, 180, 520, 220), outline="#c8ced3")
    return img


def test_faint_crop_stretches_the_placeholder_to_full_contrast() -> None:
    array = np.asarray(faint_form())
    found = faint_crop(array, FIELD)
    assert found is not None
    crop, (left, top, right, bottom) = found
    assert crop.min() == 0 and crop.max() == 255  # the faint ink is now black on white
    assert FIELD[0] < left < 140 and FIELD[1] < top and bottom < FIELD[3] and right < 230
    assert faint_crop(array, (120, 180, 520, 220)) is None  # no ink: nothing to read


def test_read_faint_reads_the_placeholder_of_an_input() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    ocr = RapidOcr(threads=1)
    img = faint_form()
    read, empty = ocr.read_faint(img, [FIELD, (120, 180, 520, 220)])
    assert read is not None and read.text == "Username", read
    assert empty is None


def test_covered_tells_each_quad_whose_centre_lies_in_a_found_box() -> None:
    from clef_engine.backbones.vision.ocr import _covered

    found = [_quad(0, 0, 100, 20), _quad(200, 50, 400, 80)]
    quads = [
        _quad(10, 2, 60, 18),  # inside the first box
        _quad(150, 60, 350, 70),  # centre (250, 65): inside the second
        _quad(90, 10, 190, 30),  # centre (140, 20): between them
        _quad(350, 75, 500, 95),  # overlaps the second, centre (425, 85) outside
    ]
    assert _covered(quads, found) == [True, True, False, False]
    assert _covered(quads, []) == [False] * 4
    assert _covered([], found) == []
    # The same as asking one pair at a time, on random boxes.
    rng = np.random.default_rng(0)
    boxes = []
    for _ in range(30):
        (left, right), (top, bottom) = np.sort(rng.uniform(0, 500, (2, 2)), axis=1)
        boxes.append(_quad(left, top, right, bottom))
    lines = [_quad(x, y, x + 40, y + 10) for x, y in rng.uniform(0, 500, (40, 2))]
    one_by_one = [
        any(
            b[:, 0].min() <= q[:, 0].mean() <= b[:, 0].max()
            and b[:, 1].min() <= q[:, 1].mean() <= b[:, 1].max()
            for b in boxes
        )
        for q in lines
    ]
    assert _covered(lines, boxes) == one_by_one
    assert 0 < sum(one_by_one) < len(lines)
