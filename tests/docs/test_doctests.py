"""Every docstring example in clef_engine and clef_agents runs (``python -m pytest`` runs them).

The modules are imported by their installed names (``clef_engine.x``, not the ``engine/``
folder's), so each example runs against the package a user imports. Each module's examples
run in an empty working directory holding the files they open (:data:`FILES`: a
screenshot, BANKING77 rows, a fine-tuned model dir, a decision log, built here by real
code) and with the names they use (:data:`GLOBS`: a screenshot, a Playwright page in the
system Chromium).
Without Chromium the browser modules' examples are skipped, as the browser integration
tests are. An example that cannot run in a test (a server on a port, a multi-gigabyte
decoder) is marked ``# doctest: +SKIP``; their number is pinned below so that it only goes
down.
"""

from __future__ import annotations

import csv
import doctest
import importlib
import io
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"engine": "clef_engine", "clef_agents": "clef_agents"}
MAX_SKIPPED = 4  # examples marked +SKIP today; lower it when you make one run

FILES: dict[str, dict[str, str]] = {
    # module: {path in the example's working directory: the asset put there}
    "clef_engine.backbones.vision.backbone": {"shot.png": "login.png"},
    "clef_agents.vision": {"shot.png": "login.png"},
    "clef_agents.browser": {"tests/fixtures/pages/login--1.html": "login.html"},
    "clef_engine.heads.trained": {"out/tickets": "tickets-model"},
    "clef_engine.heads.ensemble": {"out/tickets-ensemble": "tickets-ensemble"},
    "clef_engine.train.recalibrate": {"out/tickets": "tickets-model", "heldout.csv": "heldout"},
    "clef_agents.decision_log.review": {"decisions.sqlite": "log"},
    "clef_agents.decision_log.report": {"decisions.sqlite": "labelled-log"},
    "clef_engine.train.data": {"train.csv": "banking77"},
    "clef_engine.train.trainer": {"train.csv": "banking77-3-intents"},
}
GLOBS: dict[str, tuple[str, ...]] = {
    # module: names its examples use without defining them (see ``_screenshot``)
    "clef_engine.backbones.vision.ocr": ("screenshot",),
    "clef_engine.backbones.vision.clip": ("screenshot",),
    "clef_engine.backbones.vision.dom": ("page",),
    "clef_agents.vision": ("page",),
}
BROWSER = {"clef_agents.browser", "clef_engine.backbones.vision.dom", "clef_agents.vision"}
"""Modules whose examples drive the system Chromium (through Playwright)."""
LOGIN_HTML = ROOT / "tests" / "fixtures" / "pages" / "login--1.html"
BANKING77 = ROOT / "tests" / "data" / "banking77" / "train.csv"
"""The attributed BANKING77 slice (10 rows per intent, ``tests/data/banking77/README.md``)."""


def _screenshot() -> Image.Image:
    """A 1280x800 sign-in page: a heading, email and password fields, a button."""
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    big, small = ImageFont.load_default(size=34), ImageFont.load_default(size=18)
    d.text((480, 150), "Sign in to Acme", fill="black", font=big)
    d.text((480, 240), "Email address", fill="#333", font=small)
    d.rectangle((480, 265, 800, 305), outline="#999", width=1)
    d.text((490, 275), "you@example.com", fill="#999", font=small)
    d.text((480, 330), "Password", fill="#333", font=small)
    d.rectangle((480, 355, 800, 395), outline="#999", width=1)
    d.rounded_rectangle((480, 420, 800, 465), radius=6, fill="#2563eb")
    d.text((610, 432), "Sign in", fill="white", font=small)
    d.text((480, 490), "Forgot password?", fill="#2563eb", font=small)
    return img


def _page(stack: ExitStack) -> Any:
    """A 1280x800 Playwright page on the sign-in fixture, closed when ``stack`` closes."""
    from clef_agents.browser import chromium

    browser = stack.enter_context(chromium())
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(LOGIN_HTML.as_uri())
    return page


MAKERS: dict[str, Callable[[ExitStack], Any]] = {
    "screenshot": lambda _: _screenshot(),
    "page": _page,
}

TICKETS = {
    "billing": ["refund my payment", "money taken twice", "card fee refund", "payment failed"],
    "tech": ["login page error", "bug on the page", "error at login", "page has a bug"],
    "sales": ["exchange rate help", "cash exchange rate", "rate for exchange", "top up cash"],
}


def _tickets(seed: int) -> Any:
    """The ``route`` question (``billing``/``tech``/``sales``) on 48 word-bag tickets."""
    from clef_engine import Choice
    from clef_engine.train import Example, TrainingSet

    route = Choice(instructions="route the ticket", criteria=list(TICKETS))
    rows = [
        Example(f"{text} {seed}{i}", {"route": label})
        for i in range(4)
        for label, texts in enumerate(TICKETS.values())
        for text in texts
    ]
    return TrainingSet({"route": route}, rows, "tickets")


def _train(out: Path, ensemble: int) -> Path:
    """A tiny random encoder fine-tuned on the tickets (seconds on a CPU)."""
    from clef_engine.testing import write_tiny_bert
    from clef_engine.train import TrainConfig, Trainer

    bert = write_tiny_bert(out.parent / f"{out.name}-bert")
    config = TrainConfig(
        epochs=3, batch_size=8, lora_rank=2, head_dim=16, head_heads=2, max_length=32,
        lr=1e-2, head_lr=1e-2, val_fraction=0.25, progress=False, ensemble=ensemble,
    )  # fmt: skip
    Trainer(config, backbone=str(bert)).fit(_tickets(0), out)
    return out


def _heldout(out: Path) -> Path:
    with out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "category"])
        for example in _tickets(1).examples:
            writer.writerow([example.state, list(TICKETS)[example.labels["route"]]])
    return out


def _log(out: Path, labelled: bool) -> Path:
    """Seven tickets routed by a FakeEngine through a LoggedEngine; with ``labelled``, the
    true route of each stored, as ``clef-agents review import`` stores a reviewer's."""
    from clef_agents.decision_log import DecisionLog, LoggedEngine
    from clef_agents.decision_log.review import export_csv, import_labels, review_items
    from clef_agents.fake import FakeEngine

    truth = {
        "please refund my payment": "billing",
        "refund the card fee": "billing",
        "the login page shows an error": "tech",
        "a bug on the page": "tech",
        "what is the exchange rate": "sales",
        "I was charged the wrong exchange rate": "billing",
        "hello?": "sales",
    }
    criteria = {"billing": "refund payment", "tech": "bug error login", "sales": "exchange rate"}
    question = {"type": "choice", "instructions": "route the ticket", "criteria": criteria}
    log = DecisionLog(out)
    LoggedEngine(FakeEngine(), log).decide_batch(list(truth), {"route": question})
    log.close()
    if labelled:
        items = review_items(out, below=None, sources=("model", "rules", "default"))
        export_csv(items, out.with_suffix(".csv"))
        with out.with_suffix(".csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        for row in rows:
            row["label"] = truth[row["state"]]
        with out.with_suffix(".csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        import_labels(out, out.with_suffix(".csv"))
    return out


def _intents(out: Path, count: int) -> Path:
    """The rows of the first ``count`` intents of the BANKING77 slice (``text,category``)."""
    with BANKING77.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    keep = list(dict.fromkeys(row["category"] for row in rows))[:count]
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "category"])
        writer.writeheader()
        writer.writerows(row for row in rows if row["category"] in keep)
    return out


def _png(out: Path) -> Path:
    buf = io.BytesIO()
    _screenshot().save(buf, "PNG")
    out.write_bytes(buf.getvalue())
    return out


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "login.png": _png,
    "login.html": lambda _: LOGIN_HTML,
    "tickets-model": lambda out: _train(out, ensemble=1),
    "tickets-ensemble": lambda out: _train(out, ensemble=2),
    "heldout": _heldout,
    "log": lambda out: _log(out, labelled=False),
    "labelled-log": lambda out: _log(out, labelled=True),
    "banking77": lambda _: BANKING77,
    "banking77-3-intents": lambda out: _intents(out, 3),
}


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Builds each asset once per session, on first use."""
    root = tmp_path_factory.mktemp("doc-assets")
    built: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in built:
            built[key] = BUILDERS[key](root / key)
        return built[key]

    return get


def _modules() -> list[str]:
    names = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" not in path.read_text():
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join([package, *parts]))
    return names


MODULES = _modules()


def _tests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return doctest.DocTestFinder(exclude_empty=True).find(module, name)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, assets: Callable[[str], Path]
) -> None:
    if name in BROWSER:
        from clef_agents.browser import find_chromium

        pytest.importorskip("playwright.sync_api")
        if find_chromium() is None:
            pytest.skip("Chromium is not installed (apt-get install chromium)")
    monkeypatch.chdir(tmp_path)
    for path, key in FILES.get(name, {}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        source = assets(key)
        copy = shutil.copytree if source.is_dir() else shutil.copyfile
        copy(source, tmp_path / path)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    report: list[str] = []
    with ExitStack() as stack:
        extra = {key: MAKERS[key](stack) for key in GLOBS.get(name, ())}
        for test in _tests(name):
            test.globs.update(extra)
            runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_skipped_examples_do_not_grow() -> None:
    total = attempted = 0
    for name in MODULES:
        for test in _tests(name):
            total += len(test.examples)
            attempted += sum(
                1 for ex in test.examples if not ex.options.get(doctest.OPTIONFLAGS_BY_NAME["SKIP"])
            )
    skipped = total - attempted
    assert attempted > 0
    assert skipped <= MAX_SKIPPED, f"{skipped} docstring examples skipped (at most {MAX_SKIPPED})"
