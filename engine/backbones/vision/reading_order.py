"""Reading order of a page's elements: by blocks and columns (a recursive XY cut).

OCR returns lines in no useful order, and reading a two-column page row by row mixes the
main text with its sidebar. :func:`reading_order` splits the elements at the widest empty
band, a column gutter or the space between blocks, and reads each side the same way.

Example:
    >>> from clef_engine.backbones.vision.layout import Element
    >>> def line(text, left, top, right, h=20):
    ...     return Element(text, (left, top, right, top + h), (left, top, right, top + h))
    >>> main = [line(f"main {i}", 40, 80 + 26 * i, 700) for i in range(5)]
    >>> side = [line(f"side {i}", 860, 90 + 34 * i, 1200, h=18) for i in range(3)]
    >>> [e.text for e in reading_order(side + main)]    # the main column, then the sidebar
    ['main 0', 'main 1', 'main 2', 'main 3', 'main 4', 'side 0', 'side 1', 'side 2']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clef_engine.backbones.vision.layout import Element


NARROW_GUTTER_LINES = 3
"""A vertical band one to two line heights wide parts columns only with at least this many
lines on each side (and rows that do not line up across it)."""


def _rows(elements: Sequence[Element]) -> list[Element]:
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


def empty_bands(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(reach, start)`` of every empty band between the ``(start, end)`` spans along one
    axis, in order: nothing covers the band from ``reach`` up to ``start``."""
    ordered = sorted(spans)
    out = []
    reach = ordered[0][1] if ordered else 0.0
    for start, end in ordered[1:]:
        if start > reach:
            out.append((reach, start))
        reach = max(reach, end)
    return out


def _gaps(elements: Sequence[Element], axis: int) -> list[tuple[float, float]]:
    """``(size, position)`` of every empty band across ``elements`` along ``axis`` (0: a
    vertical band, between columns; 1: a horizontal one, between blocks), in order."""
    bands = empty_bands([(e.box[axis], e.box[axis + 2]) for e in elements])
    return [(start - reach, (start + reach) / 2.0) for reach, start in bands]


def _same_row(a: Element, b: Element) -> bool:
    tol = 0.5 * min(a.box[3] - a.box[1], b.box[3] - b.box[1])
    return abs((a.box[1] + a.box[3]) / 2.0 - (b.box[1] + b.box[3]) / 2.0) <= tol


def _aligned_rows(left: Sequence[Element], right: Sequence[Element]) -> bool:
    """Whether two sides of a vertical gap share their rows (a form with labels left of
    its inputs, a table): then the page reads row by row, not column by column."""
    small, other = (left, right) if len(left) <= len(right) else (right, left)
    if not small:
        return False
    matched = 0
    for e in small:
        cy, h = (e.box[1] + e.box[3]) / 2.0, e.box[3] - e.box[1]
        for o in other:
            tol = 0.25 * min(h, o.box[3] - o.box[1])
            if abs((o.box[1] + o.box[3]) / 2.0 - cy) <= tol:
                matched += 1
                break
    return matched >= 0.7 * len(small)


def _rows_across(
    left: Sequence[Element],
    right: Sequence[Element],
    h_gaps: Sequence[tuple[float, float]],
    least: float,
) -> bool:
    """Whether a band at least ``least`` tall crosses both sides where they lie beside
    each other (``h_gaps``: the empty bands across both): rows set apart, a table's."""
    top = max(min(e.box[1] for e in left), min(e.box[1] for e in right))
    bottom = min(max(e.box[3] for e in left), max(e.box[3] for e in right))
    return any(size >= least and top < at < bottom for size, at in h_gaps)


def reading_order(elements: Sequence[Element], depth: int = 0) -> list[Element]:
    """Reading order by blocks and columns (a recursive XY cut).

    The elements are split at the widest empty band: a vertical band (a column gutter at
    least twice the median line height wide, preferred up to half the width of the widest
    horizontal band; one to two line heights wide when at least
    :data:`NARROW_GUTTER_LINES` lines lie on each side, their rows do not line up and no
    band half a line tall crosses both where they lie side by side) or a horizontal one
    (space between blocks);
    each side is ordered the same way, the left or upper side first. A two-column page
    is read column by column, its header and footer before and after (a row that spans
    the gutter at the top or bottom is cut off first). Where no band is
    left, or the two sides of a gutter share their rows (labels left of inputs, a table),
    lines are read row by row, left to right.
    """
    if len(elements) <= 1 or depth > 48:
        return _rows(elements)
    heights = sorted(e.box[3] - e.box[1] for e in elements)
    line_h = heights[len(heights) // 2]
    v_gaps, h_gaps = _gaps(elements, 0), _gaps(elements, 1)
    v_size, v_at = max(v_gaps, default=(0.0, 0.0))
    h_size, h_at = max(h_gaps, default=(0.0, 0.0))
    left = [e for e in elements if (e.box[0] + e.box[2]) / 2.0 < v_at]
    right = [e for e in elements if (e.box[0] + e.box[2]) / 2.0 >= v_at]
    # Columns first: a gutter wins over a block gap up to twice its width, so a section
    # break in the main text does not cut the sidebar beside it in two.
    if v_size >= max(2.0 * line_h, 16.0) and 2.0 * v_size >= h_size:
        top = min(left, key=lambda e: e.box[1]), min(right, key=lambda e: e.box[1])
        bottom = max(left, key=lambda e: e.box[3]), max(right, key=lambda e: e.box[3])
        # A row across both columns right above the first block gap (a logo left, a menu
        # right) is a header and comes first; one right below the last gap, a footer.
        first = h_gaps[0] if h_gaps else (0.0, 0.0)
        last = h_gaps[-1] if h_gaps else (0.0, 0.0)
        if h_gaps and _same_row(*top) and first[1] - first[0] / 2 <= max(e.box[3] for e in top):
            h_at = first[1]
        elif (
            h_gaps and _same_row(*bottom) and last[1] + last[0] / 2 >= min(e.box[1] for e in bottom)
        ):
            h_at = last[1]
        elif not _aligned_rows(left, right):
            return reading_order(left, depth + 1) + reading_order(right, depth + 1)
    elif (
        v_size >= max(line_h, 16.0)
        and 2.0 * v_size >= h_size
        and min(len(left), len(right)) >= NARROW_GUTTER_LINES
        and not _aligned_rows(left, right)
        and not _rows_across(left, right, h_gaps, 0.5 * line_h)
    ):
        # A grid's gutter between a text column and its sidebar can be narrower than two
        # lines (30-40 px, less OCR's padding); with several lines on each side whose rows
        # do not line up, it still parts two columns (a form's label column would not, nor
        # a table whose labels sit beside values that wrap: its rows are set apart).
        return reading_order(left, depth + 1) + reading_order(right, depth + 1)
    if h_gaps:
        upper = [e for e in elements if (e.box[1] + e.box[3]) / 2.0 < h_at]
        lower = [e for e in elements if (e.box[1] + e.box[3]) / 2.0 >= h_at]
        if upper and lower:
            return reading_order(upper, depth + 1) + reading_order(lower, depth + 1)
    return _rows(elements)
