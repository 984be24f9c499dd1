"""``clef-agents calibrate``: fit temperatures (and histogram bins) on held-out labelled data.

A thin adapter over :func:`clef_engine.train.calibrate`, which does the work."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import add_deprecated_alias, check_writable, load_structured, number

EPILOG = """examples:
  clef-agents calibrate out/banking77 heldout.csv --label-col category
  clef-agents calibrate out/banking77 heldout.csv --label-col category --histogram \\
      --plot reliability.png
  clef-agents calibrate /path/to/hf-encoder heldout.csv --out out/calibrated
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="calibrate a model dir on held-out labelled data",
        description=(
            "Fit a temperature per (question type, option-count bucket), optionally "
            "histogram binning, on labelled data, and save it into the model dir. A model "
            "with an example memory gets its mixture settings chosen again on the same data."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL_DIR", help="model dir (finetune / save_pretrained)")
    p.add_argument("data", help="held-out labelled data (CSV or JSONL), not the test set")
    p.add_argument("--questions", metavar="FILE", help="JSON/YAML {id: question}")
    p.add_argument(
        "--text-col", default=None, metavar="COL", help="state column (default: text/state/...)"
    )
    p.add_argument(
        "--label-col",
        default=None,
        metavar="COL",
        help="label column (default: label/category/...)",
    )
    p.add_argument("--instructions", default=None, help="instructions of an inferred choice")
    p.add_argument(
        "--histogram",
        action="store_true",
        help="also fit histogram binning (kept where a 5-fold check lowers ECE)",
    )
    p.add_argument(
        "--bins", type=number(int, low=2), default=15, help="histogram bins (default 15)"
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        default=None,
        help="write reliability diagrams PNG-before.png and PNG-after.png",
    )
    add_deprecated_alias(p, "--diagram", "--plot")
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write a new model dir instead of updating MODEL_DIR",
    )
    p.add_argument("--dry-run", action="store_true", help="report only; save nothing")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clef_engine.errors import InvalidRequestError

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: is a file; name a directory for the model dir")
    if args.plot:  # before fitting, not after
        stem = str(Path(args.plot).with_suffix(""))
        for name in ("before", "after"):
            check_writable(f"{stem}-{name}.png", "--plot")
    questions = load_structured(args.questions) if args.questions else None
    if questions is not None and not isinstance(questions, dict):
        raise UsageError(f"{args.questions}: expected a mapping {{id: question}}")
    try:
        report = _calibrate(args, questions)
    except InvalidRequestError as exc:
        if exc.field != "out":
            raise
        raise UsageError(  # the library names its argument; say the flag
            f"{args.model} is a bare Hugging Face model dir; pass --out DIR to write a "
            "clef-agents model dir with the fitted calibration"
        ) from None
    sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


def _calibrate(args: argparse.Namespace, questions: dict[str, Any] | None) -> Any:
    from clef_engine.train import calibrate

    return calibrate(
        args.model,
        args.data,
        questions=questions,
        text_col=args.text_col,
        label_col=args.label_col,
        instructions=args.instructions,
        histogram=args.histogram,
        bins=args.bins,
        out=args.out,
        dry_run=args.dry_run,
        plot=args.plot,
        device=args.device,
        source="clef-agents calibrate",
    )
