"""What a fine-tuning run is asked to do (:class:`TrainConfig`) and what it produced
(:class:`TrainResult`); ``docs/finetune.md`` has the measurements behind the defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MAX_RANK = 256
HEADS = ("option_evidence", "prototype")


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
    """Temperature of the supervised contrastive loss (the stage and ``contrastive_weight``)."""
    contrastive_weight: float = 0.0
    """During the option-evidence epochs, add this weight times a supervised contrastive
    loss (Gunel et al., 2021) on each batch's pooled vectors: states of one label pull
    together, the rest of the batch is pushed away. The example memory votes with those
    vectors. No extra forward pass. Needs ``lora_rank > 0``. On BANKING77 (0.5, 5 seeds)
    it lowered test ECE (0.0083) but not macro-F1 (94.00 against 94.07;
    ``docs/finetune.md``). 0: off."""
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
    mixture weight and its temperature chosen on the validation split; a question keeps
    none where no mixture lowers the validation NLL. Without a validation split
    (``val_fraction=0``) the option-evidence head keeps none (nor with ``refit``), while
    ``head="prototype"`` chooses them on the 5-fold split its temperature is fitted on:
    each example is voted on by the examples of the other folds and scored against the
    head fitted without its fold."""
    memory_max_states: int = 100_000
    """Training states per question in the memory at most (a seeded random sample beyond
    that); each costs ``4 * hidden_size`` bytes on disk and one dot product per decision."""
    memory_add_validation: bool = True
    """Once the validation split has chosen the memory's settings, its states join the
    memory too (``1 / (1 - val_fraction)`` times the states, on top of
    ``memory_max_states``). On BANKING77 this added 0 to 0.09 test macro-F1 and lowered
    test NLL on every seed (``docs/finetune.md``)."""
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
    ensemble: int = 1
    """Train this many runs of the recipe, seeds ``seed`` .. ``seed + ensemble - 1``, into
    ``members/0`` .. of the model dir; the engine averages their calibrated answers
    (example memories included; :mod:`clef_engine.train.ensemble`). By default each member holds
    out its own validation split (``shared_split``) and is the single run of its seed, and
    the mean gets no temperature of its own (``ensemble_temperature``). ``ensemble`` times
    the training time and the backbone passes per decision. On BANKING77
    (``docs/finetune.md``, "Ensembles") two runs gave test macro-F1 94.10 on the mean of 7
    seeds, +0.09 over their members alone, ECE 0.0104; 15 to 17 min of training on 2
    cores. 1: one model."""
    split_seed: int | None = None
    """Seed of the validation split (default: ``seed``); the members of an ensemble take
    theirs from the ensemble's (see ``shared_split``)."""
    shared_split: float | None = None
    """How much of the validation split of ``split_seed`` a run holds out when ``split_seed``
    is not its ``seed``, as for the members 1.. of an ensemble: per label that share of it,
    the rest drawn with ``seed`` from the other states
    (:func:`~clef_engine.train.data.split_indices`). 0: each member holds out the split of its
    own seed, as its single run would; 1: every member holds out the split of
    ``split_seed``; in between, part of each. ``None`` (default):
    ``ENSEMBLE_SHARED_SPLIT`` (0) in an ensemble, 1 otherwise. A value needs
    ``ensemble > 1`` or a ``split_seed``."""
    ensemble_temperature: bool = False
    """Fit one temperature per (question type, option-count bucket) on the mean of the
    members' answers on the states that every member held out, and apply it to the mean.
    Off by default: the members chose their own temperatures and memories on those same
    states, so a fit there is biased, and on BANKING77 it raised test ECE in 12 of the 15
    ensembles measured and lowered it in one (``docs/finetune.md``). With it every question
    needs states that all members hold out (raise ``shared_split`` or ``val_fraction``).
    Needs ``ensemble > 1``."""
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
        if self.contrastive_weight < 0:
            raise ValueError(
                f"contrastive_weight must be non-negative; got {self.contrastive_weight}"
            )
        if self.contrastive_weight > 0 and self.lora_rank == 0:
            raise ValueError("contrastive_weight trains the LoRA adapters; it needs lora_rank > 0")
        if self.head == "prototype" and (
            self.rdrop_weight > 0 or self.ema_decay > 0 or self.contrastive_weight > 0
        ):
            raise ValueError(
                "rdrop_weight, ema_decay and contrastive_weight act on the option-evidence "
                "epochs; "
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
        if self.ensemble < 1:
            raise ValueError(f"ensemble must be at least 1; got {self.ensemble}")
        if self.ensemble > 1 and (self.val_fraction == 0 or self.refit):
            raise ValueError(
                "ensemble calibrates its members on the states they hold out; it "
                "needs val_fraction > 0 and no refit (whose model keeps no held-out states)"
            )
        if self.ensemble_temperature and self.ensemble < 2:
            raise ValueError(
                "ensemble_temperature calibrates the mean of an ensemble; it needs ensemble > 1"
            )
        if self.shared_split is not None:
            if not 0.0 <= self.shared_split <= 1.0:
                raise ValueError(f"shared_split must be in [0, 1]; got {self.shared_split}")
            if self.ensemble == 1 and self.split_seed is None:
                raise ValueError(
                    "shared_split shares part of the split of split_seed; it needs "
                    "ensemble > 1 or a split_seed"
                )
        if self.memory_max_states < 1:
            raise ValueError(f"memory_max_states must be at least 1; got {self.memory_max_states}")
        if self.bank_init not in ("text", "examples"):
            raise ValueError(f"bank_init must be 'text' or 'examples'; got {self.bank_init!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        if self.brier_weight < 0 or self.ordinal_weight < 0:
            raise ValueError("brier_weight and ordinal_weight must be non-negative")


ENSEMBLE_SHARED_SPLIT = 0.0
"""``TrainConfig.shared_split`` of an ensemble's members when it is not given: each holds
out the split of its own seed. On BANKING77 seeds 0 to 3 it scored 94.22 macro-F1, 0.5
94.18 and 1 94.07, differences inside the spread between seeds (``docs/finetune.md``); 0
is the simplest, each member being the single run of its seed."""


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
