"""Saved confidence thresholds: when the engine should not decide by itself.

A threshold is the least calibrated probability (``answer.top_probability()``, the number
routers compare with ``min_confidence``) at which an answer is taken automatically; below
it the answer is *abstained*: it still carries the model's best guess, with
``x_abstained=True``, and a router, selector or graph edge sends it to its default route.

Thresholds are fitted on labelled data by :func:`fit_thresholds`, for a target precision
(the accuracy of the answers kept) or a target coverage (the share of answers kept), at
three levels, each where the data has at least ``min_rows`` labelled answers:

- per question (a choice by its option names; a yes/no or score question by its
  instructions too, since their option names say nothing about them);
- per (question type, option-count bucket), the calibrator's buckets (``choice/b3`` is
  5..8 options);
- per question type.

An answer uses the most specific one that exists. They are saved as ``thresholds.json``
in the model dir (:meth:`Thresholds.save`), loaded by ``DecisionEngine.from_pretrained``;
an engine without them (the packaged default) answers exactly as before, without the
``x_abstained``/``x_threshold`` fields.

Example:
    >>> from clef_engine.schema.questions import Choice
    >>> fit = fit_rows(
    ...     [(Choice(criteria=["a", "b"]), p, p > 0.7) for p in (0.5, 0.6, 0.8, 0.9, 0.95)],
    ...     target_precision=0.95, min_rows=3)
    >>> fit.threshold_for(Choice(criteria=["b", "a"]))
    0.8
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clef_engine.errors import InvalidRequestError, ModelLoadError
from clef_engine.schema.answers import Answer, BoxAnswer, DecisionResult

logger = logging.getLogger(__name__)

THRESHOLDS_FILE = "thresholds.json"
"""Where a model dir keeps its thresholds (beside ``config.json``)."""

FORMAT_VERSION = 1

DEFAULT_MIN_ROWS = 100
"""Labelled answers a question, bucket or type needs before it gets its own threshold: at
95 % precision, 100 rows put one wrong answer at 1 point of precision."""

LEVELS = ("question", "bucket", "type")
"""Lookup order: the most specific threshold fitted wins."""


# -- keys ------------------------------------------------------------------------------


def option_names(question: Any) -> list[str]:
    """The option names of ``question`` (``true``/``false`` for a yes/no question)."""
    return [s.name for s in question.option_specs()]


def bucket(n_options: int) -> int:
    """Option-count bucket, as the calibrator's: ``ceil(log2(n))`` (2 -> 1, 3..4 -> 2, ...)."""
    return max(1, math.ceil(math.log2(max(2, n_options))))


def question_key(question: Any) -> str:
    """A stable key for ``question``: its type and option names (in any order); a yes/no
    or score question adds its instructions, which are what tell two of them apart, and a
    choice with its own ``temperature`` adds it.

    Question ids are not part of it: the same labels asked by a router or by the CLI share
    one threshold.
    """
    qtype = str(question.type)
    parts: list[Any] = [qtype, sorted(option_names(question))]
    if qtype != "choice":
        parts.append(question.instructions_text())
    temperature = getattr(question, "temperature", None)
    if temperature is not None:  # its answers are not those a threshold without it saw
        parts.append({"temperature": temperature})
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    return f"{qtype}:{digest}"


def level_keys(question: Any) -> dict[str, str]:
    """The key of ``question`` at each level (``question``, ``bucket``, ``type``)."""
    qtype = str(question.type)
    n = len(option_names(question))
    return {"question": question_key(question), "bucket": f"{qtype}/b{bucket(n)}", "type": qtype}


def describe(question: Any) -> str:
    """A short human label for a question key (kept in ``thresholds.json`` for readers)."""
    names = option_names(question)
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} options)" if len(names) > 4 else "")
    if str(question.type) == "choice":
        return f"choice [{shown}]"
    text = question.instructions_text()
    return f"{question.type} {text[:60]!r}"


# -- one threshold ---------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """One fitted threshold and what it did on the data it was fitted on."""

    threshold: float
    """Answers whose top probability is below this are abstained."""
    n: int
    """Labelled answers it was fitted on."""
    coverage: float
    """Share of those answers at or above the threshold (decided automatically)."""
    precision: float
    """Accuracy of the answers at or above it (``nan`` when none is)."""
    reachable: bool = True
    """False when no threshold met the target precision (then only certain answers pass)."""


def fit_threshold(
    confidence: Sequence[float],
    correct: Sequence[bool],
    *,
    target_precision: float | None = None,
    target_coverage: float | None = None,
) -> Threshold:
    """The threshold on ``confidence`` for one group of labelled answers.

    With ``target_precision``: the lowest threshold (so the most answers decided) at which
    the answers kept are at least that accurate. With ``target_coverage``: the highest
    threshold that still keeps that share of the answers. Answers equal to the threshold
    are kept.
    """
    _check_target(target_precision, target_coverage)
    if len(confidence) != len(correct) or not confidence:
        raise ValueError("fit_threshold needs as many outcomes as confidences, at least one")
    order = sorted(range(len(confidence)), key=lambda i: -confidence[i])
    values = [float(confidence[i]) for i in order]
    hits = [bool(correct[i]) for i in order]
    n = len(values)
    if target_coverage is not None:
        k = max(1, math.ceil(target_coverage * n - 1e-9))
        t = values[k - 1]
        return _summary(t, values, hits)
    assert target_precision is not None
    best: float | None = None
    right = 0
    for i in range(n):
        right += hits[i]
        # Only where the next answer is lower: ties are kept or dropped together.
        if (i + 1 == n or values[i + 1] < values[i]) and right / (i + 1) >= target_precision:
            best = values[i]
    if best is None:
        kept = _summary(1.0, values, hits)
        return Threshold(1.0, n, kept.coverage, kept.precision, reachable=False)
    return _summary(best, values, hits)


def _summary(t: float, values: Sequence[float], hits: Sequence[bool]) -> Threshold:
    kept = [h for v, h in zip(values, hits, strict=True) if v >= t]
    precision = round(sum(kept) / len(kept), 6) if kept else math.nan
    return Threshold(t, len(values), round(len(kept) / len(values), 6), precision)


def _check_target(target_precision: float | None, target_coverage: float | None) -> None:
    if (target_precision is None) == (target_coverage is None):
        raise InvalidRequestError(
            "give exactly one of target_precision and target_coverage", field="target_precision"
        )
    name = "target_precision" if target_precision is not None else "target_coverage"
    value = target_precision if target_precision is not None else target_coverage
    if not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise InvalidRequestError(
            f"{name} must be a number in (0, 1]; got {value!r}", field=name, limit=1
        )


# -- a set of thresholds ----------------------------------------------------------------


@dataclass
class Thresholds:
    """Fitted thresholds by question, by (type, option-count bucket) and by type.

    Attach them to an engine (``engine.thresholds = fitted``) and every answer they cover
    carries ``x_threshold`` and ``x_abstained``; ``engine.save_pretrained(dir)`` or
    :meth:`save` writes them into a model dir.
    """

    question: dict[str, Threshold] = field(default_factory=dict)
    """By :func:`question_key`."""
    bucket: dict[str, Threshold] = field(default_factory=dict)
    """By ``type/b<bucket>``, e.g. ``choice/b7`` (65..128 options)."""
    type: dict[str, Threshold] = field(default_factory=dict)
    """By question type: ``choice``, ``noul``, ``score``."""
    target: dict[str, float] = field(default_factory=dict)
    """``{"precision": p}`` or ``{"coverage": c}``."""
    names: dict[str, str] = field(default_factory=dict)
    """Per question key, what the question was (for people reading the file)."""
    model_version: str | None = None
    """The model the thresholds were fitted for; another model's answers differ."""
    source: str = ""
    """What they were fitted on."""

    def lookup(self, question: Any) -> tuple[str, Threshold] | None:
        """``(level, threshold)`` for ``question``, the most specific level first."""
        keys = level_keys(question)
        for level in LEVELS:
            found = getattr(self, level).get(keys[level])
            if found is not None:
                return level, found
        return None

    def threshold_for(self, question: Any) -> float | None:
        """The saved threshold for ``question``, or ``None`` when none covers it."""
        found = self.lookup(question)
        return None if found is None else found[1].threshold

    def decided_share(self) -> float | None:
        """Share of the fitting answers decided automatically (the type-level figure, all
        types pooled), or ``None`` when nothing was fitted."""
        groups = list(self.type.values())
        total = sum(t.n for t in groups)
        return sum(t.coverage * t.n for t in groups) / total if total else None

    # -- persistence --

    def to_dict(self) -> dict[str, Any]:
        def dump(group: Mapping[str, Threshold]) -> dict[str, Any]:
            return {k: _finite(asdict(v)) for k, v in sorted(group.items())}

        data: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "target": dict(self.target),
            "question": dump(self.question),
            "bucket": dump(self.bucket),
            "type": dump(self.type),
            "names": dict(sorted(self.names.items())),
            "source": self.source,
        }
        if self.model_version is not None:
            data["model_version"] = self.model_version
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = THRESHOLDS_FILE) -> Thresholds:
        """Read :meth:`to_dict` output; a bad value is a :class:`ModelLoadError` naming it."""

        def bad(name: str, problem: str) -> ModelLoadError:
            return ModelLoadError(f"{where}: field {name!r} {problem}", file=where, field=name)

        if not isinstance(data, dict):
            raise bad("(top level)", "must be a JSON object")
        version = data.get("format_version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise bad("format_version", f"is {version!r}; this clef-agents reads 1")
        groups: dict[str, dict[str, Threshold]] = {}
        for level in LEVELS:
            section = data.get(level, {})
            if not isinstance(section, dict):
                raise bad(level, "must be an object")
            groups[level] = {}
            for key, value in section.items():
                name = f"{level}.{key}"
                if not isinstance(value, dict):
                    raise bad(name, "must be an object")
                t: Any = value.get("threshold")
                if not _is_number(t) or not 0.0 <= t <= 1.0:
                    raise bad(f"{name}.threshold", f"must be a number in [0, 1]; got {t!r}")
                try:
                    groups[level][key] = Threshold(
                        threshold=float(t),
                        n=int(value.get("n", 0)),
                        coverage=float(value.get("coverage", math.nan)),
                        precision=_nan(value.get("precision")),
                        reachable=bool(value.get("reachable", True)),
                    )
                except (TypeError, ValueError) as exc:
                    raise bad(name, f"is not usable ({exc})") from None
        target = data.get("target", {})
        if not isinstance(target, dict):
            raise bad("target", "must be an object")
        model_version = data.get("model_version")
        if model_version is not None and not isinstance(model_version, str):
            raise bad("model_version", "must be a string")
        names = data.get("names", {})
        if not isinstance(names, dict):
            raise bad("names", "must be an object")
        return cls(
            question=groups["question"],
            bucket=groups["bucket"],
            type=groups["type"],
            target={str(k): float(v) for k, v in target.items() if _is_number(v)},
            names={str(k): str(v) for k, v in names.items()},
            model_version=model_version,
            source=str(data.get("source", "")),
        )

    def save(self, directory: str | Path) -> Path:
        """Write ``thresholds.json`` into ``directory`` (a model dir)."""
        path = Path(directory) / THRESHOLDS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Thresholds | None:
        """The thresholds saved in ``directory``, or ``None`` when it has none."""
        path = Path(directory) / THRESHOLDS_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path}: not valid JSON ({exc})", file=str(path)) from None
        return cls.from_dict(data, str(path))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _nan(value: Any) -> float:
    return float(value) if _is_number(value) else math.nan


def _finite(data: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: a precision over no answers is written as null."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()
    }


# -- fitting ----------------------------------------------------------------------------


def fit_rows(
    rows: Iterable[tuple[Any, float, bool]],
    *,
    target_precision: float | None = None,
    target_coverage: float | None = None,
    min_rows: int = DEFAULT_MIN_ROWS,
    model_version: str | None = None,
    source: str = "",
) -> Thresholds:
    """Fit thresholds from ``(question, top probability, correct)`` rows (the math behind
    :func:`fit_thresholds`, for answers you already have).

    Raises:
        InvalidRequestError: No target or two, a target outside (0, 1], ``min_rows < 1``,
            or no question type with ``min_rows`` labelled answers.
    """
    _check_target(target_precision, target_coverage)
    if min_rows < 1:
        raise InvalidRequestError(f"min_rows must be >= 1; got {min_rows}", field="min_rows")
    grouped: dict[str, dict[str, tuple[list[float], list[bool]]]] = {lv: {} for lv in LEVELS}
    names: dict[str, str] = {}
    total = 0
    for question, confidence, correct in rows:
        keys = level_keys(question)
        names.setdefault(keys["question"], describe(question))
        for level in LEVELS:
            conf, hits = grouped[level].setdefault(keys[level], ([], []))
            conf.append(float(confidence))
            hits.append(bool(correct))
        total += 1
    fitted = Thresholds(
        target=(
            {"precision": float(target_precision)}
            if target_precision is not None
            else {"coverage": float(target_coverage)}  # type: ignore[arg-type]
        ),
        model_version=model_version,
        source=source,
    )
    for level in LEVELS:
        for key, (conf, hits) in grouped[level].items():
            if len(conf) >= min_rows:
                getattr(fitted, level)[key] = fit_threshold(
                    conf, hits, target_precision=target_precision, target_coverage=target_coverage
                )
    if not fitted.type:
        raise InvalidRequestError(
            f"{total} labelled answers, and no question type has {min_rows} (min_rows); "
            "label more rows or lower min_rows",
            field="data",
            limit=min_rows,
        )
    fitted.names = {k: v for k, v in names.items() if k in fitted.question}
    return fitted


def answer_correct(answer: Answer, label: int, names: Sequence[str]) -> bool | None:
    """Whether ``answer`` gives option ``label`` (``None`` for a box: nothing to check)."""
    if isinstance(answer, BoxAnswer):
        return None
    if answer.type == "noul":
        return (answer.noul >= 0.5) == (label == 0)  # type: ignore[union-attr]
    if answer.type == "score":
        probs = answer.probabilities  # type: ignore[union-attr]
        return max(probs, key=probs.__getitem__) == names[label]
    return answer.choice == names[label]  # type: ignore[union-attr]


def fit_thresholds(
    engine: Any,
    data: Any,
    *,
    target_precision: float | None = None,
    target_coverage: float | None = None,
    min_rows: int = DEFAULT_MIN_ROWS,
    questions: Mapping[str, Any] | None = None,
    text_col: str | None = None,
    label_col: str | None = None,
    instructions: str | None = None,
    batch_size: int = 64,
) -> Thresholds:
    """Decide every labelled row with ``engine`` and fit thresholds on its answers.

    Fit on held-out data (not the examples or training rows of the model, whose answers
    are more confident than new ones), then attach and save::

        fitted = fit_thresholds(engine, "heldout.csv", target_precision=0.95)
        engine.thresholds = fitted
        engine.save_pretrained("out/model")   # or fitted.save("out/model")

    Args:
        engine: A ``DecisionEngine`` (or anything with ``decide_batch``).
        data: A CSV/JSONL path (the layouts of ``clef_engine.train.load_data``) or a
            loaded ``TrainingSet``.
        target_precision: Keep the most answers whose accuracy is at least this.
        target_coverage: Or keep this share of the answers, the most confident ones.
        min_rows: Labelled answers a question, bucket or type needs for its own threshold.
        questions: ``{id: question}`` for the data (needed for yes/no and score labels).
        text_col: Column of the state (default: ``text``, ``state``, ...).
        label_col: Column of the label (default: ``label``, ``category``, ...).
        instructions: Instructions of the choice inferred from the labels.
        batch_size: States per ``decide_batch`` call.

    Returns:
        The fitted :class:`Thresholds` (the engine is left unchanged).
    """
    _check_target(target_precision, target_coverage)
    if isinstance(data, str | Path):
        from clef_engine.train.data import load_data

        data = load_data(
            data,
            questions=questions,
            text_col=text_col,
            label_col=label_col,
            instructions=instructions,
            strict_labels=questions is not None,
        )
    names = {q: option_names(v) for q, v in data.questions.items()}
    rows: list[tuple[Any, float, bool]] = []
    examples = list(data.examples)
    for start in range(0, len(examples), max(1, batch_size)):
        chunk = examples[start : start + batch_size]
        results = engine.decide_batch(
            [
                {"state": ex.state, "questions": {q: data.questions[q] for q in ex.labels}}
                for ex in chunk
            ]
        )
        for ex, result in zip(chunk, results, strict=True):
            for qid, label in ex.labels.items():
                answer = result.answers[qid]
                correct = answer_correct(answer, label, names[qid])
                if correct is not None:
                    rows.append((data.questions[qid], answer.top_probability(), correct))
    return fit_rows(
        rows,
        target_precision=target_precision,
        target_coverage=target_coverage,
        min_rows=min_rows,
        model_version=getattr(engine, "model_version", None),
        source=f"{getattr(data, 'source', '') or 'data'} ({len(rows)} labelled answers)",
    )


# -- using them -----------------------------------------------------------------------------


def attach(engine: Any, directory: str | Path) -> None:
    """Load ``directory``'s thresholds onto ``engine`` (``None`` when it has none); warn
    when they were fitted for another model version."""
    loaded = Thresholds.load(directory)
    engine.thresholds = loaded
    if loaded is not None and loaded.model_version not in (None, engine.model_version):
        logger.warning(
            "%s was fitted for %s, not %s (recalibrated or retrained?): fit the thresholds "
            "again with `clef-agents thresholds`",
            Path(directory) / THRESHOLDS_FILE,
            loaded.model_version,
            engine.model_version,
        )


def save_into(engine: Any, directory: str | Path) -> None:
    """Write ``engine.thresholds`` into ``directory``, or remove a stale file when it has
    none (the thresholds of the model that was saved there before)."""
    fitted = getattr(engine, "thresholds", None)
    if fitted is not None:
        fitted.save(directory)
    else:
        (Path(directory) / THRESHOLDS_FILE).unlink(missing_ok=True)


def annotate(
    thresholds: Thresholds | None,
    questions: Mapping[str, Any],
    answers: Mapping[str, Answer],
) -> None:
    """Set ``x_threshold`` and ``x_abstained`` on each answer a threshold covers."""
    if thresholds is None:
        return
    for qid, answer in answers.items():
        question = questions.get(qid)
        if question is None or isinstance(answer, BoxAnswer):
            continue
        t = thresholds.threshold_for(question)
        if t is not None:
            answer.x_threshold = t
            answer.x_abstained = answer.top_probability() < t


def finish(engine: Any, requests: Sequence[Any], results: Sequence[DecisionResult]) -> None:
    """What happens to an engine's answers after scoring, in place: the out-of-scope margin
    of questions with ``none_of_these`` (:mod:`clef_engine.runtime.none_of_these`), then the
    saved thresholds. Called once per batch by the engine (and by ``FakeEngine``)."""
    from clef_engine.runtime.none_of_these import apply_margins

    thresholds = getattr(engine, "thresholds", None)
    for request, result in zip(requests, results, strict=True):
        if apply_margins(request.questions, result.answers):
            result.x_top_probability = {q: a.top_probability() for q, a in result.answers.items()}
        annotate(thresholds, request.questions, result.answers)
