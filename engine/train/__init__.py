"""Fine-tuning: LoRA adapters (peft) + the option-evidence head, then calibration.

The measured recipes are presets: ``TrainConfig.preset("full")`` (the defaults),
``"few_shot"`` (a contrastive stage on the adapters, then a prototype head on the adapted
vectors) and ``"ensemble"`` (two runs in one model dir that answers with their mean,
:mod:`clef_engine.train.ensemble`).

Needs the ``[train]`` extra (``pip install 'clef-agents[train]'``) for LoRA; data loading
and the losses work without it.
"""

from __future__ import annotations

from clef_engine.train.config import PRESETS
from clef_engine.train.contrastive import supervised_contrastive_loss
from clef_engine.train.data import (
    Example,
    TrainingDataError,
    TrainingSet,
    load_data,
    load_eval_data,
    load_training_data,
    load_unlabeled,
    sample_per_label,
    split,
)
from clef_engine.train.losses import (
    brier,
    decision_loss,
    partial_credit,
    ranked_probability_score,
    symmetric_kl,
)
from clef_engine.train.recalibrate import CalibrationReport, calibrate
from clef_engine.train.rl import rl_loss
from clef_engine.train.trainer import TrainConfig, Trainer, TrainResult

__all__ = [
    "PRESETS",
    "CalibrationReport",
    "Example",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingDataError",
    "TrainingSet",
    "brier",
    "calibrate",
    "decision_loss",
    "load_data",
    "load_eval_data",
    "load_training_data",
    "load_unlabeled",
    "partial_credit",
    "ranked_probability_score",
    "rl_loss",
    "sample_per_label",
    "split",
    "supervised_contrastive_loss",
    "symmetric_kl",
]
