"""Probe: would weights fit on data rank box candidates better than the hand-set ones?

For every target of the ``tune`` template pages (benchmarks/data/template_pages; ``heldout``
pages are never opened), the box head's evidence terms are computed for every candidate
element (:func:`clef_engine.heads.box.candidate_features`: cosine, word overlap, role term,
chrome), and a candidate is a hit when its answered region holds the target's centre.
Reported:

- ``ceiling``: targets with at least one hit candidate (no ranking can do better);
- ``hand``: targets whose top candidate under :data:`~clef_engine.heads.box.WEIGHTS` hits;
- ``fit_all``: weights fit by conditional logit (softmax over a page's candidates, the
  likelihood of the hit ones) on all tune targets, and their hits on the same targets;
- ``leave_one_package_out``: hits with weights fit on the other packages, against the hand
  weights on the same package, summed.

Run:  python benchmarks/template_pages.py --split tune   (the renders, once)
      python benchmarks/vision_box_ranker.py
Writes benchmarks/results/vision_box_ranker.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import write_result  # noqa: E402
from benchmarks.template_pages import DATA, load_manifest, select  # noqa: E402
from clef_agents.browser import Target  # noqa: E402
from clef_engine import DecisionEngine  # noqa: E402
from clef_engine.backbones.vision.images import open_image  # noqa: E402
from clef_engine.heads import box  # noqa: E402

Row = tuple[str, torch.Tensor, torch.Tensor]
"""(package, features [candidates x 4], hit mask [candidates])."""


def questions(renders: Path) -> list[Row]:
    """Features and hit masks of every tune target."""
    engine = DecisionEngine()
    embed = engine.scoring_context().embed
    targets = json.loads((renders / "targets.json").read_text())
    rows: list[Row] = []
    for spec in select(load_manifest(), split="tune"):
        ref = open_image((renders / f"{spec['id']}.png").read_bytes(), "state")
        evidence = engine.vision.read(ref)
        size = (evidence.width, evidence.height)
        chrome = box.page_chrome(evidence)
        for t in targets[spec["id"]]:
            target = Target(t["instructions"], tuple(t["box"]))
            x = box.candidate_features(embed, t["instructions"], evidence.elements, chrome)
            hits = [
                target.hit(box.fractions(box.clickable_region(evidence, j), *size), size)
                for j in range(len(evidence.elements))
            ]
            rows.append((spec["package"], x, torch.tensor(hits, dtype=torch.bool)))
    return rows


def hits(weights: torch.Tensor, rows: list[Row]) -> int:
    return sum(bool(h[int(torch.argmax(x @ weights))]) for _, x, h in rows if len(h))


def fit(rows: list[Row]) -> torch.Tensor:
    """Weights maximising the mean log-probability of a hit candidate (from the hand ones)."""
    usable = [(x, h) for _, x, h in rows if bool(h.any())]
    weights = torch.tensor(box.WEIGHTS, requires_grad=True)
    optimiser = torch.optim.LBFGS([weights], max_iter=300, line_search_fn="strong_wolfe")

    def loss_fn() -> torch.Tensor:
        optimiser.zero_grad()
        loss = -sum(torch.logsumexp(torch.log_softmax(x @ weights, 0)[h], 0) for x, h in usable)
        loss = loss / len(usable)
        loss.backward()
        return loss

    optimiser.step(loss_fn)
    return weights.detach()


def main() -> None:
    renders = DATA / "renders"
    if not (renders / "targets.json").is_file():
        raise SystemExit(f"no renders in {renders}: run benchmarks/template_pages.py first")
    rows = questions(renders)
    hand = torch.tensor(box.WEIGHTS)
    fitted = fit(rows)
    packages = sorted({p for p, _, _ in rows})
    per_package = {}
    for package in packages:
        train = [r for r in rows if r[0] != package]
        test = [r for r in rows if r[0] == package]
        per_package[package] = {
            "targets": len(test),
            "hand": hits(hand, test),
            "fit_on_others": hits(fit(train), test),
        }
    result = {
        "split": "tune",
        "targets": len(rows),
        "ceiling": sum(bool(h.any()) for _, _, h in rows),
        "hand": {"weights": list(box.WEIGHTS), "hits": hits(hand, rows)},
        "fit_all": {"weights": [round(w, 3) for w in fitted.tolist()], "hits": hits(fitted, rows)},
        "leave_one_package_out": {
            "hand": sum(v["hand"] for v in per_package.values()),
            "fit_on_others": sum(v["fit_on_others"] for v in per_package.values()),
            "per_package": per_package,
        },
    }
    print(json.dumps(result, indent=1))
    write_result("vision_box_ranker", result)


if __name__ == "__main__":
    main()
