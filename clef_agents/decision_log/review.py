"""Review logged decisions: pick the ones worth labelling, CSV out and back, training data.

One reviewable item is one question of one decision. Worth a reviewer's time: answers the
model gave below a confidence threshold, and answers a fallback gave (``rules``,
``default``) or the model abstained on. :func:`export_csv` writes them with an empty
``label`` column; a reviewer fills it in (an option name; ``true``/``false`` for a yes/no
question; a level index or text for a score); :func:`import_labels` stores the labels in
the log; :func:`write_training_data` turns the labelled rows into the files
``clef-agents finetune`` reads (``state,question,label`` JSONL plus ``{id: question}``).

Example:
    >>> items = review_items("decisions.sqlite", below=0.6)
    >>> [(item.decision.state, item.predicted, round(item.probability, 2)) for item in items]
    [('hello?', 'sales', 0.34)]
    >>> export_csv(items, "to_label.csv")
    1
    >>> import csv                          # the reviewer fills in the label column
    >>> with open("to_label.csv", newline="") as fh:
    ...     rows = [dict(row, label="billing") for row in csv.DictReader(fh)]
    >>> with open("to_label.csv", "w", newline="") as fh:
    ...     writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
    ...     _ = writer.writeheader()
    ...     writer.writerows(rows)
    >>> import_labels("decisions.sqlite", "to_label.csv")
    1
"""

from __future__ import annotations

import csv
import datetime
import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_agents.decision_log.store import (
    Decision,
    DecisionLogError,
    connect,
    read_decisions,
    read_questions,
)

FALLBACK_SOURCES = ("rules", "default", "abstained")
"""Per-question sources that always go to review (the model did not answer)."""

CSV_COLUMNS = (
    "decision_id",
    "question_id",
    "time",
    "source",
    "probability",
    "answer",
    "options",
    "state",
    "label",
)
"""Columns of the review CSV; only ``decision_id``, ``question_id`` and ``label`` are read
back."""

_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


@dataclass
class ReviewItem:
    """One question of one logged decision."""

    decision: Decision
    question_id: str
    question: dict[str, Any]
    """The question as on the wire (``type``, ``criteria``...)."""

    @property
    def answer(self) -> dict[str, Any]:
        return dict(self.decision.answers.get(self.question_id, {}))

    @property
    def source(self) -> str:
        return self.decision.question_source(self.question_id)

    @property
    def options(self) -> list[str]:
        return options_of(self.question)

    @property
    def predicted(self) -> str | None:
        """The answer given, in label form (option name, ``true``/``false``, level index)."""
        return answer_label(self.question, self.answer)

    @property
    def probability(self) -> float | None:
        """The calibrated probability of the answer given."""
        answer = self.answer
        kind = self.question.get("type")
        if kind == "noul" and "noul" in answer:
            p = float(answer["noul"])
            return max(p, 1.0 - p)
        probabilities = answer.get("probabilities")
        if probabilities:
            return float(max(probabilities.values()))
        return None

    @property
    def label(self) -> str | None:
        value = self.decision.labels.get(self.question_id)
        return None if value is None else str(value)


def options_of(question: dict[str, Any]) -> list[str]:
    """The labels a reviewer may give a question (empty for ``box``)."""
    kind = question.get("type")
    criteria = question.get("criteria")
    if kind == "noul":
        return ["true", "false"]
    if kind == "score":
        return [str(i) for i in range(len(criteria or []))]
    if kind == "choice":
        if isinstance(criteria, dict):
            return [str(k) for k in criteria]
        return [str(c.get("name")) if isinstance(c, dict) else str(c) for c in (criteria or [])]
    return []


def answer_label(question: dict[str, Any], answer: dict[str, Any]) -> str | None:
    """An answer in label form, comparable with a reviewer's label."""
    kind = question.get("type")
    if kind == "choice":
        choice = answer.get("choice")
        return None if choice is None else str(choice)
    if kind == "noul" and "noul" in answer:
        return "true" if float(answer["noul"]) >= 0.5 else "false"
    if kind == "score" and answer.get("probabilities"):
        probs = answer["probabilities"]
        return str(max(probs, key=lambda k: probs[k]))
    return None


def normalise_label(question: dict[str, Any], label: str) -> str | None:
    """A reviewer's label in canonical form, or ``None`` when it is not a valid answer."""
    text = label.strip()
    kind = question.get("type")
    if kind == "noul":
        low = text.lower()
        return "true" if low in _TRUE else "false" if low in _FALSE else None
    if kind == "score":
        levels = [str(c) for c in question.get("criteria") or []]
        if text.isdigit() and int(text) < len(levels):
            return str(int(text))
        return str(levels.index(text)) if text in levels else None
    options = options_of(question)
    return text if text in options else None


def iter_items(path: str | Path) -> Iterable[ReviewItem]:
    """Every (decision, question) in the log, oldest first (``box`` questions left out)."""
    conn = connect(path, create=False)
    try:
        questions = read_questions(conn)
        for decision in read_decisions(conn):
            asked = questions.get(decision.questions_hash, {})
            for qid in decision.answers:
                question = asked.get(qid)
                if question is None or question.get("type") == "box":
                    continue
                yield ReviewItem(decision, qid, question)
    finally:
        conn.close()


def review_items(
    path: str | Path,
    *,
    below: float | None = 0.6,
    sources: Sequence[str] = FALLBACK_SOURCES,
    question: str | None = None,
    include_labelled: bool = False,
    limit: int | None = None,
) -> list[ReviewItem]:
    """The items worth labelling, least confident first.

    Args:
        path: The decision log.
        below: Model answers whose calibrated probability is under this go to review
            (``None``: none by probability).
        sources: Per-question sources that always go to review.
        question: Only this question id.
        include_labelled: Also items that already have a label.
        limit: At most this many (the least confident).
    """
    picked = []
    for item in iter_items(path):
        if question is not None and item.question_id != question:
            continue
        if item.label is not None and not include_labelled:
            continue
        p = item.probability
        low = below is not None and item.source == "model" and p is not None and p < below
        if low or item.source in sources:
            picked.append(item)
    picked.sort(key=lambda it: it.probability if it.probability is not None else 0.0)
    return picked[:limit] if limit is not None else picked


def _state_text(state: Any) -> str:
    if state is None:
        return ""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="seconds")


def export_csv(items: Sequence[ReviewItem], out: str | Path) -> int:
    """Write ``items`` to a CSV with an empty ``label`` column; returns the row count."""
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for item in items:
            p = item.probability
            writer.writerow(
                [
                    item.decision.id,
                    item.question_id,
                    _iso(item.decision.ts),
                    item.source,
                    "" if p is None else f"{p:.4f}",
                    item.predicted or "",
                    "|".join(item.options),
                    _state_text(item.decision.state),
                    item.label or "",
                ]
            )
    return len(items)


def import_labels(path: str | Path, labelled_csv: str | Path) -> int:
    """Store the labels of a review CSV in the log; returns how many were stored.

    Rows with an empty label are skipped; a row that names no logged decision, a question
    the decision did not ask, or a label that is not a valid answer is an error naming the
    row and column, and then nothing is stored.

    Raises:
        DecisionLogError: The CSV or a row of it is unusable.
    """
    source = Path(labelled_csv)
    if not source.is_file():
        raise DecisionLogError(f"{source}: no such file")
    with source.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    missing = {"decision_id", "question_id", "label"} - set(rows[0] if rows else {})
    if missing:
        raise DecisionLogError(f"{source}: missing column(s) {sorted(missing)}")
    conn = connect(path, create=False)
    try:
        questions = read_questions(conn)
        updates: dict[int, dict[str, Any]] = {}
        for n, row in enumerate(rows, start=2):  # row 1 is the header
            label = (row.get("label") or "").strip()
            if not label:
                continue
            try:
                decision_id = int(row["decision_id"])
            except ValueError:
                raise DecisionLogError(
                    f"{source}: row {n}: decision_id {row['decision_id']!r} is not a number"
                ) from None
            qid = row["question_id"]
            found = conn.execute(
                "SELECT questions_hash, labels FROM decisions WHERE id = ?", (decision_id,)
            ).fetchone()
            if found is None:
                raise DecisionLogError(
                    f"{source}: row {n}: decision_id {decision_id} is not in the log "
                    "(deleted by retention?)"
                )
            question = questions.get(found[0], {}).get(qid)
            if question is None:
                raise DecisionLogError(
                    f"{source}: row {n}: question_id {qid!r} was not asked in decision "
                    f"{decision_id}"
                )
            value = normalise_label(question, label)
            if value is None:
                shown = ", ".join(options_of(question)[:8])
                raise DecisionLogError(
                    f"{source}: row {n}: label {label!r} is not an answer to {qid!r} "
                    f"(options: {shown}{', ...' if len(options_of(question)) > 8 else ''})"
                )
            current = updates.setdefault(decision_id, json.loads(found[1]) if found[1] else {})
            current[qid] = value
        with conn:
            conn.executemany(
                "UPDATE decisions SET labels = ? WHERE id = ?",
                [(json.dumps(v, ensure_ascii=False), k) for k, v in updates.items()],
            )
    except sqlite3.Error as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    return sum(len(v) for v in updates.values())


def labelled_items(path: str | Path) -> list[ReviewItem]:
    """Every item with a reviewer's label, oldest first."""
    return [item for item in iter_items(path) if item.label is not None]


def write_training_data(path: str | Path, out_dir: str | Path) -> tuple[Path, Path, int]:
    """Write the labelled rows as ``clef-agents finetune`` data.

    Returns ``(data.jsonl, questions.json, rows)``: JSONL rows ``{state, question, label}``
    and the questions ``{id: question}``, each id's latest definition in the log (rows
    whose label is not an option of it are left out). Rows whose state was not stored
    (``state="hash"``/``"none"``) cannot be trained on and are left out.

    Raises:
        DecisionLogError: No labelled row with a stored state.
    """
    items = [it for it in labelled_items(path) if it.decision.state is not None]
    if not items:
        raise DecisionLogError(
            f"{path}: no labelled decisions with a stored state to train on "
            "(label some with `clef-agents review`; a log kept with state='hash' or 'none' "
            "has no states)"
        )
    latest: dict[str, dict[str, Any]] = {}
    for item in items:  # oldest first: the last definition wins
        latest[item.question_id] = item.question
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.jsonl"
    kept = 0
    with data.open("w", encoding="utf-8") as fh:
        for item in items:
            question = latest[item.question_id]
            label = normalise_label(question, str(item.label))
            if label is None:
                continue
            row = {"state": item.decision.state, "question": item.question_id, "label": label}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            kept += 1
    questions = out / "questions.json"
    questions.write_text(json.dumps(latest, ensure_ascii=False, indent=1), encoding="utf-8")
    return data, questions, kept
