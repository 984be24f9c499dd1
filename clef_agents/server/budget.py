"""The compute budget of one HTTP request, checked before it is queued for the model.

The model worker answers one batch at a time, so a single request with a huge state, tens
of thousands of fresh option texts or thousands of examples would hold everyone else up
for minutes. The server refuses such a request at once: 413 for state size, 422 (naming
``questions`` and the limit) for option and example counts. The limits are settings of
:class:`~clef_agents.server.config.ServerConfig` (defaults in :mod:`clef_engine.schema.limits`);
the Python API has no such budget.

Example:
    >>> from clef_engine.schema.request import DecisionRequest
    >>> from clef_agents.server.config import ServerConfig
    >>> req = DecisionRequest.parse({"state": "hi", "questions": {"q": {
    ...     "type": "noul", "instructions": "ok?"}}})
    >>> state_chars(req.state)
    2
    >>> check_questions(req.questions, ServerConfig())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clef_agents.server.config import ServerConfig
from clef_agents.server.errors import HTTPError, ValidationFailed
from clef_engine.backbones.vision.images import is_image
from clef_engine.errors import InvalidRequestError
from clef_engine.heads.zero_shot import option_texts
from clef_engine.schema.limits import MAX_JSON_DEPTH
from clef_engine.schema.render import render_value

_IMAGE = "[image]"


def _strip_images(value: Any, top: bool, depth: int) -> Any:
    """``value`` with every image string (data URL, top-level base64) as ``[image]``."""
    if depth > MAX_JSON_DEPTH + 1:
        # The engine refuses this too; stop before the stack does.
        raise InvalidRequestError(
            f"JSON is nested deeper than {MAX_JSON_DEPTH} levels",
            field="state",
            limit=MAX_JSON_DEPTH,
        )
    if isinstance(value, str):
        return _IMAGE if is_image(value, top_level=top, allow_paths=False) else value
    if isinstance(value, Mapping):
        return {k: _strip_images(v, False, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strip_images(v, False, depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _IMAGE
    return value


def state_chars(state: Any, prefix: tuple[Any, ...] = ()) -> int:
    """Characters of the rendered state, as the engine renders it, images counted as 7.

    Raises:
        ValidationFailed: The state cannot be rendered (too deep, NaN, ...); its ``loc``
            starts with ``prefix`` (``("states", 3)`` for a batch item).
    """
    try:
        return len(render_value(_strip_images(state, True, 0), "state"))
    except InvalidRequestError as exc:
        raise ValidationFailed.from_engine(exc, prefix) from None


def too_large(what: str, chars: int, limit: int, setting: str) -> HTTPError:
    """The 413 of a state over the budget, naming the field, the limit and the setting."""
    return HTTPError(
        413,
        "request_too_large",
        f"{what} renders to {chars} characters; the limit is {limit} (server setting {setting})",
    )


def check_state(state: Any, config: ServerConfig, index: int | None = None) -> int:
    """Refuse a state longer than ``max_state_chars`` (413); return its length.

    ``index`` is the state's place in a batch request (named in errors).
    """
    prefix: tuple[Any, ...] = () if index is None else ("states", index)
    chars = state_chars(state, prefix)
    if chars > config.max_state_chars:
        where = "state" if index is None else f"states[{index}]"
        raise too_large(where, chars, config.max_state_chars, "max_state_chars")
    return chars


def check_questions(questions: Mapping[str, Any], config: ServerConfig) -> None:
    """Refuse too many distinct option texts or examples over all questions (422)."""
    texts: set[str] = set()
    examples = 0
    for question in questions.values():
        if question.type == "box":
            continue
        texts.update(option_texts(question))
        examples += sum(len(spec.examples) for spec in question.option_specs())
    if len(texts) > config.max_option_texts:
        raise ValidationFailed.one(
            ["questions"],
            f"the questions have {len(texts)} distinct option texts; the limit is "
            f"{config.max_option_texts} per request (server setting max_option_texts)",
            "too_long",
        )
    if examples > config.max_example_texts:
        raise ValidationFailed.one(
            ["questions"],
            f"the questions have {examples} option examples; the limit is "
            f"{config.max_example_texts} per request (server setting max_example_texts)",
            "too_long",
        )


def check_batch_states(states: Sequence[Any], config: ServerConfig) -> None:
    """Refuse a batch whose states together are longer than ``max_batch_state_chars``.

    Items that cannot be rendered are left to their own per-item errors.
    """
    total = 0
    for i, state in enumerate(states):
        try:
            total += state_chars(state, ("states", i))
        except ValidationFailed:
            continue
    if total > config.max_batch_state_chars:
        raise too_large("states", total, config.max_batch_state_chars, "max_batch_state_chars")
