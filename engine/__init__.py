"""clef-agents decision engine: typed questions in, calibrated probabilities out.

Imports no agent framework. See ``clef_agents`` for the LangChain/LlamaIndex layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clef_engine._version import __version__
from clef_engine.errors import (
    ClefError,
    DeviceUnavailableError,
    InvalidRequestError,
    MissingDependencyError,
    ModelLoadError,
    StateTooLargeError,
    UnsupportedQuestionError,
)
from clef_engine.protocol import Engine
from clef_engine.schema import (
    Answer,
    Box,
    BoxAnswer,
    Choice,
    ChoiceAnswer,
    DecisionRequest,
    DecisionResult,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
)

if TYPE_CHECKING:
    from clef_engine.backbones import Backbone, EncoderBackbone, load_backbone, register_backbone
    from clef_engine.calibration import Calibrator
    from clef_engine.calibration.fit import fit_choice_temperature
    from clef_engine.runtime.engine import DecisionEngine
    from clef_engine.runtime.none_of_these import fit_none_below
    from clef_engine.runtime.thresholds import Thresholds, fit_thresholds

# Names whose modules import torch load on first use, so that the schema, the errors and
# torch-free layers (``clef_agents.fake``, rule fallbacks) import without torch.
_LAZY = {
    "Backbone": "clef_engine.backbones",
    "EncoderBackbone": "clef_engine.backbones",
    "load_backbone": "clef_engine.backbones",
    "register_backbone": "clef_engine.backbones",
    "Calibrator": "clef_engine.calibration",
    "DecisionEngine": "clef_engine.runtime.engine",
    "Thresholds": "clef_engine.runtime.thresholds",
    "fit_thresholds": "clef_engine.runtime.thresholds",
    "fit_none_below": "clef_engine.runtime.none_of_these",
    "fit_choice_temperature": "clef_engine.calibration.fit",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clef_engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Answer",
    "Backbone",
    "Box",
    "BoxAnswer",
    "Calibrator",
    "Choice",
    "ChoiceAnswer",
    "ClefError",
    "DecisionEngine",
    "DecisionRequest",
    "DecisionResult",
    "DeviceUnavailableError",
    "EncoderBackbone",
    "Engine",
    "InvalidRequestError",
    "MissingDependencyError",
    "ModelLoadError",
    "Noul",
    "NoulAnswer",
    "Question",
    "Score",
    "ScoreAnswer",
    "StateTooLargeError",
    "Thresholds",
    "UnsupportedQuestionError",
    "Usage",
    "__version__",
    "fit_choice_temperature",
    "fit_none_below",
    "fit_thresholds",
    "load_backbone",
    "register_backbone",
]
