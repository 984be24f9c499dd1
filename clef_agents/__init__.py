"""clef-agents: calibrated decisions for agent graphs.

Re-exports the engine's public API, so ``from clef_agents import DecisionEngine, Choice``
is all most users need. Framework layers live in submodules (``clef_agents.langchain``,
``clef_agents.llama_index``, ...) and import their framework only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import clef_engine as _engine
from clef_engine import __all__ as _engine_all
from clef_engine import __version__

if TYPE_CHECKING:
    from clef_engine import *  # noqa: F403 - the engine's public API is ours
    from clef_engine.calibration.metrics import (
        accuracy,
        expected_calibration_error,
        reliability_diagram,
    )
    from clef_engine.train import (
        TrainConfig,
        Trainer,
        calibrate,
        load_eval_data,
        load_training_data,
        sample_per_label,
    )

# What a notebook or script needs beyond deciding: measure calibration, fine-tune, recalibrate.
_TOOLS = {
    "accuracy": "clef_engine.calibration.metrics",
    "expected_calibration_error": "clef_engine.calibration.metrics",
    "reliability_diagram": "clef_engine.calibration.metrics",
    "TrainConfig": "clef_engine.train",
    "Trainer": "clef_engine.train",
    "calibrate": "clef_engine.train",
    "load_eval_data": "clef_engine.train",
    "load_training_data": "clef_engine.train",
    "sample_per_label": "clef_engine.train",
}

__all__ = [*_engine_all]
__all__ += [
    "TrainConfig",
    "Trainer",
    "accuracy",
    "calibrate",
    "expected_calibration_error",
    "load_eval_data",
    "load_training_data",
    "reliability_diagram",
    "sample_per_label",
]
_ = __version__


def __getattr__(name: str) -> Any:
    # Forwarded lazily: DecisionEngine and friends import torch only when first used.
    if name in _engine_all:
        value = getattr(_engine, name)
    elif name in _TOOLS:
        import importlib

        value = getattr(importlib.import_module(_TOOLS[name]), name)
    else:
        raise AttributeError(f"module 'clef_agents' has no attribute {name!r}")
    globals()[name] = value
    return value
