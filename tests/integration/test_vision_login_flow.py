"""A browser agent signs in by looking: locate each control, click its centre, type.

Headless Chromium (the system one) renders tests/fixtures/flows/login.html, a plain login
card (labels above empty inputs, a pill-shaped button). The agent only has box answers:
from the screenshot's pixels, and from the page's own DOM. Before controls were found
from the pixels, "the sign-in button" came back as the heading above the form and the
click did nothing. Skips when Chromium or Playwright is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clef_agents.browser import CHROMIUM_ARGS, find_chromium
from clef_agents.vision import ScreenshotClassifier

pytest.importorskip("rapidocr_onnxruntime")
pytest.importorskip("playwright.sync_api")
if find_chromium() is None:
    pytest.skip(
        "Chromium is not installed (apt-get install chromium); browser tests skipped",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LOGIN = Path(__file__).resolve().parents[1] / "fixtures" / "flows" / "login.html"
VIEWPORT = (1280, 800)


@pytest.fixture(scope="module")
def page() -> Any:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
        yield page
        browser.close()


def _sign_in(page: Any, find: Any) -> None:
    page.goto(LOGIN.as_uri())
    for what, text in (("the username field", "alice"), ("the password input field", None)):
        box = find(what)
        assert box.box is not None, what
        page.mouse.click(*box.box.center(*VIEWPORT))
        page.keyboard.type(text or "correct horse")
    focused = page.evaluate("document.activeElement.id")
    assert focused == "pass"  # the click landed in the password input, not beside it
    box = find("the sign-in button")
    page.mouse.click(*box.box.center(*VIEWPORT))
    page.wait_for_function("document.body.dataset.state !== undefined", timeout=5000)


def test_login_by_screenshot_boxes(engine, page) -> None:
    classifier = ScreenshotClassifier(engine)
    _sign_in(page, lambda what: classifier.locate(page.screenshot(), what))
    assert page.evaluate("document.body.dataset.state") == "signed-in"
    assert page.is_visible("#welcome")


def test_login_by_dom_boxes(engine, page) -> None:
    classifier = ScreenshotClassifier(engine)
    answers = []

    def find(what: str) -> Any:
        answers.append(classifier.locate(page, what))
        return answers[-1]

    _sign_in(page, find)
    assert page.evaluate("document.body.dataset.state") == "signed-in"
    assert all(getattr(a, "x_geometry", None) == "dom" for a in answers)
