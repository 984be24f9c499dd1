"""The decision loop on BANKING77: decide, log, review, label, fine-tune, measure.

1. **decide and log**: the packaged engine routes ``--pool`` customer messages (BANKING77
   train rows) to one of 77 intents, zero-shot, through ``DecisionLog.wrap``;
2. **review**: ``clef-agents review`` exports the ``--labels`` least confident decisions
   to a CSV with an empty label column;
3. **label**: a *simulated* reviewer fills the label column from the data set's ground
   truth (in production a person does this), and ``review --import`` stores the labels;
4. **fine-tune**: ``clef-agents finetune --from-log`` trains on the labelled rows (the
   few-shot recipe with a frozen backbone: a prototype head on the state vectors);
5. **measure**: accuracy of the zero-shot engine and of the fine-tuned model on
   ``--test`` held-out BANKING77 test rows, and ``clef-agents report`` on the log.

Run: ``python examples/decision_loop.py`` (reads ``../shared/data/banking77``, else the
slice in ``tests/data/banking77``; a few minutes on 2 CPU cores, see docs/decision_log.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from clef_agents import Choice, DecisionEngine
from clef_agents.cli import main as cli
from clef_agents.decision_log import DecisionLog

ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The full BANKING77 set beside the checkout, else the slice shipped with the tests."""
    full = ROOT.parent / "shared" / "data" / "banking77"
    return full if (full / "train.csv").is_file() else ROOT / "tests" / "data" / "banking77"


def read_rows(path: Path) -> list[tuple[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return [(row["text"], row["category"]) for row in csv.DictReader(fh)]


def stratified(rows: list[tuple[str, str]], n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` rows spread evenly over the labels (round-robin over shuffled labels)."""
    rng = random.Random(seed)
    by_label: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in rows:
        by_label[row[1]].append(row)
    for group in by_label.values():
        rng.shuffle(group)
    out: list[tuple[str, str]] = []
    while len(out) < n and any(by_label.values()):
        for label in sorted(by_label):
            if by_label[label] and len(out) < n:
                out.append(by_label[label].pop())
    rng.shuffle(out)
    return out


def accuracy(engine: Any, rows: list[tuple[str, str]], questions: Any) -> float:
    results = engine.decide_batch([t for t, _ in rows], questions)
    return sum(r["intent"].choice == y for r, (_, y) in zip(results, rows, strict=True)) / len(rows)


def main(
    pool: int = 600,
    labels: int = 200,
    test: int = 400,
    workdir: str | Path | None = None,
    engine: Any = None,
    seed: int = 0,
    data: str | Path | None = None,
) -> dict[str, Any]:
    """Walk the loop; returns the measured numbers (also printed). ``data``: a BANKING77
    folder (``train.csv``, ``test.csv``, ``categories.json``), default :func:`data_dir`."""
    root = Path(data) if data is not None else data_dir()
    names = json.loads((root / "categories.json").read_text())
    questions = {
        "intent": Choice(
            instructions="Which banking intent does the customer message express?",
            criteria={name: name.replace("_", " ") for name in names},
        )
    }
    work = Path(workdir or tempfile.mkdtemp(prefix="clef-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path, review_csv, model_dir = work / "decisions.sqlite", work / "review.csv", work / "model"
    traffic = stratified(read_rows(root / "train.csv"), pool, seed)
    held_out = stratified(read_rows(root / "test.csv"), test, seed + 1)
    timings: dict[str, float] = {}
    engine = engine or DecisionEngine()

    # 1. Decide and log.
    started = time.perf_counter()
    with DecisionLog(log_path) as log:
        logged = log.wrap(engine)
        for i in range(0, len(traffic), 32):
            logged.decide_batch([t for t, _ in traffic[i : i + 32]], questions)
    timings["decide_and_log_s"] = time.perf_counter() - started

    # 2. Review: the least confident decisions go to a CSV with an empty label column.
    cli(["review", str(log_path), "--out", str(review_csv), "--below", "1", "--limit", str(labels)])

    # 3. Label. A simulated reviewer: the labels come from BANKING77's ground truth.
    truth = dict(traffic)
    with review_csv.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row["label"] = truth[row["state"]]
    with review_csv.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    reviewed_correct = sum(r["answer"] == r["label"] for r in rows)
    cli(["review", str(log_path), "--import", str(review_csv)])

    # 4. Fine-tune on the labelled rows: few-shot recipe, frozen backbone (head only).
    started = time.perf_counter()
    code = cli(
        [
            "finetune",
            "--from-log",
            str(log_path),
            "--out",
            str(model_dir),
            "--recipe",
            "few-shot",
            "--lora-rank",
            "0",
            "--no-progress",
            "--seed",
            str(seed),
        ]
    )
    if code != 0:
        raise RuntimeError(f"finetune exited {code}")
    timings["finetune_s"] = time.perf_counter() - started

    # 5. Measure on held-out rows, before and after.
    started = time.perf_counter()
    before = accuracy(engine, held_out, questions)
    after = accuracy(DecisionEngine.from_pretrained(model_dir), held_out, questions)
    timings["measure_s"] = time.perf_counter() - started
    cli(["report", str(log_path), "--buckets", "1"])
    out = {
        "data": str(root),
        "decided": len(traffic),
        "labelled": len(rows),
        "accuracy_on_reviewed_least_confident": reviewed_correct / len(rows),
        "held_out": len(held_out),
        "accuracy_before": before,
        "accuracy_after": after,
        "gain_points": 100 * (after - before),
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "workdir": str(work),
    }
    print(
        f"held-out accuracy on {len(held_out)} BANKING77 test rows: "
        f"{100 * before:.1f} % zero-shot -> {100 * after:.1f} % after fine-tuning on "
        f"{len(rows)} reviewed decisions ({out['gain_points']:+.1f} points)"
    )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The decision loop on BANKING77.")
    parser.add_argument("--pool", type=int, default=600, help="decisions to make and log")
    parser.add_argument("--labels", type=int, default=200, help="decisions to label")
    parser.add_argument("--test", type=int, default=400, help="held-out rows to measure on")
    parser.add_argument("--workdir", default=None, help="where the log and model go")
    args = parser.parse_args()
    print(json.dumps(main(args.pool, args.labels, args.test, args.workdir), indent=2))
