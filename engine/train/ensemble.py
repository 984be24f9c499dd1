"""An ensemble of fine-tuning runs as one model dir (``TrainConfig.ensemble``).

Runs of the same recipe from different starts disagree on the hard cases; the mean of
their calibrated answers is right more often than the average member (BANKING77 numbers in
``docs/finetune.md``, "Ensembles").

:func:`fit_ensemble` trains ``ensemble`` runs with seeds ``seed``, ``seed + 1``, ... (each
its own initialisation, batch order and dropout). Their validation splits are carved from
the split of ``split_seed`` (default ``seed``) by ``shared_split``
(:func:`~clef_engine.train.data.split_indices`): each member keeps that share of it, per
label, and draws the rest of its held-out states with its own seed. The default
(``ENSEMBLE_SHARED_SPLIT``, 0) shares nothing: member i holds out the split of its own
seed and is the single run of ``seed + i``; with 1 every member holds out exactly the
split of ``split_seed``. Each member is a whole model dir under ``members/<i>`` with its
own temperature and example memory, chosen on its own split.

The engine answers with the mean of the members' calibrated answers. That mean is scored
on the states that every member held out (calibrated, with the memory chosen there, before
the split's states join it), where there are any: ``training.json``'s ``validation``.
With ``ensemble_temperature`` one temperature per (question type, option-count bucket) is
also fitted there and applied to the mean (averaging calibrated models tends to make them
under-confident). It is off by default: each member chose its own temperature and memory
on its split, those states included, so the fit is biased, and on BANKING77 it raised
test ECE in 12 of the 15 ensembles measured (``docs/finetune.md``, "Ensembles").

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
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_engine.backbones import PACKAGED
from clef_engine.calibration.fit import fit_calibrator
from clef_engine.calibration.temperature import Calibrator
from clef_engine.runtime.model_dir import CONFIG, ENSEMBLE_DIR, FORMAT, FORMAT_VERSION
from clef_engine.train.config import ENSEMBLE_SHARED_SPLIT, TrainResult
from clef_engine.train.data import TrainingDataError, TrainingSet, split_indices
from clef_engine.train.forward import _ece_after

if TYPE_CHECKING:
    from clef_engine.train.trainer import Trainer

log = logging.getLogger(__name__)

HELD_OUT = "held_out.pt"
"""In each finished member's checkpoint folder: its answers on its validation split, so
that ``resume=True`` does not train a finished member again."""


def fit_ensemble(
    trainer: Trainer,
    data: TrainingSet,
    out: Path,
    *,
    resume: bool = False,
    unlabeled: Sequence[str] | None = None,
) -> TrainResult:
    """Train ``trainer.config.ensemble`` members into ``out/members/<i>``, score their mean
    on the states all of them held out (with ``ensemble_temperature``, fit its temperature
    there) and write ``out/config.json``; see the module docstring.

    With ``resume=True`` a member that finished with the same recipe on the same states
    (and unlabelled states) is kept, and an interrupted one continues from its checkpoint.

    Raises:
        TrainingDataError: With ``ensemble_temperature``, a question has no states that
            every member holds out.
    """
    from clef_engine.train.trainer import CHECKPOINT_DIR, Trainer

    started = time.perf_counter()
    cfg = trainer.config
    checkpoint = out / CHECKPOINT_DIR
    split_seed = cfg.seed if cfg.split_seed is None else cfg.split_seed
    shared = ENSEMBLE_SHARED_SPLIT if cfg.shared_split is None else cfg.shared_split
    member_configs = [
        replace(
            cfg,
            ensemble=1,
            ensemble_temperature=False,
            seed=cfg.seed + i,
            split_seed=split_seed,
            shared_split=shared,
            model_name=None,
        )
        for i in range(cfg.ensemble)
    ]
    # Each member's validation split, as its trainer carves it; the mean is scored (and,
    # with ensemble_temperature, calibrated) on the states all of them hold out. A fit
    # needs some for every question: say so before any member trains.
    splits = [
        split_indices(data, cfg.val_fraction, seed=m.seed, base_seed=split_seed, shared=shared)[1]
        for m in member_configs
    ]
    common = set(splits[0]).intersection(*splits[1:])
    unheld = [
        qid for qid in data.questions if not any(qid in data.examples[i].labels for i in common)
    ]
    if cfg.ensemble_temperature and unheld:
        raise TrainingDataError(
            f"question {unheld[0]!r} has no states that every member holds out (val_fraction "
            f"{cfg.val_fraction}, shared_split {shared:g}); an ensemble fits "
            "the temperature of its mean there. Give it more labelled states or raise "
            "val_fraction or shared_split",
            field="shared_split" if shared < 1 else "val_fraction",
        )
    keys = [_row_keys(data, rows) for rows in splits]
    members: list[TrainResult] = []
    held: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for i, member_cfg in enumerate(member_configs):
        directory = out / ENSEMBLE_DIR / str(i)
        saved = checkpoint / f"member{i}" / HELD_OUT
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
                held.append({fp: (p, y) for fp, (p, y) in kept["held_out"].items()})
                members.append(TrainResult(directory, **kept["result"]))
                continue
            log.warning("ensemble member %d was trained with another recipe; training it again", i)
        member = Trainer(member_cfg, backbone=trainer._backbone_arg)
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
        held.append(member.held_out)
        members.append(result)
        del member  # one member's model in memory at a time
        gc.collect()

    calibration, validation = _calibrate(
        held, data, members, histogram=cfg.histogram, keys=keys, fit=cfg.ensemble_temperature
    )
    config: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "ensemble": [f"{ENSEMBLE_DIR}/{i}" for i in range(cfg.ensemble)],
        "calibration": calibration.to_dict(),
    }
    if cfg.model_name:
        config["model_name"] = cfg.model_name
    (out / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    seconds = time.perf_counter() - started
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
    shutil.rmtree(checkpoint, ignore_errors=True)
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


def _calibrate(
    held: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    data: TrainingSet,
    members: list[TrainResult],
    *,
    histogram: bool = False,
    keys: list[dict[str, list[tuple[str, int]]]] | None = None,
    fit: bool = True,
) -> tuple[Calibrator, dict[str, float]]:
    """The ensemble's temperatures, fitted on the members' mean answers on the states that
    every member held out (with ``fit=False`` none: the identity), and the validation
    metrics of that mean before and after them (``accuracy``, ``nll``, ``ece``,
    ``ece_calibrated``), beside ``members_accuracy``, the mean of the members' own
    accuracies on the same answers. Without such states and ``fit=False``: the identity
    and no metrics.

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
    identity = Calibrator(
        source=f"none: the mean of {len(held)} calibrated members (ensemble_temperature off)"
    )
    if not labels:
        if not fit:
            return identity, {}
        raise RuntimeError("the members of the ensemble held out no state in common")
    if fit:
        calibration = fit_calibrator(
            logits,
            labels,
            kinds,
            histogram=histogram,
            source=f"validation split ({len(labels)} answers held out by every member) of "
            f"{data.source or 'training data'}, mean of {len(held)} members",
        )
    else:
        calibration = identity
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
