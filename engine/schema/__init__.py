"""The ``/v1/systemone`` question model: questions, requests, answers, rendering."""

from __future__ import annotations

from clef_engine.schema.answers import (
    Answer,
    BoxAnswer,
    BoxCoords,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
    Source,
    Usage,
    choice_confidence,
    score_confidence,
)
from clef_engine.schema.questions import Box, Choice, Noul, OptionSpec, Question, Score, readable
from clef_engine.schema.render import render_value
from clef_engine.schema.request import (
    DEFAULT_MODEL,
    IMAGE_PLACEHOLDER,
    DecisionRequest,
    ImageAsset,
    questions_from,
)

__all__ = [
    "DEFAULT_MODEL",
    "IMAGE_PLACEHOLDER",
    "Answer",
    "Box",
    "BoxAnswer",
    "BoxCoords",
    "Choice",
    "ChoiceAnswer",
    "DecisionRequest",
    "DecisionResult",
    "ImageAsset",
    "Noul",
    "NoulAnswer",
    "OptionSpec",
    "Question",
    "Score",
    "ScoreAnswer",
    "Source",
    "Usage",
    "choice_confidence",
    "questions_from",
    "readable",
    "render_value",
    "score_confidence",
]
