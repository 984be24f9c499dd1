"""Controls from the pixels: input boxes, buttons and checkboxes as rectangles.

OCR finds text; a browser agent clicks controls, and an empty input box has no text at
all. Controls are drawn as rectangles (a border, or a fill that differs from the page), so
they are found from the edges: Canny edges, dilated so that a one-pixel border becomes a
closed ring, then every closed contour whose outline fills its bounding rectangle (a
rectangle, rounded corners and pills included) and whose size fits a control. A ring has
an outer and an inner contour; of two nested rectangles a few pixels apart the outer is
kept, and where the outer one is polluted (text touching the border) the inner survives.

:func:`find_controls` returns candidate rectangles; :mod:`~.layout` decides what each is
from the OCR text inside and around it (a button centres its text, a field is wider than
its left-aligned text or empty, a small empty square is a checkbox). OpenCV comes with
RapidOCR (the ``[vision]`` extra); without it no controls are found and the layout falls
back to growing rectangles from the text.

Example:
    >>> import numpy as np
    >>> page = np.full((120, 400, 3), 255, np.uint8)
    >>> page[40, 50:350] = page[79, 50:350] = 120              # an input's border
    >>> page[40:80, 50] = page[40:80, 349] = 120
    >>> [c.box for c in find_controls(page)]       # the dilated ring's outer edge
    [(49, 39, 351, 81)]
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

Rect = tuple[int, int, int, int]
"""``(left, top, right, bottom)`` in pixels, right and bottom exclusive."""

MIN_SIDE = 9
"""Smallest control side (Chromium draws a 13 px checkbox)."""
MAX_HEIGHT = 200
"""Tallest control (a textarea); taller rectangles are cards and panels."""
_RECTANGULARITY = 0.86
"""Contour area over bounding-rectangle area: a pill (radius = half the height) on a
300x44 button is 0.97, a circle 0.79; text glyphs merged by dilation fall far below."""
_NESTED = 6
"""Two rectangles whose sides are all within this many pixels are one control's ring."""
_CANNY = (12, 36)
"""Hysteresis thresholds: a #cbd5e1 border on white (about 30 grey levels) is an edge."""


@dataclass(frozen=True)
class Control:
    """A rectangle that may be a control.

    Attributes:
        box: ``(left, top, right, bottom)`` in pixels.
        bordered: The outline differs from both the inside and the outside (an input's
            border); ``False`` for a filled shape without a border (most buttons).
        uniform: The inside is one flat colour (ignoring text), as inputs and buttons are.
        fill: Mean RGB colour of the inside.
        grid: The rectangle shares a side with a neighbour of the same height or width
            (a table cell, a segmented bar), so it is not an input on its own.
        section: The rectangle is the header (``"top"``) or footer (``"bottom"``) band of a
            taller box (a card): it spans the box's width and shares its top or bottom
            edge, so it is a card title or footer, not a control; ``None`` otherwise.
    """

    box: Rect
    bordered: bool
    uniform: bool
    fill: tuple[int, int, int]
    grid: bool = False
    section: str | None = None

    @property
    def width(self) -> int:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> int:
        return self.box[3] - self.box[1]

    def contains(self, box: tuple[float, float, float, float], slack: float = 3.0) -> bool:
        """Whether ``box`` (a text box) lies inside this rectangle, give or take ``slack``."""
        left, top, right, bottom = self.box
        return (
            box[0] >= left - slack
            and box[1] >= top - slack
            and box[2] <= right + slack
            and box[3] <= bottom + slack
        )


def available() -> bool:
    """Whether OpenCV can be imported (it comes with RapidOCR)."""
    return importlib.util.find_spec("cv2") is not None


def _cv2() -> Any:
    import cv2

    return cv2


def _rects(array: np.ndarray) -> tuple[list[Rect], list[Rect]]:
    """Control-sized rectangles, and taller ones (cards and panels: ``panels``)."""
    cv2 = _cv2()
    height, width = array.shape[:2]
    gray = cv2.cvtColor(array, cv2.COLOR_RGB2GRAY)
    edges = cv2.Canny(gray, *_CANNY)
    edges = cv2.dilate(edges, np.ones((3, 3), np.uint8))
    contours, _ = cv2.findContours(edges, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    max_h = min(MAX_HEIGHT, int(0.4 * height))
    out: list[Rect] = []
    panels: list[Rect] = []
    for contour in contours:
        x, y, w, h = cv2.boundingRect(contour)
        if w < MIN_SIDE or h < MIN_SIDE or w > 0.9 * width:
            continue
        # contourArea runs through pixel centres: a filled w x h rectangle has (w-1)(h-1).
        if cv2.contourArea(contour) < _RECTANGULARITY * (w - 1) * (h - 1):
            continue
        rect = (x + 1, y + 1, x + w - 1, y + h - 1)  # the dilation added a pixel
        (panels if h > max_h else out).append(rect)
    return out, panels


def _dedupe(rects: list[Rect]) -> list[Rect]:
    """One rectangle per ring: of nested rectangles a few pixels apart, the outer."""
    rects = sorted(set(rects), key=lambda r: -(r[2] - r[0]) * (r[3] - r[1]))
    kept: list[Rect] = []
    for r in rects:
        inner = any(
            k[0] <= r[0] <= k[0] + _NESTED
            and k[1] <= r[1] <= k[1] + _NESTED
            and k[2] - _NESTED <= r[2] <= k[2]
            and k[3] - _NESTED <= r[3] <= k[3]
            for k in kept
        )
        if not inner:
            kept.append(r)
    return kept


def _describe(array: np.ndarray, rect: Rect) -> Control:
    """Border, flatness and fill of a rectangle from its pixels."""
    height, width = array.shape[:2]
    left, top, right, bottom = rect
    m = 3 if min(right - left, bottom - top) > 12 else 2
    inside = array[top + m : bottom - m, left + m : right - m].reshape(-1, 3).astype(np.int32)
    if inside.size == 0:
        inside = array[top:bottom, left:right].reshape(-1, 3).astype(np.int32)
    # The inside's dominant colour (text pixels are a minority in a control).
    packed = (inside[:, 0] << 16) | (inside[:, 1] << 8) | inside[:, 2]
    colours, counts = np.unique(packed, return_counts=True)
    top_colour = int(colours[int(np.argmax(counts))])
    fill = np.array([top_colour >> 16, (top_colour >> 8) & 255, top_colour & 255], np.int32)
    near = np.abs(inside - fill).sum(axis=1) <= 24
    uniform = bool(near.mean() >= 0.6)
    # A border: walking in from outside the rectangle at the middle of each side, some
    # pixel of the first few differs from both the outside and the inside's fill.
    cy, cx = (top + bottom) // 2, (left + right) // 2
    depth = min(5, (bottom - top) // 3, (right - left) // 3)
    y0, y1 = max(0, top - 1), min(height - 1, bottom)
    x0, x1 = max(0, left - 1), min(width - 1, right)
    sides = [
        array[y0 : y0 + depth + 1, cx],
        array[y1 - depth : y1 + 1, cx][::-1],
        array[cy, x0 : x0 + depth + 1],
        array[cy, x1 - depth : x1 + 1][::-1],
    ]
    bordered_sides = 0
    for side in sides:
        side = side.astype(np.int32)
        if len(side) < 2:
            continue
        vs_out = np.abs(side[1:] - side[0]).sum(axis=1) > 30
        vs_fill = np.abs(side[1:] - fill).sum(axis=1) > 30
        bordered_sides += bool((vs_out & vs_fill).any())
    bordered = bordered_sides >= 3
    return Control(rect, bordered, uniform, (int(fill[0]), int(fill[1]), int(fill[2])))


def _holds_a_control(c: Control, controls: Sequence[Control]) -> bool:
    """Whether ``c`` contains a smaller control-sized rectangle. (A letter's bowl, "o" in
    a title, is a rectangle too small to be a control.)"""
    return any(
        o.box != c.box
        and c.contains(o.box, slack=0.0)
        and o.height < c.height
        and o.width >= 24
        and o.height >= 16
        for o in controls
    )


def _light(fill: tuple[int, int, int]) -> bool:
    """A white or pale grey fill (a card's header band), not a coloured button."""
    return min(fill) >= 200 and max(fill) - min(fill) <= 24


def _mark_sections(controls: list[Control], panels: list[Rect]) -> list[Control]:
    """Flag light bands that span a taller box's width at its top or bottom edge (a card's
    header or footer): the box continues below (above) them, an input's border does not.
    A band is at most 45% of its box's height and holds no other rectangle (the card's
    body, which holds its inputs, is not a band)."""
    near = 5
    boxes = [c.box for c in controls] + panels
    out = []
    for c in controls:
        left, top, right, bottom = c.box
        section = None
        if _light(c.fill) and not _holds_a_control(c, controls):
            for o in boxes:
                if c.height > 0.45 * (o[3] - o[1]):
                    continue
                if abs(o[0] - left) > near or abs(o[2] - right) > near:
                    continue
                if abs(o[1] - top) <= near:
                    section = "top"
                    break
                if abs(o[3] - bottom) <= near:
                    section = "bottom"
                    break
        out.append(c if section is None else replace(c, section=section))
    return out


def _mark_grid(controls: list[Control], array: np.ndarray) -> list[Control]:
    """Flag table cells (a side shared with a same-sized neighbour, the border between them
    a few pixels thick) and the rows and tables that hold them (two or more inside). A wide box
    whose only such neighbour is a square cell at its side is an input with its icon (an
    input group), not a cell; the icon cell is still flagged. Neighbours drawn apart, each
    with its own border and the page between them (inputs side by side in a form row), are
    not cells either, unless they are both along the row and down the column (a table
    with spaced cells)."""
    out = []
    near = 6
    for c in controls:
        l1, t1, r1, b1 = c.box
        grid = False
        inside = 0
        apart_row = apart_col = False
        for o in controls:
            if o is c:
                continue
            l2, t2, r2, b2 = o.box
            same_row = abs(t1 - t2) <= 3 and abs(b1 - b2) <= 3
            same_col = abs(l1 - l2) <= 3 and abs(r1 - r2) <= 3
            # Cells share a border line (their insides are a few pixels apart); stacked
            # buttons keep a margin (8 px in Bootstrap) and are not cells.
            touch_h = abs(r1 - l2) <= near or abs(r2 - l1) <= near
            touch_v = abs(b1 - t2) <= near or abs(b2 - t1) <= near
            inside += l1 <= l2 and t1 <= t2 and r2 <= r1 and b2 <= b1
            if same_row and touch_h and _addon_of(o, c):
                continue  # an input group's icon: the input is still an input
            if same_row and touch_h and _apart(array, c.box, o.box, horizontal=True):
                apart_row = True
                continue
            if same_col and touch_v and _apart(array, c.box, o.box, horizontal=False):
                apart_col = True
                continue
            if (same_row and touch_h) or (same_col and touch_v) or inside >= 2:
                grid = True
                break
        # Drawn apart along its row and down its column too: a table with spaced cells (a
        # form's inputs have their labels between rows).
        grid = grid or (apart_row and apart_col)
        out.append(c if not grid else replace(c, grid=True))
    return out


def _apart(array: np.ndarray, a: Rect, b: Rect, horizontal: bool) -> bool:
    """Whether two neighbouring rectangles have a border each, with the page between them.

    Across the strip between them, a shared border is one line; two controls a gutter apart
    are two lines with a run of the page between. Lines are counted on the middle half of
    the rows (columns, for ``horizontal=False``) the two share, against the strip's
    dominant colour, and the median count decides.
    """
    if not horizontal:
        array = array.transpose(1, 0, 2)
        a = (a[1], a[0], a[3], a[2])
        b = (b[1], b[0], b[3], b[2])
    if b[0] < a[0]:
        a, b = b, a
    x0, x1 = max(0, min(a[2], b[0]) - 3), min(array.shape[1], max(a[2], b[0]) + 3)
    y0, y1 = max(a[1], b[1]), min(a[3], b[3])
    q = (y1 - y0) // 4
    strip = array[y0 + q : y1 - q, x0:x1].astype(np.int32)
    if strip.shape[0] == 0 or strip.shape[1] < 5:
        return False
    packed = (strip[..., 0] << 16) | (strip[..., 1] << 8) | strip[..., 2]
    colours, counts = np.unique(packed, return_counts=True)
    top = int(colours[int(np.argmax(counts))])
    page = np.array([top >> 16, (top >> 8) & 255, top & 255], np.int32)
    ink = np.abs(strip - page).sum(axis=-1) > 24
    # A line starts where ink follows no ink: count the starts in each row.
    starts = (ink[:, 1:] & ~ink[:, :-1]).sum(axis=1) + ink[:, 0]
    return bool(np.median(starts) >= 2)


def _addon_of(addon: Control, c: Control) -> bool:
    """Whether ``addon`` is the icon or text cell stuck to the side of the input ``c``
    (Bootstrap's input group: a square with a user icon, then the username box)."""
    return addon.width <= 1.6 * addon.height and c.width >= 3 * c.height and c.height <= 80


def find_controls(array: np.ndarray) -> list[Control]:
    """Rectangles in an RGB ``array`` (height x width x 3, uint8) that may be controls.

    Returns an empty list when OpenCV is not installed.
    """
    if not available() or array.ndim != 3 or min(array.shape[:2]) < MIN_SIDE:
        return []
    rects, panels = _rects(np.ascontiguousarray(array))
    controls = _mark_grid([_describe(array, r) for r in _dedupe(rects)], array)
    return _mark_sections(controls, panels)
