"""What a fine-tuning run is asked to do (:class:`TrainConfig`) and what it produced
(:class:`TrainResult`); ``docs/finetune.md`` has the measurements behind the defaults.

The measured recipes are named presets (:data:`PRESETS`, :meth:`TrainConfig.preset`).
Ablations that were measured and did not become a default (R-Drop, a weight average,
DoRA, LoRA+, refitting on all the data, the option bank started from the examples, a
supervised contrastive term in the epochs, shared ensemble splits, a temperature for an
ensemble's mean) are not options of the library: ``benchmarks/finetune_probes.py`` keeps
running them as a subclass of the trainer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_RANK = 256
HEADS = ("option_evidence", "prototype")

PRESETS: dict[str, dict[str, Any]] = {
    "full": {},
    "few_shot": {"head": "prototype", "contrastive_steps": 30, "val_fraction": 0.0},
    "ensemble": {"ensemble": 2, "lr": 1e-3},
}
"""The measured recipes (BANKING77, ``docs/finetune.md``), by name:

* ``"full"`` (the defaults): LoRA rank 16 + the option-evidence head, 4 epochs, a 10 %
  validation split for the kept epoch, the temperature and the example memory. 94.15
  test macro-F1 on the full training set (mean of 5 seeds), 8.6 to 12 min on 2 CPU cores.
* ``"few_shot"``: about 10 examples per label. 30 contrastive steps on the LoRA adapters,
  then a prototype head on the adapted vectors, every example trains it (no validation
  split; the temperature and memory come from its 5 folds). 87.58 % at 10 per label
  (3 samples; 75 to 81 s of training on 2 CPU cores) where the option-evidence head
  trained for 10 epochs gave 83.50 %.
* ``"ensemble"``: two runs of ``"full"`` (seeds ``seed`` and ``seed + 1``) at lr 1e-3 in
  one model dir, answering with the mean of their calibrated answers: 94.26 macro-F1
  (6 seeds), at twice the training time and the backbone passes per decision.
"""


@dataclass
class TrainConfig:
    """Hyper-parameters of a fine-tuning run (stored in ``training.json``).

    Start from a measured recipe with :meth:`preset`; the defaults are ``"full"``.

    Example:
        >>> TrainConfig.preset("few_shot").head
        'prototype'
        >>> TrainConfig.preset("full", epochs=3).epochs
        3
    """

    epochs: int = 4
    batch_size: int = 32
    lr: float = 5e-4
    """Learning rate of the LoRA adapters."""
    head_lr: float = 2e-3
    """Learning rate of the head and its option bank."""
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    """Share of the steps over which the learning rate warms up from 0 (then it decays
    linearly to 0: transformers' ``get_linear_schedule_with_warmup``)."""
    lora_rank: int = 16
    """0 trains the head only (the backbone stays frozen)."""
    lora_alpha: float | None = None
    """Default: ``2 * lora_rank``."""
    lora_dropout: float = 0.1
    target_modules: list[str] | None = None
    """Default: the attention and MLP projections of the backbone's architecture."""
    label_smoothing: float = 0.1
    brier_weight: float = 0.5
    ordinal_weight: float = 1.0
    head_dim: int = 256
    head_heads: int = 4
    head_dropout: float = 0.1
    val_fraction: float = 0.1
    patience: int = 2
    max_length: int | None = 128
    """Tokens per training text (longer states are truncated while training)."""
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
    """Temperature of the contrastive stage's supervised contrastive loss."""
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
    """Keep an example memory per question (:mod:`clef_engine.heads.memory`): the adapted vectors
    of its training states vote with the head (kNN mixture), with ``k``, ``tau``, the
    mixture weight and its temperature chosen on the validation split, whose states then
    join the memory; a question keeps none where no mixture lowers the validation NLL.
    Without a validation split (``val_fraction=0``) the option-evidence head keeps none,
    while ``head="prototype"`` chooses them on the 5-fold split its temperature is fitted
    on: each example is voted on by the examples of the other folds and scored against
    the head fitted without its fold."""
    memory_max_states: int = 100_000
    """Training states per question in the memory at most (a seeded random sample beyond
    that); each costs ``4 * hidden_size`` bytes on disk and one dot product per decision."""
    ensemble: int = 1
    """Train this many runs of the recipe, seeds ``seed`` .. ``seed + ensemble - 1``, into
    ``members/0`` .. of the model dir; the engine averages their calibrated answers
    (example memories included; :mod:`clef_engine.train.ensemble`). Each member holds out
    the validation split of its own seed and is the single run of that seed. ``ensemble``
    times the training time and the backbone passes per decision; the ``"ensemble"``
    preset is the measured recipe. 1: one model."""
    seed: int = 0
    device: str | None = None
    progress: bool = True
    model_name: str | None = None

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TrainConfig:
        """The measured recipe ``name`` (:data:`PRESETS`; ``"few-shot"`` is accepted for
        ``"few_shot"``), with ``overrides`` on top.

        Raises:
            ValueError: An unknown name.
        """
        key = name.replace("-", "_")
        if key not in PRESETS:
            raise ValueError(f"recipe must be one of {', '.join(PRESETS)}; got {name!r}")
        return cls(**{**PRESETS[key], **overrides})

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """A config from ``values`` (such as the ``config`` of a ``training.json``), leaving
        out keys this version has no field for: those that earlier versions wrote for
        options since removed (``rdrop_weight``, ``use_dora``, ``refit``...)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            log.info("TrainConfig: ignoring fields of an earlier version: %s", unknown)
        return cls(**{k: v for k, v in values.items() if k in names})

    def check(self) -> None:
        """Refuse values no run can use (``ValueError`` naming the field and the limit)."""
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
        if self.ensemble < 1:
            raise ValueError(f"ensemble must be at least 1; got {self.ensemble}")
        if self.ensemble > 1 and self.val_fraction == 0:
            raise ValueError(
                "ensemble calibrates its members on the states they hold out; it "
                "needs val_fraction > 0"
            )
        if self.memory_max_states < 1:
            raise ValueError(f"memory_max_states must be at least 1; got {self.memory_max_states}")
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
    members: list[TrainResult] = field(default_factory=list)
    """With ``ensemble > 1``: each member's result (``history`` holds them all, with a
    ``member`` key; ``best_epoch`` and ``memory`` are member 0's)."""
