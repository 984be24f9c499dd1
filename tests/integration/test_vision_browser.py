"""Real headless Chromium: rendered fixture pages → page types and element boxes.

Pages are rendered once per session (one page per page type, plus their data-target
elements); OCR evidence is cached by the engine, so box questions reuse it. Skips with a
reason when Chromium or Playwright is missing (.ci/run installs Chromium with apt-get).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clef_agents.browser import CHROMIUM_ARGS, RenderedPage, find_chromium, render_files
from clef_agents.vision import PAGE_TYPES, ScreenshotClassifier, aas_state, as_state

pytest.importorskip("rapidocr_onnxruntime")
pytest.importorskip("playwright.sync_api")
if find_chromium() is None:
    pytest.skip(
        "Chromium is not installed (apt-get install chromium); browser tests skipped",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "pages"


@pytest.fixture(scope="session")
def rendered() -> list[RenderedPage]:
    """The first fixture of every page type, rendered at 1280x800."""
    files = [PAGES / f"{label}--1.html" for label in PAGE_TYPES]
    return render_files(files)


@pytest.fixture(scope="session")
def classifier(engine) -> ScreenshotClassifier:
    return ScreenshotClassifier(engine)


def test_every_page_type_has_fixtures() -> None:
    labels = {p.stem.split("--")[0] for p in PAGES.glob("*.html")}
    assert labels == set(PAGE_TYPES)
    # The real-template set (benchmarks/data/template_pages) measures them; the fixtures
    # here only need one page per type.
    assert all(list(PAGES.glob(f"{label}--*.html")) for label in PAGE_TYPES)


def test_page_types_from_screenshots(classifier, rendered) -> None:
    answers = classifier.classify_batch([p.png for p in rendered])
    predicted = [a.choice for a in answers]
    correct = sum(p == page.label for p, page in zip(predicted, rendered, strict=True))
    # Measured 34/41 on the full fixture set (benchmarks/vision_screenshots.py).
    assert correct / len(rendered) >= 0.7, ([p.label for p in rendered], predicted)
    for answer in answers:
        assert abs(sum(answer.probabilities.values()) - 1.0) < 1e-6
        assert set(answer.probabilities) == set(PAGE_TYPES)


def test_boxes_contain_the_target_centres(classifier, rendered) -> None:
    targets = [(page, t) for page in rendered for t in page.targets]
    assert len(targets) >= 8
    hits = []
    for page, target in targets:
        answer = classifier.locate(page.png, target.instructions)
        assert answer.box is not None
        # Fractions of the screenshot, as the wire schema says; the target is in pixels.
        assert 0.0 <= answer.box.left < answer.box.right <= 1.0
        assert 0.0 <= answer.box.top < answer.box.bottom <= 1.0
        hits.append(target.hit(answer.box, page.size))
    assert sum(hits) / len(hits) >= 0.7, ([t.instructions for _, t in targets], hits)


def _launch(playwright):
    return playwright.chromium.launch(
        executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS
    )


def test_sync_playwright_page_is_screenshotted(classifier, rendered) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = _launch(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto((PAGES / "not_found--1.html").as_uri())
        state = as_state(page)
        assert isinstance(state, bytes) and state.startswith(b"\x89PNG")
        answer = classifier.classify(page)
        browser.close()
    assert answer.choice == "not_found"


def test_async_playwright_page(classifier) -> None:
    from playwright.async_api import async_playwright

    async def run() -> tuple[str, bool]:
        async with async_playwright() as pw:
            browser = await _launch(pw)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto((PAGES / "not_found--1.html").as_uri())
            with pytest.raises(TypeError, match="aas_state"):
                as_state(page)
            state = await aas_state(page)
            answer = await classifier.aclassify(page)
            box = await classifier.alocate(page, "the go back home button")
            target = await page.eval_on_selector(
                "[data-target]",
                "e => { const r = e.getBoundingClientRect(); "
                "return [r.left + r.width / 2, r.top + r.height / 2]; }",
            )
            await browser.close()
        assert isinstance(state, bytes)
        assert box.box is not None
        pixels = box.box.to_pixels(1280, 800)  # the viewport screenshot's size
        hit = pixels.left <= target[0] <= pixels.right and pixels.top <= target[1] <= pixels.bottom
        return answer.choice, hit

    choice, hit = asyncio.run(run())
    assert choice == "not_found"
    assert hit


def test_example_browser_agent_runs() -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "browser_agent_screenshot.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4
    assert "error page" in lines[2]
