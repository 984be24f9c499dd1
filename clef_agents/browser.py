"""Render local HTML in headless Chromium (Playwright) and screenshot it.

For building labelled screenshot sets (tests, benchmarks, your own evaluation). Uses the
system Chromium (Debian: ``apt-get install chromium``); nothing is downloaded, and the
browser runs with networking features off. Needs ``playwright`` (the ``[vision]`` extra);
never run ``playwright install``.

Example:
    >>> shots = render_files(["tests/fixtures/pages/login--1.html"])
    >>> shots[0].png[:4], shots[0].size
    (b'\\x89PNG', (1280, 800))
    >>> [target.instructions for target in shots[0].targets]   # its data-target elements
    ['the sign-in button']
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_engine.errors import require
from clef_engine.schema.answers import BoxCoords

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a system Chromium (``$CLEF_CHROMIUM`` first), or ``None``."""
    env = os.environ.get("CLEF_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Target:
    """An element marked ``data-target="<instructions>"`` in a fixture page."""

    instructions: str
    box: tuple[float, float, float, float]
    """``(left, top, right, bottom)`` in CSS pixels of the screenshot."""

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2.0, (self.box[1] + self.box[3]) / 2.0

    def hit(self, box: BoxCoords | None, size: tuple[int, int]) -> bool:
        """Whether a box answer (fractions of a ``size`` = ``(width, height)`` screenshot)
        contains this target's centre."""
        if box is None:
            return False
        pixels = box.to_pixels(*size)
        cx, cy = self.center
        return pixels.left <= cx <= pixels.right and pixels.top <= cy <= pixels.bottom


@dataclass
class RenderedPage:
    """A screenshot of one HTML file and the targets marked in it."""

    path: Path
    png: bytes
    targets: list[Target] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def label(self) -> str:
        """The page type, from a file name such as ``login--2.html``."""
        return self.path.stem.split("--")[0]

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of the screenshot in pixels, from the PNG header: what a box
        answer's fractions are fractions of."""
        width, height = struct.unpack(">II", self.png[16:24])
        return int(width), int(height)


@contextmanager
def chromium(executable_path: str | None = None) -> Iterator[Any]:
    """A headless Chromium browser (sync Playwright), closed on exit."""
    sync_api = require(
        "playwright.sync_api", package="playwright", extra="vision", feature="Browser rendering"
    )
    executable = executable_path or find_chromium()
    if executable is None:
        raise FileNotFoundError("no Chromium found; install it with: apt-get install chromium")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


_TARGETS_JS = """els => els.map(e => {
  const r = e.getBoundingClientRect();
  return [e.dataset.target, r.left, r.top, r.right, r.bottom];
})"""


def render_files(
    paths: Sequence[str | Path],
    *,
    viewport: tuple[int, int] = (1280, 800),
    executable_path: str | None = None,
) -> list[RenderedPage]:
    """Screenshot each local HTML file at ``viewport`` (one browser, one page reused)."""
    out = []
    with chromium(executable_path) as browser:
        context = browser.new_context(
            viewport={"width": viewport[0], "height": viewport[1]}, device_scale_factor=1
        )
        page = context.new_page()
        # Local files only: any request off the file system is aborted.
        page.route(
            "**/*",
            lambda route: (
                route.continue_() if route.request.url.startswith("file:") else route.abort()
            ),
        )
        for path in paths:
            p = Path(path).resolve()
            page.goto(p.as_uri())
            targets = [
                Target(str(t[0]), (float(t[1]), float(t[2]), float(t[3]), float(t[4])))
                for t in page.eval_on_selector_all("[data-target]", _TARGETS_JS)
            ]
            out.append(RenderedPage(p, page.screenshot(), targets))
        context.close()
    return out
