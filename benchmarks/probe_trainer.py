"""The ablations of the fine-tuning recipe that were measured and did not become options.

:class:`ProbeConfig` is the library's :class:`~clef_engine.train.TrainConfig` plus one
field per ablation, and :class:`ProbeTrainer` runs them by overriding the trainer's
protected steps (``_head_config``, ``_bank_vectors``, ``_lora_options``,
``_param_groups``, ``_batch_loss``, ``GROUP_BY_LENGTH``, ``ADD_VALIDATION_TO_MEMORY``),
so the library keeps no option for them. ``finetune_banking77.py`` (``--dora``,
``--lora-plus-ratio``, ``--rdrop-weight``, ``--contrastive-weight``, ``--refit``,
``--no-evidence-head``), ``finetune_probes.py`` and ``gpu/finetune_sweep.py``
(``bank_init``) build their runs with it. docs/finetune.md has the measurements:

* ``use_dora``: DoRA (Liu et al., 2024) adapters; 93.85 macro-F1 against 94.08, 1.6x the time.
* ``lora_plus_ratio``: LoRA+ (Hayou et al., 2024), the B matrices learn ``ratio`` times
  faster; 93.30 at 16.
* ``rdrop_weight``: R-Drop (Liang et al., 2021), every batch twice with two dropout draws,
  plus that weight times the symmetric KL of the two predictions; 93.83 at 1, 1.9x the time.
* ``contrastive_weight``: plus that weight times a supervised contrastive loss on each
  batch's pooled vectors (Gunel et al., 2021); 94.00 against 94.07 (5 seeds).
* ``refit``: after the run, train again from the same start on every state (validation
  split included) for the kept number of epochs, keeping the first run's calibration;
  93.91 against 94.08 on the full set, +1.6 points at 10 shots (where the few-shot
  recipe is 2.5 points higher still).
* ``bank_init="examples"``: the option bank starts at the normalised mean of the option
  text's and its training states' embeddings; within the seed spread at 10 shots, worse
  on the full set.
* ``evidence=False`` / ``option_bank=False``: the head's ablations (cosine scores only,
  or option vectors that do not train).
* ``group_by_length=False``: plain shuffled batches (2.3x the time of an epoch).
* ``memory_add_validation=False``: the example memory of the training states alone.

Removed with no probe left (their sections in ``results/finetune_banking77.json`` stay the
record): ``ema_decay`` (a weight average, 94.02 against 94.08), and the ensemble's
``shared_split``/``split_seed`` and ``ensemble_temperature`` (which raised test ECE in 12
of 15 ensembles).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_engine.heads.option_evidence import HeadConfig
from clef_engine.runtime import model_dir
from clef_engine.train import TrainConfig, Trainer, TrainingSet, TrainResult
from clef_engine.train.contrastive import supervised_contrastive_loss
from clef_engine.train.losses import decision_loss, symmetric_kl


@dataclass
class ProbeConfig(TrainConfig):
    """:class:`TrainConfig` with the ablations; the defaults are the library's recipe."""

    use_dora: bool = False
    lora_plus_ratio: float = 1.0
    rdrop_weight: float = 0.0
    contrastive_weight: float = 0.0
    refit: bool = False
    bank_init: str = "text"
    evidence: bool = True
    option_bank: bool = True
    group_by_length: bool = True
    memory_add_validation: bool = True

    def check(self) -> None:
        super().check()
        if self.bank_init not in ("text", "examples"):
            raise ValueError(f"bank_init must be 'text' or 'examples'; got {self.bank_init!r}")
        if self.lora_plus_ratio <= 0:
            raise ValueError(f"lora_plus_ratio must be positive; got {self.lora_plus_ratio}")
        if min(self.rdrop_weight, self.contrastive_weight) < 0:
            raise ValueError("rdrop_weight and contrastive_weight must be non-negative")
        adapters = self.use_dora or self.contrastive_weight > 0
        if adapters and self.lora_rank == 0:
            raise ValueError("use_dora and contrastive_weight train LoRA adapters: lora_rank > 0")
        epochs_only = self.rdrop_weight > 0 or self.contrastive_weight > 0 or self.refit
        if epochs_only and (self.head == "prototype" or self.rl_epochs > 0):
            raise ValueError(
                "rdrop_weight, contrastive_weight and refit act on the option-evidence epochs; "
                "not with head='prototype' or the RL stage"
            )
        if self.refit and (self.val_fraction == 0 or self.ensemble > 1):
            raise ValueError("refit needs a validation split (val_fraction > 0) and one run")


def probe_fields() -> set[str]:
    """The names of :class:`ProbeConfig`'s ablation fields (not in TrainConfig)."""
    return {f.name for f in dataclasses.fields(ProbeConfig)} - {
        f.name for f in dataclasses.fields(TrainConfig)
    }


class ProbeTrainer(Trainer):
    """:class:`~clef_engine.train.Trainer` running a :class:`ProbeConfig`'s ablations."""

    config: ProbeConfig

    def __init__(self, config: ProbeConfig | None = None, backbone: Any = None) -> None:
        super().__init__(config or ProbeConfig(), backbone)
        self.GROUP_BY_LENGTH = self.config.group_by_length
        self.ADD_VALIDATION_TO_MEMORY = self.config.memory_add_validation

    def _head_config(self) -> HeadConfig:
        return dataclasses.replace(
            super()._head_config(),
            evidence=self.config.evidence,
            option_bank=self.config.option_bank,
        )

    def _bank_vectors(self, train: TrainingSet, qid: str) -> torch.Tensor:
        question = train.questions[qid]
        if self.config.bank_init != "examples" or str(question.type) == "score":  # type: ignore[attr-defined]
            return super()._bank_vectors(train, qid)
        # Per option: the normalised mean of its text's and its states' embeddings.
        texts, members = self._members(train, qid)  # every option has its text as a member
        chunks = [texts[i : i + 256] for i in range(0, len(texts), 256)]
        pooled = torch.cat([self.backbone.encode(c).pooled.float().cpu() for c in chunks])
        means = torch.stack([pooled[items].mean(dim=0) for items in members])
        return torch.nn.functional.normalize(means, dim=-1)

    def _lora_options(self) -> dict[str, Any]:
        return {**super()._lora_options(), "use_dora": self.config.use_dora}

    def _param_groups(self, params: dict[str, torch.nn.Parameter]) -> list[dict[str, Any]]:
        groups = super()._param_groups(params)
        groups[2]["lr"] = self.config.lr * self.config.lora_plus_ratio  # the B matrices
        return groups

    def _batch_loss(self, train: TrainingSet, batch: list[int]) -> torch.Tensor:
        cfg = self.config
        if cfg.rdrop_weight == 0 and cfg.contrastive_weight == 0:
            return super()._batch_loss(train, batch)
        if cfg.rdrop_weight > 0:  # each state twice in one forward: two dropout draws
            batch = batch + batch
        tokens, mask, pooled = self.features([train.examples[i].state for i in batch])
        loss = torch.zeros((), device=self.device)
        for qid, logits, target in self._question_logits(train, batch, tokens, mask, pooled):
            part = decision_loss(
                logits,
                target,
                str(train.questions[qid].type),  # type: ignore[attr-defined]
                label_smoothing=cfg.label_smoothing,
                brier_weight=cfg.brier_weight,
                ordinal_weight=cfg.ordinal_weight,
            )
            if cfg.rdrop_weight > 0:  # rows: the first copies, then the second
                half = len(target) // 2
                part = part + cfg.rdrop_weight * symmetric_kl(logits[:half], logits[half:])
            loss = loss + part * (len(target) / len(batch))
        if cfg.contrastive_weight > 0:
            loss = loss + cfg.contrastive_weight * self._batch_contrast(train, batch, pooled)
        return loss

    def _batch_contrast(
        self, data: TrainingSet, batch: list[int], pooled: torch.Tensor
    ) -> torch.Tensor:
        """Per question asked in the batch, the supervised contrastive loss of its states'
        pooled vectors under their labels, weighted by the question's share of the batch."""
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

    def fit(self, data: TrainingSet, out: str | Path, **kwargs: Any) -> TrainResult:
        if not self.config.refit:
            return super().fit(data, out, **kwargs)
        # Selection as usual, then the same start trained on every state for the kept
        # epochs (no validation split left: no memory), with the selection's calibration.
        with tempfile.TemporaryDirectory(prefix="clef-refit-") as tmp:
            selection = super().fit(data, tmp, **kwargs)
            calibration = model_dir.read_config(Path(tmp)).get("calibration")
        again = dataclasses.replace(
            self.config, refit=False, epochs=selection.best_epoch, val_fraction=0.0, memory=False
        )
        result = ProbeTrainer(again, self._backbone_arg).fit(data, out)
        config = model_dir.read_config(Path(out))
        if calibration is not None:
            config["calibration"] = calibration
        (Path(out) / model_dir.CONFIG).write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n"
        )
        history = selection.history + [{**h, "refit": 1.0} for h in result.history]
        return dataclasses.replace(
            result,
            history=history,
            best_epoch=selection.best_epoch,
            validation=selection.validation,
        )
