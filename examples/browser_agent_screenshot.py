"""A browser agent step: screenshot the page, ask what it is, branch, find the button.

Drives headless Chromium (Debian's /usr/bin/chromium; nothing is downloaded) through
Playwright to a few local fixture pages. For each page the agent asks one calibrated
question ("what kind of page is this?") and branches on the answer: on a cookie wall it
finds and clicks the accept button, on a login page it finds the sign-in button, on an
error page it gives up, and anything uncertain goes to a human.

Run:  python examples/browser_agent_screenshot.py
Needs: pip install 'clef-agents[vision]' and apt-get install chromium.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from clef_agents.browser import CHROMIUM_ARGS, find_chromium
from clef_agents.vision import ScreenshotClassifier

PAGES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pages"
VISIT = ["cookie_consent--1.html", "login--4.html", "not_found--1.html", "blog_article--1.html"]
CONFIDENT = 0.5  # below this calibrated probability, a human decides
VIEWPORT = (1280, 800)  # the screenshot's size: boxes are fractions of it


def step(classifier: ScreenshotClassifier, page) -> str:  # type: ignore[no-untyped-def]
    """One agent step on the page in view; returns what the agent did."""
    answer = classifier.classify(page)  # the Page is screenshotted for us
    p = answer.probabilities[answer.choice]
    if p < CONFIDENT:
        return f"unsure ({answer.choice} p={p:.2f}) -> ask a human"
    if answer.choice == "cookie_consent":
        box = classifier.locate(page, "the accept all cookies button")
        if box.box is not None:
            x, y = box.box.center(*VIEWPORT)  # fractions of the screenshot -> pixels
            page.mouse.click(x, y)
            return f"cookie wall (p={p:.2f}) -> clicked accept at ({x:.0f}, {y:.0f})"
    if answer.choice == "login":
        box = classifier.locate(page, "the sign-in button")
        where = (
            "not found"
            if box.box is None
            else "at ({:.0f}, {:.0f})".format(*box.box.center(*VIEWPORT))
        )
        return f"login (p={p:.2f}) -> credentials needed; sign-in button {where}"
    if answer.choice == "not_found":
        return f"error page, not found (p={p:.2f}) -> go back, do not retry this address"
    if answer.choice == "server_error":
        return f"error page, server error (p={p:.2f}) -> back off and retry later"
    return f"{answer.choice} (p={p:.2f}) -> continue the task"


def main() -> int:
    executable = find_chromium()
    if executable is None:
        print("Chromium not found: apt-get install chromium", file=sys.stderr)
        return 1
    classifier = ScreenshotClassifier()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
        for name in VISIT:
            page.goto((PAGES / name).as_uri())
            print(f"{name:24s} {step(classifier, page)}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
