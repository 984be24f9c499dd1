"""The decision request: a state, questions keyed by id, optional image assets."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, field_validator

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.image_limits import MAX_ASSET_KEY_CHARS, MAX_IMAGES
from clef_engine.schema.limits import MAX_QUESTION_ID_CHARS, MAX_QUESTIONS
from clef_engine.schema.questions import Question
from clef_engine.schema.render import (
    find_lone_surrogate,
    message_to_dict,
    printable,
    surrogate_message,
)

IMAGE_PLACEHOLDER = re.compile(r"<image:[0-9a-fA-F]{32}>")
"""The official SDK's asset reference; any other non-empty key is just as valid."""
DEFAULT_MODEL = "clef-minilm-l6"
_QUESTION_TAGS = {"choice", "noul", "score", "box"}


class ImageAsset(BaseModel):
    """An image referenced from the state, instructions or criteria by its asset key.

    The key is an opaque placeholder the caller chose (the SDK's ``<image:32 hex>``, a
    UUID, an alias such as ``screen``); each exact occurrence of it inside a string stands
    for the image.
    """

    model_config = ConfigDict(extra="ignore")

    type: Literal["image"] = "image"
    format: Literal["png", "jpg", "jpeg", "webp"]
    data_base64: str


class DecisionRequest(BaseModel):
    """A ``/v1/systemone`` request.

    Example:
        >>> from clef_engine.schema import Choice
        >>> req = DecisionRequest(state="refund me", questions={"q": Choice(
        ...     instructions="Route", criteria=["billing", "tech"])})
        >>> sorted(req.questions)
        ['q']
    """

    model_config = ConfigDict(extra="ignore")

    model: str = DEFAULT_MODEL
    state: Any
    questions: dict[str, Question]
    assets: dict[str, ImageAsset] | None = None
    _allow_paths: bool = PrivateAttr(default=True)

    @property
    def allow_paths(self) -> bool:
        """Whether a string in the state may name an image file to read (not over HTTP)."""
        return self._allow_paths

    def without_paths(self) -> DecisionRequest:
        """A copy whose path-like strings are text, never opened (what the server decides)."""
        copy = self.model_copy()
        copy._allow_paths = False
        return copy

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        message = surrogate_message(value, "model")
        if message is not None:
            raise ValueError(message)
        return value

    @field_validator("state", mode="before")
    @classmethod
    def _normalise_state(cls, value: Any) -> Any:
        state = cls._state_value(value)
        # A lone surrogate would fail deep in the tokenizer (or the response encoder).
        found = find_lone_surrogate(state, "state")
        if found is not None:
            raise ValueError(found[1])
        return state

    @staticmethod
    def _state_value(value: Any) -> Any:
        if value is None:
            raise ValueError("state is required")
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("state must not be empty")
            return value
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError("state must not be empty")
            converted = [message_to_dict(m) for m in value]
            if all(c is not None for c in converted):
                return converted
            return list(value)
        if isinstance(value, Mapping):
            if not value:
                raise ValueError("state must not be empty (got an empty JSON object)")
            return dict(value)
        if isinstance(value, (bytes, bytearray, memoryview, os.PathLike)) or hasattr(value, "save"):
            # Images; the vision backbone takes these.
            return value
        raise ValueError(
            f"state must be a string, a JSON object or array, or chat messages; "
            f"got {type(value).__name__}"
        )

    @field_validator("questions")
    @classmethod
    def _check_questions(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            raise ValueError("at least one question is required")
        if len(value) > MAX_QUESTIONS:
            raise ValueError(f"{len(value)} questions; the limit is {MAX_QUESTIONS}")
        for qid in value:
            message = surrogate_message(qid, "a question id")
            if message is not None:
                raise ValueError(message)
            if not qid or not qid.strip():
                raise ValueError("question ids must be non-empty")
            if len(qid) > MAX_QUESTION_ID_CHARS:
                raise ValueError(
                    f"question id has {len(qid)} characters; the limit is {MAX_QUESTION_ID_CHARS}"
                )
        return value

    @field_validator("assets")
    @classmethod
    def _check_asset_keys(cls, value: dict[str, ImageAsset] | None) -> Any:
        if not value:
            return value
        if len(value) > MAX_IMAGES:
            raise ValueError(f"{len(value)} assets; the limit is {MAX_IMAGES} images per request")
        for key in value:
            message = surrogate_message(key, "an asset key")
            if message is not None:
                raise ValueError(message)
            if not key.strip():
                raise ValueError("asset keys must be non-empty (not only whitespace)")
            if len(key) > MAX_ASSET_KEY_CHARS:
                raise ValueError(
                    f"an asset key has {len(key)} characters; the limit is {MAX_ASSET_KEY_CHARS}"
                )
        return value

    @classmethod
    def parse(cls, obj: Any) -> DecisionRequest:
        """Validate a dict (or an existing request) and raise :class:`InvalidRequestError`."""
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, Mapping):
            raise InvalidRequestError(
                f"a request must be a JSON object; got {type(obj).__name__}", field="body"
            )
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            raise validation_error(exc) from None


def validation_error(exc: ValidationError, prefix: tuple[str, ...] = ()) -> InvalidRequestError:
    """Convert pydantic's error into ours, keeping every ``{loc, msg, type}`` entry."""
    entries: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False, include_input=False):
        # Keys (question ids, option names) are echoed in ``loc``; a lone surrogate in one
        # would make the 422 response itself unencodable.
        loc = prefix + tuple(printable(str(p)) for p in err["loc"])
        # Drop pydantic's union-member tags ("choice", "function-after[...]").
        loc = tuple(p for p in loc if not p.startswith("function-") and "[" not in p)
        if len(loc) > 2 and loc[0] == "questions" and loc[2] in _QUESTION_TAGS:
            loc = loc[:2] + loc[3:]
        msg = printable(str(err["msg"]).removeprefix("Value error, "))
        entries.append({"loc": loc, "msg": msg, "type": err["type"]})
    first = entries[0]
    field = ".".join(first["loc"])
    return InvalidRequestError(first["msg"], field=field or None, errors=entries)


def build_request(
    item: Any, questions: Mapping[str, Any] | None, model: str, assets: Any = None
) -> DecisionRequest:
    """The request behind ``decide(state, questions)`` or ``decide(request)``.

    Without ``questions``, ``item`` must be a :class:`DecisionRequest` or a wire dict with
    ``questions``; with them, ``item`` is the state.
    """
    if questions is None:
        if isinstance(item, DecisionRequest):
            return item
        if isinstance(item, Mapping) and "questions" in item:
            return DecisionRequest.parse(item)
        raise InvalidRequestError(
            "questions are required (pass them, or a request with 'questions')",
            field="questions",
        )
    payload: dict[str, Any] = {
        "state": item,
        "questions": questions_from(questions),
        "model": model,
    }
    if assets:
        payload["assets"] = assets
    return DecisionRequest.parse(payload)


def questions_from(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a mapping of questions (objects or dicts) the way a request would."""
    return DecisionRequest.parse({"state": "x", "questions": dict(obj)}).questions
