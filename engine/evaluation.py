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

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("probabilities")
        data.pop("label_index")
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in data.items()}


def evaluate(
    engine: Any,
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
    names = list(question.criteria)
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
    )
