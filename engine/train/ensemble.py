"""An ensemble of fine-tuning runs as one model dir (``TrainConfig.ensemble``).

Runs of the same recipe from different starts disagree on the hard cases; the mean of
their calibrated answers is right more often than the average member (BANKING77 numbers in
``docs/finetune.md``, "Ensembles").

:func:`fit_ensemble` trains ``ensemble`` runs with seeds ``seed``, ``seed + 1``, ... (each
its own initialisation, batch order and dropout). Member i holds out the validation split
of its own seed and is the single run of ``seed + i``: a whole model dir under
``members/<i>`` with its own temperature and example memory, chosen on its own split.

The engine answers with the mean of the members' calibrated answers; the mean gets no
temperature of its own (each member chose its temperature and memory on its split, so a
fit on those states is biased, and on BANKING77 it raised test ECE in 12 of the 15
ensembles measured; ``docs/finetune.md``, "Ensembles"). That mean is scored on the states
that every member held out (calibrated, with the memory chosen there, before the split's
states join it), where there are any: ``training.json``'s ``validation``.

Layout::

    config.json        {"format": "clef-agents", "ensemble": ["members/0", "members/1"],
                        "calibration": {...}}
    training.json      the ensemble's validation metrics and each member's report
    members/0/ ...     a model dir as :class:`~clef_engine.train.trainer.Trainer` writes it

``DecisionEngine.from_pretrained`` loads it (:mod:`clef_engine.heads.ensemble`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from clef_engine.backbones import PACKAGED
from clef_engine.calibration.temperature import Calibrator
from clef_engine.runtime.model_dir import CONFIG, ENSEMBLE_DIR, FORMAT, FORMAT_VERSION
from clef_engine.train.checkpoint import CHECKPOINT_DIR
from clef_engine.train.config import TrainConfig, TrainResult
from clef_engine.train.data import TrainingSet, split_indices
from clef_engine.train.forward import _ece_after

log = logging.getLogger(__name__)

HELD_OUT = "held_out.pt"
"""In each finished member's checkpoint folder: its answers on its validation split, so
that ``resume=True`` does not train a finished member again."""


class MemberTrainer(Protocol):
    """What trains one member (a :class:`~clef_engine.train.trainer.Trainer`)."""

    held_out: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """After :meth:`fit`: its calibrated answers and labels on its validation split."""

    def fit(
        self,
        data: TrainingSet,
        out: str | Path,
        *,
        resume: bool = False,
        unlabeled: Sequence[str] | None = None,
    ) -> TrainResult:
        """Train on ``data`` and write a model dir to ``out``."""
        ...


def fit_ensemble(
    cfg: TrainConfig,
    data: TrainingSet,
    out: Path,
    *,
    make_member: Callable[[TrainConfig], MemberTrainer],
    resume: bool = False,
    unlabeled: Sequence[str] | None = None,
) -> TrainResult:
    """Train ``cfg.ensemble`` members into ``out/members/<i>``, score their mean
    on the states all of them held out and write ``out/config.json``; see the module
    docstring. ``make_member`` builds the trainer of one member from its config (the
    trainer passes itself, so that this module does not import it).

    With ``resume=True`` a member that finished with the same recipe on the same states
    (and unlabelled states) is kept, and an interrupted one continues from its checkpoint.
    """
    started = time.perf_counter()
    member_configs = [
        replace(cfg, ensemble=1, seed=cfg.seed + i, model_name=None) for i in range(cfg.ensemble)
    ]
    # Each member's validation split, as its trainer carves it; the mean is scored on the
    # states all of them hold out.
    splits = [split_indices(data, cfg.val_fraction, seed=m.seed)[1] for m in member_configs]
    keys = [_row_keys(data, rows) for rows in splits]
    members: list[TrainResult] = []
    held: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for i, member_cfg in enumerate(member_configs):
        answers, result = _fit_member(
            i, member_cfg, data, out, make_member=make_member, resume=resume, unlabeled=unlabeled
        )
        held.append(answers)
        members.append(result)

    calibration, validation = _score_mean(held, data, members, keys=keys)
    _write_config(cfg, out, calibration)
    seconds = time.perf_counter() - started
    _write_report(cfg, data, out, members, validation, seconds)
    shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
    history = [{**h, "member": float(i)} for i, m in enumerate(members) for h in m.history]
    return TrainResult(
        out,
        history,
        members[0].best_epoch,
        validation,
        seconds,
        members[0].memory,
        members=members,
    )


def _fit_member(
    i: int,
    member_cfg: TrainConfig,
    data: TrainingSet,
    out: Path,
    *,
    make_member: Callable[[TrainConfig], MemberTrainer],
    resume: bool,
    unlabeled: Sequence[str] | None,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], TrainResult]:
    """Member ``i`` into ``out/members/<i>``: its answers on its validation split and its
    result. With ``resume``, a member that finished with the same recipe (config, states
    and unlabelled states) is kept as it is; otherwise it is trained (continuing from its
    checkpoint, if any) and its answers are saved in the checkpoint folder."""
    directory = out / ENSEMBLE_DIR / str(i)
    saved = out / CHECKPOINT_DIR / f"member{i}" / HELD_OUT
    # What a kept member must have been trained with: this recipe, on these states.
    recipe = json.dumps(
        {
            "config": asdict(member_cfg),
            "states": len(data),
            "data": data.digest(),
            "unlabeled": _texts_digest(unlabeled),
        },
        sort_keys=True,
        default=str,
    )
    if resume and saved.is_file() and (directory / "training.json").is_file():
        kept = torch.load(saved, weights_only=True)
        if kept.get("recipe") == recipe:
            answers = {fp: (p, y) for fp, (p, y) in kept["held_out"].items()}
            return answers, TrainResult(directory, **kept["result"])
        log.warning("ensemble member %d was trained with another recipe; training it again", i)
    member = make_member(member_cfg)
    result = member.fit(data, directory, resume=resume, unlabeled=unlabeled)
    if not member.held_out:
        raise RuntimeError(f"ensemble member {i} kept no answers on the validation split")
    report = {
        "history": result.history,
        "best_epoch": result.best_epoch,
        "validation": result.validation,
        "seconds": result.seconds,
        "memory": result.memory,
    }
    saved.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "held_out": member.held_out,
            "result": report,
            "recipe": recipe,
        },
        saved,
    )
    answers = member.held_out
    del member  # one member's model in memory at a time
    gc.collect()
    return answers, result


def _write_config(cfg: TrainConfig, out: Path, calibration: Calibrator) -> None:
    """``out/config.json``: the members' directories and the ensemble's calibration."""
    config: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "ensemble": [f"{ENSEMBLE_DIR}/{i}" for i in range(cfg.ensemble)],
        "calibration": calibration.to_dict(),
    }
    if cfg.model_name:
        config["model_name"] = cfg.model_name
    (out / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_report(
    cfg: TrainConfig,
    data: TrainingSet,
    out: Path,
    members: list[TrainResult],
    validation: dict[str, float],
    seconds: float,
) -> None:
    """``out/training.json``: the ensemble's validation metrics and each member's report."""
    members_config = json.loads((members[0].directory / CONFIG).read_text())
    report = {
        "config": asdict(cfg),
        "data": {"source": data.source, "states": len(data)},
        "validation": validation,
        "members": [
            {
                "directory": f"{ENSEMBLE_DIR}/{i}",
                "seed": cfg.seed + i,
                "best_epoch": m.best_epoch,
                "validation": m.validation,
                "seconds": round(m.seconds, 1),
            }
            for i, m in enumerate(members)
        ],
        "seconds": round(seconds, 1),
        "backbone": members_config["backbone"].get("path", PACKAGED),
    }
    (out / "training.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def _score_mean(
    held: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    data: TrainingSet,
    members: list[TrainResult],
    *,
    keys: list[dict[str, list[tuple[str, int]]]] | None = None,
) -> tuple[Calibrator, dict[str, float]]:
    """The ensemble's calibration (the identity: the members' answers are calibrated) and
    the validation metrics of the members' mean answers on the states that every member
    held out (``accuracy``, ``nll``, ``ece``, ``ece_calibrated`` (the same: no temperature
    of its own), ``answers``), beside ``members_accuracy``, the mean of the members' own
    accuracies on the same answers. Without such states: no metrics.

    ``keys[i][fp]`` names the rows of ``held[i][fp]`` (:func:`_row_keys`); without
    ``keys`` every member held out the same rows in the same order."""
    types = {}
    for qid, question in data.questions.items():
        types[_fingerprint(data, qid)] = str(getattr(question, "type", ""))
    logits: list[torch.Tensor] = []
    labels: list[int] = []
    kinds: list[str] = []
    chosen: dict[str, list[torch.Tensor]] = {}  # per fingerprint, each member's rows
    for fp, (_, y) in held[0].items():
        if keys is None:
            rows = [torch.arange(len(y))] * len(held)
        else:
            for i, member in enumerate(held):
                if fp in member and len(keys[i].get(fp, [])) != len(member[fp][1]):
                    raise RuntimeError(
                        f"ensemble member {i} held out {len(member[fp][1])} answers, "
                        f"not the {len(keys[i].get(fp, []))} of its split"
                    )
            common = set(keys[0][fp]).intersection(*(k.get(fp, []) for k in keys[1:]))
            rows = [
                torch.tensor(
                    [r for r, key in enumerate(k.get(fp, [])) if key in common], dtype=torch.long
                )
                for k in keys
            ]
        y = y[rows[0]]
        for i, member in enumerate(held[1:], start=1):
            if fp not in member or not torch.equal(member[fp][1][rows[i]], y):
                raise RuntimeError(
                    f"ensemble member {i} was not validated on the states of member 0 "
                    f"({members[i].directory})"
                )
        if not len(y):
            continue
        chosen[fp] = rows
        mean = torch.stack([m[fp][0][r].double() for m, r in zip(held, rows, strict=True)])
        mean = mean.mean(dim=0)
        logits.extend(mean.clamp(min=1e-300).log())
        labels.extend(int(t) for t in y)
        kinds.extend([types[fp]] * len(y))
    calibration = Calibrator(source=f"none: the mean of {len(held)} calibrated members")
    if not labels:
        return calibration, {}
    correct = [
        sum(
            int(p.argmax()) == int(t)
            for p, t in zip(m[fp][0][rows[i]], m[fp][1][rows[i]], strict=True)
        )
        for fp, rows in chosen.items()
        for i, m in enumerate(held)
    ]
    nll = sum(float(-torch.log_softmax(r, -1)[t]) for r, t in zip(logits, labels, strict=True))
    accuracy = sum(int(r.argmax()) == t for r, t in zip(logits, labels, strict=True))
    validation = {
        "accuracy": accuracy / len(labels),
        "nll": nll / len(labels),
        "ece": _ece_after(None, logits, labels, kinds),
        "ece_calibrated": _ece_after(calibration, logits, labels, kinds),
        "members_accuracy": sum(correct) / (len(labels) * len(held)),
        "answers": float(len(labels)),
    }
    return calibration, validation


def _fingerprint(data: TrainingSet, qid: str) -> str:
    from clef_engine.heads.option_evidence import fingerprint, question_context

    question = data.questions[qid]
    return fingerprint(
        str(getattr(question, "type", "")), data.names(qid), question_context(question)
    )


def _row_keys(data: TrainingSet, held_out: list[int]) -> dict[str, list[tuple[str, int]]]:
    """Per fingerprint, ``(question id, example index)`` of each row of a member's
    :attr:`~clef_engine.train.trainer.Trainer.held_out` answers, in their order: the group's
    questions in ``data.questions`` order, each over the held-out examples it labels."""
    keys: dict[str, list[tuple[str, int]]] = {}
    for qid in data.questions:
        keys.setdefault(_fingerprint(data, qid), []).extend(
            (qid, i) for i in held_out if qid in data.examples[i].labels
        )
    return keys


def _texts_digest(texts: Sequence[str] | None) -> str:
    """A hash of ``texts`` in order (``""`` for none)."""
    if not texts:
        return ""
    h = hashlib.sha256()
    for text in texts:
        h.update(json.dumps(text).encode())
    return h.hexdigest()[:16]
