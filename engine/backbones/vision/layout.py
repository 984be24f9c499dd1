"""Layout evidence: OCR lines → page elements (heading, button, field, text) in reading order.

OCR gives text and its box; a browser agent also needs to know what the text sits on. For
each line we look at the pixels around it: starting from the colour that surrounds the
text (its "fill"), the box grows outwards row by row and column by column while the fill
continues, and stops at an edge (a row or column where less than half the pixels match
the fill: a border, or where a coloured button meets the page). A line enclosed on all
four sides by a small rectangle is a control: a **button** when the text is centred in
it, a **field** when the text is left-aligned in a wider box (an input with placeholder
text). The rectangle, not the text, is then the element's box. Lines noticeably taller
than the page's median are **headings**. Everything else is **text**.

The evidence is rendered as a textual state (lines in reading order plus a short layout
summary), so image states are scored by the same engine path as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PIL import Image

from clef_engine.backbones.vision.ocr import OcrLine

Box4 = tuple[float, float, float, float]
"""``(left, top, right, bottom)`` in pixels."""

_EDGE = 0.5
"""A row or column is an edge when fewer than this share of its pixels match the fill."""
_TOLERANCE = 48
"""Colour distance (sum of absolute channel differences) that still counts as the fill."""
_HEADING_RATIO = 1.35
"""A line this many times taller than the median line is a heading."""
_INLINE_CHARS = 600


@dataclass(frozen=True)
class Element:
    """One text element of an image.

    Attributes:
        text: The recognised text.
        box: The text's box ``(left, top, right, bottom)`` in image pixels.
        region: The element's box: the button or field rectangle around the text, or
            the text box itself.
        role: ``heading``, ``button``, ``field`` or ``text``. A label with an empty
            input box right below it is a ``field`` whose region is that box.
        score: OCR confidence.
    """

    text: str
    box: Box4
    region: Box4
    role: str = "text"
    score: float = 1.0
    label: str | None = None
    """For a field: the text that labels it (above it, or left of it on its row), and the
    text of a button right after it on its row."""

    @property
    def center(self) -> tuple[float, float]:
        left, top, right, bottom = self.region
        return (left + right) / 2.0, (top + bottom) / 2.0


@dataclass
class ImageEvidence:
    """What the vision pipeline read from one image.

    Attributes:
        digest: Content digest of the image (cache key).
        width: Image width in pixels.
        height: Image height in pixels.
        elements: Text elements in reading order.
        ocr_ms: Milliseconds OCR and layout analysis took.
    """

    digest: str
    width: int
    height: int
    elements: list[Element] = field(default_factory=list)
    ocr_ms: float = 0.0
    image_vector: Any = None
    """The image encoder's normalised embedding (a tensor), when the pipeline has one."""

    def text(self, label: str = "screenshot") -> str:
        """The textual state: lines in reading order, then a layout summary."""
        head = f"[{label} {self.width}x{self.height}]"
        if not self.elements:
            return f"{head}\n(no text found in the image)"
        lines = [head, *(e.text for e in self.elements)]
        summary = []
        for role, name in (("heading", "headings"), ("button", "buttons"), ("field", "fields")):
            texts = [e.text for e in self.elements if e.role == role]
            if texts:
                summary.append(f"{name}: " + ", ".join(texts[:12]))
        if summary:
            lines.append("(layout: " + "; ".join(summary) + ")")
        return "\n".join(lines)

    def inline(self) -> str:
        """A one-line rendering for placeholders inside instructions or criteria."""
        joined = " / ".join(e.text for e in self.elements) or "no text"
        if len(joined) > _INLINE_CHARS:
            joined = joined[: _INLINE_CHARS - 1] + "…"
        return f"[image: {joined}]"


def _fill_colour(array: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    left, top, right, bottom = box
    ring = np.concatenate(
        [
            array[top, left:right],
            array[bottom - 1, left:right],
            array[top:bottom, left],
            array[top:bottom, right - 1],
        ]
    )
    # One int per colour: a 1-D unique is ~10x faster than np.unique(..., axis=0).
    rgb = ring.reshape(-1, 3).astype(np.int32)
    colours, counts = np.unique(
        (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2], return_counts=True
    )
    top_colour = int(colours[int(np.argmax(counts))])
    return np.array([top_colour >> 16, (top_colour >> 8) & 255, top_colour & 255], dtype=np.int32)


def _close(pixels: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """Mask of ``pixels`` (uint8 RGB) within the colour tolerance of ``colour``."""
    diff = np.abs(pixels.astype(np.int16) - colour.astype(np.int16))
    return diff.sum(axis=-1, dtype=np.int16) <= _TOLERANCE


def _first_edge(fractions: np.ndarray) -> int | None:
    """Index of the first entry below the edge threshold, or ``None`` (no edge within reach)."""
    hits = np.nonzero(fractions < _EDGE)[0]
    return int(hits[0]) if len(hits) else None


def _enclosing_rect(
    array: np.ndarray, box: tuple[int, int, int, int], vcap: int, hcap: int
) -> tuple[int, int, int, int] | None:
    """The smallest fill-coloured rectangle around ``box`` bounded by edges, if any."""
    height, width = array.shape[:2]
    left, top, right, bottom = box
    fill = _fill_colour(array, box)
    y0, y1 = max(0, top - vcap), min(height, bottom + vcap)
    x0, x1 = max(0, left - hcap), min(width, right + hcap)
    window = array[y0:y1, x0:x1]
    lt, tp, rt, bt = left - x0, top - y0, right - x0, bottom - y0
    # Up and down, over the text's columns.
    rows = _close(window[:, lt:rt], fill).mean(axis=1)
    up = _first_edge(rows[:tp][::-1])
    down = _first_edge(rows[bt:])
    if up is None or down is None:
        return None
    r_top, r_bottom = tp - up, bt + down
    # Left and right, over the rectangle's inner rows (only these rows are compared: the
    # window spans most of the page width, and comparing all of it cost 34 ms a page).
    band = window[r_top + 1 : r_bottom - 1] if r_bottom - r_top > 3 else window[r_top:r_bottom]
    cols = _close(band, fill).mean(axis=0)
    leftward = _first_edge(cols[:lt][::-1])
    rightward = _first_edge(cols[rt:])
    if leftward is None or rightward is None:
        return None
    rect = (x0 + lt - leftward, y0 + r_top, x0 + rt + rightward, y0 + r_bottom)
    return rect if _has_border(array, rect, fill) else None


def _has_border(array: np.ndarray, rect: tuple[int, int, int, int], fill: np.ndarray) -> bool:
    """Whether all four sides of ``rect`` are straight edges (not text that stopped growth).

    A real edge (a border line, or where a button's colour meets the page) differs from
    the fill along most of the side; a line of text above or beside does not.
    """
    height, width = array.shape[:2]
    left, top, right, bottom = rect
    w, h = right - left, bottom - top
    # Ignore the ends of each side (rounded corners up to a quarter of the height).
    x_in = slice(left + max(1, min(h // 4, w // 8)), right - max(1, min(h // 4, w // 8)))
    y_in = slice(top + max(1, h // 5), bottom - max(1, h // 5))
    sides = [
        array[max(0, top - 1), x_in],
        array[min(height - 1, bottom), x_in],
        array[y_in, max(0, left - 1)],
        array[y_in, min(width - 1, right)],
    ]
    for side in sides:
        if side.size == 0:
            return False
        differs = np.abs(side.astype(np.int32) - fill).sum(axis=-1) > _TOLERANCE
        if differs.mean() < 0.95:
            return False
    return True


def _role(box: Box4, rect: tuple[int, int, int, int] | None, page_width: int) -> str | None:
    if rect is None:
        return None
    left, top, right, bottom = box
    r_left, r_top, r_right, r_bottom = rect
    text_w, text_h = right - left, bottom - top
    rect_w, rect_h = r_right - r_left, r_bottom - r_top
    if rect_h > 2.5 * text_h or rect_w > 0.7 * page_width or rect_w < text_w:
        return None
    # Controls centre their text vertically; a label boxed in by neighbours does not.
    if abs((top - r_top) - (r_bottom - bottom)) > 0.35 * rect_h:
        return None
    offset = ((left + right) / 2.0 - (r_left + r_right) / 2.0) / max(rect_w, 1.0)
    if abs(offset) <= 0.12:
        return "button"
    if offset < 0 and rect_w >= 1.5 * text_w:
        return "field"
    return "button"


def _empty_box_below(
    array: np.ndarray, box: tuple[int, int, int, int]
) -> tuple[int, int, int, int] | None:
    """An empty bordered (or filled) box starting just below a label, if there is one."""
    height, width = array.shape[:2]
    left, top, right, bottom = box
    text_h = bottom - top
    x0 = max(0, left - 2)
    x1 = min(width, x0 + max(3 * (right - left), 160))
    fill = _fill_colour(array, box)
    last_start = bottom + int(1.5 * text_h) + 4  # the box's top edge starts above this row
    # Only rows from the label's bottom to the deepest row a box may reach are looked at.
    seg = array[bottom : min(height, last_start + 5 * text_h), x0:x1]
    differs = 1.0 - _close(seg, fill).mean(axis=1)
    start = None
    for y in range(bottom, min(height, last_start)):
        if differs[y - bottom] > 0.85:
            start = y
            break
    if start is None:
        return None
    # Inside the box: the colour a few pixels below its top edge, away from the corner.
    probe_y = min(height - 1, start + 3)
    inner = array[probe_y, min(width - 1, x0 + 8)].astype(np.int32)
    inside = _close(seg, inner).mean(axis=1)
    end = None
    for y in range(probe_y, min(height, start + 5 * text_h)):
        if inside[y - bottom] < _EDGE:
            end = y
            break
    if end is None or end - start < 0.8 * text_h:
        return None
    mid = (start + end) // 2
    row = _close(array[mid], inner)
    a = x0 + 8
    while a > 0 and row[a - 1]:
        a -= 1
    b = x0 + 8
    while b < width - 1 and row[b + 1]:
        b += 1
    if b - a < 1.5 * (right - left) or b - a > 0.7 * width or row[a:b].mean() < 0.9:
        return None
    return (max(0, a - 1), start, min(width, b + 2), end + 1)


def _attach_labels(elements: list[Element]) -> list[Element]:
    """Give each field the text that labels it (just above it, or left on its row)."""
    out = []
    for element in elements:
        if element.role != "field" or element.label is not None:
            out.append(element)
            continue
        left, top, right, bottom = element.region
        best: tuple[float, str] | None = None
        for other in elements:
            if other is element or other.role in ("button", "field"):
                continue
            if len(other.text) > 40 or len(other.text.split()) > 5:
                continue  # prose, not a label
            o_left, o_top, o_right, o_bottom = other.box
            o_h = o_bottom - o_top
            above = -0.5 * o_h <= top - o_bottom <= 2.0 * o_h and o_left < right and o_right > left
            cy = (o_top + o_bottom) / 2.0
            beside = top <= cy <= bottom and 0 <= left - o_right <= 12 * o_h
            if above or beside:
                gap = (top - o_bottom) if above else (left - o_right) / 4.0
                if best is None or gap < best[0]:
                    best = (gap, other.text)
        label = best[1] if best else None
        # A button right after the field on its row names what the field is for
        # ("Search", "Subscribe", "Apply").
        for other in elements:
            o_left, o_top, o_right, o_bottom = other.region
            cy = (o_top + o_bottom) / 2.0
            if other.role == "button" and top <= cy <= bottom and 0 <= o_left - right <= 60:
                label = f"{label} {other.text}" if label else other.text
                break
        out.append(replace(element, label=label) if label else element)
    return out


def reading_order(elements: Sequence[Element]) -> list[Element]:
    """Top-to-bottom rows (lines whose vertical centres are close), left to right within."""
    ordered = sorted(elements, key=lambda e: (e.box[1] + e.box[3]) / 2.0)
    rows: list[list[Element]] = []
    for element in ordered:
        cy = (element.box[1] + element.box[3]) / 2.0
        h = element.box[3] - element.box[1]
        if rows:
            last = rows[-1]
            row_cy = sum((e.box[1] + e.box[3]) / 2.0 for e in last) / len(last)
            row_h = min(e.box[3] - e.box[1] for e in last)
            if abs(cy - row_cy) <= 0.5 * min(h, row_h):
                last.append(element)
                continue
        rows.append([element])
    return [e for row in rows for e in sorted(row, key=lambda e: e.box[0])]


def analyse(image: Image.Image, lines: Sequence[OcrLine]) -> list[Element]:
    """Elements with roles and regions from OCR ``lines`` of ``image``, in reading order."""
    if not lines:
        return []
    array = np.asarray(image.convert("RGB"))
    height, width = array.shape[:2]
    heights = sorted(line.box[3] - line.box[1] for line in lines)
    median_h = heights[len(heights) // 2]
    elements = []
    for line in lines:
        left, top, right, bottom = line.box
        ibox = (
            max(0, int(left)),
            max(0, int(top)),
            min(width, int(np.ceil(right))),
            min(height, int(np.ceil(bottom))),
        )
        if ibox[2] - ibox[0] < 2 or ibox[3] - ibox[1] < 2:
            continue
        text_h = ibox[3] - ibox[1]
        rect = _enclosing_rect(array, ibox, vcap=max(6, int(1.2 * text_h)), hcap=int(0.6 * width))
        role = _role(line.box, rect, width)
        region: Box4 = tuple(float(v) for v in rect) if role and rect else line.box  # type: ignore[assignment]
        label = None
        if role is None and text_h < _HEADING_RATIO * median_h and len(line.text) <= 40:
            below = _empty_box_below(array, ibox)
            if below is not None:
                role, label = "field", line.text
                region = tuple(float(v) for v in below)  # type: ignore[assignment]
        if role is None:
            role = "heading" if text_h >= _HEADING_RATIO * median_h else "text"
        elements.append(Element(line.text, line.box, region, role, line.score, label))
    return _attach_labels(reading_order(elements))
