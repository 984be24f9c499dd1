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

# The server's compute budget per request (defaults of ``ServerConfig`` and ``clef-agents
# serve``): one request must not hold the model worker for minutes while others wait. Each
# is checked before the request is queued for the model. The Python API has no such budget.
SERVER_MAX_STATE_CHARS = 100_000
"""Longest rendered state of one request, images left out (413 above it). English text
runs about 4-5 characters a token, so this is about 80-100 windows of 256 tokens."""
SERVER_MAX_BATCH_STATE_CHARS = 500_000
"""Most rendered state characters of one ``/v1/systemone/batch`` request, all states
together (413 above it)."""
SERVER_MAX_OPTION_TEXTS = 1_024
"""Most distinct option texts over all questions of one request (422 above it)."""
SERVER_MAX_EXAMPLE_TEXTS = 1_000
"""Most option examples over all questions of one request (422 above it)."""
