"""Fine-tune the engine: LoRA on a frozen backbone + the option-evidence head.

The recipe (see ``docs/finetune.md`` for the measurements behind the defaults):

1. carve a stratified validation split from the training data;
2. embed every option text once with the *base* backbone; these vectors start the
   head's option bank for the trained questions;
3. optionally a contrastive stage on the LoRA adapters (``contrastive_steps``,
   :mod:`engine.train.contrastive`);
4. ``head="option_evidence"`` (default): train LoRA adapters (peft) and the head with
   label-smoothed CE + lambda * Brier (+ RPS for score questions); all questions about a
   state share one backbone pass; keep the latest epoch whose validation accuracy is
   within one standard error of the best so far (early stopping: ``patience`` epochs
   below that band end the run); a checkpoint after every epoch makes ``resume=True``
   continue an interrupted run. ``head="prototype"``: no epochs; fit a prototype head per
   question on the (adapted) pooled vectors of the training states (the few-shot recipe),
   semi-supervised when unlabelled states are given (``fit(..., unlabeled=texts)``:
   pseudo-labels from the head fitted on the labelled states join a second fit);
5. optionally an RL stage (:mod:`engine.train.rl`) on the head;
6. fit temperatures (and optional histogram binning) on the validation split;
7. ``memory=True`` (default): an example memory per question, the adapted vectors of its
   training states, whose nearest-neighbour vote is mixed with the head's probabilities
   (:mod:`engine.heads.memory`; settings chosen on the validation split, none kept where
   it does not lower the validation NLL);
8. write a model dir: ``config.json``, ``head.safetensors``, ``memory.safetensors``,
   ``adapter/`` (peft format), ``training.json``. ``DecisionEngine.from_pretrained(out)``
   loads it.

Example:
    >>> from engine.train import Trainer, TrainConfig, load_training_data
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.backbones import PACKAGED
from engine.backbones.encoder import EncoderBackbone
from engine.calibration.fit import fit_calibrator
from engine.calibration.metrics import expected_calibration_error
from engine.calibration.temperature import Calibrator
from engine.errors import peft_quietly, require
from engine.heads.memory import MEMORY_FILE, ExampleMemory, fit_question_memory
from engine.heads.option_evidence import (
    HEAD_FILE,
    HeadConfig,
    OptionEvidenceHead,
    fingerprint,
    pad_tokens,
)
from engine.heads.prototype import PrototypeClassifier
from engine.heads.zero_shot import option_texts
from engine.runtime.adapter import ADAPTER_DIR
from engine.runtime.model_dir import CONFIG, FORMAT, FORMAT_VERSION
from engine.train.contrastive import contrastive_batch, supervised_contrastive_loss
from engine.train.data import TrainingDataError, TrainingSet, split
from engine.train.losses import decision_loss, partial_credit, symmetric_kl
from engine.train.rl import rl_loss

log = logging.getLogger(__name__)

TARGETS = (
    ("query", "key", "value", "dense"),  # BERT, MiniLM, RoBERTa
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),  # Qwen, Llama
    ("q", "k", "v", "o"),  # T5
    ("q_lin", "k_lin", "v_lin", "out_lin"),  # DistilBERT
)
MAX_RANK = 256
CHECKPOINT_DIR = "checkpoint"
SELECTION_FILE = "selection.json"
"""With ``refit``: the selection run's history, kept epoch and calibration, for ``--resume``."""
HEADS = ("option_evidence", "prototype")
CONTRASTIVE_CHUNK = 32
"""States per backbone forward inside one contrastive step (sorted by length first)."""


@dataclass
class TrainConfig:
    """Hyper-parameters of a fine-tuning run (stored in ``training.json``)."""

    epochs: int = 4
    batch_size: int = 32
    lr: float = 5e-4
    """Learning rate of the LoRA adapters."""
    head_lr: float = 2e-3
    """Learning rate of the head and its option bank."""
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    lora_rank: int = 16
    """0 trains the head only (the backbone stays frozen)."""
    lora_alpha: float | None = None
    """Default: ``2 * lora_rank``."""
    lora_dropout: float = 0.1
    use_dora: bool = False
    """DoRA (Liu et al., 2024): each adapted weight is split into a magnitude per output
    feature (trained) and a direction that LoRA adapts; merged at load time like LoRA."""
    lora_plus_ratio: float = 1.0
    """LoRA+ (Hayou et al., 2024): the learning rate of the adapters' B matrices is ``lr``
    times this (the A matrices keep ``lr``). 1: plain LoRA."""
    target_modules: list[str] | None = None
    """Default: the attention and MLP projections of the backbone's architecture."""
    label_smoothing: float = 0.1
    brier_weight: float = 0.5
    ordinal_weight: float = 1.0
    head_dim: int = 256
    head_heads: int = 4
    head_dropout: float = 0.1
    evidence: bool = True
    """``False``: cosine + learned scale only (the "no head" ablation)."""
    option_bank: bool = True
    bank_init: str = "text"
    """Start of each trained option's bank vector: ``"text"``, the embedding of the option's
    text (an untrained head is the zero-shot scorer); ``"examples"``, the normalised mean
    of that embedding and the base backbone's embeddings of the option's training states
    (an untrained head is a nearest-centroid classifier). ``choice`` and ``noul`` only."""
    val_fraction: float = 0.1
    patience: int = 2
    max_length: int | None = 128
    """Tokens per training text (longer states are truncated while training)."""
    group_by_length: bool = True
    """Batch states of similar token length together (shuffled in windows of 50 batches,
    batch order shuffled), so little compute goes to padding; on BANKING77 the padded tokens
    per state drop from 47 to 17."""
    head: str = "option_evidence"
    """``"option_evidence"``: train the option-evidence head for ``epochs`` epochs;
    ``"prototype"``: no epochs, fit a linear prototype head per question on the (adapted)
    pooled vectors of the training states, as the engine does for options with examples;
    with ``contrastive_steps`` this is the few-shot recipe (SetFit-style)."""
    contrastive_steps: int = 0
    """Steps of the contrastive stage on the LoRA adapters before the head (0: none)."""
    contrastive_per_label: int = 2
    """States of each label in one contrastive step (the option text counts as one)."""
    contrastive_temperature: float = 0.05
    contrastive_lr: float | None = None
    """Default: ``lr``."""
    pseudo_per_label: int | None = None
    """With unlabelled states (``Trainer.fit(..., unlabeled=...)``, ``head="prototype"``):
    at most this many pseudo-labelled states per option join the prototype head's fit, the
    most confident first. ``None``: every unlabelled state, with its predicted option."""
    rl_epochs: int = 0
    rl_lr: float = 2e-4
    rl_kl: float = 0.5
    rl_samples: int = 4
    similarity: dict[str, list[list[float]]] = field(default_factory=dict)
    """Per choice question id, an option-similarity matrix in [0, 1] (RL partial credit)."""
    histogram: bool = False
    """Fit histogram binning after the temperature (needs a large validation split)."""
    memory: bool = True
    """Keep an example memory per question (:mod:`engine.heads.memory`): the adapted vectors
    of its training states vote with the head (kNN mixture), with ``k``, ``tau``, the
    mixture weight and its temperature chosen on the validation split; a question keeps
    none where no mixture lowers the validation NLL. Needs a validation split
    (``val_fraction > 0``); without one, or with ``refit``, no memory is fitted."""
    memory_max_states: int = 100_000
    """Memory states per question at most (a seeded random sample beyond that); each costs
    ``4 * hidden_size`` bytes on disk and one dot product per decision."""
    rdrop_weight: float = 0.0
    """R-Drop (Liang et al., 2021): every batch runs through the model twice, with two
    dropout draws, and the loss adds this weight times the symmetric KL divergence between
    the two predictions (the supervised loss is averaged over both). Twice the training
    compute per epoch. 0: off."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the trained weights (LoRA adapters and head),
    updated after every step with this decay (warmed up as ``min(decay, (1+t)/(10+t))``);
    validation, the kept epoch and the saved model then use the average. 0: off."""
    refit: bool = False
    """After the run has chosen its epoch and fitted its calibration on the validation
    split, train again from the same start on all the data, that split included, for the
    chosen number of epochs, and save that model with that calibration (sklearn's
    ``refit``). About twice the training time; the model sees ``1/(1-val_fraction)`` times
    the states. Needs ``val_fraction > 0`` and the option-evidence head."""
    seed: int = 0
    device: str | None = None
    progress: bool = True
    model_name: str | None = None

    def check(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1; got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1; got {self.batch_size}")
        if not 0 <= self.lora_rank <= MAX_RANK:
            raise ValueError(f"lora_rank must be in 0..{MAX_RANK}; got {self.lora_rank}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}; got {self.head!r}")
        if self.contrastive_steps < 0:
            raise ValueError(f"contrastive_steps must be >= 0; got {self.contrastive_steps}")
        if self.contrastive_steps > 0 and self.lora_rank == 0:
            raise ValueError("contrastive_steps trains the LoRA adapters; it needs lora_rank > 0")
        if self.contrastive_per_label < 2:
            raise ValueError(
                f"contrastive_per_label must be at least 2 (a state needs a positive); "
                f"got {self.contrastive_per_label}"
            )
        if self.contrastive_temperature <= 0:
            raise ValueError(
                f"contrastive_temperature must be positive; got {self.contrastive_temperature}"
            )
        if self.head == "prototype" and self.rl_epochs > 0:
            raise ValueError(
                "the RL stage trains the option-evidence head; head='prototype' "
                "has none (set rl_epochs=0)"
            )
        if self.head == "prototype" and (self.rdrop_weight > 0 or self.ema_decay > 0):
            raise ValueError(
                "rdrop_weight and ema_decay act on the option-evidence epochs; "
                "head='prototype' runs none (set them to 0)"
            )
        if self.refit and self.val_fraction == 0:
            raise ValueError(
                "refit trains again on the validation split after choosing on it; "
                "it needs val_fraction > 0"
            )
        if self.refit and (self.head == "prototype" or self.rl_epochs > 0):
            raise ValueError(
                "refit repeats the option-evidence epochs; it does not support "
                "head='prototype' or the RL stage (rl_epochs > 0)"
            )
        if self.pseudo_per_label is not None and self.pseudo_per_label < 1:
            raise ValueError(
                "pseudo_per_label must be at least 1 (or None: no cap); "
                f"got {self.pseudo_per_label}"
            )
        if self.pseudo_per_label is not None and self.head != "prototype":
            raise ValueError(
                "pseudo_per_label caps the pseudo-labels of the prototype head; "
                f"it needs head='prototype' (got head={self.head!r})"
            )
        if self.use_dora and self.lora_rank == 0:
            raise ValueError("use_dora adapts the backbone; it needs lora_rank > 0")
        if self.lora_plus_ratio <= 0:
            raise ValueError(f"lora_plus_ratio must be positive; got {self.lora_plus_ratio}")
        if self.rdrop_weight < 0:
            raise ValueError(f"rdrop_weight must be non-negative; got {self.rdrop_weight}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1); got {self.ema_decay}")
        if self.memory_max_states < 1:
            raise ValueError(f"memory_max_states must be at least 1; got {self.memory_max_states}")
        if self.bank_init not in ("text", "examples"):
            raise ValueError(f"bank_init must be 'text' or 'examples'; got {self.bank_init!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        if self.brier_weight < 0 or self.ordinal_weight < 0:
            raise ValueError("brier_weight and ordinal_weight must be non-negative")


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` produced."""

    directory: Path
    history: list[dict[str, float]]
    best_epoch: int
    validation: dict[str, float]
    seconds: float
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per question id, the report of its example memory's fit (``fit_question_memory``)."""


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


class Trainer:
    """Fine-tunes a backbone (LoRA) and the option-evidence head; see the module docstring.

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
            self.fps[qid] = self.head.add_question(str(question.type), names, vectors)  # type: ignore[attr-defined]
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

    def _trainable(self) -> dict[str, torch.nn.Parameter]:
        out = {f"head.{n}": p for n, p in self.head.named_parameters() if p.requires_grad}
        if self.config.lora_rank > 0:
            out.update(
                {f"lora.{n}": p for n, p in self.model.named_parameters() if p.requires_grad}
            )
        return out

    def features(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(token states [B, L, H], mask [B, L], pooled [B, H])`` as the engine computes them.

        With a frozen backbone (``lora_rank=0``) each text is encoded once and cached, so
        later epochs only run the head.
        """
        if self.config.lora_rank > 0:
            return self._forward(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        with torch.no_grad():
            for start in range(0, len(missing), 64):
                chunk = missing[start : start + 64]
                hidden, mask, pooled = self._forward(chunk)
                for i, text in enumerate(chunk):
                    self._cache[text] = (hidden[i, : int(mask[i].sum())].clone(), pooled[i].clone())
        tokens, mask = pad_tokens([self._cache[t][0] for t in texts])
        return tokens, mask, torch.stack([self._cache[t][1] for t in texts])

    def _forward(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tok = self.backbone.tokenizer
        enc = tok(
            texts,
            padding=True,
            truncation=True,
            max_length=min(
                self.config.max_length or self.backbone.max_length, self.backbone.max_length
            ),
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        m = mask.unsqueeze(-1).float()
        hidden = hidden * m
        pooled = torch.nn.functional.normalize(hidden.sum(1) / m.sum(1).clamp(min=1.0), dim=-1)
        return hidden, mask.bool(), pooled

    def _question_logits(
        self,
        data: TrainingSet,
        batch: list[int],
        tokens: torch.Tensor,
        mask: torch.Tensor,
        pooled: torch.Tensor,
        head: OptionEvidenceHead | None = None,
    ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """Per question asked in the batch: ``(qid, logits [b, n], targets [b])``."""
        head = head or self.head
        out = []
        for qid, question in data.questions.items():
            rows = [r for r, i in enumerate(batch) if qid in data.examples[i].labels]
            if not rows:
                continue
            idx = torch.tensor(rows, device=self.device)
            qtype = str(question.type)  # type: ignore[attr-defined]
            logits = head.prototype_logits(qtype, data.names(qid), pooled[idx])
            if logits is None:
                options = head.option_vectors(qtype, data.names(qid), None)
                logits = head(tokens[idx], mask[idx], pooled[idx], options, qtype)
            target = torch.tensor(
                [data.examples[batch[r]].labels[qid] for r in rows], device=self.device
            )
            out.append((qid, logits, target))
        return out

    # -- loop ----------------------------------------------------------------------------

    def _lengths(self, data: TrainingSet) -> list[int]:
        """Token count of each state, as :meth:`_forward` truncates it."""
        return self._token_counts([ex.state for ex in data.examples])

    def _token_counts(self, texts: list[str]) -> list[int]:
        limit = min(self.config.max_length or self.backbone.max_length, self.backbone.max_length)
        enc = self.backbone.tokenizer(texts, truncation=True, max_length=limit)
        return [len(ids) for ids in enc["input_ids"]]

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
        train, val = split(data, cfg.val_fraction, seed=cfg.seed)
        checkpoint = out / CHECKPOINT_DIR
        selection = checkpoint / SELECTION_FILE
        validation: dict[str, float] = {}
        calibration: Calibrator | None = None
        self.memory, memory = None, {}
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
                stats = self.fit_prototypes(train, pool)
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

    def _unlabeled_pool(self, data: TrainingSet, unlabeled: Sequence[str]) -> list[str]:
        """``unlabeled`` without repeats and labelled states; refuses unusable input early."""
        if self.config.head != "prototype":
            raise TrainingDataError(
                "unlabelled states feed the prototype head's pseudo-labels; "
                f"they need head='prototype' (got head={self.config.head!r})",
                field="unlabeled",
            )
        if isinstance(unlabeled, str):
            raise TrainingDataError(
                "unlabeled must be a sequence of states, not one string", field="unlabeled"
            )
        for i, state in enumerate(unlabeled):
            if not isinstance(state, str) or not state.strip():
                raise TrainingDataError(
                    f"unlabelled state {i} must be a non-empty string; got {state!r}",
                    field=f"unlabeled[{i}]",
                )
        labelled = {ex.state for ex in data.examples}
        pool = [t for t in dict.fromkeys(unlabeled) if t not in labelled]
        if not pool:
            raise TrainingDataError(
                f"none of the {len(unlabeled)} unlabelled states is left once the labelled "
                "states are removed; pass states that carry no label",
                field="unlabeled",
            )
        return pool

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
        warmup = max(1, int(cfg.warmup_ratio * total))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        history: list[dict[str, float]] = []
        best: dict[str, Any] = {"score": -math.inf, "epoch": 0, "state": None}
        start_epoch = 0
        self._ema = None
        if resume and (checkpoint / "meta.json").is_file():
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
            self._save_checkpoint(checkpoint, epoch + 1, history, best, optimizer, scheduler)

        return history, best

    @torch.no_grad()
    def evaluate(
        self, data: TrainingSet, head: OptionEvidenceHead | None = None
    ) -> tuple[dict[str, float], list[torch.Tensor], list[int], list[str]]:
        """Raw-logit metrics on ``data`` plus the logits, labels and types themselves."""
        self.model.eval()
        head = head or self.head
        head.eval()
        logits_out: list[torch.Tensor] = []
        labels: list[int] = []
        types: list[str] = []
        order = list(range(len(data)))
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            tokens, mask, pooled = self.features([data.examples[i].state for i in batch])
            for qid, logits, target in self._question_logits(
                data, batch, tokens, mask, pooled, head
            ):
                qtype = str(data.questions[qid].type)  # type: ignore[attr-defined]
                logits_out.extend(logits.detach().double().cpu())
                labels.extend(int(t) for t in target)
                types.extend([qtype] * len(target))
        nll = sum(
            float(-torch.log_softmax(row, -1)[y]) for row, y in zip(logits_out, labels, strict=True)
        ) / max(1, len(labels))
        acc = sum(int(row.argmax()) == y for row, y in zip(logits_out, labels, strict=True)) / max(
            1, len(labels)
        )
        ece = _ece_after(None, logits_out, labels, types)
        return {"accuracy": acc, "nll": nll, "ece": ece}, logits_out, labels, types

    # -- contrastive stage and prototype head ----------------------------------------------

    def _members(self, data: TrainingSet, qid: str) -> tuple[list[str], list[list[int]]]:
        """Texts of a question's labelled states plus its option texts, grouped by label."""
        question = data.questions[qid]
        texts: list[str] = []
        members: list[list[int]] = [[] for _ in data.names(qid)]
        for ex in data.examples:
            if qid in ex.labels:
                members[ex.labels[qid]].append(len(texts))
                texts.append(ex.state)
        for label, text in enumerate(option_texts(question)):
            members[label].append(len(texts))
            texts.append(text)
        return texts, members

    def contrast(self, train: TrainingSet) -> dict[str, float]:
        """The contrastive stage (:mod:`engine.train.contrastive`) on the LoRA adapters.

        Step ``s`` of ``contrastive_steps`` takes the questions in turn (those with at least
        two labels) and samples ``contrastive_per_label`` members of each label; the
        learning rate warms up over the first sixth of the steps, then decays linearly.
        """
        from tqdm.auto import tqdm

        cfg = self.config
        questions = [q for q in train.questions if len(train.names(q)) >= 2]
        if not questions:
            raise TrainingDataError(
                "the contrastive stage needs a question with at least two labels",
                field="contrastive_steps",
            )
        pools = {q: self._members(train, q) for q in questions}
        lengths = {q: self._token_counts(pools[q][0]) for q in questions}
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=cfg.contrastive_lr or cfg.lr, weight_decay=cfg.weight_decay
        )
        total = cfg.contrastive_steps
        warmup = max(1, round(total / 6))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1.0 - s / total)
        )
        rng = random.Random(cfg.seed)
        self.model.train()
        losses: list[float] = []
        bar = tqdm(range(total), desc="contrastive", disable=not cfg.progress, leave=False)
        for step in bar:
            qid = questions[step % len(questions)]
            texts, members = pools[qid]
            batch = contrastive_batch(members, cfg.contrastive_per_label, rng)
            # The loss is order-free: encode the step's states in chunks of similar length,
            # so the forward pads (and keeps activations for) a few tokens, not the longest.
            batch.sort(key=lambda item: lengths[qid][item[0]])
            size = CONTRASTIVE_CHUNK
            chunks = [batch[i : i + size] for i in range(0, len(batch), size)]
            pooled = torch.cat([self._forward([texts[i] for i, _ in c])[2] for c in chunks])
            labels = torch.tensor([c for _, c in batch], device=self.device)
            loss = supervised_contrastive_loss(pooled, labels, cfg.contrastive_temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        self.model.eval()
        tail = losses[-max(1, total // 10) :]
        return {
            "contrastive_steps": float(total),
            "contrastive_loss_first": losses[0],
            "contrastive_loss_last": sum(tail) / len(tail),
        }

    @torch.no_grad()
    def _encode(self, texts: list[str]) -> torch.Tensor:
        """Adapted, pooled, normalised vectors of ``texts`` (``[N, H]``, CPU), in chunks."""
        self.model.eval()
        out = [torch.empty(0, self.backbone.hidden_size)]
        for start in range(0, len(texts), 64):
            out.append(self._forward(texts[start : start + 64])[2].float().cpu())
        return torch.cat(out)

    @torch.no_grad()
    def fit_prototypes(
        self, train: TrainingSet, unlabeled: Sequence[str] | None = None
    ) -> dict[str, float]:
        """Fit a prototype head per question on the adapted pooled vectors of ``train``.

        Each option's text is one more example of its label (as in the engine's prototype
        head); the temperature comes from a 5-fold split of those same examples and is
        folded into the stored weights. A validation split, when there is one, is left
        for the calibrator that the trainer fits afterwards.

        ``unlabeled`` states (encoded once; :meth:`fit` has already dropped repeats and
        labelled states, see :meth:`_unlabeled_pool`) are pseudo-labelled for every
        question by the head fitted on its labelled states, at most ``pseudo_per_label``
        per option, and join a second fit (:class:`~engine.heads.prototype.PrototypeClassifier`);
        the temperature still comes from the labelled states alone. Every question sees
        every unlabelled state, also in data where each question is asked of only some
        states. Returns the history entry of that step, ``{"unlabeled_states",
        "pseudo_labels"}`` (the latter counts (state, question) pairs), or ``{}`` without
        ``unlabeled``.
        """
        self.model.eval()
        pool = None if unlabeled is None else self._encode(list(unlabeled))
        pseudo = 0
        for qid, question in train.questions.items():
            texts, members = self._members(train, qid)
            labels = torch.empty(len(texts), dtype=torch.long)
            for label, items in enumerate(members):
                labels[items] = label
            vectors = self._encode(texts)
            names = train.names(qid)
            fitted = PrototypeClassifier.fit(
                vectors,
                labels,
                len(names),
                seed=self.config.seed,
                unlabeled=pool,
                per_label=self.config.pseudo_per_label,
            )
            pseudo += fitted.n_pseudo
            self.head.add_prototypes(
                str(question.type),  # type: ignore[attr-defined]
                names,
                (fitted.weight / fitted.temperature).to(self.device),
                (fitted.bias / fitted.temperature).to(self.device),
            )
        if pool is None:
            return {}
        return {"unlabeled_states": float(len(pool)), "pseudo_labels": float(pseudo)}

    # -- example memory ------------------------------------------------------------------

    @torch.no_grad()
    def fit_memory(
        self, train: TrainingSet, val: TrainingSet, calibration: Calibrator
    ) -> dict[str, dict[str, float]]:
        """An example memory per question (:mod:`engine.heads.memory`) into ``self.memory``.

        The memory holds the adapted vectors of the question's states in ``train`` (at most
        ``memory_max_states``); ``k``, ``tau``, the mixture weight and its temperature are
        chosen on ``val`` against the head's probabilities under ``calibration``. Questions
        with the same fingerprint (type and option set) share the head's option bank, so
        they share one memory too: their states and held-out states are pooled. Each state
        is encoded once. Returns the fit's report per question id, with the ``seconds`` it
        took.
        """
        cfg = self.config
        self.memory = ExampleMemory()
        reports: dict[str, dict[str, float]] = {}
        rng = random.Random(cfg.seed)
        vectors: dict[str, torch.Tensor] = {}

        def encode(texts: list[str]) -> torch.Tensor:
            missing = [t for t in dict.fromkeys(texts) if t not in vectors]
            if missing:
                vectors.update(zip(missing, self._engine_vectors(missing), strict=True))
            return torch.stack([vectors[t] for t in texts])

        groups: dict[str, list[str]] = {}
        for qid in train.questions:
            groups.setdefault(self.fps[qid], []).append(qid)
        for qids in groups.values():
            started = time.perf_counter()
            qtype = str(train.questions[qids[0]].type)  # type: ignore[attr-defined]
            names = train.names(qids[0])
            states: list[tuple[str, int]] = []
            held: list[str] = []
            held_probs: list[torch.Tensor] = []
            held_labels: list[torch.Tensor] = []
            for qid in qids:
                # Labels and probabilities in the order of the first question's options.
                order = [train.names(qid).index(name) for name in names]
                relabel = [order.index(i) for i in range(len(names))]
                states += [
                    (ex.state, relabel[ex.labels[qid]]) for ex in train.examples if qid in ex.labels
                ]
                part = val.only(qid)
                if not part.examples:
                    continue
                _, logits, labels, _ = self.evaluate(part)
                scaled = torch.softmax(
                    calibration.scale(torch.stack(logits), qtype, len(names)), -1
                )
                held_probs.append(calibration.adjust(scaled, qtype, len(names))[:, order])
                held_labels.append(torch.tensor([relabel[y] for y in labels]))
                held += [ex.state for ex in part.examples]
            if not states or not held:
                continue
            if len(states) > cfg.memory_max_states:
                states = rng.sample(states, cfg.memory_max_states)
            fitted, report = fit_question_memory(
                encode([state for state, _ in states]),
                torch.tensor([label for _, label in states]),
                names,
                encode(held),
                torch.cat(held_probs),
                torch.cat(held_labels),
            )
            report["seconds"] = round(time.perf_counter() - started, 1)
            reports.update(dict.fromkeys(qids, report))
            if fitted is not None:
                self.memory.add(qtype, fitted)
        if not self.memory:
            self.memory = None
        return reports

    def _engine_vectors(self, texts: list[str]) -> torch.Tensor:
        """Adapted pooled vectors of ``texts`` as the loaded model dir computes them: the
        backbone's own windowed encoding (no ``max_length`` truncation) through the adapted
        model (``[N, H]``, CPU)."""
        self.model.eval()
        base, self.backbone.model = self.backbone.model, self.model
        try:
            return self.backbone.encode(texts).pooled.float().cpu()
        finally:
            self.backbone.model = base

    # -- RL stage ------------------------------------------------------------------------

    def reinforce(self, train: TrainingSet, val: TrainingSet) -> list[dict[str, float]]:
        """Policy-gradient fine-tuning of the head with a proper-scoring reward (see rl.py)."""
        cfg = self.config
        from tqdm.auto import tqdm

        reference = copy.deepcopy(self.head).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        params = [p for p in self.head.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.rl_lr, weight_decay=0.0)
        credits = {
            qid: partial_credit(
                str(q.type),  # type: ignore[attr-defined]
                len(train.names(qid)),
                cfg.similarity.get(qid),
            ).to(self.device)
            for qid, q in train.questions.items()
        }
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        history = []
        self.model.eval()
        for epoch in range(cfg.rl_epochs):
            order = list(range(len(train)))
            random.Random(cfg.seed + 7919 * (epoch + 1)).shuffle(order)
            self.head.train()
            running, steps = 0.0, 0
            for start in tqdm(
                range(0, len(order), cfg.batch_size),
                desc=f"RL {epoch + 1}/{cfg.rl_epochs}",
                disable=not cfg.progress,
                leave=False,
            ):
                batch = order[start : start + cfg.batch_size]
                with torch.no_grad():
                    tokens, mask, pooled = self.features([train.examples[i].state for i in batch])
                    ref = {
                        q: lg
                        for q, lg, _ in self._question_logits(
                            train, batch, tokens, mask, pooled, reference
                        )
                    }
                loss = torch.zeros((), device=self.device)
                for qid, logits, target in self._question_logits(
                    train, batch, tokens, mask, pooled
                ):
                    part = rl_loss(
                        logits,
                        ref[qid],
                        target,
                        credits[qid],
                        samples=cfg.rl_samples,
                        kl_weight=cfg.rl_kl,
                        generator=gen,
                    )
                    loss = loss + part * (len(target) / len(batch))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                running += float(loss.detach())
                steps += 1
            record = {
                "epoch": float(self.config.epochs + epoch + 1),
                "rl_loss": running / max(1, steps),
            }
            if val.examples:
                record.update({f"val_{k}": v for k, v in self.evaluate(val)[0].items()})
            history.append(record)
        return history

    # -- state, checkpoints, output ------------------------------------------------------

    def _state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self._trainable().items()}

    @torch.no_grad()
    def _average(self, params: dict[str, torch.nn.Parameter], step: int) -> None:
        """One update of the moving average of the trained weights (``ema_decay``)."""
        assert self._ema is not None
        decay = min(self.config.ema_decay, (1 + step) / (10 + step))
        for n, p in params.items():
            self._ema[n].lerp_(p.detach(), 1.0 - decay)

    def _restore(self, state: dict[str, torch.Tensor]) -> None:
        params = self._trainable()
        with torch.no_grad():
            for n, value in state.items():
                params[n].copy_(value.to(params[n].device))

    def _save_checkpoint(
        self,
        directory: Path,
        epoch: int,
        history: list[dict[str, float]],
        best: dict[str, Any],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
    ) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"current.{n}": v.cpu().contiguous() for n, v in self._state().items()}
        tensors.update(
            {f"best.{n}": v.cpu().contiguous() for n, v in (best["state"] or {}).items()}
        )
        tensors.update({f"ema.{n}": v.cpu().contiguous() for n, v in (self._ema or {}).items()})
        opt = optimizer.state_dict()
        for idx, slots in opt["state"].items():
            for k, v in slots.items():
                tensors[f"opt.{idx}.{k}"] = torch.as_tensor(v).cpu().contiguous()
        save_file(tensors, str(directory / "state.safetensors"))
        meta = {
            "epoch": epoch,
            "history": history,
            "best_epoch": best["epoch"],
            "best_score": best["score"],
            "param_groups": opt["param_groups"],
            "scheduler": scheduler.state_dict()["last_epoch"],
            "config": asdict(self.config),
        }
        (directory / "meta.json").write_text(json.dumps(meta, indent=1, default=str))

    def _load_checkpoint(
        self, directory: Path, optimizer: torch.optim.Optimizer, scheduler: Any
    ) -> tuple[int, list[dict[str, float]], dict[str, Any]]:
        from safetensors.torch import load_file

        meta = json.loads((directory / "meta.json").read_text())
        tensors = load_file(str(directory / "state.safetensors"))

        def prefixed(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

        self._restore(prefixed("current."))
        best_state = prefixed("best.")
        params = self._trainable()
        ema = prefixed("ema.")
        if ema and self.config.ema_decay > 0:  # a run resumed with the average off drops it
            self._ema = {n: v.to(params[n].device) for n, v in ema.items()}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, idx, slot = k.split(".", 2)
                state.setdefault(int(idx), {})[slot] = v
        groups = meta["param_groups"]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        scheduler.last_epoch = int(meta["scheduler"])
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
        best = {
            "score": float(meta["best_score"]),
            "epoch": int(meta["best_epoch"]),
            "state": best_state or None,
        }
        return int(meta["epoch"]), list(meta["history"]), best

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
                        "fingerprint": fingerprint(str(getattr(v, "type", "")), data.names(q)),
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


def _ece_after(
    calibration: Any, logits: list[torch.Tensor], labels: list[int], types: list[str]
) -> float:
    """Mean ECE over question groups with the same option count (after ``calibration``)."""
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(logits):
        groups.setdefault(int(row.numel()), []).append(i)
    total, weighted = 0, 0.0
    for n, idx in groups.items():
        rows = torch.stack([logits[i] for i in idx]).double()
        if calibration is not None:
            t = types[idx[0]]
            probs = calibration.adjust(torch.softmax(calibration.scale(rows, t, n), -1), t, n)
        else:
            probs = torch.softmax(rows, -1)
        weighted += len(idx) * expected_calibration_error(probs.numpy(), [labels[i] for i in idx])
        total += len(idx)
    return weighted / max(1, total)
