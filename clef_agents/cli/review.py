"""``clef-agents review``: low-confidence and fallback decisions out to CSV for labelling,
and the labelled CSV back into the log."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import check_writable, number

EPILOG = """examples:
  clef-agents review decisions.sqlite                        # the table, least confident first
  clef-agents review decisions.sqlite --out to_label.csv     # CSV with an empty label column
  clef-agents review decisions.sqlite --import to_label.csv  # store the filled-in labels
  clef-agents finetune --from-log decisions.sqlite --out out/next-model
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "review",
        help="label low-confidence and fallback decisions from a decision log (CSV)",
        description="Show logged decisions worth labelling (below --below, or answered by a "
        "fallback or abstained), export them to CSV with an empty label column, and import "
        "the labelled CSV back into the log.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", help="decision log (SQLite, from --log-decisions or DecisionLog)")
    p.add_argument("--out", metavar="CSV", help="write the items to label to this CSV")
    p.add_argument(
        "--import",
        dest="import_csv",
        metavar="CSV",
        help="store the labels of a reviewed CSV in the log (empty labels are skipped)",
    )
    p.add_argument(
        "--below",
        type=number(float, low=0, high=1),
        default=0.6,
        metavar="P",
        help="model answers with a calibrated probability under P (default 0.6)",
    )
    p.add_argument(
        "--sources",
        default="rules,default,abstained",
        help="answers from these sources always go to review (default rules,default,"
        "abstained; '' for none)",
    )
    p.add_argument("--question", metavar="ID", help="only this question id")
    p.add_argument(
        "--include-labelled", action="store_true", help="also items that already have a label"
    )
    p.add_argument("--limit", type=number(int, low=1), default=None, metavar="N")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clef_agents.decision_log.review import (
        FALLBACK_SOURCES,
        export_csv,
        import_labels,
        review_items,
    )

    if args.import_csv:
        if args.out:
            raise UsageError("--import stores labels; --out exports items: give one of them")
        stored = import_labels(args.log, args.import_csv)
        sys.stdout.write(f"stored {stored} labels in {args.log}\n")
        return 0
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = sorted(set(sources) - set(FALLBACK_SOURCES))
    if unknown:
        raise UsageError(f"--sources: unknown {unknown}; choose from {list(FALLBACK_SOURCES)}")
    if args.out:
        check_writable(args.out, "--out")
    items = review_items(
        args.log,
        below=args.below,
        sources=sources,
        question=args.question,
        include_labelled=args.include_labelled,
        limit=args.limit,
    )
    if args.out:
        n = export_csv(items, args.out)
        sys.stdout.write(
            f"wrote {n} items to {args.out}; fill in the label column, then run "
            f"clef-agents review {args.log} --import {args.out}\n"
        )
        return 0
    sys.stdout.write(f"{'id':>7} {'question':<12} {'source':<9} {'p':>6} {'answer':<20} state\n")
    for item in items:
        p = item.probability
        state = item.decision.state
        text = "" if state is None else str(state).replace("\n", " ")
        sys.stdout.write(
            f"{item.decision.id:>7} {item.question_id[:12]:<12} {item.source:<9} "
            f"{'-' if p is None else f'{p:.3f}':>6} {str(item.predicted)[:20]:<20} "
            f"{text[:60]}\n"
        )
    sys.stdout.write(f"{len(items)} items to review\n")
    return 0
