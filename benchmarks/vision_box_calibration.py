"""Box answers: hit rate, calibration of their confidence, and screenshot latency.

Renders HTML pages in headless Chromium at 1280x800 and asks ``box`` questions about
their controls. The questions come from each page's DOM: every visible input, button,
checkbox and link with a short name (its label, aria name, placeholder or text) becomes
"the <name> field/button/checkbox/link", plus every element marked ``data-target``. A box
is a hit when it contains the centre of an element the question names (any of them when
several share the name, like eight "Add to cart" buttons). Each question is answered
twice: from the screenshot's pixels (``engine.decide(png, {"x": Box(...)})``) and from the
page's DOM (``ScreenshotClassifier.locate(page, ...)``).

The confidence is ``sigmoid(a·logit(p) + c)`` per source (see
:func:`clef_engine.heads.box.hit_probability`); ``(a, c)`` are fit by logistic
regression on the fit pages (tests/fixtures/pages, tests/fixtures/flows, and with
``--renders`` the tune template pages) and reported on the held-out pages
(tests/fixtures/pages_holdout and any ``--holdout`` folder), never fit on: hit rate,
mean confidence, expected calibration error (10 bins) and Brier score, for the raw
softmax probability and for the calibrated one.

``--latency`` also times one end-to-end decision per page (a page-type Choice and a box
question, cold OCR cache) and reports p50/p95 over all pages and over the text-heavy ones
(at least 30 OCR lines).

``--renders`` adds pixel questions on the real template pages, and the pixel calibration
is then fit on their ``tune`` split too (``--no-fit-tune``: fixtures only; ``heldout``
pages are never fit on, only reported); ``--split tune`` opens the tune pages only (then
``--out`` is required: a part of the set never overwrites the committed JSON). The
shipped constants (:data:`clef_engine.heads.box.CALIBRATION`) come from the run with the
renders; :func:`by_package` checks, on the tune pages alone, that such a fit carries to a
package it was not fit on.

Run:  python benchmarks/vision_box_calibration.py --threads 2 \
          --renders benchmarks/data/template_pages/renders [--latency]
Writes benchmarks/results/vision_box_calibration.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine  # noqa: E402
from benchmarks.template_pages import load_manifest  # noqa: E402
from clef_agents.browser import chromium, find_chromium  # noqa: E402
from clef_agents.vision import ScreenshotClassifier  # noqa: E402
from clef_engine import Box, Choice, DecisionEngine  # noqa: E402
from clef_engine.backbones.vision import dom  # noqa: E402
from clef_engine.backbones.vision.images import open_image  # noqa: E402
from clef_engine.heads import box as box_head  # noqa: E402

FIT = [ROOT / "tests" / "fixtures" / "pages", ROOT / "tests" / "fixtures" / "flows"]
HOLDOUT = [ROOT / "tests" / "fixtures" / "pages_holdout"]
OUT = ROOT / "benchmarks" / "results" / "vision_box_calibration.json"
MAX_MARGIN = 20.0
"""The logit lead of a page's only candidate (recorded per question, not fit on)."""
ROLE_WORD = {"field": "field", "button": "button", "checkbox": "checkbox", "link": "link"}
PAGE_Q = Choice(
    instructions="What kind of web page is this?",
    criteria=["login", "article", "search results", "product", "error"],
)
"""The choice timed with a box question in ``--latency`` (one decision: OCR, layout, both
questions)."""
_TARGETS_JS = """els => els.map(e => {
  const r = e.getBoundingClientRect();
  return [e.dataset.target, r.left, r.top, r.right, r.bottom];
})"""


def questions(evidence: Any, targets: list[list[Any]]) -> dict[str, list[tuple[float, ...]]]:
    """Question text -> the rectangles (left, top, right, bottom) it may name."""
    out: dict[str, list[tuple[float, ...]]] = {}
    for e in evidence.elements:
        if e.role not in ROLE_WORD:
            continue
        name = " ".join((e.label or e.text or "").split())
        if not name or len(name) > 40 or len(name.split()) > 5:
            continue
        out.setdefault(f"the {name} {ROLE_WORD[e.role]}", []).append(tuple(e.region))
    for text, *rect in targets:
        out.setdefault(str(text), []).append(tuple(float(v) for v in rect))
    return out


def hit(answer: Any, rects: list[tuple[float, ...]], size: tuple[int, int]) -> bool:
    if answer.box is None:
        return False
    px = answer.box.to_pixels(*size)
    for left, top, right, bottom in rects:
        cx, cy = (left + right) / 2.0, (top + bottom) / 2.0
        if px.left <= cx <= px.right and px.top <= cy <= px.bottom:
            return True
    return False


def raw(engine: DecisionEngine, instructions: str, evidence: Any) -> tuple[float, float]:
    """The best candidate's softmax probability and its logit lead over the second, scored
    as :func:`~clef_engine.heads.box.locate` scores them (page chrome from pixels only)."""
    logits = box_head.candidate_logits(
        engine.scoring_context().embed,
        instructions,
        evidence.elements,
        box_head.page_chrome(evidence),
    ).double()
    probs = torch.softmax(logits, 0)
    top = torch.topk(logits, min(2, len(logits))).values
    margin = float(top[0] - top[1]) if len(top) > 1 else MAX_MARGIN
    return float(probs.max()), min(MAX_MARGIN, margin)


def features(rows: list[dict[str, Any]]) -> np.ndarray:
    p = np.clip(np.array([r["p"] for r in rows]), 1e-6, 1 - 1e-6)
    return np.stack([np.log(p / (1 - p)), np.ones(len(p))], 1)


def fit(rows: list[dict[str, Any]], l2: float = 1e-2) -> tuple[float, float]:
    """Platt scaling: logistic regression on logit(p) (Newton's method, a little L2 on the
    slope). The logit margin over the second candidate was tried as a second feature; with
    a handful of misses its slope came out negative (a larger lead, a lower confidence)."""
    x, y = features(rows), np.array([float(r["hit"]) for r in rows])
    w = np.zeros(2)
    reg = np.diag([l2, 0.0])
    for _ in range(100):
        p = 1 / (1 + np.exp(-np.clip(x @ w, -30, 30)))
        grad = x.T @ (p - y) + reg @ w
        hess = x.T @ (x * (p * (1 - p))[:, None]) + reg + 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(w[0]), float(w[1])


def report(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    if not rows:
        return {"n": 0}
    conf = np.array([r[key] for r in rows])
    hits = np.array([float(r["hit"]) for r in rows])
    bins = np.minimum((conf * 10).astype(int), 9)
    ece = sum(
        abs(conf[bins == b].mean() - hits[bins == b].mean()) * (bins == b).sum()
        for b in range(10)
        if (bins == b).any()
    ) / len(rows)
    return {
        "n": len(rows),
        "hit_rate": round(float(hits.mean()), 4),
        "mean_confidence": round(float(conf.mean()), 4),
        "ece": round(float(ece), 4),
        "brier": round(float(((conf - hits) ** 2).mean()), 4),
        "misses_at_0.8_or_more": int(((conf >= 0.8) & (hits == 0)).sum()),
    }


def by_package(rows: list[dict[str, Any]], tune: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the pixel fit carries to a package it was not fit on, from the tune pages
    alone: each tune package's rows scored by a fit on the fixtures and the other tune
    packages (``refit``), beside the raw softmax on the same rows. (``shipped``, the
    constants in the code, is there for reference only: they were fit on these very
    packages.) The held-out packages play no part in it."""
    package = {p["id"]: p["package"] for p in load_manifest()["pages"]}
    fixtures = [r for r in rows if r["source"] == "pixels" and r["group"] == "fit"]
    scored = []
    for name in sorted({package[r["page"]] for r in tune}):
        test = [r for r in tune if package[r["page"]] == name]
        train = fixtures + [r for r in tune if package[r["page"]] != name]
        params = np.array(fit(train))
        z = np.clip(features(test) @ params, -30, 30)
        for r, c in zip(test, 1 / (1 + np.exp(-z)), strict=True):
            scored.append(
                {**r, "refit": float(c), "shipped": box_head.hit_probability(r["p"], "pixels")}
            )
    return {key: report(scored, key) for key in ("p", "shipped", "refit")}


def template_rows(
    engine: DecisionEngine,
    renders: Path,
    timings: list[dict[str, Any]] | None,
    splits: tuple[str, ...] = ("tune", "heldout"),
) -> list[dict[str, Any]]:
    """Pixel questions on the real template pages (benchmarks/template_pages.py) of
    ``splits``; pages of other splits are never opened."""
    split = {p["id"]: p["split"] for p in load_manifest()["pages"]}
    targets = json.loads((renders / "targets.json").read_text())
    rows = []
    for page_id, page_targets in sorted(targets.items()):
        if split.get(page_id, "heldout") not in splits:
            continue
        png = (renders / f"{page_id}.png").read_bytes()
        if timings is not None:
            engine.vision._cache.clear()
            started = time.perf_counter()
            engine.decide(png, {"page": PAGE_Q, "x": Box(instructions="the main button")})
            ms = (time.perf_counter() - started) * 1000.0
            lines = sum(1 for e in engine.vision.read(open_image(png, "s")).elements if e.text)
            timings.append({"page": page_id, "ms": round(ms, 1), "ocr_lines": lines})
        evidence = engine.vision.read(open_image(png, "state"))
        for target in page_targets:
            text = target["instructions"]
            answer = engine.decide(png, {"x": Box(instructions=text)}).answers["x"]
            if not evidence.elements:
                continue
            p, margin = raw(engine, text, evidence)
            rows.append(
                {
                    "page": page_id,
                    "question": text,
                    "source": "pixels",
                    "group": f"templates_{split.get(page_id, 'heldout')}",
                    "hit": hit(answer, [tuple(target["box"])], (1280, 800)),
                    "p": p,
                    "margin": margin,
                    "confidence": answer.confidence,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--holdout", type=Path, action="append", default=[])
    parser.add_argument(
        "--renders",
        type=Path,
        default=None,
        help="benchmarks/template_pages.py renders (PNGs + targets.json): pixel questions only",
    )
    parser.add_argument(
        "--split",
        choices=("all", "tune", "heldout"),
        default="all",
        help="template pages of one split only (with --renders)",
    )
    parser.add_argument(
        "--fit-tune",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fit the pixel calibration on the tune template pages too (with --renders)",
    )
    parser.add_argument("--latency", action="store_true", help="time end-to-end decisions")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help=f"default {OUT}")
    args = parser.parse_args()
    if args.out is None:
        if args.split != "all":
            raise SystemExit(f"--split {args.split} measures part of the set: pass --out")
        args.out = OUT
    if find_chromium() is None:
        raise SystemExit("no Chromium: apt-get install chromium")
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = DecisionEngine()
    classifier = ScreenshotClassifier(engine, threads=args.threads)
    sets = [(d, "fit") for d in FIT] + [(d, "fixtures_holdout") for d in HOLDOUT + args.holdout]
    rows: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
        page.route(
            "**/*",
            lambda route: (
                route.continue_() if route.request.url.startswith("file:") else route.abort()
            ),
        )
        for folder, group in sets:
            for path in sorted(folder.glob("*.html")):
                page.goto(path.resolve().as_uri())
                png = page.screenshot()
                targets = page.eval_on_selector_all("[data-target]", _TARGETS_JS)
                dom_ev = dom.page_evidence(page)
                if args.latency:
                    engine.vision._cache.clear()
                    started = time.perf_counter()
                    engine.decide(png, {"page": PAGE_Q, "x": Box(instructions="the main button")})
                    ms = (time.perf_counter() - started) * 1000.0
                    lines = sum(
                        1 for e in engine.vision.read(open_image(png, "s")).elements if e.text
                    )
                    timings.append({"page": path.name, "ms": round(ms, 1), "ocr_lines": lines})
                pix_ev = engine.vision.read(open_image(png, "state"))
                for text, rects in questions(dom_ev, targets).items():
                    for source, evidence in (("pixels", pix_ev), ("dom", dom_ev)):
                        if source == "pixels":
                            answer = engine.decide(png, {"x": Box(instructions=text)}).answers["x"]
                        else:
                            answer = classifier.locate(page, text)
                        if not evidence.elements:
                            continue
                        p, margin = raw(engine, text, evidence)
                        rows.append(
                            {
                                "page": f"{folder.name}/{path.name}",
                                "question": text,
                                "source": source,
                                "group": group,
                                "hit": hit(answer, rects, (1280, 800)),
                                "p": p,
                                "margin": margin,
                                "confidence": answer.confidence,
                            }
                        )
    if args.renders is not None:
        splits = ("tune", "heldout") if args.split == "all" else (args.split,)
        rows += template_rows(engine, args.renders, timings if args.latency else None, splits)
    fit_groups = {"fit", "templates_tune"} if args.fit_tune else {"fit"}
    out: dict[str, Any] = {
        "machine": machine(),
        "load_average": os.getloadavg()[0],
        "calibration": {},
        "fit_on": sorted(fit_groups),
        "results": {},
    }
    groups = ("fit", "fixtures_holdout", "templates_tune", "templates_heldout")
    for source in ("pixels", "dom"):
        mine = [r for r in rows if r["source"] == source]
        train = [r for r in mine if r["group"] in fit_groups]
        if len({r["hit"] for r in train}) < 2:
            # Every answer hit (or none did): logistic regression has no optimum (it runs
            # to a flat 1.0). Nothing to learn from; the shipped constants stand.
            print(f"{source}: no misses among {len(train)} fit questions; not refit")
            params = box_head.CALIBRATION[source]
            out["not_refit"] = [*out.get("not_refit", []), source]
        else:
            params = fit(train)
        calibrated = 1 / (1 + np.exp(-np.clip(features(mine) @ np.array(params), -30, 30)))
        for r, c in zip(mine, calibrated, strict=True):
            r["calibrated"] = float(c)
        out["calibration"][source] = [round(v, 4) for v in params]
        for group in groups:
            part = [r for r in mine if r["group"] == group]
            if not part:
                continue
            out["results"][f"{source}/{group}"] = {
                "raw_softmax": report(part, "p"),
                "calibrated": report(part, "calibrated"),
                "as_answered": report(
                    [r for r in part if r["confidence"] is not None], "confidence"
                ),
                "misses": [
                    {k: r[k] for k in ("page", "question", "calibrated")}
                    for r in part
                    if not r["hit"]
                ],
            }
    tune = [r for r in rows if r["source"] == "pixels" and r["group"] == "templates_tune"]
    if args.fit_tune and tune:
        out["results"]["pixels/templates_tune_by_package"] = by_package(rows, tune)
    if timings:
        ms = [t["ms"] for t in timings]
        heavy = [t["ms"] for t in timings if t["ocr_lines"] >= 30]
        out["latency_ms"] = {
            "pages": len(ms),
            "p50": round(statistics.median(ms), 1),
            "p95": round(float(np.percentile(ms, 95)), 1),
            "text_heavy_pages": len(heavy),
            "text_heavy_p50": round(statistics.median(heavy), 1) if heavy else None,
            "text_heavy_p95": round(float(np.percentile(heavy, 95)), 1) if heavy else None,
            "per_page": timings,
        }
    out["rows"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "latency_ms"}, indent=2)[:6000])
    if timings:
        print({k: v for k, v in out["latency_ms"].items() if k != "per_page"})


if __name__ == "__main__":
    main()
