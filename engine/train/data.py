"""Labelled decisions for training and calibration: CSV or JSONL, one or several questions.

Two layouts:

- **one question**: columns ``text`` and ``label`` (names configurable). The question is
  a ``choice`` over the labels found in the training data unless one is given.
- **several questions**: columns ``state``, ``question`` (an id) and ``label``; the
  questions come from a JSON mapping ``{id: question}`` (wire format) or, when absent,
  each id becomes a ``choice`` over its labels. Rows with the same state are merged, so
  the backbone reads each state once per step, whatever the number of questions.

Labels are option names for ``choice``, ``true``/``false`` (also yes/no, 1/0) for
``noul``, and a level index or the level's text for ``score``.

Example:
    >>> ts = load_training_data("train.csv", label_col="category")  # columns text,category
    >>> len(ts), list(ts.questions), len(ts.names("category"))
    (770, ['category'], 77)
    >>> ts.questions["category"].type, ts.names("category")[:2]  # options in sorted order
    ('choice', ['Refund_not_showing_up', 'activate_my_card'])
    >>> ts.examples[0]  # labels are option indices
    Example(state='Can you track my card for me?', labels={'category': 12})
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.questions import Choice, Noul, Score, _Question
from clef_engine.schema.render import render_value
from clef_engine.schema.request import questions_from

TEXT_COLUMNS = ("text", "state", "utterance", "sentence")
LABEL_COLUMNS = ("label", "category", "intent", "answer")
QUESTION_COLUMN = "question"
DEFAULT_INSTRUCTIONS = "Which label fits the text?"
_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


class TrainingDataError(InvalidRequestError):
    """Training or evaluation data that cannot be used (names the file, row and column)."""

    error_type = "training_data_error"


@dataclass
class Example:
    """One state and the labels (option indices) of the questions asked about it."""

    state: str
    labels: dict[str, int] = field(default_factory=dict)


@dataclass
class TrainingSet:
    """Questions plus labelled states."""

    questions: dict[str, _Question]
    examples: list[Example]
    source: str = ""

    def __len__(self) -> int:
        return len(self.examples)

    def names(self, qid: str) -> list[str]:
        return [s.name for s in self.questions[qid].option_specs()]

    def digest(self) -> str:
        """A hash of the questions' option names and of every state with its labels, in
        order: what a checkpoint must have been trained on for ``resume`` to continue it."""
        h = hashlib.sha256(json.dumps({q: self.names(q) for q in sorted(self.questions)}).encode())
        for ex in self.examples:
            h.update(json.dumps([ex.state, sorted(ex.labels.items())]).encode())
        return h.hexdigest()[:16]

    def subset(self, indices: Sequence[int]) -> TrainingSet:
        return TrainingSet(self.questions, [self.examples[i] for i in indices], self.source)

    def only(self, qid: str) -> TrainingSet:
        """The states labelled for question ``qid``, each with that one label."""
        examples = [
            Example(ex.state, {qid: ex.labels[qid]}) for ex in self.examples if qid in ex.labels
        ]
        return TrainingSet({qid: self.questions[qid]}, examples, self.source)

    def pairs(self) -> list[tuple[int, str, int]]:
        """``(example index, question id, label)`` for every label."""
        return [(i, q, y) for i, ex in enumerate(self.examples) for q, y in ex.labels.items()]


# -- reading ---------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV (header line) or JSONL/JSON file, as dicts."""
    p = Path(path)
    if not p.is_file():
        raise TrainingDataError(f"{p}: no such file", field="data")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainingDataError(f"{p}: cannot read ({exc})", field="data") from None
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainingDataError(
                    f"{p}: line {n} is not valid JSON ({exc.msg})", field=f"data.rows[{n}]"
                ) from None
            if not isinstance(row, dict):
                raise TrainingDataError(
                    f"{p}: line {n} is not a JSON object", field=f"data.rows[{n}]"
                )
            rows.append(row)
        return rows
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TrainingDataError(
                f"{p}: not valid JSON (line {exc.lineno}: {exc.msg})", field="data"
            ) from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise TrainingDataError(f"{p}: expected a JSON array of objects", field="data")
        return data
    return list(csv.DictReader(text.splitlines()))


def _column(
    rows: list[dict[str, Any]],
    wanted: str | None,
    candidates: Sequence[str],
    what: str,
    source: str,
) -> str:
    columns = list(rows[0])
    if wanted is not None:
        if wanted not in columns:
            raise TrainingDataError(
                f"{source}: no {what} column {wanted!r}; columns are {columns}",
                field=f"data.{wanted}",
            )
        return wanted
    for name in candidates:
        if name in columns:
            return name
    raise TrainingDataError(
        f"{source}: cannot find the {what} column (tried {list(candidates)}); columns are "
        f"{columns}; name it with --{what}-col",
        field=f"data.{what}",
    )


def label_index(question: _Question, label: Any) -> int | None:
    """Option index of ``label`` for ``question``, or ``None`` when it is not an option."""
    text = str(label).strip()
    if isinstance(question, Noul):
        low = text.lower()
        return 0 if low in _TRUE else 1 if low in _FALSE else None
    names = [s.name for s in question.option_specs()]
    if isinstance(question, Score):
        if text.isdigit() and int(text) < len(names):
            return int(text)
        legend = list(question.legend().values())
        return legend.index(text) if text in legend else None
    return names.index(text) if text in names else None


def load_data(
    path: str | Path,
    *,
    questions: Mapping[str, Any] | None = None,
    text_col: str | None = None,
    label_col: str | None = None,
    question_col: str = QUESTION_COLUMN,
    instructions: str | None = None,
    strict_labels: bool = False,
) -> TrainingSet:
    """Read labelled data from ``path``.

    Args:
        path: CSV (with a header) or JSONL file.
        questions: ``{id: question}`` (objects or wire dicts). Needed for ``noul`` and
            ``score``; without it each question is a ``choice`` over its labels.
        text_col: Column of the state (default: the first of ``text``, ``state``, ...).
        label_col: Column of the label (default: ``label``, ``category``, ...).
        question_col: Column of the question id (several questions per file).
        instructions: Instructions of inferred ``choice`` questions.
        strict_labels: Labels that are not options are an error (evaluation data) rather
            than new options (training data without ``questions``).

    Raises:
        TrainingDataError: The file is missing or empty, a column is missing, a label is
            not an option of its question, or a question has fewer than two labels.
    """
    source = str(path)
    rows = read_rows(path)
    if not rows:
        raise TrainingDataError(f"{source}: no labelled rows", field="data")
    tcol = _column(rows, text_col, TEXT_COLUMNS, "text", source)
    lcol = _column(rows, label_col, LABEL_COLUMNS, "label", source)
    multi = question_col in rows[0]
    given = {k: v for k, v in questions_from(questions).items()} if questions else {}
    triples = _labelled_rows(rows, source, (tcol, lcol, question_col), multi, given)
    built, asked = _build_questions(
        triples, given, source, lcol, instructions=instructions, strict_labels=strict_labels
    )
    examples = _merge_states(triples, built, source, lcol)
    if not strict_labels:
        for qid in asked:
            if len({ex.labels[qid] for ex in examples if qid in ex.labels}) < 2:
                raise TrainingDataError(
                    f"{source}: question {qid!r} has only one distinct label; "
                    "training needs at least 2",
                    field=f"data.{lcol}",
                )
    return TrainingSet(built, examples, source)


def _labelled_rows(
    rows: list[dict[str, Any]],
    source: str,
    columns: tuple[str, str, str],
    multi: bool,
    given: Mapping[str, _Question],
) -> list[tuple[str, str, str]]:
    """``(state, question id, label)`` of every row, the state rendered to text; refuses
    an empty state or label and a question id that is not among the ``given`` questions
    (in a one-question file, the one given question takes the labels)."""
    tcol, lcol, question_col = columns
    triples: list[tuple[str, str, str]] = []
    for n, row in enumerate(rows, start=1):
        state, label = row.get(tcol), row.get(lcol)
        if state is None or (isinstance(state, str) and not state.strip()):
            raise TrainingDataError(
                f"{source}: row {n} has an empty {tcol!r}", field=f"data.rows[{n}].{tcol}"
            )
        if label is None or str(label).strip() == "":
            raise TrainingDataError(
                f"{source}: row {n} has an empty {lcol!r}", field=f"data.rows[{n}].{lcol}"
            )
        qid = str(row[question_col]) if multi else lcol
        if given and qid not in given:
            if not multi and len(given) == 1:
                qid = next(iter(given))
            else:
                raise TrainingDataError(
                    f"{source}: row {n} names question {qid!r}, which is not among {sorted(given)}",
                    field=f"data.rows[{n}].{question_col}",
                )
        triples.append((render_value(state, f"data.rows[{n}].{tcol}"), qid, str(label).strip()))
    return triples


def _build_questions(
    triples: list[tuple[str, str, str]],
    given: Mapping[str, _Question],
    source: str,
    lcol: str,
    *,
    instructions: str | None,
    strict_labels: bool,
) -> tuple[dict[str, _Question], list[str]]:
    """The ``given`` questions plus a ``choice`` over its labels (sorted) for each question
    id in ``triples`` without one, unless ``strict_labels``. Returns them and the ids the
    rows ask, in order of first appearance."""
    built: dict[str, _Question] = dict(given)
    seen: dict[str, list[str]] = {}
    for _, qid, label in triples:
        seen.setdefault(qid, [])
        if label not in seen[qid]:
            seen[qid].append(label)
    for qid, labels in seen.items():
        if qid not in built:
            if strict_labels:
                raise TrainingDataError(
                    f"{source}: question {qid!r} is not defined", field="questions"
                )
            if len(labels) < 2:
                raise TrainingDataError(
                    f"{source}: question {qid!r} has only one label ({labels[0]!r}); "
                    "training needs at least 2 distinct labels",
                    field=f"data.{lcol}",
                )
            built[qid] = Choice(
                instructions=instructions or DEFAULT_INSTRUCTIONS,
                criteria=dict.fromkeys(sorted(labels)),
            )
    return built, list(seen)


def _merge_states(
    triples: list[tuple[str, str, str]],
    built: Mapping[str, _Question],
    source: str,
    lcol: str,
) -> list[Example]:
    """One :class:`Example` per distinct state (in order of first appearance) with the
    option index of each of its labels; refuses a label that is not an option."""
    by_state: dict[str, Example] = {}
    for n, (state, qid, label) in enumerate(triples, start=1):
        index = label_index(built[qid], label)
        if index is None:
            names = [s.name for s in built[qid].option_specs()]
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise TrainingDataError(
                f"{source}: row {n}: label {label!r} is not an option of question {qid!r} "
                f"(options: {shown})",
                field=f"data.rows[{n}].{lcol}",
            )
        by_state.setdefault(state, Example(state)).labels[qid] = index
    return list(by_state.values())


def load_unlabeled(path: str | Path, *, text_col: str | None = None) -> list[str]:
    """States without labels (one per row) from a CSV or JSONL file, for pseudo-labelling.

    The state column is ``text_col`` or the first of ``text``, ``state``, ... found; other
    columns (a label column too) are ignored. Repeated states are kept once.

    Raises:
        TrainingDataError: The file is missing or has no rows, the column is missing, or a
            row's state is empty (the error names the row).
    """
    source = str(path)
    try:
        rows = read_rows(path)
        if not rows:
            raise TrainingDataError(f"{source}: no unlabelled rows", field="unlabeled")
        tcol = _column(rows, text_col, TEXT_COLUMNS, "text", source)
    except TrainingDataError as exc:  # name the unlabelled file's field, not the data's
        field = (exc.field or "data").replace("data", "unlabeled", 1)
        raise TrainingDataError(exc.message, field=field) from None
    states: dict[str, None] = {}
    for n, row in enumerate(rows, start=1):
        state = row.get(tcol)
        if state is None or (isinstance(state, str) and not state.strip()):
            raise TrainingDataError(
                f"{source}: row {n} has an empty {tcol!r}", field=f"unlabeled.rows[{n}].{tcol}"
            )
        states[render_value(state, f"unlabeled.rows[{n}].{tcol}")] = None
    return list(states)


def load_training_data(path: str | Path, **kwargs: Any) -> TrainingSet:
    """:func:`load_data` for training (labels may define the options)."""
    return load_data(path, **kwargs)


def load_eval_data(path: str | Path, questions: Mapping[str, Any], **kwargs: Any) -> TrainingSet:
    """:func:`load_data` for evaluation: every label must be an option of a known question."""
    return load_data(path, questions=questions, strict_labels=True, **kwargs)


# -- sampling and splits ----------------------------------------------------------------


def _stratum(ex: Example) -> tuple[str, int]:
    qid = sorted(ex.labels)[0]
    return qid, ex.labels[qid]


def sample_per_label(data: TrainingSet, k: int, *, seed: int = 0) -> TrainingSet:
    """At most ``k`` examples per (question, label), drawn with ``seed``."""
    if k < 1:
        raise TrainingDataError(
            f"examples per label must be at least 1; got {k}", field="examples_per_label"
        )
    rng = random.Random(seed)
    strata: dict[tuple[str, int], list[int]] = {}
    for i, ex in enumerate(data.examples):
        strata.setdefault(_stratum(ex), []).append(i)
    keep: list[int] = []
    for key in sorted(strata):
        idx = strata[key]
        keep.extend(rng.sample(idx, min(k, len(idx))))
    return data.subset(sorted(keep))


def split(
    data: TrainingSet,
    fraction: float,
    *,
    seed: int = 0,
    base_seed: int | None = None,
    shared: float = 1.0,
) -> tuple[TrainingSet, TrainingSet]:
    """Stratified ``(train, validation)`` split; a label with one example stays in train.

    ``base_seed`` and ``shared`` (see :func:`split_indices`) carve a split that shares part
    of another seed's (the ensemble splits measured in ``docs/finetune.md``, "Ensembles")."""
    train, val = split_indices(data, fraction, seed=seed, base_seed=base_seed, shared=shared)
    return data.subset(train), data.subset(val)


def split_indices(
    data: TrainingSet,
    fraction: float,
    *,
    seed: int = 0,
    base_seed: int | None = None,
    shared: float = 1.0,
) -> tuple[list[int], list[int]]:
    """The example indices of :func:`split`'s ``(train, validation)``, each sorted.

    Per stratum (question and label) the split of ``base_seed`` (default ``seed``) holds
    out ``fraction`` of the states. With ``shared < 1`` and a ``base_seed`` other than
    ``seed``, only the first ``ceil(shared * n)`` of those ``n`` states are kept (the
    *shared* part: the same for every ``seed``); the rest of the ``n`` are drawn with
    ``seed`` from the stratum's other states. So the splits of several seeds on one
    ``base_seed`` hold out as many states each, all share the shared part, and differ in
    the rest. The split of ``seed == base_seed``, or of any seed with ``shared=0``, is the
    plain split of ``seed``.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1); got {fraction}")
    if not 0.0 <= shared <= 1.0:
        raise ValueError(f"shared must be in [0, 1]; got {shared}")
    base = random.Random(seed if base_seed is None else base_seed)
    own = random.Random(seed)
    mixed = base_seed is not None and base_seed != seed and shared < 1.0
    strata: dict[tuple[str, int], list[int]] = {}
    for i, ex in enumerate(data.examples):
        strata.setdefault(_stratum(ex), []).append(i)
    val: list[int] = []
    for key in sorted(strata):
        idx = list(strata[key])
        base.shuffle(idx)
        take = round(fraction * len(idx))
        if fraction > 0 and len(idx) >= 2:
            take = max(1, take)
        take = min(take, len(idx) - 1)
        if mixed:
            kept = idx[: math.ceil(round(shared * take, 9))]  # 0.07 * 100: 7, not 8
            chosen = set(kept)
            rest = [i for i in strata[key] if i not in chosen]
            own.shuffle(rest)  # with shared=0: the plain split of seed
            idx = kept + rest
        val.extend(idx[:take])
    val_set = set(val)
    train = [i for i in range(len(data.examples)) if i not in val_set]
    return train, sorted(val)
