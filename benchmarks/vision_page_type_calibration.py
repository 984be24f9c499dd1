"""Page-type calibration: the temperature of the choice over all page types, fitted on screenshots.

The page types are taught by hand-written example texts (``clef_agents.page_types``); the
engine calibrates such a choice on those examples (k-fold, out of fold), but OCR'd
screenshots of real pages are further from the examples than the examples are from each
other, so the answers came out underconfident (mean top probability 0.73 at 94 % right
on the tune template pages). This script asks the ``ScreenshotClassifier`` question with
its ``temperature`` unset on the fixture pages (tests/fixtures/pages) and the ``tune``
template pages, fits one temperature on the log-probabilities of those answers (what
:func:`clef_engine.calibration.fit.fit_choice_temperature` does), and reports accuracy,
mean confidence, top-label ECE (10 bins), NLL and Brier before and after:

- on the pages it was fit on;
- leaving one package out (each tune package, and the fixtures as one group, answered with
  the temperature fit on the rest): does it carry to pages it was not fit on?
- on subsets of the types (3 seeded draws of 4 and of 8 types, asked of the fit pages of
  those types with the temperature fitted on all of them);
- on the held-out pages (tests/fixtures/pages_holdout and the ``heldout`` template
  pages), never fit on, only reported. ``--split tune`` leaves them out (then ``--out``
  is required).

The shipped constant (:data:`clef_agents.page_types.PAGE_TYPE_TEMPERATURE`) is the
temperature of the run with all pages.

Run:  python benchmarks/vision_page_type_calibration.py --threads 2
Writes benchmarks/results/vision_page_type_calibration.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine  # noqa: E402
from benchmarks.template_pages import DATA as TEMPLATE_DATA  # noqa: E402
from benchmarks.template_pages import load_manifest, select  # noqa: E402
from clef_agents.browser import find_chromium, render_files  # noqa: E402
from clef_agents.page_types import PAGE_TYPE_TEMPERATURE  # noqa: E402
from clef_agents.vision import page_type_question  # noqa: E402
from clef_engine import DecisionEngine  # noqa: E402
from clef_engine.backbones.vision.ocr import RapidOcr  # noqa: E402
from clef_engine.backbones.vision.pipeline import VisionPipeline  # noqa: E402
from clef_engine.calibration.fit import temperature_of_answers  # noqa: E402
from clef_engine.calibration.metrics import (  # noqa: E402
    brier_score,
    negative_log_likelihood,
    top_label_ece,
)

OUT = ROOT / "benchmarks" / "results" / "vision_page_type_calibration.json"
PAGES = ROOT / "tests" / "fixtures" / "pages"
HOLDOUT = ROOT / "tests" / "fixtures" / "pages_holdout"
BINS = 10
SUBSET_SIZES = (4, 8)
SUBSET_DRAWS = 3


def tempered(logp: np.ndarray, t: float) -> np.ndarray:
    z = logp / t
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def report(probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    top = probs.max(axis=1)
    right = probs.argmax(axis=1) == labels
    return {
        "pages": len(labels),
        "accuracy": round(float(right.mean()), 4),
        "mean_confidence": round(float(top.mean()), 4),
        "ece": round(top_label_ece(top, right, BINS), 4),
        "nll": round(negative_log_likelihood(probs, labels), 4),
        "brier": round(brier_score(probs, labels), 4),
    }


def fit(logp: np.ndarray, labels: np.ndarray) -> float:
    """What ``fit_choice_temperature`` fits on these answers."""
    return temperature_of_answers(torch.from_numpy(logp), [int(v) for v in labels])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    parser.add_argument("--split", choices=("all", "tune"), default="all")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--renders", type=Path, default=TEMPLATE_DATA / "renders", help="template page renders"
    )
    args = parser.parse_args()
    if args.out is None:
        if args.split != "all":
            raise SystemExit("--split tune measures part of the set: pass --out")
        args.out = OUT
    if args.threads:
        torch.set_num_threads(args.threads)
    if find_chromium() is None:
        raise SystemExit("no Chromium found: apt-get install chromium")
    if not (args.renders / "targets.json").is_file():
        raise SystemExit(f"no renders in {args.renders}: run benchmarks/template_pages.py")

    engine = DecisionEngine()
    engine.vision = VisionPipeline(RapidOcr(threads=args.threads))
    question = page_type_question().model_copy(update={"temperature": None})
    names = list(question.criteria)

    # (group, split, page, label, png): fixtures are one group, each template package one.
    pages: list[tuple[str, str, str, str, bytes]] = []
    for page in render_files(sorted(PAGES.glob("*.html"))):
        pages.append(("fixtures", "fit", page.name, page.label, page.png))
    splits = ("tune",) if args.split == "tune" else ("tune", "heldout")
    for split in splits:
        for spec in select(load_manifest(), split=split):
            png = (args.renders / f"{spec['id']}.png").read_bytes()
            where = "fit" if split == "tune" else "heldout"
            pages.append((spec["package"], where, spec["id"], spec["label"], png))
    if args.split == "all":
        for page in render_files(sorted(HOLDOUT.glob("*.html"))):
            pages.append(("fixtures_holdout", "heldout", page.name, page.label, page.png))

    rows = []
    for _group, where, name, label, png in pages:
        p = engine.decide(png, {"q": question}).answers["q"].probabilities
        rows.append([p[n] for n in names])
        print(f"{where:7s} {name:36s} {label:16s} -> {max(p, key=p.__getitem__)}", flush=True)
    logp = np.log(np.clip(np.array(rows, dtype=np.float64), 1e-12, 1.0))
    labels = np.array([names.index(p[3]) for p in pages])
    groups = np.array([p[0] for p in pages])
    fit_rows = np.array([p[1] == "fit" for p in pages])

    t = fit(logp[fit_rows], labels[fit_rows])
    out_of_group = np.zeros_like(logp)
    by_group: dict[str, float] = {}
    for g in sorted(set(groups[fit_rows])):
        rest = fit_rows & (groups != g)
        by_group[g] = fit(logp[rest], labels[rest])
        mine = fit_rows & (groups == g)
        out_of_group[mine] = tempered(logp[mine], by_group[g])

    raw = tempered(logp, 1.0)
    result: dict[str, Any] = {
        "benchmark": "vision_page_type_calibration",
        "split": args.split,
        "temperature": round(t, 4),
        "shipped_temperature": PAGE_TYPE_TEMPERATURE,
        "fit_on": "tests/fixtures/pages and the tune template pages",
        "fit_pages": {
            "before": report(raw[fit_rows], labels[fit_rows]),
            "after": report(tempered(logp[fit_rows], t), labels[fit_rows]),
            "leave_one_package_out": report(out_of_group[fit_rows], labels[fit_rows]),
        },
        "temperature_leaving_out": {g: round(v, 4) for g, v in by_group.items()},
        "machine": machine(),
    }
    # Subsets of the types (page_type_question(["login", ...]) carries the same
    # temperature): seeded random subsets, asked of the fit pages of their types.
    rng = np.random.default_rng(0)
    subsets: dict[str, Any] = {}
    for size in SUBSET_SIZES:
        rows_raw: list[np.ndarray] = []
        sub_labels: list[int] = []
        for _ in range(SUBSET_DRAWS):
            chosen = [str(n) for n in rng.choice(names, size=size, replace=False)]
            sub = page_type_question(chosen).model_copy(update={"temperature": None})
            for _, where, _, label, png in pages:
                if where == "fit" and label in chosen:
                    p = engine.decide(png, {"q": sub}).answers["q"].probabilities
                    rows_raw.append(np.log(np.clip([p[n] for n in chosen], 1e-12, 1.0)))
                    sub_labels.append(chosen.index(label))
        logs, ys = np.array(rows_raw), np.array(sub_labels)
        subsets[f"{size}_types"] = {
            "draws": SUBSET_DRAWS,
            "before": report(tempered(logs, 1.0), ys),
            "after": report(tempered(logs, t), ys),
        }
    result["subsets_of_fit_pages"] = subsets
    held = ~fit_rows
    if held.any():
        result["heldout_pages"] = {
            "pages": "tests/fixtures/pages_holdout and the heldout template pages (never fit on)",
            "before": report(raw[held], labels[held]),
            "after": report(tempered(logp[held], t), labels[held]),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))


if __name__ == "__main__":
    main()
