"""Evaluation harness: labelled texts in, accuracy / macro-F1 / calibration / latency out.

Used by ``clef-agents eval`` and the benchmarks, so the numbers in the README come from
the same code a user runs.

Example:
    >>> from clef_engine import DecisionEngine
    >>> from clef_engine.evaluation import evaluate, label_question
    >>> q = label_question(["card_arrival", "exchange_rate"])
    >>> report = evaluate(DecisionEngine(), ["where is my card?"], ["card_arrival"], q)
    >>> report.accuracy
    1.0
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clef_engine.calibration.metrics import (
    brier_score,
    expected_calibration_error,
    macro_f1,
    negative_log_likelihood,
)
from clef_engine.errors import InvalidRequestError
from clef_engine.protocol import Engine
from clef_engine.schema.questions import Choice

QUESTION_ID = "label"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV (header row) or JSONL file, as dicts.

    Raises:
        InvalidRequestError: unreadable file, bad JSON line, unknown extension, no rows.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidRequestError(f"{p}: no such file", field="data")
    suffix = p.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            with p.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ","))
        elif suffix in (".jsonl", ".ndjson"):
            rows = []
            with p.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise InvalidRequestError(
                            f"{p}: line {n} is not valid JSON ({exc.msg})", field="data"
                        ) from None
                    if not isinstance(row, dict):
                        raise InvalidRequestError(
                            f"{p}: line {n} is not a JSON object", field="data"
                        )
                    rows.append(row)
        else:
            raise InvalidRequestError(
                f"{p}: unsupported file type {suffix!r}; use .csv, .tsv or .jsonl", field="data"
            )
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidRequestError(f"{p}: cannot read ({exc})", field="data") from None
    if not rows:
        raise InvalidRequestError(f"{p}: no rows", field="data")
    return rows


def columns(
    rows: list[dict[str, Any]], text_col: str, label_col: str, source: str = "data"
) -> tuple[list[str], list[str]]:
    """Extract the text and label columns, naming a missing column and the ones present."""
    present = list(rows[0])
    for col, flag in ((text_col, "--text-col"), (label_col, "--label-col")):
        if col not in rows[0]:
            raise InvalidRequestError(
                f"{source}: no column {col!r} ({flag}); columns are {present}", field=flag
            )
    texts, labels = [], []
    for i, row in enumerate(rows):
        text, label = row.get(text_col), row.get(label_col)
        if text is None or not str(text).strip():
            raise InvalidRequestError(
                f"{source}: row {i + 1} has an empty {text_col!r}", field=text_col
            )
        if label is None or str(label) == "":
            raise InvalidRequestError(
                f"{source}: row {i + 1} has an empty {label_col!r}", field=label_col
            )
        texts.append(str(text))
        labels.append(str(label))
    return texts, labels


def label_question(
    labels: Sequence[str],
    examples: dict[str, list[str]] | None = None,
    instructions: str = "What is this text about?",
) -> Choice:
    """A choice over ``labels`` (made readable by the engine); examples become prototypes."""
    names = list(dict.fromkeys(labels))
    criteria: dict[str, Any] = {}
    for name in names:
        ex = (examples or {}).get(name)
        criteria[name] = {"examples": ex} if ex else None
    return Choice(instructions=instructions, criteria=criteria)


def sample_examples(
    texts: Sequence[str], labels: Sequence[str], k: int, seed: int = 0
) -> tuple[dict[str, list[str]], set[int]]:
    """``k`` random examples per label (fewer if a label has fewer); returns rows used."""
    if k < 1:
        raise InvalidRequestError(
            f"examples per label must be >= 1; got {k}", field="--examples-per-label", limit=1
        )
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        by_label[label].append(i)
    rng = random.Random(seed)
    chosen: dict[str, list[str]] = {}
    used: set[int] = set()
    for label in sorted(by_label):
        idx = by_label[label][:]
        rng.shuffle(idx)
        chosen[label] = [texts[i] for i in idx[:k]]
        used.update(idx[:k])
    return chosen, used


@dataclass
class EvalReport:
    """Metrics of one evaluation run."""

    n: int
    n_labels: int
    accuracy: float
    macro_f1: float
    ece: float
    brier: float
    nll: float
    latency_p50_ms: float
    latency_p95_ms: float
    batch_size: int
    probabilities: np.ndarray = field(repr=False)
    label_index: np.ndarray = field(repr=False)
    abstained: list[bool | None] = field(default_factory=list, repr=False)
    """Per row, the answer's ``x_abstained`` (``None`` when the engine has no saved
    threshold for the question)."""

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("probabilities", "label_index", "abstained"):
            data.pop(key)
        at = decided_at_precision(self.probabilities, self.label_index, AUTOMATIC_PRECISION)
        data["decided_at_95_precision"] = at["coverage"]
        data["threshold_at_95_precision"] = at["threshold"]
        flags = [a for a in self.abstained if a is not None]
        if flags:  # the engine's saved thresholds, on this data
            kept = [not a for a in self.abstained]
            right = self.probabilities.argmax(1) == self.label_index
            data["saved_thresholds_decided"] = sum(kept) / len(kept)
            data["saved_thresholds_precision"] = (
                float(right[np.array(kept)].mean()) if any(kept) else math.nan
            )
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in data.items()}


def prediction_rows(
    texts: Sequence[str], labels: Sequence[str], report: EvalReport, question: Choice
) -> list[dict[str, Any]]:
    """One record per evaluated row, for auditing: ``text``, ``label``, ``prediction``,
    ``correct``, ``probabilities`` (every option), ``probability`` (of the prediction),
    ``confidence`` (the reference confidence) and ``abstained`` (``None`` without saved
    thresholds)."""
    from clef_engine.schema.answers import choice_confidence

    names = [s.name for s in question.option_specs()]
    out = []
    for i, (text, label) in enumerate(zip(texts, labels, strict=True)):
        row = report.probabilities[i]
        best = int(row.argmax())
        out.append(
            {
                "text": text,
                "label": label,
                "prediction": names[best],
                "correct": names[best] == label,
                "probabilities": {n: round(float(v), 6) for n, v in zip(names, row, strict=True)},
                "probability": round(float(row[best]), 6),
                "confidence": round(choice_confidence(row.tolist()), 6),
                "abstained": report.abstained[i] if i < len(report.abstained) else None,
            }
        )
    return out


AUTOMATIC_PRECISION = 0.95
"""The precision of the headline "decided automatically" figure."""


def decided_at_precision(probs: Any, label_index: Any, precision: float) -> dict[str, Any]:
    """The largest share of rows whose top probability clears one threshold and whose
    answers are at least ``precision`` accurate: ``{"coverage", "threshold", "accuracy"}``
    (measured on these rows; fit a threshold on other data to use it,
    :func:`clef_engine.runtime.thresholds.fit_thresholds`)."""
    from clef_engine.runtime.thresholds import fit_threshold

    p = np.asarray(probs, dtype=np.float64)
    right = (p.argmax(1) == np.asarray(label_index)).tolist()
    t = fit_threshold(p.max(1).tolist(), right, target_precision=precision)
    return {
        "coverage": t.coverage,
        "threshold": t.threshold if t.reachable else None,
        "accuracy": None if math.isnan(t.precision) else t.precision,
    }


def coverage_curve(probs: Any, label_index: Any, points: int = 100) -> list[dict[str, Any]]:
    """Accuracy of the most confident rows against their share (the coverage).

    For coverage ``k/points`` (k = 1..points): the threshold that keeps that share of the
    rows (their least top probability), the share actually kept (ties are kept together)
    and the accuracy of the rows kept. Read it from the right: at coverage 1 every row is
    decided; moving left, the threshold rises and the accuracy with it.
    """
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(label_index)
    if p.ndim != 2 or len(p) != len(y) or not len(p):
        raise ValueError(f"probs must be [N, C] and labels [N], N > 0; got {p.shape}, {y.shape}")
    top = p.max(1)
    right = p.argmax(1) == y
    order = np.argsort(-top, kind="stable")
    top, right = top[order], right[order]
    n = len(top)
    out = []
    for k in sorted({max(1, math.ceil(n * i / points)) for i in range(1, points + 1)}):
        t = top[k - 1]
        kept = int(np.searchsorted(-top, -t, side="right"))  # ties with the k-th kept too
        out.append(
            {
                "threshold": round(float(t), 6),
                "coverage": round(kept / n, 6),
                "accuracy": round(float(right[:kept].mean()), 6),
                "n": kept,
            }
        )
    return out


def coverage_plot(
    curve: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    title: str = "Coverage",
    precision: float = AUTOMATIC_PRECISION,
) -> Path:
    """Write the accuracy-coverage curve as an image (the reliability diagram's style;
    needs matplotlib: ``pip install 'clef-agents[eval]'``)."""
    from clef_engine.errors import require

    require("matplotlib", package="matplotlib", extra="eval", feature="coverage plots")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    coverage = [c["coverage"] for c in curve]
    accuracy = [c["accuracy"] for c in curve]
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=110)
    ax.plot(coverage, accuracy, "-", color="C0", label="accuracy of the decided rows")
    ax.axhline(precision, linestyle="--", color="gray", label=f"{precision:.0%} precision")
    reached = [c for c in curve if c["accuracy"] >= precision]
    if reached:
        best = max(reached, key=lambda c: c["coverage"])
        ax.plot([best["coverage"]], [best["accuracy"]], "o", color="C3")
        ax.annotate(
            f"{best['coverage']:.0%} decided\n(p >= {best['threshold']:.2f})",
            (best["coverage"], best["accuracy"]),
            textcoords="offset points",
            xytext=(-10, -30),
            ha="right",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(min(0.5, min(accuracy) - 0.05), 1.005)
    ax.set_xlabel("coverage (share decided automatically)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\nfull coverage: {accuracy[-1]:.3f}, n={curve[-1]['n']}")
    ax.legend(loc="lower left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def evaluate(
    engine: Engine,
    texts: Sequence[str],
    labels: Sequence[str],
    question: Choice,
    *,
    batch_size: int = 1,
    progress: bool = False,
) -> EvalReport:
    """Decide every text, compare with its label, measure calibration and latency.

    Latency is wall time per ``decide`` call (``batch_size == 1``) or per item of a
    ``decide_batch`` call.
    """
    if not texts:
        raise InvalidRequestError("nothing to evaluate", field="data")
    names = [s.name for s in question.option_specs()]  # none_of_these included
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise InvalidRequestError(
            f"{len(unknown)} label(s) are not options of the question, e.g. {unknown[:3]}",
            field="labels",
        )
    questions = {QUESTION_ID: question}
    engine.prepare_question(question)  # fit prototypes once, outside the timed loop
    probs = np.zeros((len(texts), len(names)))
    abstained: list[bool | None] = []
    latencies: list[float] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), unit="text", desc="eval")
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        t0 = time.perf_counter()
        if batch_size == 1:
            results = [engine.decide(chunk[0], questions)]
        else:
            results = engine.decide_batch(chunk, questions)
        per_item = (time.perf_counter() - t0) * 1000.0 / len(chunk)
        latencies.extend([per_item] * len(chunk))
        for j, result in enumerate(results):
            answer = result.answers[QUESTION_ID]
            probs[start + j] = [answer.probabilities[n] for n in names]
            abstained.append(getattr(answer, "x_abstained", None))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    y = np.array([index[label] for label in labels])
    return EvalReport(
        n=len(texts),
        n_labels=len(names),
        accuracy=float((probs.argmax(1) == y).mean()),
        macro_f1=macro_f1(probs.argmax(1).tolist(), y.tolist(), len(names)),
        ece=expected_calibration_error(probs, y),
        brier=brier_score(probs, y),
        nll=negative_log_likelihood(probs, y),
        latency_p50_ms=float(np.percentile(latencies, 50)),
        latency_p95_ms=float(np.percentile(latencies, 95)),
        batch_size=batch_size,
        probabilities=probs,
        label_index=y,
        abstained=abstained,
    )
