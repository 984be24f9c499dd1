"""Teaching a yes/no question by examples, measured on the hand-written yes/no suite.

The general model answers yes/no questions about urgency, spam, prompt injection and risky
tool calls at 62 to 69 % zero-shot (``benchmarks.general_model``). The remedy the engine
offers without a training run is a few examples on each side of the question
(``Noul(criteria={"true": {"examples": [...]}, "false": {"examples": [...]}})``: the
examples become a prototype head calibrated by cross-validation on them). This benchmark
measures that remedy on ``tests/data/noul_suite.jsonl``.

The candidate examples (``benchmarks/data/noul_examples.json``, 24 per side for six of the
suite's categories) were written for this benchmark by helper sessions that were given only
a description of each concept and never saw the suite. Their first 8 per side came out
close to suite cases all the same (a $1,000 Walmart gift card in both), because both were
written by models with the same stock scenarios. So the benchmark drops, by a rule fixed
before any example was scored, every candidate whose cosine to any suite state is at least
``--max-similarity`` (0.6) under the bare all-MiniLM-L6-v2, and teaches with the first
``POOL`` (8) survivors per side, in file order. Each suite case gets the examples of its
category (an off-topic case, those of the category its question is asked in); the
relevance cases ask about a different topic each and have none, so they are left out. With
``k`` examples per side, ``--draws`` random draws (seeded) of ``k`` of the 8 are scored;
``k = 8`` is the one draw of all eight.

The candidates that pass the filter after the first 8 (9 to 16 per side) are a dev split
(``dev`` in the JSON): each category's ``question`` taught by its 8 + 8 examples and asked
of them. Design choices are made there, never on the suite: on it, yes/no prototypes on
the general model's vectors beat those on the bare model's (which the default engine used
before), so the engine now fits them there.

Run:  python -m benchmarks.noul_examples [--ks 0 2 4 8] [--draws 5] [--scorer similarity]
Writes benchmarks/results/noul_examples.json (one section per scorer).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks._common import RESULTS, ROOT, machine
from benchmarks.general_model import SUITE
from clef_engine import DecisionEngine
from clef_engine.calibration.metrics import top_label_ece
from clef_engine.schema.questions import Noul
from clef_engine.schema.request import build_request

EXAMPLES = ROOT / "benchmarks" / "data" / "noul_examples.json"
OUT = RESULTS / "noul_examples.json"
POOL = 8
"""Examples per side that teach (the first that pass the near-duplicate filter)."""


def load_cases(examples: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Suite cases with the category whose examples teach them (relevance: none)."""
    asked_in = {r["question"]: r["category"] for r in rows if r["category"] != "off_topic"}
    out = []
    for row in rows:
        category = row["category"]
        taught = category if category != "off_topic" else asked_in.get(row["question"])
        if taught in examples:
            out.append({**row, "taught_by": taught})
    return out


def filter_examples(
    candidates: dict[str, Any], states: list[str], max_similarity: float
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(teach, held, dropped)``: per category and side, the first :data:`POOL`
    candidates whose cosine to every suite state is below ``max_similarity`` (bare
    all-MiniLM-L6-v2), the candidates that pass after those (the dev split), and how many
    did not pass."""
    encoder = DecisionEngine(scorer="similarity").backbone
    suite = encoder.encode(states).pooled.float()
    teach: dict[str, Any] = {}
    held: dict[str, Any] = {}
    dropped: dict[str, Any] = {}
    for cat, spec in sorted(candidates.items()):
        teach[cat], held[cat], dropped[cat] = {}, {}, {}
        for side in ("yes", "no"):
            texts = spec[side]
            nearest = (encoder.encode(texts).pooled.float() @ suite.T).max(dim=1).values
            ok = [t for t, s in zip(texts, nearest.tolist(), strict=True) if s < max_similarity]
            if len(ok) < POOL:
                raise SystemExit(f"{cat}/{side}: only {len(ok)} candidates pass the filter")
            teach[cat][side], held[cat][side] = ok[:POOL], ok[POOL:]
            dropped[cat][side] = len(texts) - len(ok)
    return teach, held, dropped


def dev(
    engine: DecisionEngine,
    candidates: dict[str, Any],
    teach: dict[str, Any],
    held: dict[str, Any],
    taught: str = "both",
) -> dict[str, Any]:
    """The dev split (never the suite): each category's question (``question`` in the
    examples file) taught by its 8 + 8 examples, asked of its held candidates.

    ``taught``: ``"both"`` sides, ``"yes"`` (the 8 yes examples only, which the schema
    reads as the yes side's description: prototypes fitted on one side answered 48.4 % right
    here at 5193eb3) or ``"none"`` (zero-shot)."""
    p_yes: list[float] = []
    truth: list[bool] = []
    for cat in sorted(teach):
        sides = {"true": {"examples": teach[cat]["yes"]}, "false": {"examples": teach[cat]["no"]}}
        instructions = candidates[cat]["question"]
        criteria = {"both": sides, "yes": {"true": sides["true"]}, "none": None}[taught]
        q = Noul(instructions=instructions, criteria=criteria)
        rows = [(t, True) for t in held[cat]["yes"]] + [(t, False) for t in held[cat]["no"]]
        results = engine.decide_batch(
            [build_request(t, {"q": q}, engine.model_name) for t, _ in rows]
        )
        p_yes += [r.answers["q"].noul for r in results]
        truth += [answer for _, answer in rows]
    p, y = np.array(p_yes), np.array(truth)
    correct = (p > 0.5) == y
    confidence = np.maximum(p, 1.0 - p)
    return {
        "n": len(y),
        "accuracy": round(float(correct.mean()), 4),
        "nll": round(float(-np.log(np.where(y, p, 1.0 - p).clip(1e-9)).mean()), 4),
        "ece": round(top_label_ece(confidence, correct), 4),
        "confidence_mean": round(float(confidence.mean()), 4),
    }


def draw(pool: list[str], k: int, rng: random.Random) -> list[str]:
    return list(pool) if k >= len(pool) else rng.sample(pool, k)


def score(
    engine: DecisionEngine,
    cases: list[dict[str, Any]],
    examples: dict[str, Any],
    k: int,
    rng: random.Random,
) -> dict[str, Any]:
    """Accuracy at 0.5 and ECE with ``k`` examples per side (one draw per category)."""
    taught = {
        cat: {"true": draw(v["yes"], k, rng), "false": draw(v["no"], k, rng)}
        for cat, v in sorted(examples.items())
    }
    requests = []
    for case in cases:
        criteria = None
        if k:
            sides = taught[case["taught_by"]]
            criteria = {side: {"examples": sides[side]} for side in ("true", "false")}
        q = Noul(instructions=case["question"], criteria=criteria)
        requests.append(build_request(case["state"], {"q": q}, engine.model_name))
    p_yes = np.array([r.answers["q"].noul for r in engine.decide_batch(requests)])
    truth = np.array([bool(c["answer"]) for c in cases])
    correct = (p_yes > 0.5) == truth
    confidence = np.maximum(p_yes, 1.0 - p_yes)
    by_category: dict[str, list[bool]] = defaultdict(list)
    for case, ok in zip(cases, correct, strict=True):
        by_category[case["category"]].append(bool(ok))
    return {
        "accuracy": round(float(correct.mean()), 4),
        "correct": int(correct.sum()),
        "ece": round(top_label_ece(confidence, correct), 4),
        "confidence_mean": round(float(confidence.mean()), 4),
        "by_category": {c: round(float(np.mean(v)), 4) for c, v in sorted(by_category.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 2, 4, 8])
    parser.add_argument("--draws", type=int, default=5, help="random draws per k below 8")
    parser.add_argument("--scorer", default="general", choices=["general", "similarity"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-similarity", type=float, default=0.6)
    args = parser.parse_args()

    candidates = json.loads(EXAMPLES.read_text())
    rows = [json.loads(line) for line in SUITE.read_text(encoding="utf-8").splitlines() if line]
    cases = load_cases(candidates, rows)
    examples, held, dropped = filter_examples(
        candidates, [r["state"] for r in rows], args.max_similarity
    )
    engine = DecisionEngine(scorer=args.scorer)
    rng = random.Random(args.seed)
    report: dict[str, Any] = {
        "n": len(cases),
        "categories": {c: sum(x["taught_by"] == c for x in cases) for c in sorted(examples)},
        "max_similarity": args.max_similarity,
        "candidates": {c: [len(v["yes"]), len(v["no"])] for c, v in sorted(candidates.items())},
        "candidates_dropped": dropped,
        "examples": examples,
    }
    for key, taught in (("dev", "both"), ("dev_yes_examples_only", "yes"),
                        ("dev_zero_shot", "none")):  # fmt: skip
        report[key] = dev(engine, candidates, examples, held, taught)
        print(key, report[key], flush=True)
    for k in args.ks:
        full = k == 0 or all(len(v["yes"]) <= k and len(v["no"]) <= k for v in examples.values())
        runs = [score(engine, cases, examples, k, rng) for _ in range(1 if full else args.draws)]
        accs = [r["accuracy"] for r in runs]
        report[f"k{k}"] = {
            "k": k,
            "draws": len(runs),
            "accuracy_mean": round(float(np.mean(accs)), 4),
            "accuracy_min": min(accs),
            "accuracy_max": max(accs),
            "ece_mean": round(float(np.mean([r["ece"] for r in runs])), 4),
            "confidence_mean": round(float(np.mean([r["confidence_mean"] for r in runs])), 4),
            "by_category_mean": {
                c: round(float(np.mean([r["by_category"][c] for r in runs])), 4)
                for c in runs[0]["by_category"]
            },
            "runs": runs,
        }
        print(k, report[f"k{k}"]["accuracy_mean"], accs, flush=True)
    report["machine"] = machine()
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    results[args.scorer] = report
    OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
