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

With ``ensemble=K`` the whole recipe runs K times from K seeds, each on its own seed's
validation split, into ``out/members/<i>``; the engine answers with the mean of their
calibrated answers (:mod:`clef_engine.train.ensemble`).

The measured recipes are presets (``TrainConfig.preset("full" | "few_shot" |
"ensemble")``). Probes of other recipes subclass :class:`Trainer` and override its
protected steps (``_head_config``, ``_bank_vectors``, ``_lora_options``,
``_param_groups``, ``_batch_loss``, ``GROUP_BY_LENGTH``); ``benchmarks/finetune_probes.py``
does so for the ablations that did not become options.

Example:
    Ten BANKING77 rows for each of three intents train in seconds on a CPU (the whole
    training set takes the default recipe 8.6 to 12 min on 2 CPU cores).

    >>> from clef_engine import DecisionEngine
    >>> from clef_engine.train import Trainer, TrainConfig, load_training_data
    >>> data = load_training_data("train.csv", label_col="category")
    >>> len(data), data.names("category")
    (30, ['card_arrival', 'card_linking', 'exchange_rate'])
    >>> result = Trainer(TrainConfig(epochs=3)).fit(data, "out/banking77")
    >>> [row["epoch"] for row in result.history], result.validation["accuracy"]
    ([1, 2, 3], 1.0)
    >>> sorted(path.name for path in result.directory.iterdir())
    ['adapter', 'config.json', 'head.safetensors', 'training.json']
    >>> engine = DecisionEngine.from_pretrained(result.directory)  # the local dir written
    >>> engine.head.knows(data.questions["category"])  # answered by the trained head
    True
    >>> answer = engine.decide("I ordered a card two weeks ago and it still hasn't come",
    ...                        data.questions).answers["category"]
    >>> answer.choice, answer.probabilities["card_arrival"] > 0.5
    ('card_arrival', True)
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
from clef_engine.runtime import general
from clef_engine.runtime.model_dir import CONFIG, FORMAT, FORMAT_VERSION
from clef_engine.train.checkpoint import CHECKPOINT_DIR, CheckpointState
from clef_engine.train.config import HEADS, MAX_RANK, TrainConfig, TrainResult
from clef_engine.train.data import TrainingDataError, TrainingSet, split
from clef_engine.train.ensemble import fit_ensemble
from clef_engine.train.few_shot import CONTRASTIVE_CHUNK, FewShotStages
from clef_engine.train.forward import _ece_after
from clef_engine.train.losses import decision_loss
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
__all__ = [
    "CHECKPOINT_DIR",
    "CONTRASTIVE_CHUNK",
    "HEADS",
    "MAX_RANK",
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
        backbone: A local HF encoder dir, a built :class:`EncoderBackbone`, ``None``
            for the embedded all-MiniLM-L6-v2, or ``"packaged:general"`` for the general
            decision model (the embedded model with its general adapter merged; the saved
            model dir records it as ``backbone.base`` and loads on the same weights).
    """

    GROUP_BY_LENGTH = True
    """Batch states of similar token length together (shuffled in windows of 50 batches,
    batch order shuffled), so little compute goes to padding: on BANKING77 the padded
    tokens per state drop from 47 to 17 and a LoRA epoch on 2 CPU cores from 5.8 to
    2.5 min. A probe sets it to ``False`` for plain shuffled batches."""

    def __init__(
        self,
        config: TrainConfig | None = None,
        backbone: str | Path | EncoderBackbone | None = None,
    ) -> None:
        self.config = config or TrainConfig()
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

        ``train`` (default ``data``): the states a subclass's :meth:`_bank_vectors` may
        start the option bank from; the trainer passes its split without validation.
        """
        cfg = self.config
        torch.manual_seed(cfg.seed)
        if isinstance(self._backbone_arg, EncoderBackbone):
            self.backbone = self._backbone_arg
        elif str(self._backbone_arg) == general.REFERENCE:  # "packaged:general"
            self.backbone = general.general_backbone(device=cfg.device, dtype=torch.float32)
        else:
            self.backbone = EncoderBackbone(
                self._backbone_arg, device=cfg.device, dtype=torch.float32
            )
        self.device = self.backbone.device
        self.base_model = self.backbone.model
        self.head = OptionEvidenceHead(self._head_config())
        self.fps: dict[str, str] = {}
        for qid, question in data.questions.items():
            self.fps[qid] = self.head.add_question(
                str(question.type),  # type: ignore[attr-defined]
                data.names(qid),
                self._bank_vectors(train or data, qid),
                question_context(question),
            )
        self.head.to(self.device)
        if cfg.lora_rank > 0:
            peft = require("peft", package="peft", extra="train", feature="LoRA fine-tuning")
            lora = peft.LoraConfig(**self._lora_options())
            with peft_quietly():
                self.model = peft.get_peft_model(copy.deepcopy(self.base_model), lora)
        else:
            self.model = self.base_model
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.model.to(self.device)
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- the steps a probe may override (benchmarks/finetune_probes.py) ------------------

    def _head_config(self) -> HeadConfig:
        """The option-evidence head's architecture."""
        cfg = self.config
        return HeadConfig(
            hidden_size=self.backbone.hidden_size,
            dim=cfg.head_dim,
            heads=cfg.head_heads,
            dropout=cfg.head_dropout,
        )

    def _bank_vectors(self, train: TrainingSet, qid: str) -> torch.Tensor:
        """The start of question ``qid``'s option bank: its option texts' embeddings (so
        the untrained head is the zero-shot scorer)."""
        return self.backbone.encode(option_texts(train.questions[qid])).pooled.float().cpu()

    def _lora_options(self) -> dict[str, Any]:
        """Keyword arguments of ``peft.LoraConfig``."""
        cfg = self.config
        return {
            "r": cfg.lora_rank,
            "lora_alpha": cfg.lora_alpha or 2 * cfg.lora_rank,
            "lora_dropout": cfg.lora_dropout,
            "target_modules": cfg.target_modules or _default_targets(self.base_model),
            "bias": "none",
        }

    def _param_groups(self, params: dict[str, torch.nn.Parameter]) -> list[dict[str, Any]]:
        """AdamW's parameter groups: the head (``head_lr``), the adapters' A matrices and
        their B matrices (both ``lr``; two groups, so checkpoints of every version resume).
        """
        cfg = self.config
        lora_b = {n for n in params if n.startswith("lora.") and ".lora_B." in n}
        return [
            {"params": [p for n, p in params.items() if n.startswith("head.")], "lr": cfg.head_lr},
            {
                "params": [
                    p for n, p in params.items() if n.startswith("lora.") and n not in lora_b
                ],
                "lr": cfg.lr,
            },
            {"params": [params[n] for n in sorted(lora_b)], "lr": cfg.lr},
        ]

    def _batch_loss(self, train: TrainingSet, batch: list[int]) -> torch.Tensor:
        """One step's loss: the decision loss of every question asked in ``batch``,
        weighted by its share of the batch; all questions share one backbone pass."""
        cfg = self.config
        tokens, mask, pooled = self.features([train.examples[i].state for i in batch])
        loss = torch.zeros((), device=self.device)
        for qid, logits, target in self._question_logits(train, batch, tokens, mask, pooled):
            qtype = str(train.questions[qid].type)  # type: ignore[attr-defined]
            part = decision_loss(
                logits,
                target,
                qtype,
                label_smoothing=cfg.label_smoothing,
                brier_weight=cfg.brier_weight,
                ordinal_weight=cfg.ordinal_weight,
            )
            loss = loss + part * (len(target) / len(batch))
        return loss

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
            return fit_ensemble(
                cfg,
                data,
                out,
                make_member=lambda member: Trainer(member, backbone=self._backbone_arg),
                resume=resume,
                unlabeled=unlabeled,
            )
        train, val = split(data, cfg.val_fraction, seed=cfg.seed)
        checkpoint = out / CHECKPOINT_DIR
        validation: dict[str, float] = {}
        calibration: Calibrator | None = None
        self.memory = None
        self.held_out = {}
        memory: dict[str, dict[str, float]] = {}
        self.build(data, train)
        epochs = cfg.epochs if cfg.head == "option_evidence" else 0
        history, best = self._supervised(train, val, epochs, checkpoint, resume)
        kept = best["epoch"]
        if best["state"] is not None:
            self._restore(best["state"])
        if cfg.head == "prototype":
            # Without a validation split, the memory is cross-fitted on the head's folds.
            stats, memory = self.fit_prototypes(train, pool, memory=cfg.memory and not val.examples)
            if stats:
                history.append(stats)
        if cfg.rl_epochs > 0:
            history.extend(self.reinforce(train, val))
        if val.examples:
            metrics, val_logits, labels, types = self.evaluate(val)
            calibration = fit_calibrator(
                val_logits,
                labels,
                types,
                histogram=cfg.histogram,
                source=f"validation split ({len(val)} states) of {data.source or 'training data'}",
            )
            validation = dict(metrics)
            validation["ece_calibrated"] = _ece_after(calibration, val_logits, labels, types)
            if cfg.memory:
                memory = self.fit_memory(train, val, calibration)
            else:
                self.held_out_probabilities(val, calibration)
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
        groups = [g for g in self._param_groups(params) if g["params"]]
        optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
        total = steps_per_epoch * epochs
        # Transformers' linear warm-up and decay (epochs=0, the prototype head: never stepped).
        scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total), max(1, total))
        data = f"{train.digest()}/{val.digest()}"
        start_epoch, history, best = self._begin(
            train, checkpoint, resume, data, optimizer, scheduler
        )
        bad_epochs = sum(1 for h in history if h.get("epoch", 0) > best["epoch"])
        lengths = self._lengths(train) if self.GROUP_BY_LENGTH else None
        for epoch in range(start_epoch, epochs):
            if bad_epochs >= cfg.patience and val.examples:
                break
            running = self._epoch(
                train,
                epoch,
                params,
                optimizer,
                scheduler,
                lengths,
                desc=f"{label}epoch {epoch + 1}/{epochs}",
            )
            record = {"epoch": epoch + 1, "train_loss": running / max(1, steps_per_epoch)}
            score, tolerance = self._epoch_score(record, val)
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
            self._save_checkpoint(
                checkpoint, epoch + 1, history, best, optimizer, scheduler, data=data
            )

        return history, best

    def _begin(
        self,
        train: TrainingSet,
        checkpoint: Path,
        resume: bool,
        data: str,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
    ) -> tuple[int, list[dict[str, float]], dict[str, Any]]:
        """Where the epochs start: from ``checkpoint`` when ``resume`` and it was written for
        the same training and validation states (``data``, their digests), else from epoch 0
        after the contrastive stage (if any).

        Returns the first epoch to run, the history so far and the kept epoch so far.
        """
        resume = resume and (checkpoint / "meta.json").is_file()
        if resume and self.checkpoint_data(checkpoint) not in (None, data):
            log.warning(
                "%s was written for other training or validation states; training from the start",
                checkpoint,
            )
            resume = False
        if resume:
            # The checkpointed adapters already went through the contrastive stage.
            return self._load_checkpoint(checkpoint, optimizer, scheduler)
        history: list[dict[str, float]] = []
        if self.config.contrastive_steps > 0:
            history.append(self.contrast(train))
        return 0, history, {"score": -math.inf, "epoch": 0, "state": None}

    def _epoch(
        self,
        train: TrainingSet,
        epoch: int,
        params: dict[str, torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        lengths: list[int] | None,
        *,
        desc: str,
    ) -> float:
        """One epoch of the head and adapters (batches and dropout seeded by the epoch, so
        a resumed run draws what an uninterrupted one would). Returns the summed loss."""
        from tqdm.auto import tqdm

        cfg = self.config
        rng = random.Random(cfg.seed * 1000 + epoch)
        batches = _batches(len(train), cfg.batch_size, rng, lengths)
        torch.manual_seed(cfg.seed * 1000 + epoch)
        self.model.train(cfg.lora_rank > 0)  # a frozen backbone stays deterministic
        self.head.train()
        running = 0.0
        bar = tqdm(batches, desc=desc, disable=not cfg.progress, leave=False)
        for n, batch in enumerate(bar, start=1):
            loss = self._batch_loss(train, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            optimizer.step()
            scheduler.step()
            running += float(loss.detach())
            bar.set_postfix(loss=f"{running / n:.4f}")
        return running

    def _epoch_score(self, record: dict[str, float], val: TrainingSet) -> tuple[float, float]:
        """Score an epoch for keeping: adds the validation metrics (``val_*``) to its
        history ``record`` and returns ``(score, tolerance)``: validation accuracy less
        1e-3 x NLL within one standard error, or, without a validation split, minus the
        training loss with no tolerance."""
        if not val.examples:
            return -record["train_loss"], 0.0
        metrics = self.evaluate(val)[0]
        record.update({f"val_{k}": v for k, v in metrics.items()})
        score = metrics["accuracy"] - 1e-3 * metrics["nll"]
        return score, _standard_error(metrics["accuracy"], len(val.pairs()))

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
