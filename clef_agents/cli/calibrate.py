"""``clef-agents calibrate``: fit temperatures (and histogram bins) on held-out labelled data."""

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


def _trained_questions(engine: Any, instructions: str | None) -> dict[str, Any] | None:
    """Questions a trained head knows, as choice/score/noul objects (for text,label data)."""
    module = getattr(getattr(engine, "head", None), "module", None)
    if module is None:
        return None
    from clef_engine.schema.questions import Choice, Noul, Score

    out: dict[str, Any] = {}
    for i, fp in enumerate(module.bank_names):
        qtype, names = module.bank_types[fp], module.bank_names[fp]
        qid = "label" if len(module.bank_names) == 1 else f"q{i}"
        text = instructions or "Which label fits the text?"
        # A noul or score question is known by its wording (question_context), which the
        # model dir keeps: rebuild it from there, or the head would not recognise it.
        context = module.bank_contexts.get(fp)
        asked, described = json.loads(context) if context else (None, [])
        if qtype == "choice":
            out[qid] = Choice(instructions=text, criteria=names)
        elif qtype == "score":
            levels = [d or None for d in described] if context else list(names)
            out[qid] = Score(instructions=asked or text, criteria=levels)
        else:
            sides = {k: d for k, d in zip(("true", "false"), described, strict=False) if d}
            out[qid] = Noul(instructions=asked or (None if sides else text), criteria=sides or None)
    return out


def _metrics(probs: list[list[float]], labels: list[int]) -> dict[str, float]:
    import numpy as np

    from clef_engine.calibration import (
        brier_score,
        expected_calibration_error,
        negative_log_likelihood,
    )

    out: dict[str, list[float]] = {"ece": [], "nll": [], "brier": []}
    by_width: dict[int, list[int]] = {}
    for i, row in enumerate(probs):
        by_width.setdefault(len(row), []).append(i)
    weights = []
    for idx in by_width.values():
        p = np.array([probs[i] for i in idx])
        y = np.array([labels[i] for i in idx])
        out["ece"].append(expected_calibration_error(p, y))
        out["nll"].append(negative_log_likelihood(p, y))
        out["brier"].append(brier_score(p, y))
        weights.append(len(idx))
    return {k: round(float(np.average(v, weights=weights)), 4) for k, v in out.items()}


def _refit_memory(
    engine: Any,
    memory: Any,
    data: Any,
    asked: list[tuple[str, str]],
    before: list[list[float]],
    after: list[list[float]],
    labels: list[int],
) -> dict[str, dict[str, float]]:
    """:func:`clef_engine.heads.memory.refit_memory` on the held-out rows, by question id."""
    from clef_engine.heads.memory import refit_memory
    from clef_engine.heads.option_evidence import fingerprint, question_context

    names = {q: [s.name for s in v.option_specs()] for q, v in data.questions.items()}
    types = {q: str(v.type) for q, v in data.questions.items()}
    contexts = {q: question_context(v) for q, v in data.questions.items()}
    rows = [
        (types[qid], contexts[qid], names[qid], state, after[i], before[i], labels[i])
        for i, (qid, state) in enumerate(asked)
    ]

    def encode(states: list[str]) -> Any:
        return engine.backbone.encode(states).pooled.float()

    reports = refit_memory(memory, rows, encode)
    by_id = {q: fingerprint(types[q], names[q], contexts[q]) for q in data.questions}
    return {q: reports[fp] for q, fp in by_id.items() if fp in reports}


def run(args: argparse.Namespace) -> int:
    import torch

    from clef_engine import DecisionEngine
    from clef_engine.calibration import Calibrator, fit_calibrator, reliability_diagram
    from clef_engine.heads.memory import MEMORY_FILE
    from clef_engine.runtime import model_dir
    from clef_engine.train import load_data

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: is a file; name a directory for the model dir")
    if args.plot:  # before fitting, not after
        stem = str(Path(args.plot).with_suffix(""))
        for name in ("before", "after"):
            check_writable(f"{stem}-{name}.png", "--plot")
    directory = Path(args.model)
    engine = DecisionEngine.from_pretrained(directory, device=args.device)
    ours = model_dir.read_config(directory).get("format") == model_dir.FORMAT
    if not ours and not args.out and not args.dry_run:
        raise UsageError(
            f"{directory} is a bare Hugging Face model dir; pass --out DIR to write a "
            "clef-agents model dir with the fitted calibration"
        )
    questions = load_structured(args.questions) if args.questions else None
    if questions is None:
        questions = _trained_questions(engine, args.instructions)
    data = load_data(
        args.data,
        questions=questions,
        text_col=args.text_col,
        label_col=args.label_col,
        instructions=args.instructions,
        strict_labels=questions is not None,
    )
    trained = hasattr(engine.head, "module")
    memory = getattr(engine.head, "memory", None)
    old = engine.calibrator
    engine.calibrator = Calibrator(source="identity")
    if memory is not None:
        engine.head.memory = None  # type: ignore[attr-defined]  # the head alone
    logits: list[torch.Tensor] = []
    labels: list[int] = []
    types: list[str] = []
    asked: list[tuple[str, str]] = []  # (question id, state) of each row
    for start in range(0, len(data), 256):
        chunk = data.examples[start : start + 256]
        results = engine.decide_batch(
            [
                {"state": ex.state, "questions": {q: data.questions[q] for q in ex.labels}}
                for ex in chunk
            ]
        )
        for ex, result in zip(chunk, results, strict=True):
            for qid, label in ex.labels.items():
                question = data.questions[qid]
                qtype = str(question.type)  # type: ignore[attr-defined]
                if qtype == "noul" and not trained and question.sides() != (True, True):  # type: ignore[attr-defined]
                    continue  # one-sided yes/no keeps its fitted threshold
                answer = result.answers[qid]
                if qtype == "noul":
                    p = [answer.noul, 1.0 - answer.noul]
                else:
                    p = list(answer.probabilities.values())
                logits.append(torch.tensor(p, dtype=torch.float64).clamp(min=1e-300).log())
                labels.append(label)
                types.append(qtype)
                asked.append((qid, ex.state))
    if not logits:
        raise UsageError(f"{args.data}: no labelled questions that calibration can fit")
    new = fit_calibrator(
        logits,
        labels,
        types,
        histogram=args.histogram,
        n_bins=args.bins,
        base=old,
        source=f"clef-agents calibrate on {args.data} ({len(labels)} labels)",
    )

    def probs_with(cal: Calibrator) -> list[list[float]]:
        out = []
        for row, qtype in zip(logits, types, strict=True):
            n = row.numel()
            out.append(cal.adjust(torch.softmax(cal.scale(row, qtype, n), -1), qtype, n).tolist())
        return out

    before, after = probs_with(old), probs_with(new)
    summary: dict[str, Any] = {
        "labels": len(labels),
        "before": _metrics(before, labels),
        "after": _metrics(after, labels),
        "temperatures": new.to_dict()["temperatures"],
        "histograms": sorted(new.histograms),
    }
    if memory is not None:
        summary["memory"] = _refit_memory(engine, memory, data, asked, before, after, labels)
        engine.head.memory = memory if memory.questions else None  # type: ignore[attr-defined]
    if args.plot:
        import numpy as np

        width = max(len(r) for r in before)
        rows = [i for i, r in enumerate(before) if len(r) == width]
        stem = str(Path(args.plot).with_suffix(""))
        for name, probs in (("before", before), ("after", after)):
            reliability_diagram(
                np.array([probs[i] for i in rows]),
                np.array([labels[i] for i in rows]),
                f"{stem}-{name}.png",
                title=f"{name} calibration",
            )
        summary["diagrams"] = [f"{stem}-before.png", f"{stem}-after.png"]
    if not args.dry_run:
        engine.calibrator = new
        if args.out:
            engine.save_pretrained(args.out)
            summary["saved"] = args.out
        else:
            config = model_dir.read_config(directory)
            config["calibration"] = new.to_dict()
            if memory is not None:
                config["head"].pop("memory", None)
                if memory.questions:
                    config["head"]["memory"] = memory.save(directory)
                else:  # no question kept its memory
                    (directory / MEMORY_FILE).unlink(missing_ok=True)
            (directory / model_dir.CONFIG).write_text(
                json.dumps(config, indent=2, sort_keys=True) + "\n"
            )
            summary["saved"] = str(directory)
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0
