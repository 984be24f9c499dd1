"""Fine-tune the engine: LoRA on a frozen backbone + the option-evidence head.

The recipe (see ``docs/finetune.md`` for the measurements behind the defaults):

1. carve a stratified validation split from the training data;
2. embed every option text once with the *base* backbone; these vectors start the
   head's option bank for the trained questions;
3. optionally a contrastive stage on the LoRA adapters (``contrastive_steps``,
   :mod:`clef_engine.train.contrastive`);
4. ``head="option_evidence"`` (default): train LoRA adapters (peft) and the head with
   label-smoothed CE + lambda * Brier (+ RPS for score questions); all questions about a
   state share one backbone pass; keep the latest epoch whose validation accuracy is
   within one standard error of the best so far (early stopping: ``patience`` epochs
   below that band end the run); a checkpoint after every epoch makes ``resume=True``
   continue an interrupted run. ``head="prototype"``: no epochs; fit a prototype head per
   question on the (adapted) pooled vectors of the training states (the few-shot recipe),
   semi-supervised when unlabelled states are given (``fit(..., unlabeled=texts)``:
   pseudo-labels from the head fitted on the labelled states join a second fit);
5. optionally an RL stage (:mod:`clef_engine.train.rl`) on the head;
6. fit temperatures (and optional histogram binning) on the validation split;
7. ``memory=True`` (default): an example memory per question, the adapted vectors of its
   training states, whose nearest-neighbour vote is mixed with the head's probabilities
   (:mod:`clef_engine.heads.memory`; settings chosen on the validation split, none kept where
   it does not lower the validation NLL; a prototype head without a validation split
   cross-fits them on its own 5-fold split instead);
8. write a model dir: ``config.json``, ``head.safetensors``, ``memory.safetensors``,
   ``adapter/`` (peft format), ``training.json``. ``DecisionEngine.from_pretrained(out)``
   loads it.

With ``ensemble=K`` the whole recipe runs K times from K seeds on one validation split,
into ``out/members/<i>``, and one temperature is fitted on the mean of their answers
(:mod:`clef_engine.train.ensemble`).

Example:
    >>> from clef_engine.train import Trainer, TrainConfig, load_training_data
    >>> data = load_training_data("train.csv", label_col="category")    # doctest: +SKIP
    >>> Trainer(TrainConfig(epochs=3)).fit(data, "out/banking77")      # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from clef_engine.backbones import PACKAGED
from clef_engine.backbones.adapter import ADAPTER_DIR
from clef_engine.backbones.encoder import EncoderBackbone
from clef_engine.calibration.fit import fit_calibrator
from clef_engine.calibration.temperature import Calibrator
from clef_engine.errors import peft_quietly, require
from clef_engine.heads.memory import MEMORY_FILE, ExampleMemory
from clef_engine.heads.option_evidence import (
    HEAD_FILE,
    HeadConfig,
    OptionEvidenceHead,
    fingerprint,
    question_context,
)
from clef_engine.heads.zero_shot import option_texts
from clef_engine.runtime.model_dir import CONFIG, FORMAT, FORMAT_VERSION
from clef_engine.train.checkpoint import CheckpointState
from clef_engine.train.config import HEADS, MAX_RANK, TrainConfig, TrainResult
from clef_engine.train.contrastive import supervised_contrastive_loss
from clef_engine.train.data import TrainingDataError, TrainingSet, split
from clef_engine.train.few_shot import CONTRASTIVE_CHUNK, FewShotStages
from clef_engine.train.forward import _ece_after
from clef_engine.train.losses import decision_loss, symmetric_kl
from clef_engine.train.memory import MemoryStage
from clef_engine.train.rl import ReinforceStage
from clef_engine.train.schedule import linear_schedule

log = logging.getLogger(__name__)

TARGETS = (
    ("query", "key", "value", "dense"),  # BERT, MiniLM, RoBERTa
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),  # Qwen, Llama
    ("q", "k", "v", "o"),  # T5
    ("q_lin", "k_lin", "v_lin", "out_lin"),  # DistilBERT
)
CHECKPOINT_DIR = "checkpoint"
SELECTION_FILE = "selection.json"
"""With ``refit``: the selection run's history, kept epoch and calibration, for ``--resume``."""
__all__ = [
    "CHECKPOINT_DIR",
    "CONTRASTIVE_CHUNK",
    "HEADS",
    "MAX_RANK",
    "SELECTION_FILE",
    "TrainConfig",
    "TrainResult",
    "Trainer",
]


def _default_targets(model: torch.nn.Module) -> list[str]:
    leaves = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    for group in TARGETS:
        found = [t for t in group if t in leaves]
        if len(found) >= 2:
            return found
    if not leaves:
        raise ValueError("the backbone has no linear layers to adapt")
    return sorted(leaves)


class Trainer(FewShotStages, MemoryStage, ReinforceStage, CheckpointState):
    """Fine-tunes a backbone (LoRA) and the option-evidence head; see the module docstring.

    The rest of it lives beside it: the forward passes every stage reads (features,
    logits per question, evaluation) in :mod:`clef_engine.train.forward`, the contrastive stage
    and the prototype heads in :mod:`clef_engine.train.few_shot`, the example memory in
    :mod:`clef_engine.train.memory`, the RL stage in :mod:`clef_engine.train.rl`, kept states and
    checkpoints in :mod:`clef_engine.train.checkpoint`.

    Args:
        config: Hyper-parameters.
        backbone: A local HF encoder dir, a built :class:`EncoderBackbone`, or ``None``
            for the embedded all-MiniLM-L6-v2.
    """

    def __init__(
        self,
        config: TrainConfig | None = None,
        backbone: str | Path | EncoderBackbone | None = None,
    ) -> None:
        self.config = config or TrainConfig()
        self._ema: dict[str, torch.Tensor] | None = None  # ema_decay's average, during fit
        self.memory: ExampleMemory | None = None
        self.held_out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        """After :meth:`fit`, per question fingerprint, the model's answers on the validation
        split (calibrated, with the example memory chosen there, before the split's states
        join it) and their labels; what an ensemble calibrates on."""
        self.config.check()
        self._backbone_arg = backbone

    # -- model ---------------------------------------------------------------------------

    def build(self, data: TrainingSet, train: TrainingSet | None = None) -> None:
        """Load the backbone, register the questions in the head, attach LoRA.

        ``train`` (default ``data``) are the states whose embeddings start the option bank
        when ``bank_init="examples"``; the trainer passes its split without validation.
        """
        cfg = self.config
        torch.manual_seed(cfg.seed)
        if isinstance(self._backbone_arg, EncoderBackbone):
            self.backbone = self._backbone_arg
        else:
            self.backbone = EncoderBackbone(
                self._backbone_arg, device=cfg.device, dtype=torch.float32
            )
        self.device = self.backbone.device
        self.base_model = self.backbone.model
        self.head = OptionEvidenceHead(
            HeadConfig(
                hidden_size=self.backbone.hidden_size,
                dim=cfg.head_dim,
                heads=cfg.head_heads,
                dropout=cfg.head_dropout,
                evidence=cfg.evidence,
                option_bank=cfg.option_bank,
            )
        )
        self.fps: dict[str, str] = {}
        for qid, question in data.questions.items():
            names = data.names(qid)
            if cfg.bank_init == "examples" and str(question.type) != "score":  # type: ignore[attr-defined]
                vectors = self._centroids(train or data, qid)  # encodes the option texts too
            else:
                vectors = self.backbone.encode(option_texts(question)).pooled.float().cpu()
            self.fps[qid] = self.head.add_question(
                str(question.type),  # type: ignore[attr-defined]
                names,
                vectors,
                question_context(question),
            )
        self.head.to(self.device)
        if cfg.lora_rank > 0:
            peft = require("peft", package="peft", extra="train", feature="LoRA fine-tuning")
            lora = peft.LoraConfig(
                r=cfg.lora_rank,
                lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
                lora_dropout=cfg.lora_dropout,
                target_modules=cfg.target_modules or _default_targets(self.base_model),
                bias="none",
                use_dora=cfg.use_dora,
            )
            with peft_quietly():
                self.model = peft.get_peft_model(copy.deepcopy(self.base_model), lora)
        else:
            self.model = self.base_model
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.model.to(self.device)
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _centroids(self, data: TrainingSet, qid: str) -> torch.Tensor:
        """Per option: normalised mean of its text embedding and its states' embeddings."""
        texts, members = self._members(data, qid)  # every option has its text as a member
        chunks = [texts[i : i + 256] for i in range(0, len(texts), 256)]
        pooled = torch.cat([self.backbone.encode(c).pooled.float().cpu() for c in chunks])
        means = torch.stack([pooled[items].mean(dim=0) for items in members])
        return torch.nn.functional.normalize(means, dim=-1)

    # -- loop ----------------------------------------------------------------------------

    def fit(
        self,
        data: TrainingSet,
        out: str | Path,
        *,
        resume: bool = False,
        unlabeled: Sequence[str] | None = None,
    ) -> TrainResult:
        """Train on ``data`` and write a model dir to ``out``.

        ``unlabeled``: states without labels from the same domain, for ``head="prototype"``
        (semi-supervised prototype head, :meth:`fit_prototypes`). States that are also
        labelled (validation split included), and repeats, are dropped; at least one
        state must remain.
        """
        started = time.perf_counter()
        cfg = self.config
        out = Path(out)
        if len(data) == 0:
            raise TrainingDataError("no training examples", field="data")
        pool = None if unlabeled is None else self._unlabeled_pool(data, unlabeled)
        out.mkdir(parents=True, exist_ok=True)
        if cfg.ensemble > 1:
            from clef_engine.train.ensemble import fit_ensemble

            return fit_ensemble(self, data, out, resume=resume, unlabeled=unlabeled)
        train, val = split(
            data,
            cfg.val_fraction,
            seed=cfg.seed,
            base_seed=cfg.split_seed,
            shared=1.0 if cfg.shared_split is None else cfg.shared_split,
        )
        checkpoint = out / CHECKPOINT_DIR
        selection = checkpoint / SELECTION_FILE
        validation: dict[str, float] = {}
        calibration: Calibrator | None = None
        self.memory = None
        self.held_out = {}
        memory: dict[str, dict[str, float]] = {}
        if resume and cfg.refit and selection.is_file():  # the selection run had finished
            chosen = json.loads(selection.read_text())
            history, kept = chosen["history"], int(chosen["best_epoch"])
            validation = chosen["validation"]
            calibration = (
                Calibrator.from_dict(chosen["calibration"]) if chosen["calibration"] else None
            )
        else:
            self.build(data, train)
            epochs = cfg.epochs if cfg.head == "option_evidence" else 0
            history, best = self._supervised(train, val, epochs, checkpoint, resume)
            kept = best["epoch"]
            if best["state"] is not None:
                self._restore(best["state"])
            if cfg.head == "prototype":
                # Without a validation split, the memory is cross-fitted on the head's folds.
                stats, memory = self.fit_prototypes(
                    train, pool, memory=cfg.memory and not val.examples
                )
                if stats:
                    history.append(stats)
            if cfg.rl_epochs > 0:
                rl_history = self.reinforce(train, val)
                history.extend(rl_history)
            if val.examples:
                metrics, val_logits, labels, types = self.evaluate(val)
                calibration = fit_calibrator(
                    val_logits,
                    labels,
                    types,
                    histogram=cfg.histogram,
                    source=f"validation split ({len(val)} states) of "
                    f"{data.source or 'training data'}"
                    + (", model before the refit" if cfg.refit else ""),
                )
                validation = dict(metrics)
                validation["ece_calibrated"] = _ece_after(calibration, val_logits, labels, types)
                if cfg.memory and not cfg.refit:  # the refit model has no held-out states
                    memory = self.fit_memory(train, val, calibration)
                elif not cfg.refit:
                    self.held_out_probabilities(val, calibration)
            if cfg.refit:
                chosen = {
                    "history": history,
                    "best_epoch": kept,
                    "validation": validation,
                    "calibration": calibration.to_dict() if calibration is not None else None,
                }
                checkpoint.mkdir(parents=True, exist_ok=True)
                selection.write_text(json.dumps(chosen, indent=1, default=str))
        if cfg.refit:
            # Selection is done: train again from the same start on every state, validation
            # split included, for the kept number of epochs; keep the last weights and the
            # calibration fitted on the held-out split (the refit model has none left).
            self.build(data, data)
            refit_history, _ = self._supervised(
                data, data.subset([]), kept, checkpoint / "refit", resume, "refit "
            )
            if self._ema is not None:
                self._restore(self._ema)
            history = history + [{**h, "refit": 1.0} for h in refit_history]
        self._write(
            out,
            data,
            calibration,
            history,
            kept,
            validation,
            time.perf_counter() - started,
            memory,
        )
        shutil.rmtree(checkpoint, ignore_errors=True)
        return TrainResult(out, history, kept, validation, time.perf_counter() - started, memory)

    def _supervised(
        self,
        train: TrainingSet,
        val: TrainingSet,
        epochs: int,
        checkpoint: Path,
        resume: bool,
        label: str = "",
    ) -> tuple[list[dict[str, float]], dict[str, Any]]:
        """The contrastive stage (if any) and ``epochs`` epochs of the head and adapters.

        Returns the history and the kept epoch (``{"score", "epoch", "state"}``): the latest
        one within one standard error of the best validation accuracy, or, without a
        validation split, of the lowest training loss. The model ends on the last weights.
        """
        cfg = self.config
        params = self._trainable()
        lora_b = {n for n in params if n.startswith("lora.") and ".lora_B." in n}
        groups = [
            {"params": [p for n, p in params.items() if n.startswith("head.")], "lr": cfg.head_lr},
            {
                "params": [
                    p for n, p in params.items() if n.startswith("lora.") and n not in lora_b
                ],
                "lr": cfg.lr,
            },
            # LoRA+: the B matrices (zero at the start) learn lora_plus_ratio times faster.
            {"params": [params[n] for n in sorted(lora_b)], "lr": cfg.lr * cfg.lora_plus_ratio},
        ]
        optimizer = torch.optim.AdamW(
            [g for g in groups if g["params"]], weight_decay=cfg.weight_decay
        )
        steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
        total = steps_per_epoch * epochs
        # Transformers' linear warm-up and decay (epochs=0, the prototype head: never stepped).
        scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total), max(1, total))
        history: list[dict[str, float]] = []
        best: dict[str, Any] = {"score": -math.inf, "epoch": 0, "state": None}
        start_epoch = 0
        self._ema = None
        data = f"{train.digest()}/{val.digest()}"
        resume = resume and (checkpoint / "meta.json").is_file()
        if resume and self.checkpoint_data(checkpoint) not in (None, data):
            log.warning(
                "%s was written for other training or validation states; training from the start",
                checkpoint,
            )
            resume = False
        if resume:
            # The checkpointed adapters already went through the contrastive stage.
            start_epoch, history, best = self._load_checkpoint(checkpoint, optimizer, scheduler)
        elif cfg.contrastive_steps > 0:
            history.append(self.contrast(train))
        if cfg.ema_decay > 0 and self._ema is None:
            self._ema = self._state()
        bad_epochs = sum(1 for h in history if h.get("epoch", 0) > best["epoch"])
        from tqdm.auto import tqdm

        lengths = self._lengths(train) if cfg.group_by_length else None
        for epoch in range(start_epoch, epochs):
            if bad_epochs >= cfg.patience and val.examples:
                break
            rng = random.Random(cfg.seed * 1000 + epoch)
            batches = _batches(len(train), cfg.batch_size, rng, lengths)
            torch.manual_seed(cfg.seed * 1000 + epoch)
            self.model.train(cfg.lora_rank > 0)  # a frozen backbone stays deterministic
            self.head.train()
            running = 0.0
            bar = tqdm(
                batches,
                desc=f"{label}epoch {epoch + 1}/{epochs}",
                disable=not cfg.progress,
                leave=False,
            )
            for n, batch in enumerate(bar, start=1):
                if cfg.rdrop_weight > 0:  # each state twice in one forward: two dropout draws
                    batch = batch + batch
                tokens, mask, pooled = self.features([train.examples[i].state for i in batch])
                loss = torch.zeros((), device=self.device)
                for qid, logits, target in self._question_logits(
                    train, batch, tokens, mask, pooled
                ):
                    qtype = str(train.questions[qid].type)  # type: ignore[attr-defined]
                    part = decision_loss(
                        logits,
                        target,
                        qtype,
                        label_smoothing=cfg.label_smoothing,
                        brier_weight=cfg.brier_weight,
                        ordinal_weight=cfg.ordinal_weight,
                    )
                    if cfg.rdrop_weight > 0:  # rows: the first copies, then the second
                        half = len(target) // 2
                        part = part + cfg.rdrop_weight * symmetric_kl(logits[:half], logits[half:])
                    loss = loss + part * (len(target) / len(batch))
                if cfg.contrastive_weight > 0:
                    loss = loss + cfg.contrastive_weight * self._batch_contrast(
                        train, batch, pooled
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
                optimizer.step()
                scheduler.step()
                if self._ema is not None:
                    self._average(params, scheduler.last_epoch)
                running += float(loss.detach())
                bar.set_postfix(loss=f"{running / n:.4f}")
            record = {"epoch": epoch + 1, "train_loss": running / max(1, steps_per_epoch)}
            current = None
            if self._ema is not None:  # validate (and keep) the average, train on the weights
                current = self._state()
                self._restore(self._ema)
            tolerance = 0.0
            if val.examples:
                metrics = self.evaluate(val)[0]
                record.update({f"val_{k}": v for k, v in metrics.items()})
                score = metrics["accuracy"] - 1e-3 * metrics["nll"]
                tolerance = _standard_error(metrics["accuracy"], len(val.pairs()))
            else:
                score = -record["train_loss"]
            history.append(record)
            log.info("epoch %d: %s", epoch + 1, record)
            # Validation accuracy is a sample: a later epoch within one standard error of the
            # best so far counts as no worse, and it has seen a lower learning rate.
            if score >= best["score"] - tolerance:
                best = {
                    "score": max(score, best["score"]),
                    "epoch": epoch + 1,
                    "state": self._state(),
                }
                bad_epochs = 0
            else:
                bad_epochs += 1
            if current is not None:
                self._restore(current)
            self._save_checkpoint(
                checkpoint, epoch + 1, history, best, optimizer, scheduler, data=data
            )

        return history, best

    def _batch_contrast(
        self, data: TrainingSet, batch: list[int], pooled: torch.Tensor
    ) -> torch.Tensor:
        """The ``contrastive_weight`` term: per question asked in the batch, the supervised
        contrastive loss of its states' pooled vectors under their labels, weighted by the
        question's share of the batch (as the decision loss is)."""
        total = pooled.sum() * 0.0
        for qid in data.questions:
            rows, labels = self._asked(data, batch, qid)
            if len(rows) < 2:
                continue
            term = supervised_contrastive_loss(
                pooled[rows], labels, self.config.contrastive_temperature
            )
            total = total + term * (len(rows) / len(batch))
        return total

    # -- output ----------------------------------------------------------------------

    def _write(
        self,
        out: Path,
        data: TrainingSet,
        calibration: Any,
        history: list[dict[str, float]],
        best_epoch: int,
        validation: dict[str, float],
        seconds: float,
        memory: dict[str, dict[str, float]],
    ) -> None:
        cfg = self.config
        if cfg.lora_rank > 0:
            adapter = out / ADAPTER_DIR
            shutil.rmtree(adapter, ignore_errors=True)
            self.model.save_pretrained(str(adapter))
        self.head.eval()
        description = self.head.save(out)
        (out / MEMORY_FILE).unlink(missing_ok=True)  # from an earlier run into ``out``
        if self.memory:
            description["memory"] = self.memory.save(out)
        config: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "backbone": self.backbone.config(),
            "head": description,
        }
        if calibration is not None:
            config["calibration"] = calibration.to_dict()
        if cfg.model_name:
            config["model_name"] = cfg.model_name
        (out / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        report = {
            "config": asdict(cfg),
            "data": {
                "source": data.source,
                "states": len(data),
                "questions": {
                    q: {
                        "type": str(getattr(v, "type", "")),
                        "options": len(data.names(q)),
                        "fingerprint": fingerprint(
                            str(getattr(v, "type", "")), data.names(q), question_context(v)
                        ),
                    }
                    for q, v in data.questions.items()
                },
            },
            "history": history,
            "best_epoch": best_epoch,
            "validation": validation,
            **({"memory": memory} if memory else {}),
            "seconds": round(seconds, 1),
            "backbone": self.backbone.config().get("path", PACKAGED),
        }
        (out / "training.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        assert (out / HEAD_FILE).is_file()


def _standard_error(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on ``n`` labels (at least that of 1 in n)."""
    n = max(1, n)
    return math.sqrt(max(accuracy * (1.0 - accuracy), 1.0 / n) / n)


GROUP_WINDOW = 50
"""Batches per window inside which ``group_by_length`` sorts states by length."""


def _batches(
    n: int, batch_size: int, rng: random.Random, lengths: list[int] | None = None
) -> list[list[int]]:
    """One epoch's batches of indices into ``range(n)``: every index exactly once.

    Without ``lengths``, a plain shuffle cut into batches. With them, the shuffled order is
    cut into windows of ``GROUP_WINDOW`` batches, each window is sorted by length and cut
    into batches, and the batch order is shuffled (the ``group_by_length`` of HF's Trainer),
    so a batch pads to a length close to that of its states while every epoch still sees
    the states in a new random grouping.
    """
    order = list(range(n))
    rng.shuffle(order)
    if lengths is None:
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    window = batch_size * GROUP_WINDOW
    batches: list[list[int]] = []
    for start in range(0, n, window):
        chunk = sorted(order[start : start + window], key=lambda i: -lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches
