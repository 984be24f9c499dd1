"""``clef-agents thresholds``: fit confidence thresholds on held-out labelled data, save them
into the model dir, and report the share of answers decided automatically."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_engine_args,
    add_threads_arg,
    apply_threads,
    build_engine,
    load_structured,
    number,
)

DEFAULT_PRECISION = 0.95

EPILOG = """examples:
  clef-agents thresholds heldout.csv --model out/banking77 --label-col category
  clef-agents thresholds heldout.csv --model out/banking77 --target-precision 0.99
  clef-agents thresholds heldout.csv --model out/banking77 --target-coverage 0.8 --dry-run
  clef-agents thresholds tickets.jsonl --model out/support --questions questions.json

Answers below their threshold come back with x_abstained: true, and routers, selectors
and graph edges built without min_confidence send them to their default route.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "thresholds",
        help="fit abstention thresholds on held-out data and save them into a model dir",
        description=(
            "Decide every labelled row, then fit the least confidence at which an answer "
            "is taken automatically: per question, per (type, option-count bucket) and per "
            "type, each where the data has --min-rows labelled answers. Saved as "
            "thresholds.json in the model dir; DecisionEngine.from_pretrained loads it."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", help="held-out labelled data (CSV or JSONL), not the training rows")
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--target-precision",
        type=number(float, low=0, high=1, low_open=True),
        default=None,
        metavar="P",
        help=f"keep the most answers whose accuracy is at least P (default {DEFAULT_PRECISION})",
    )
    target.add_argument(
        "--target-coverage",
        type=number(float, low=0, high=1, low_open=True),
        default=None,
        metavar="C",
        help="or keep this share of the answers, the most confident ones",
    )
    p.add_argument(
        "--min-rows",
        type=number(int, low=1),
        default=None,
        metavar="N",
        help="labelled answers a question, bucket or type needs for its own threshold "
        "(default 100)",
    )
    p.add_argument("--questions", metavar="FILE", help="JSON/YAML {id: question} of the data")
    p.add_argument("--text-col", default=None, help="column of the state (default: text, ...)")
    p.add_argument("--label-col", default=None, help="column of the label (default: label, ...)")
    p.add_argument("--instructions", default=None, help="instructions of an inferred choice")
    p.add_argument(
        "--batch-size", type=number(int, low=1), default=64, metavar="N", help="default 64"
    )
    p.add_argument("--dry-run", action="store_true", help="report only; save nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_engine_args(p)
    add_threads_arg(p)
    p.set_defaults(func=run)


def _pct(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def run(args: argparse.Namespace) -> int:
    from clef_engine.runtime.thresholds import DEFAULT_MIN_ROWS, THRESHOLDS_FILE, fit_thresholds

    if not args.model and not args.dry_run:
        raise UsageError(
            "name the model dir to save the thresholds into with --model DIR "
            "(or pass --dry-run to only report)"
        )
    if args.model and not Path(args.model).is_dir():
        raise UsageError(f"--model {args.model}: no such directory")
    precision = args.target_precision
    if precision is None and args.target_coverage is None:
        precision = DEFAULT_PRECISION
    questions = load_structured(args.questions) if args.questions else None
    apply_threads(args)
    engine = build_engine(args)
    fitted = fit_thresholds(
        engine,
        args.data,
        target_precision=precision,
        target_coverage=args.target_coverage,
        min_rows=args.min_rows or DEFAULT_MIN_ROWS,
        questions=questions,
        text_col=args.text_col,
        label_col=args.label_col,
        instructions=args.instructions,
        batch_size=args.batch_size,
    )
    report = fitted.to_dict()
    report["decided_automatically"] = fitted.decided_share()
    unreachable = [
        f"{level} {key}"
        for level in ("question", "bucket", "type")
        for key, t in getattr(fitted, level).items()
        if not t.reachable
    ]
    if not args.dry_run:
        report["saved"] = str(fitted.save(args.model))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        goal = (
            f"precision {_pct(precision)}"
            if precision is not None
            else f"coverage {_pct(args.target_coverage)}"
        )
        sys.stdout.write(f"target: {goal}; fitted on {fitted.source}\n")
        for level in ("question", "bucket", "type"):
            for key, t in sorted(getattr(fitted, level).items()):
                name = fitted.names.get(key, key) if level == "question" else key
                sys.stdout.write(
                    f"{level:<8}  {name:<48}  threshold {t.threshold:.4f}  "
                    f"decided {_pct(t.coverage)}  precision {_pct(t.precision)}  n={t.n}\n"
                )
        sys.stdout.write(
            f"decided automatically: {_pct(report['decided_automatically'])} of the answers"
            f" at {goal}\n"
        )
        if "saved" in report:
            sys.stdout.write(f"saved: {report['saved']}\n")
    for where in unreachable:
        sys.stderr.write(
            f"clef-agents: warning: {where}: no threshold reaches the target precision; "
            "only answers with probability 1 are decided automatically\n"
        )
    if args.dry_run and args.model:
        sys.stderr.write(f"clef-agents: --dry-run: {THRESHOLDS_FILE} not written\n")
    return 0
