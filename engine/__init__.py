"""clef-agents decision engine: typed questions in, calibrated probabilities out.

Imports no agent framework. See ``clef_agents`` for the LangChain/LlamaIndex layers.
"""

from __future__ import annotations

from engine._version import __version__
from engine.backbones import Backbone, EncoderBackbone, load_backbone, register_backbone
from engine.calibration import Calibrator
from engine.errors import (
    ClefError,
    DeviceUnavailableError,
    InvalidRequestError,
    MissingDependencyError,
    ModelLoadError,
    StateTooLargeError,
    UnsupportedQuestionError,
)
from engine.runtime.engine import DecisionEngine
from engine.schema import (
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
    "InvalidRequestError",
    "MissingDependencyError",
    "ModelLoadError",
    "Noul",
    "NoulAnswer",
    "Question",
    "Score",
    "ScoreAnswer",
    "StateTooLargeError",
    "UnsupportedQuestionError",
    "Usage",
    "__version__",
    "load_backbone",
    "register_backbone",
]
