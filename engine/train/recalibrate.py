"""Calibrate a model dir on held-out labelled data: :func:`calibrate`.

What ``clef-agents calibrate`` runs, as a library call (the notebook calls it too): the
model answers every labelled question with its calibration and example memory off, a
temperature per (question type, option-count bucket) (and optionally histogram binning)
is fitted on those answers on top of the model's own calibration, a model with an example
memory gets the memory's mixture settings chosen again on the same rows, and the result is
saved into the model dir (or a new one).

Example:
    >>> from clef_engine.train import calibrate
    >>> report = calibrate("out/tickets", "heldout.csv", label_col="category")
    >>> report.labels, report.saved
    (48, 'out/tickets')
    >>> report.after["ece"] <= report.before["ece"]
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from clef_engine.calibration import Calibrator, fit_calibrator
from clef_engine.errors import InvalidRequestError
from clef_engine.heads.memory import MEMORY_FILE
from clef_engine.runtime import model_dir
from clef_engine.runtime.engine import DecisionEngine
from clef_engine.train.data import TrainingDataError, TrainingSet, load_data


@dataclass
class CalibrationReport:
    """What :func:`calibrate` measured and where it saved the calibration."""

    labels: int
    """Labelled (state, question) pairs the calibration was fitted on."""
    before: dict[str, float]
    """ECE, NLL and Brier score of the model's answers with its previous calibration."""
    after: dict[str, float]
    """The same with the fitted one (on the same rows: a fit, not a held-out score)."""
    temperatures: dict[str, float]
    histograms: list[str]
    memory: dict[str, dict[str, float]] | None = None
    """Per question id, the example memory's refit (models with a memory)."""
    diagrams: list[str] | None = None
    """The reliability diagrams written (``plot=``): before, after."""
    saved: str | None = None
    """The model dir written; ``None`` with ``dry_run``."""
    probabilities: dict[str, list[list[float]]] = field(default_factory=dict, repr=False)
    """``{"before": ..., "after": ...}``: each row's probabilities (for plots)."""
    targets: list[int] = field(default_factory=list, repr=False)
    """Each row's label (an option index)."""

    def to_dict(self) -> dict[str, Any]:
        """The report as ``clef-agents calibrate`` prints it (without the rows)."""
        out = asdict(self)
        for key in ("probabilities", "targets"):
            out.pop(key)
        return {k: v for k, v in out.items() if v is not None}


def calibrate(
    model: str | Path,
    data: str | Path | TrainingSet,
    *,
    questions: dict[str, Any] | None = None,
    text_col: str | None = None,
    label_col: str | None = None,
    instructions: str | None = None,
    histogram: bool = False,
    bins: int = 15,
    out: str | Path | None = None,
    dry_run: bool = False,
    plot: str | Path | None = None,
    device: str = "auto",
    source: str | None = None,
) -> CalibrationReport:
    """Fit the calibration of the model dir ``model`` on held-out labelled ``data`` and save it.

    Args:
        model: A model dir (``finetune`` / ``save_pretrained``), or a bare Hugging Face
            encoder dir (then ``out`` or ``dry_run`` is needed).
        data: CSV or JSONL (as ``clef-agents finetune`` reads it) or a loaded
            :class:`~clef_engine.train.TrainingSet`; not the test set.
        questions: ``{id: question}`` for state,question,label data; by default the
            questions the model was trained on.
        text_col, label_col, instructions: As for the training data.
        histogram, bins: Also fit histogram binning with ``bins`` bins (kept where a 5-fold
            check lowers ECE).
        out: Write a new model dir there instead of updating ``model``.
        dry_run: Measure and fit, save nothing.
        plot: Write ``<plot>-before.png`` and ``<plot>-after.png`` reliability diagrams
            (the widest option count; the ``[eval]`` extra).
        device: ``auto``, ``cpu``, ``cuda``, ``mps``.
        source: Where the calibration says it came from (default ``calibrate``).

    Raises:
        InvalidRequestError: A bare Hugging Face dir without ``out`` or ``dry_run``, or an
            ``out`` that is a file (``field`` names it).
        TrainingDataError: Unusable data, or no labelled question calibration can fit.
    """
    directory = Path(model)
    _check_target(directory, out, dry_run)
    engine = DecisionEngine.from_pretrained(directory, device=device)
    name = str(data) if not isinstance(data, TrainingSet) else data.source or "labelled data"
    if not isinstance(data, TrainingSet):
        asked = questions if questions is not None else trained_questions(engine, instructions)
        columns = {"text_col": text_col, "label_col": label_col, "instructions": instructions}
        data = load_data(data, questions=asked, strict_labels=asked is not None, **columns)
    memory = getattr(engine.head, "memory", None)
    old = engine.calibrator
    logits, labels, types, rows = _raw_answers(engine, data)
    if not logits:
        raise TrainingDataError(f"{name}: no labelled questions that calibration can fit")
    new = fit_calibrator(
        logits,
        labels,
        types,
        histogram=histogram,
        n_bins=bins,
        base=old,
        source=f"{source or 'calibrate'} on {name} ({len(labels)} labels)",
    )
    before, after = (_probabilities(c, logits, types) for c in (old, new))
    report = CalibrationReport(
        labels=len(labels),
        before=_metrics(before, labels),
        after=_metrics(after, labels),
        temperatures=new.to_dict()["temperatures"],
        histograms=sorted(new.histograms),
        probabilities={"before": before, "after": after},
        targets=labels,
    )
    if memory is not None:
        report.memory = _refit_memory(engine, memory, data, rows, before, after, labels)
        engine.head.memory = memory if memory.questions else None  # type: ignore[attr-defined]
    report.diagrams = None if plot is None else _plot(report, plot)
    if not dry_run:
        engine.calibrator = new
        report.saved = str(_save(engine, directory, new, memory, out))
    return report


def _check_target(directory: Path, out: str | Path | None, dry_run: bool) -> None:
    """Refuse, before any work, an ``out`` that is a file and a bare Hugging Face dir that
    would be overwritten (it has no clef-agents config to hold a calibration)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise InvalidRequestError(f"{out}: is a file; name a directory", field="out")
    ours = model_dir.read_config(directory).get("format") == model_dir.FORMAT
    if not ours and out is None and not dry_run:
        raise InvalidRequestError(
            f"{directory} is a bare Hugging Face model dir; pass out=DIR to write a "
            "clef-agents model dir with the fitted calibration",
            field="out",
        )


def _raw_answers(
    engine: DecisionEngine, data: TrainingSet
) -> tuple[list[torch.Tensor], list[int], list[str], list[tuple[str, str]]]:
    """The model's answers with no calibration and no memory, as log-probabilities, with
    each row's label, question type and (question id, state). The engine is put back."""
    trained = hasattr(engine.head, "module")
    memory = getattr(engine.head, "memory", None)
    old = engine.calibrator
    engine.calibrator = Calibrator(source="identity")
    if memory is not None:
        engine.head.memory = None  # type: ignore[attr-defined]  # the head alone
    logits: list[torch.Tensor] = []
    labels: list[int] = []
    types: list[str] = []
    rows: list[tuple[str, str]] = []
    examples = [ex for ex in data.examples if ex.labels]  # a state no question is asked of
    try:
        for start in range(0, len(examples), 256):
            chunk = examples[start : start + 256]
            requests = [
                {"state": ex.state, "questions": {q: data.questions[q] for q in ex.labels}}
                for ex in chunk
            ]
            for ex, result in zip(chunk, engine.decide_batch(requests), strict=True):
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
                    rows.append((qid, ex.state))
    finally:
        engine.calibrator = old
        if memory is not None:
            engine.head.memory = memory  # type: ignore[attr-defined]
    return logits, labels, types, rows


def _probabilities(
    calibrator: Calibrator, logits: list[torch.Tensor], types: list[str]
) -> list[list[float]]:
    """Each row's probabilities under ``calibrator``, as the engine applies it."""
    out = []
    for row, qtype in zip(logits, types, strict=True):
        n = row.numel()
        scaled = torch.softmax(calibrator.scale(row, qtype, n), -1)
        out.append(calibrator.adjust(scaled, qtype, n).tolist())
    return out


def _save(
    engine: DecisionEngine,
    directory: Path,
    calibration: Calibrator,
    memory: Any,
    out: str | Path | None,
) -> Path:
    """Write the calibration (and the refitted memory) into ``out``, a new model dir, or
    into ``directory``'s ``config.json`` and ``memory.safetensors``."""
    if out is not None:
        engine.save_pretrained(out)
        return Path(out)
    config = model_dir.read_config(directory)
    config["calibration"] = calibration.to_dict()
    if memory is not None:
        config["head"].pop("memory", None)
        if memory.questions:
            config["head"]["memory"] = memory.save(directory)
        else:  # no question kept its memory
            (directory / MEMORY_FILE).unlink(missing_ok=True)
    (directory / model_dir.CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def _plot(report: CalibrationReport, plot: str | Path) -> list[str]:
    """Reliability diagrams before and after, for the rows of the widest option count."""
    import numpy as np

    from clef_engine.calibration import reliability_diagram

    before, after = report.probabilities["before"], report.probabilities["after"]
    width = max(len(r) for r in before)
    rows = [i for i, r in enumerate(before) if len(r) == width]
    stem = str(Path(plot).with_suffix(""))
    written = []
    for name, probs in (("before", before), ("after", after)):
        path = f"{stem}-{name}.png"
        reliability_diagram(
            np.array([probs[i] for i in rows]),
            np.array([report.targets[i] for i in rows]),
            path,
            title=f"{name} calibration",
        )
        written.append(path)
    return written


def trained_questions(engine: DecisionEngine, instructions: str | None) -> dict[str, Any] | None:
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
    """ECE, NLL and Brier score, averaged over option counts weighted by their rows."""
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
    engine: DecisionEngine,
    memory: Any,
    data: TrainingSet,
    rows: list[tuple[str, str]],
    before: list[list[float]],
    after: list[list[float]],
    labels: list[int],
) -> dict[str, dict[str, float]]:
    """:func:`clef_engine.heads.memory.refit_memory` on the held-out rows, by question id."""
    from clef_engine.heads.memory import refit_memory
    from clef_engine.heads.option_evidence import fingerprint, question_context

    names = {q: [s.name for s in v.option_specs()] for q, v in data.questions.items()}  # type: ignore[attr-defined]
    types = {q: str(v.type) for q, v in data.questions.items()}  # type: ignore[attr-defined]
    contexts = {q: question_context(v) for q, v in data.questions.items()}
    table = [
        (types[qid], contexts[qid], names[qid], state, after[i], before[i], labels[i])
        for i, (qid, state) in enumerate(rows)
    ]

    def encode(states: list[str]) -> Any:
        return engine.backbone.encode(states).pooled.float()

    reports = refit_memory(memory, table, encode)
    by_id = {q: fingerprint(types[q], names[q], contexts[q]) for q in data.questions}
    return {q: reports[fp] for q, fp in by_id.items() if fp in reports}
