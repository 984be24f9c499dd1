"""``clef-agents report``: model vs fallback accuracy, fallback rate over time and
confidence drift, from a decision log."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from clef_agents.cli.common import check_writable, number

EPILOG = """examples:
  clef-agents report decisions.sqlite
  clef-agents report decisions.sqlite --plot report.png --json report.json --buckets 24
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="accuracy by source, fallback rate and confidence drift of a decision log",
        description="Compare model and fallback accuracy on the labelled rows of a decision "
        "log, and show the fallback rate and the model's confidence over time and per model "
        "version: tables, plus a PNG with --plot.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", help="decision log (SQLite)")
    p.add_argument("--plot", metavar="PNG", help="also draw the report (needs the eval extra)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write the report JSON")
    p.add_argument(
        "--buckets",
        type=number(int, low=1, high=1000),
        default=10,
        metavar="N",
        help="time spans from the first to the last decision (default 10)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clef_agents.decision_log.report import build_report, format_report, plot_report

    for path, flag in ((args.plot, "--plot"), (args.json_out, "--json")):
        if path:
            check_writable(path, flag)
    if args.plot:  # fail on a missing matplotlib before reading the log
        from clef_engine.errors import require

        require("matplotlib", package="matplotlib", extra="eval", feature="report --plot")
    report = build_report(args.log, buckets=args.buckets)
    sys.stdout.write(format_report(report))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    if args.plot:
        plot_report(report, args.plot)
        sys.stdout.write(f"plot: {args.plot}\n")
    return 0
