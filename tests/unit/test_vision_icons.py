"""Icon-only buttons from pixels: the search magnifier and the menu's three bars.

The icons are drawn here with OpenCV in the styles the real template pages use (a solid
Font Awesome magnifier, Nucleo's ring with a detached handle, a hamburger); what must not
be an icon is drawn beside them: letters, a radio button, a list icon, a badge.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from clef_engine.backbones.vision.controls import find_controls
from clef_engine.backbones.vision.icons import find_icons
from clef_engine.backbones.vision.layout import analyse
from clef_engine.backbones.vision.ocr import OcrLine

cv2 = pytest.importorskip("cv2")


def _magnifier(
    page: np.ndarray, cx: int, cy: int, colour: tuple[int, int, int], gap: int = 0
) -> None:
    cv2.circle(page, (cx, cy), 6, colour, 2, lineType=cv2.LINE_AA)
    start = 6 + gap
    cv2.line(page, (cx + start, cy + start), (cx + 12, cy + 12), colour, 3, lineType=cv2.LINE_AA)


def _text(page: np.ndarray, xy: tuple[int, int], text: str, size: int = 16) -> OcrLine:
    img = Image.fromarray(page)
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=size)
    d.text(xy, text, font=font, fill=(30, 30, 30))
    page[:] = np.asarray(img)
    left, top, right, bottom = d.textbbox(xy, text, font=font)
    return OcrLine(text, (left - 2.0, top - 3.0, right + 2.0, bottom + 3.0), 0.99)


def test_magnifiers_in_three_styles_are_search_icons() -> None:
    page = np.full((200, 600, 3), 255, np.uint8)
    page[:60] = (30, 30, 46)  # a dark navbar
    _magnifier(page, 500, 26, (230, 230, 240), gap=2)  # light, with a detached handle
    _magnifier(page, 100, 120, (70, 70, 90))  # dark on white
    cv2.rectangle(page, (280, 100), (320, 140), (78, 115, 223), -1)  # a filled button
    _magnifier(page, 294, 114, (255, 255, 255))
    found = sorted(find_icons(page, [], find_controls(page)), key=lambda f: f[1][0])
    assert [name for name, _ in found] == ["search", "search", "search"], found
    for (_, (left, top, right, bottom)), (cx, cy) in zip(
        found, [(100, 120), (294, 114), (500, 26)]
    ):
        assert left <= cx <= right and top <= cy <= bottom


def test_rings_without_a_diagonal_handle_and_badges_are_not_search_icons() -> None:
    page = np.full((200, 600, 3), 255, np.uint8)
    cv2.circle(page, (60, 60), 7, (60, 60, 60), 2, lineType=cv2.LINE_AA)  # a radio button
    cv2.circle(page, (160, 60), 6, (60, 60, 60), 2, lineType=cv2.LINE_AA)  # a "9": its tail
    cv2.line(page, (166, 60), (166, 80), (60, 60, 60), 2)  # goes straight down
    cv2.rectangle(page, (240, 40), (276, 76), (200, 60, 200), -1)  # a badge with a ring and
    cv2.circle(page, (258, 58), 9, (255, 255, 255), 2)  # a stroke in each corner
    for x, y in ((244, 44), (268, 44), (244, 68), (268, 68)):
        cv2.line(page, (x, y), (x + 4, y + 4), (255, 255, 255), 2)
    # The same magnifier inside a line of text ("Q" of a word) is the text's.
    _magnifier(page, 400, 60, (60, 60, 60))
    assert find_icons(page, [(380.0, 40.0, 520.0, 82.0)]) == []


def test_letters_with_a_stem_beside_a_bowl_are_not_search_icons() -> None:
    # A "P", "p", "q" or "4" standing alone (an avatar's initial, the active page of a
    # pagination) has a ring and a stroke leaving it, but steeper than a handle.
    for size in range(12, 34, 3):
        font = ImageFont.load_default(size=size)
        for ch in "Ppq4":
            for fg, bg in (((40, 40, 40), "white"), ((255, 255, 255), (60, 90, 200))):
                img = Image.new("RGB", (120, 90), bg)
                ImageDraw.Draw(img).text((40, 25), ch, font=font, fill=fg)
                assert find_icons(np.asarray(img).copy(), []) == [], (ch, size, fg)


def test_three_even_bars_are_a_menu_but_list_and_alignment_icons_are_not() -> None:
    page = np.full((120, 400, 3), 255, np.uint8)
    for y in (40, 47, 54):
        cv2.rectangle(page, (60, y), (79, y + 2), (80, 80, 80), -1)  # the hamburger
        cv2.rectangle(page, (210, y), (229, y + 2), (80, 80, 80), -1)  # a list's lines,
        cv2.circle(page, (203, y + 1), 2, (80, 80, 80), -1)  # each after a bullet
        cv2.rectangle(page, (300, y), (319, y + 2), (80, 80, 80), -1)  # an align-centre
    for y in (44, 51):  # icon: shorter lines between its long ones
        cv2.line(page, (305, y), (314, y), (80, 80, 80), 1)
    found = find_icons(page, [])
    assert [name for name, _ in found] == ["menu"], found
    left, top, right, bottom = found[0][1]
    assert left <= 60 and right >= 79 and top <= 40 and bottom >= 56


def test_an_icon_button_is_a_named_button_and_a_fields_decoration_is_not() -> None:
    page = np.full((240, 800, 3), 255, np.uint8)
    # A search input with the magnifier button stuck to its right (SB Admin's topbar).
    cv2.rectangle(page, (100, 40), (400, 78), (206, 212, 218), 1)
    lines = [_text(page, (114, 50), "Search for...")]
    cv2.rectangle(page, (401, 40), (441, 78), (78, 115, 223), -1)
    _magnifier(page, 415, 53, (255, 255, 255))
    # A magnifier in front of a field (an input group's decoration), then a Search button.
    _magnifier(page, 100, 160, (90, 90, 90))
    cv2.rectangle(page, (130, 146), (500, 184), (206, 212, 218), 1)
    lines.append(_text(page, (144, 156), "What are you looking for"))
    cv2.rectangle(page, (501, 146), (581, 184), (108, 117, 125), -1)
    img = Image.fromarray(page)
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=16)
    d.text((516, 156), "Search", font=font, fill="white")
    left, top, right, bottom = d.textbbox((516, 156), "Search", font=font)
    lines.append(OcrLine("Search", (left - 2.0, top - 3.0, right + 2.0, bottom + 3.0), 0.99))
    elements = analyse(img, lines)
    icons = [e for e in elements if e.role == "button" and e.label == "search" and not e.text]
    assert len(icons) == 1, elements
    left, top, right, bottom = icons[0].region  # the blue button's box, not only the glyph's
    assert abs(left - 401) <= 3 and abs(right - 441) <= 3
    assert abs(top - 40) <= 3 and abs(bottom - 78) <= 3
    assert [e.text for e in elements if e.role == "button" and e.text] == ["Search"]
    assert not [e for e in elements if e.region[2] <= 125 and e.region[1] >= 130], elements


def test_a_magnifier_before_a_borderless_search_boxs_placeholder_is_its_decoration() -> None:
    page = np.full((120, 900, 3), (30, 30, 46), np.uint8)  # a dark navbar
    _magnifier(page, 60, 50, (200, 200, 210))
    img = Image.fromarray(page)
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=16)
    d.text((86, 42), "Search...", font=font, fill=(150, 150, 160))
    left, top, right, bottom = d.textbbox((86, 42), "Search...", font=font)
    placeholder = OcrLine("Search...", (left - 2.0, top - 3.0, right + 2.0, bottom + 3.0), 0.99)
    page = np.asarray(img).copy()
    _magnifier(page, 800, 50, (200, 200, 210))  # and one on its own: a search button
    elements = analyse(Image.fromarray(page), [placeholder])
    icons = [e for e in elements if e.label == "search" and not e.text]
    assert len(icons) == 1, elements
    assert icons[0].region[0] > 700
