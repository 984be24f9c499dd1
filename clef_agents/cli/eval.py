"""``clef-agents eval``: accuracy, macro-F1, calibration and latency on labelled data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import add_engine_args, build_engine

EPILOG = """examples:
  clef-agents eval test.csv --text-col text --label-col category
  clef-agents eval test.csv --text-col text --label-col category \\
      --examples-per-label 10 --train train.csv --plot reliability.png
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate on labelled data (CSV or JSONL)",
        description="Evaluate a single-label choice question on labelled data: "
        "accuracy, macro-F1, ECE (15 bins), Brier, latency.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", help="CSV/TSV (with header) or JSONL file")
    p.add_argument("--text-col", default="text", help="column holding the state (default: text)")
    p.add_argument("--label-col", default="label", help="column holding the label (default: label)")
    p.add_argument(
        "--examples-per-label",
        type=int,
        default=0,
        metavar="K",
        help="teach each label with K examples (from --train, else from DATA, "
        "which are then left out of the evaluation)",
    )
    p.add_argument("--train", metavar="FILE", help="where --examples-per-label draws from")
    p.add_argument("--seed", type=int, default=0, help="seed for drawing examples (default: 0)")
    p.add_argument(
        "--instructions", default="What is this text about?", help="the question's instructions"
    )
    p.add_argument("--limit", type=int, default=0, metavar="N", help="evaluate the first N rows")
    p.add_argument("--batch-size", type=int, default=1, help="decide_batch size (default: 1)")
    p.add_argument("--plot", metavar="PNG", help="write a reliability diagram here")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.evaluation import (
        columns,
        evaluate,
        label_question,
        read_records,
        sample_examples,
    )

    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1; got {args.batch_size}")
    if args.limit < 0:
        raise UsageError(f"--limit must be >= 0; got {args.limit}")
    texts, labels = columns(read_records(args.data), args.text_col, args.label_col, args.data)
    all_labels = sorted(set(labels))
    examples = None
    if args.examples_per_label:
        if args.train:
            tr_texts, tr_labels = columns(
                read_records(args.train), args.text_col, args.label_col, args.train
            )
            all_labels = sorted(set(all_labels) | set(tr_labels))
            examples, _ = sample_examples(tr_texts, tr_labels, args.examples_per_label, args.seed)
        else:
            examples, used = sample_examples(texts, labels, args.examples_per_label, args.seed)
            keep = [i for i in range(len(texts)) if i not in used]
            texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
    if len(all_labels) < 2:
        raise UsageError(f"{args.data}: column {args.label_col!r} has fewer than 2 labels")
    if args.limit:
        texts, labels = texts[: args.limit], labels[: args.limit]
    question = label_question(all_labels, examples, args.instructions)
    engine = build_engine(args)
    report = evaluate(
        engine, texts, labels, question, batch_size=args.batch_size, progress=not args.no_progress
    )
    summary = report.summary()
    summary["model_version"] = engine.model_version
    if args.plot:
        from engine.calibration.metrics import reliability_diagram

        reliability_diagram(
            report.probabilities,
            report.label_index,
            Path(args.plot),
            title=f"{Path(args.data).name} ({engine.model_version})",
        )
        summary["plot"] = args.plot
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            text = f"{value:.4f}" if isinstance(value, float) else str(value)
            sys.stdout.write(f"{key:<{width}}  {text}\n")
    return 0
