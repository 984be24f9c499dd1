"""``clef-agents eval``: accuracy, macro-F1, calibration and latency on labelled data."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_engine_args,
    add_threads_arg,
    apply_threads,
    build_engine,
    check_writable,
    number,
)

if TYPE_CHECKING:
    from clef_engine.evaluation import EvalReport

DEFAULT_BATCH_SIZE = 32
"""Texts per ``decide_batch`` call: one padded forward pass each."""

EPILOG = """examples:
  clef-agents eval test.csv --text-col text --label-col category
  clef-agents eval test.csv --text-col text --label-col category \\
      --examples-per-label 10 --train train.csv --plot reliability.png
  clef-agents eval test.csv --label-col category --predictions rows.jsonl
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
    p.add_argument("--text-col", default="text", metavar="COL", help="state column (default: text)")
    p.add_argument(
        "--label-col", default="label", metavar="COL", help="label column (default: label)"
    )
    p.add_argument(
        "--examples-per-label",
        type=number(int, low=0),
        default=0,
        metavar="K",
        help="teach each label with K examples (from --train, else from DATA, "
        "which are then left out of the evaluation)",
    )
    p.add_argument("--train", metavar="FILE", help="where --examples-per-label draws from")
    p.add_argument(
        "--seed",
        type=number(int, low=0),
        default=0,
        help="seed for drawing examples and the --limit sample (default: 0)",
    )
    p.add_argument(
        "--instructions", default="What is this text about?", help="the question's instructions"
    )
    p.add_argument(
        "--limit",
        type=number(int, low=0),
        default=0,
        metavar="N",
        help="evaluate a sample of N rows, stratified by label: each label keeps its share "
        "of the data (largest remainders), rows drawn with --seed, so the same N and seed "
        "give the same rows (default 0: all rows)",
    )
    p.add_argument(
        "--batch-size",
        type=number(int, low=1),
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"texts per decide_batch call (default: {DEFAULT_BATCH_SIZE}); latency is "
        "reported per text, so 1 measures single-request latency",
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="write a reliability diagram here (checked before evaluating; .png, .svg, .pdf), "
        "and beside it the accuracy-coverage curve: NAME-coverage.png and NAME-coverage.json",
    )
    p.add_argument(
        "--predictions",
        metavar="JSONL",
        help="write one line per row: text, label, prediction, correct, probabilities, "
        "probability, confidence, abstained (checked before evaluating)",
    )
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_engine_args(p)
    add_threads_arg(p)
    p.set_defaults(func=run)


def stratified_sample(labels: Sequence[str], n: int, seed: int) -> list[int]:
    """Indices of ``n`` rows in input order, each label keeping its share of the data.

    Each label gets ``n x its share`` rows, rounded down, and the rows left over go to the
    labels with the largest remainders (ties in an order shuffled with ``seed``); within a
    label the rows are drawn with ``seed``. Deterministic for the same data, ``n`` and seed.
    """
    if n >= len(labels):
        return list(range(len(labels)))
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        by_label[label].append(i)
    rng = random.Random(seed)
    quota = {label: n * len(rows) / len(labels) for label, rows in by_label.items()}
    take = {label: int(q) for label, q in quota.items()}
    order = sorted(by_label)
    rng.shuffle(order)
    order.sort(key=lambda label: take[label] - quota[label])  # stable: largest remainder first
    for label in order[: n - sum(take.values())]:
        take[label] += 1
    chosen: list[int] = []
    for label in sorted(by_label):
        rows = by_label[label][:]
        rng.shuffle(rows)
        chosen.extend(rows[: take[label]])
    return sorted(chosen)


def check_plot_path(path: str) -> None:
    """Refuse a --plot path matplotlib cannot write, before the evaluation runs."""
    from clef_engine.errors import require

    require("matplotlib", package="matplotlib", extra="eval", feature="eval --plot")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise UsageError(
            f"--plot {path}: the file name must end in an image type ({', '.join(formats)})"
        )
    check_writable(path, "--plot")


def coverage_paths(plot: str) -> tuple[Path, Path]:
    """Where ``--plot NAME.png`` puts the coverage curve: ``NAME-coverage.png`` (same image
    type) and ``NAME-coverage.json``."""
    p = Path(plot)
    stem = p.with_suffix("")
    return Path(f"{stem}-coverage{p.suffix}"), Path(f"{stem}-coverage.json")


def which_head(engine: Any, question: Any, labels: Sequence[str]) -> tuple[str, str | None]:
    """``("trained" | "zero_shot", why)``: which head answers ``question``, and, when a
    fine-tuned model falls back to zero-shot, how the question differs from its trained ones.
    """
    head = getattr(engine, "head", None)
    knows = getattr(head, "knows", None)
    if knows is None:  # no trained head: zero-shot is all this engine has, nothing to warn
        return "zero_shot", None
    if knows(question):
        return "trained", None
    module = getattr(head, "module", None)
    banks = [
        list(names)
        for fp, names in getattr(module, "bank_names", {}).items()
        if getattr(module, "bank_types", {}).get(fp) == "choice"
    ]
    if not banks:
        return "zero_shot", "it was trained on no choice question"
    wanted = set(labels)
    nearest = min(banks, key=lambda names: len(wanted.symmetric_difference(names)))
    extra = sorted(wanted - set(nearest))
    missing = sorted(set(nearest) - wanted)
    why = []
    if extra:
        why.append(f"labels not among its trained options: {_few(extra)}")
    if missing:
        why.append(f"trained options not among the labels: {_few(missing)}")
    if not why:
        why.append("same labels, but the question's wording (--instructions) or examples differ")
    return "zero_shot", "; ".join(why)


def _few(names: list[str], k: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def run(args: argparse.Namespace) -> int:
    from clef_engine.evaluation import evaluate, label_question, prediction_rows

    _check_outputs(args)
    texts, labels, all_labels, examples = _load_data(args)
    question = label_question(all_labels, examples, args.instructions)
    apply_threads(args)
    engine = build_engine(args)
    head, why = which_head(engine, question, all_labels)
    if why is not None:
        sys.stderr.write(
            f"clef-agents: warning: the fine-tuned model {args.model} does not know this "
            f"question ({why}), so its trained head will not answer: every answer comes "
            "from the zero-shot fallback on the base backbone (head: zero_shot)\n"
        )
    report = evaluate(
        engine, texts, labels, question, batch_size=args.batch_size, progress=not args.no_progress
    )
    summary = report.summary()
    summary["model_version"] = engine.model_version
    summary["head"] = head
    if args.plot:
        summary.update(_write_plots(args, report, engine.model_version))
    if args.predictions:
        with open(args.predictions, "w", encoding="utf-8") as fh:
            for row in prediction_rows(texts, labels, report, question):
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        summary["predictions"] = args.predictions
    _print_summary(summary, as_json=args.json)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an unwritable --plot or --predictions path before any data is read."""
    if args.plot:
        check_plot_path(args.plot)
        for path in coverage_paths(args.plot):
            check_writable(str(path), "--plot")
    if args.predictions:
        check_writable(args.predictions, "--predictions")


def _load_data(
    args: argparse.Namespace,
) -> tuple[list[str], list[str], list[str], dict[str, list[str]] | None]:
    """``(texts, labels, all_labels, examples)`` to evaluate on.

    Draws ``--examples-per-label`` examples (from ``--train``, else from DATA, whose drawn
    rows then leave the evaluation), checks there are at least 2 labels, then applies
    ``--limit``.
    """
    from clef_engine.evaluation import columns, read_records, sample_examples

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
        keep = stratified_sample(labels, args.limit, args.seed)
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
    return texts, labels, all_labels, examples


def _write_plots(
    args: argparse.Namespace, report: EvalReport, model_version: str
) -> dict[str, str]:
    """Write the reliability diagram and the coverage curve (image and JSON) for ``--plot``;
    return the summary entries that name them."""
    from clef_engine.calibration.metrics import reliability_diagram
    from clef_engine.evaluation import (
        AUTOMATIC_PRECISION,
        coverage_curve,
        coverage_plot,
        decided_at_precision,
    )

    title = f"{Path(args.data).name} ({model_version})"
    reliability_diagram(report.probabilities, report.label_index, Path(args.plot), title=title)
    png, data = coverage_paths(args.plot)
    curve = coverage_curve(report.probabilities, report.label_index)
    coverage_plot(curve, png, title=title)
    at = decided_at_precision(report.probabilities, report.label_index, AUTOMATIC_PRECISION)
    data.write_text(
        json.dumps(
            {
                "model_version": model_version,
                "data": args.data,
                "n": report.n,
                "at_95_precision": at,
                "curve": curve,
            },
            indent=2,
        )
        + "\n"
    )
    return {"plot": args.plot, "coverage_plot": str(png), "coverage_json": str(data)}


def _print_summary(summary: dict[str, Any], *, as_json: bool) -> None:
    """Print the metrics as JSON or as an aligned ``key  value`` table."""
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        sys.stdout.write(f"{key:<{width}}  {text}\n")
