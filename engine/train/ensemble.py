"""An ensemble of fine-tuning runs as one model dir (``TrainConfig.ensemble``).

Runs of the same recipe from different starts disagree on the hard cases; the mean of
their calibrated answers is right more often than the average member (on BANKING77, +0.13
macro-F1 over 4 seeds, ``docs/finetune.md``).
:func:`fit_ensemble` trains ``ensemble`` runs with seeds ``seed``, ``seed + 1``, ... (each
its own initialisation, batch order and dropout) on one validation split, the split of
``split_seed`` (default ``seed``), so that every member is held out from the same states.
Each member is a whole model dir under ``members/<i>`` with its own temperature and example
memory. The members' answers on that split (calibrated, with the memory chosen there,
before the split's states join it) are averaged, and one temperature per (question type,
option-count bucket) is fitted on the average: averaging makes a set of calibrated models
under-confident. The members chose their own temperatures and memories on the same split,
so the mean's temperature is fitted on answers already tuned there; the test ECE in
``docs/finetune.md`` measures what that costs.

Layout::

    config.json        {"format": "clef-agents", "ensemble": ["members/0", "members/1"],
                        "calibration": {...}}
    training.json      the ensemble's validation metrics and each member's report
    members/0/ ...     a model dir as :class:`~engine.train.trainer.Trainer` writes it

``DecisionEngine.from_pretrained`` loads it (:mod:`engine.heads.ensemble`).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.backbones import PACKAGED
from engine.calibration.fit import fit_calibrator
from engine.calibration.temperature import Calibrator
from engine.runtime.model_dir import CONFIG, ENSEMBLE_DIR, FORMAT, FORMAT_VERSION
from engine.train.config import TrainResult
from engine.train.data import TrainingDataError, TrainingSet, split
from engine.train.forward import _ece_after

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

log = logging.getLogger(__name__)

HELD_OUT = "held_out.pt"
"""In each finished member's checkpoint folder: its answers on the shared split, so that
``resume=True`` does not train a finished member again."""


def fit_ensemble(
    trainer: Trainer,
    data: TrainingSet,
    out: Path,
    *,
    resume: bool = False,
    unlabeled: Sequence[str] | None = None,
) -> TrainResult:
    """Train ``trainer.config.ensemble`` members into ``out/members/<i>``, then fit the
    ensemble's temperature and write ``out/config.json``; see the module docstring.

    With ``resume=True`` a member that finished with the same recipe on as many states is
    kept, and an interrupted one continues from its checkpoint.

    Raises:
        TrainingDataError: A question has no states in the validation split.
    """
    from engine.train.trainer import CHECKPOINT_DIR, Trainer

    started = time.perf_counter()
    cfg = trainer.config
    checkpoint = out / CHECKPOINT_DIR
    split_seed = cfg.seed if cfg.split_seed is None else cfg.split_seed
    members: list[TrainResult] = []
    held: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    # Every question needs held-out states for the mean's temperature: say so before any
    # member trains.
    _, val = split(data, cfg.val_fraction, seed=split_seed)
    for qid in data.questions:
        if not val.only(qid).examples:
            raise TrainingDataError(
                f"question {qid!r} has no states in the validation split (val_fraction "
                f"{cfg.val_fraction}); an ensemble fits the temperature of its mean there. "
                "Give it more labelled states or raise val_fraction",
                field="val_fraction",
            )
    for i in range(cfg.ensemble):
        directory = out / ENSEMBLE_DIR / str(i)
        saved = checkpoint / f"member{i}" / HELD_OUT
        member_cfg = replace(
            cfg, ensemble=1, seed=cfg.seed + i, split_seed=split_seed, model_name=None
        )
        # What a kept member must have been trained with: this recipe, on as many states.
        recipe = json.dumps(
            {"config": asdict(member_cfg), "states": len(data)}, sort_keys=True, default=str
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

    calibration, validation = _calibrate(held, data, members, histogram=cfg.histogram)
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
) -> tuple[Calibrator, dict[str, float]]:
    """The ensemble's temperatures, fitted on the members' mean answers on the shared
    split, and the validation metrics of that mean before and after them (``accuracy``,
    ``nll``, ``ece``, ``ece_calibrated``), beside ``members_accuracy``, the mean of the
    members' own accuracies on the same answers."""
    types = {}
    for qid, question in data.questions.items():
        types[_fingerprint(data, qid)] = str(getattr(question, "type", ""))
    logits: list[torch.Tensor] = []
    labels: list[int] = []
    kinds: list[str] = []
    for fp, (_, y) in held[0].items():
        for i, member in enumerate(held[1:], start=1):
            if fp not in member or not torch.equal(member[fp][1], y):
                raise RuntimeError(
                    f"ensemble member {i} was not validated on the states of member 0 "
                    f"({members[i].directory})"
                )
        mean = torch.stack([m[fp][0].double() for m in held]).mean(dim=0)
        logits.extend(mean.clamp(min=1e-300).log())
        labels.extend(int(t) for t in y)
        kinds.extend([types[fp]] * len(y))
    calibration = fit_calibrator(
        logits,
        labels,
        kinds,
        histogram=histogram,
        source=f"validation split ({len(labels)} answers) of {data.source or 'training data'}, "
        f"mean of {len(held)} members",
    )
    correct = [
        sum(int(p.argmax()) == int(t) for p, t in zip(m[fp][0], m[fp][1], strict=True))
        for m in held
        for fp in held[0]
    ]
    nll = sum(float(-torch.log_softmax(r, -1)[t]) for r, t in zip(logits, labels, strict=True))
    accuracy = sum(int(r.argmax()) == t for r, t in zip(logits, labels, strict=True))
    validation = {
        "accuracy": accuracy / len(labels),
        "nll": nll / len(labels),
        "ece": _ece_after(None, logits, labels, kinds),
        "ece_calibrated": _ece_after(calibration, logits, labels, kinds),
        "members_accuracy": sum(correct) / (len(labels) * len(held)),
    }
    return calibration, validation


def _fingerprint(data: TrainingSet, qid: str) -> str:
    from engine.heads.option_evidence import fingerprint, question_context

    question = data.questions[qid]
    return fingerprint(
        str(getattr(question, "type", "")), data.names(qid), question_context(question)
    )
