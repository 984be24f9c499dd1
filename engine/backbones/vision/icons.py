"""Icon-only buttons from the pixels: the search magnifier and the menu's three bars.

OCR finds no text on an icon-only button, and many of a page's most used controls are
one: the magnifier that opens or submits a search, the "hamburger" that opens the menu.
Their shapes are the same in every icon set (Font Awesome, Bootstrap Icons, Material,
Nucleo), so they are found by shape, not by a model:

- **search**: a ring (ink around one round hole) with a handle, ink leaving the ring
  diagonally downwards (Font Awesome's handle touches the ring; Nucleo's "zoom-split"
  leaves a gap of a pixel or two, bridged here);
- **menu**: three bars of the same length, stacked at an even spacing.

Ink is what differs from the local background (a median over 33 pixels), so light icons
on a dark navbar and dark ones on a white page are found alike; inside a small button
found from its edges, ink is what differs from the button's own fill (a white magnifier
on a blue button). An icon inside a line of text (a "Q" in "Quick search", a "≡" in a
sentence) is not one: only ink outside the OCR lines of two or more characters is looked
at. Other icons (a bell, a gear, a chevron) are not named: a box question about them
finds them only from the DOM.

On the 145 tune template pages this finds 30 magnifiers and 14 menu icons (most of them
a package's header again on its other pages), none of them another shape (checked by
eye); it costs about 10 ms a 1280x800 page.

:func:`find_icons` returns ``(name, box)`` pairs; :func:`~.layout.analyse` makes each a
button element named by its ``label``, so "the search button" and "the menu icon" find it.

Example:
    >>> import numpy as np, cv2
    >>> page = np.full((80, 200, 3), 255, np.uint8)
    >>> _ = cv2.circle(page, (100, 36), 7, (60, 60, 60), 2)          # the ring
    >>> _ = cv2.line(page, (106, 42), (112, 48), (60, 60, 60), 3)    # its handle
    >>> [(name, box) for name, box in find_icons(page, [])]
    [('search', (92, 28, 115, 51))]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clef_engine.backbones.vision import controls

Box4 = tuple[float, float, float, float]

_INK = 40
"""Grey levels from the local background that make a pixel ink."""
_SIDE = (10, 40)
"""Smallest and largest side of an icon, in pixels (a 14-32 px glyph at 1x)."""


def _ink(array: np.ndarray) -> np.ndarray:
    """Pixels more than :data:`_INK` grey levels from the local background: the median of
    an 11x11 window of a third-size copy (33 pixels across at full size, so a bold 24 px
    icon is still a minority of it), scaled back. 6 ms a 1280x800 page, where a median
    over 21 pixels at full size takes 17."""
    cv2 = controls._cv2()
    gray = cv2.cvtColor(array, cv2.COLOR_RGB2GRAY)
    h, w = gray.shape
    small = cv2.resize(gray, (max(1, w // 3), max(1, h // 3)), interpolation=cv2.INTER_NEAREST)
    background = cv2.resize(cv2.medianBlur(small, 11), (w, h), interpolation=cv2.INTER_NEAREST)
    return (cv2.absdiff(gray, background) > _INK).astype(np.uint8)


def _in_text(box: tuple[int, int, int, int], texts: Sequence[Box4]) -> bool:
    left, top, right, bottom = box
    area = max(1, (right - left) * (bottom - top))
    for t in texts:
        w = min(right, t[2]) - max(left, t[0])
        h = min(bottom, t[3]) - max(top, t[1])
        if w > 0 and h > 0 and w * h > 0.3 * area:
            return True
    return False


def _magnifier(mask: np.ndarray) -> bool:
    """Whether a blob's mask (1 = ink) is a ring around one round hole with a handle
    leaving it diagonally downwards."""
    cv2 = controls._cv2()
    h, w = mask.shape
    padded = np.pad(mask, 1)
    contours, hierarchy = cv2.findContours(padded, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_NONE)
    if hierarchy is None:
        return False
    holes = [c for c, (_, _, _, parent) in zip(contours, hierarchy[0], strict=True) if parent >= 0]
    holes = [c for c in holes if cv2.contourArea(c) >= 0.06 * h * w]
    if len(holes) != 1:
        return False
    hole = holes[0]
    hx, hy, hw, hh = cv2.boundingRect(hole)
    area = cv2.contourArea(hole)
    # Round: a contour through the boundary pixels' centres gives a circle 0.55-0.75 of its
    # box; a document's rectangle is fuller.
    if not 0.7 <= hw / hh <= 1.4 or not 0.45 * hw * hh <= area <= 0.8 * hw * hh:
        return False
    # And convex and smooth (4πA/P² is 1 for a circle; the tune pages' magnifiers have
    # 0.71-0.94, a thumbs-up's outline 0.56).
    perimeter = cv2.arcLength(hole, True)
    hull = cv2.contourArea(cv2.convexHull(hole))
    if 4 * np.pi * area < 0.65 * perimeter**2 or area < 0.9 * hull:
        return False
    cx, cy = hx + hw / 2.0 - 1, hy + hh / 2.0 - 1  # back to mask coordinates
    radius = (hw + hh) / 4.0
    ys, xs = np.nonzero(mask)
    dist = np.hypot(xs + 0.5 - cx, ys + 0.5 - cy)
    # The ring holds most of the ink: its median distance is mid-stroke, so the stroke
    # ends as far past that as the hole's edge is before it.
    mid = float(np.median(dist))
    ring = dist <= 2 * mid - radius + 1.5
    handle = ~ring
    if handle.sum() < max(4, 0.06 * len(xs)) or ring.sum() < 4:
        return False
    # The hole is the ring's centre (a photo's light patch is not).
    off = np.hypot(xs[ring].mean() + 0.5 - cx, ys[ring].mean() + 0.5 - cy)
    if off > max(1.5, 0.3 * radius):
        return False
    hx_, hy_ = xs[handle] + 0.5 - cx, ys[handle] + 0.5 - cy
    # One handle: most ink outside the ring lies in one lower quarter (a square badge
    # behind a ring has ink in all four corners; a ring drawn a little out of round lends
    # a stray pixel or two elsewhere).
    below = hy_ > 0
    quarter = max((below & (hx_ > 0)).mean(), (below & (hx_ < 0)).mean())
    if quarter < 0.8:
        return False
    dx, dy = float(hx_[below].mean()), float(hy_[below].mean())
    # Down and to one side, at 35-55 degrees: a stem beside a bowl ("P", "p", "q", "4":
    # 0.46-0.68) or a "9"'s tail (straight down) is steeper; magnifiers measure 0.96-1.08.
    return 0.7 <= abs(dx) / dy <= 1.45


def _magnifier_in(
    ink: np.ndarray, labels: np.ndarray, stats: np.ndarray, i: int
) -> tuple[int, int, int, int] | None:
    """The box of component ``i`` (of the dilated ``ink``, with its ``labels`` and
    ``stats``) when its undilated ink is a magnifier, in ``ink``'s coordinates."""
    x, y, w, h, _ = (int(v) for v in stats[i])
    mask = ink[y : y + h, x : x + w] * (labels[y : y + h, x : x + w] == i)
    if not _magnifier(mask.astype(np.uint8)):
        return None
    return (x + 1, y + 1, x + w - 1, y + h - 1)  # the dilation added a pixel


def _components(ink: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Connected components of ``ink`` dilated by a pixel, so a split handle (a pixel or
    two from its ring) joins it: ``(count, labels, stats)``."""
    cv2 = controls._cv2()
    joined = cv2.dilate(ink, np.ones((3, 3), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    return n, labels, stats


def _menu(
    bars: list[tuple[int, int, int, int]], ink: np.ndarray
) -> list[tuple[int, int, int, int]]:
    """Boxes of three bars of one length stacked at an even spacing, with nothing else
    drawn within a few pixels (a list icon's bullets, a table's rules)."""
    out = []
    for a in bars:
        below = sorted(
            (o for o in bars if o[1] > a[1] and abs(o[0] - a[0]) <= 2 and abs(o[2] - a[2]) <= 2),
            key=lambda o: o[1],
        )
        if len(below) < 2:
            continue
        b, c = below[:2]
        g1, g2 = b[1] - a[3], c[1] - b[3]
        if not (1 <= g1 <= 10 and abs(g1 - g2) <= 2):
            continue
        box = (min(a[0], b[0], c[0]), a[1], max(a[2], b[2], c[2]), c[3])
        m = max(5, g1 + 2)  # past the spacing: a fourth bar below is not "nothing"
        around = ink[max(0, box[1] - m) : box[3] + m, max(0, box[0] - m) : box[2] + m]
        bars_area = sum(int(ink[o[1] : o[3], o[0] : o[2]].sum()) for o in (a, b, c))
        # Nothing else around them, nor between them (an align-centre icon's short lines).
        if int(around.sum()) - bars_area <= 2:
            out.append(box)
    return out


def _in_buttons(
    array: np.ndarray, boxes: Sequence[controls.Control], texts: Sequence[Box4]
) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Magnifiers drawn inside small filled or bordered buttons, as ink against the
    button's own fill (the page-wide background blurs a button's edge into its icon)."""
    cv2 = controls._cv2()
    found = []
    for c in boxes:
        left, top, right, bottom = c.box
        if not 16 <= c.height <= 64 or c.width > 2.5 * c.height or _in_text(c.box, texts):
            continue
        inner = np.ascontiguousarray(array[top + 2 : bottom - 2, left + 2 : right - 2])
        if inner.size == 0:
            continue
        fill = cv2.cvtColor(np.array([[c.fill]], np.uint8), cv2.COLOR_RGB2GRAY)[0, 0]
        gray = cv2.cvtColor(inner, cv2.COLOR_RGB2GRAY)
        ink = (cv2.absdiff(gray, np.full_like(gray, fill)) > _INK).astype(np.uint8)
        n, labels, stats = _components(ink)
        if n < 2:
            continue
        i = 1 + int(np.argmax(stats[1:, 4]))  # the icon: the most ink in the button
        w, h = int(stats[i, 2]), int(stats[i, 3])
        if not (_SIDE[0] <= w <= _SIDE[1] and _SIDE[0] <= h <= _SIDE[1]):
            continue
        box = _magnifier_in(ink, labels, stats, i)
        if box is not None:
            x0, y0, x1, y1 = box
            found.append(("search", (x0 + left + 2, y0 + top + 2, x1 + left + 2, y1 + top + 2)))
    return found


def find_icons(
    array: np.ndarray,
    texts: Sequence[Box4],
    buttons: Sequence[controls.Control] = (),
) -> list[tuple[str, tuple[int, int, int, int]]]:
    """``(name, box)`` of each search magnifier and menu icon in an RGB ``array``, outside
    the text boxes ``texts`` (OCR lines of two or more characters); ``buttons`` (controls
    found from the edges) are looked into against their own fill as well. Empty without
    OpenCV."""
    if not controls.available() or array.ndim != 3 or min(array.shape[:2]) < _SIDE[0]:
        return []
    cv2 = controls._cv2()
    ink = _ink(np.ascontiguousarray(array))
    found = _in_buttons(array, buttons, texts)

    def seen(box: tuple[int, int, int, int]) -> bool:
        return any(
            min(box[2], f[2]) - max(box[0], f[0]) > 0 and min(box[3], f[3]) - max(box[1], f[1]) > 0
            for _, f in found
        )

    _, labels, stats = _components(ink)
    lo, hi = _SIDE
    ws, hs = stats[:, 2], stats[:, 3]
    sized = (ws >= lo) & (ws <= hi) & (hs >= lo) & (hs <= hi) & (ws >= 0.6 * hs) & (ws <= 1.7 * hs)
    for i in np.nonzero(sized)[0]:
        if i == 0:
            continue
        x, y, w, h, _ = (int(v) for v in stats[i])
        outline = (x, y, x + w, y + h)
        if _in_text(outline, texts) or seen(outline):
            continue
        box = _magnifier_in(ink, labels, stats, int(i))
        if box is not None:
            found.append(("search", box))
    # Bars: thin and long, from the undilated ink (dilation would merge the three).
    _, _, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
    ws, hs = stats[:, 2], stats[:, 3]
    thin = (ws >= 12) & (ws <= 36) & (hs <= 5) & (ws >= 4 * hs)
    thin[0] = False
    bars = [(int(x), int(y), int(x + w), int(y + h)) for x, y, w, h, _ in stats[thin]]
    for box in _menu(bars, ink):
        if not _in_text(box, texts):
            found.append(("menu", box))
    return found
