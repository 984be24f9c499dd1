"""Limits of the question model, in one place so errors, docs and the server agree."""

from __future__ import annotations

MIN_CHOICE_OPTIONS = 2
MAX_CHOICE_OPTIONS = 255
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10
MAX_QUESTIONS = 128
MAX_QUESTION_ID_CHARS = 256
MAX_OPTION_NAME_CHARS = 1_000
MAX_TEXT_CHARS = 20_000
"""Longest rendered instructions or option description, in characters."""
MAX_EXAMPLES_PER_OPTION = 10_000
MAX_STATE_CHARS = 1_000_000
"""Default cap on the rendered state; longer states are refused, shorter long ones are windowed."""
MAX_JSON_DEPTH = 32
