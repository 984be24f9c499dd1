"""Page chrome: the top bar and the left sidebar that frame an app's main content.

Admin and shop pages repeat the same navigation on every page ("Dashboard", "Widgets",
"Cart"). For a page-type question it is noise that crowds the page's own text out of the
encoder's window; for a box question it holds look-alikes of the element asked for (the
sidebar's search box beside the page's). :func:`chrome` finds it from the elements'
geometry alone: the textual state reads the main content first and the chrome after it,
and box questions that do not name a menu, sidebar or header prefer the main content.

Example:
    >>> from clef_engine.backbones.vision.layout import Element
    >>> def line(text, left, top, right):
    ...     return Element(text, (left, top, right, top + 20), (left, top, right, top + 20))
    >>> side = [line(t, 20, 100 + 60 * i, 120) for i, t in enumerate("ABCDEFGH")]
    >>> main = [line("Welcome", 300, 120, 700), line("Body", 300, 200, 900),
    ...         line("More", 300, 300, 900)]
    >>> chrome(side + main, 1280, 800)[-3:], all(chrome(side + main, 1280, 800)[:8])
    ([False, False, False], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clef_engine.backbones.vision.reading_order import empty_bands

if TYPE_CHECKING:
    from clef_engine.backbones.vision.layout import Element

TOP_BAR = 0.1
"""The top bar lies within this share of the page height from the top."""
SIDEBAR = (0.08, 0.3)
"""A sidebar ends in this band of the page width (a gutter there, no element across)."""


def chrome(elements: Sequence[Element], width: int, height: int) -> list[bool]:
    """Which elements are page chrome: a top bar, or a sidebar down the left side.

    The top bar is two or more elements within the top tenth of the page, with more of
    the page below. A sidebar is five or more elements left of an empty vertical band in
    the left 8-30% of the width (the top bar left out), reaching down half the page, with
    three or more elements right of the band.
    """
    out = [False] * len(elements)
    if not elements or width <= 0 or height <= 0:
        return out
    for i in chrome_top(elements, height):
        out[i] = True
    found = sidebar(elements, width, height, skip=out)
    for i in found[0] if found else ():
        out[i] = True
    return out


def chrome_top(elements: Sequence[Element], height: int) -> list[int]:
    """Indices of the top bar's elements (see :func:`chrome`); empty without one."""
    top = [
        i
        for i, e in enumerate(elements)
        if e.region[1] < 0.6 * TOP_BAR * height and e.region[3] <= TOP_BAR * height
    ]
    below = any(e.region[1] > 1.5 * TOP_BAR * height for e in elements)
    return top if len(top) >= 2 and below else []


def sidebar(
    elements: Sequence[Element], width: int, height: int, skip: Sequence[bool] | None = None
) -> tuple[list[int], float, float] | None:
    """The left sidebar (see :func:`chrome`): its elements' indices, its left edge and the
    middle of the gutter right of it, where a menu row's clickable width ends; ``None``
    without one. ``skip`` marks elements left out (the top bar); by default those of
    :func:`chrome`'s top bar."""
    if skip is None:
        top = chrome_top(elements, height)
        skip = [i in top for i in range(len(elements))]
    rest = [(i, e) for i, e in enumerate(elements) if not skip[i]]
    bands = empty_bands([(e.region[0], e.region[2]) for _, e in rest])
    cut = next(
        (
            (start + reach) / 2.0
            for reach, start in bands
            if SIDEBAR[0] * width <= reach and start <= SIDEBAR[1] * width
        ),
        None,
    )
    if cut is None:
        return None
    left = [(i, e) for i, e in rest if e.region[2] <= cut]
    right = [e for _, e in rest if e.region[0] >= cut]
    if len(left) < 5 or len(right) < 3:
        return None
    reach_down = max(e.region[3] for _, e in left) - min(e.region[1] for _, e in left)
    if reach_down < 0.5 * height:
        return None
    return [i for i, _ in left], min(e.region[0] for _, e in left), cut
