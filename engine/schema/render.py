"""Deterministic rendering of states, instructions and descriptions to text.

The backbone reads text. Structured inputs are rendered so that equal values give equal
text whatever the key order: JSON objects become ``key: value`` lines with sorted keys and
dotted paths for nesting, chat messages become ``role: content`` lines.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.limits import MAX_JSON_DEPTH

_ROLE_ALIASES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def message_to_dict(message: Any) -> dict[str, Any] | None:
    """Convert a LangChain-style message object (``.type`` + ``.content``) to a dict.

    Returns ``None`` when ``message`` is not message-like. Duck-typed so that ``engine``
    never imports an agent framework.
    """
    if isinstance(message, Mapping):
        if "role" in message and "content" in message:
            return {"role": str(message["role"]), "content": message["content"]}
        return None
    role = getattr(message, "role", None) or getattr(message, "type", None)
    if role is not None and hasattr(message, "content"):
        role = _ROLE_ALIASES.get(str(role), str(role))
        return {"role": role, "content": message.content}
    return None


def is_message_list(value: Any) -> bool:
    """True for a non-empty list whose items all look like chat messages."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        return False
    return all(message_to_dict(m) is not None for m in value)


def lone_surrogate(text: str) -> int | None:
    """Index of the first code point that UTF-8 cannot encode (a lone surrogate), or ``None``.

    JSON can carry ``"\\ud800"`` and Python strings can hold it, but no tokenizer, log or
    response encoder can, so such text is refused at validation (see :func:`check_unicode`).
    """
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes, safe to echo in errors."""
    if lone_surrogate(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def surrogate_message(text: str, what: str) -> str | None:
    """The error message for ``what`` if ``text`` holds a lone surrogate, else ``None``."""
    index = lone_surrogate(text)
    if index is None:
        return None
    return (
        f"{what} contains a lone surrogate (U+{ord(text[index]):04X}) at character {index}; "
        "text must be valid Unicode (UTF-8 encodable)"
    )


def find_lone_surrogate(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """The first string (value or object key) inside ``value`` that holds a lone surrogate.

    Returns ``(dotted path, message)`` or ``None``. Walks JSON objects, arrays and chat
    messages; stops below :data:`MAX_JSON_DEPTH` (rendering refuses deeper values anyway).
    """
    if isinstance(value, str):
        message = surrogate_message(value, path)
        return None if message is None else (path, message)
    if depth > MAX_JSON_DEPTH + 1:
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            sub = f"{path}.{printable(key) if isinstance(key, str) else key}"
            if isinstance(key, str) and lone_surrogate(key) is not None:
                return sub, f"a key of {path} contains a lone surrogate; text must be valid Unicode"
            found = find_lone_surrogate(item, sub, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = find_lone_surrogate(item, f"{path}[{i}]", depth + 1)
            if found is not None:
                return found
    return None


def _scalar(value: Any, field: str) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError("numbers must be finite (got NaN or infinity)", field=field)
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return str(value)


def _render_json(value: Any, path: str, lines: list[str], depth: int, field: str) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequestError(
            f"JSON is nested deeper than {MAX_JSON_DEPTH} levels", field=field, limit=MAX_JSON_DEPTH
        )
    if isinstance(value, Mapping):
        if not value:
            lines.append(f"{path}: {{}}" if path else "{}")
        for key in sorted(value, key=str):
            sub = f"{path}.{key}" if path else str(key)
            _render_json(value[key], sub, lines, depth + 1, field)
    elif isinstance(value, (list, tuple)):
        if not value:
            lines.append(f"{path}: []" if path else "[]")
        for i, item in enumerate(value):
            _render_json(item, f"{path}[{i}]", lines, depth + 1, field)
    else:
        text = _scalar(value, field)
        lines.append(f"{path}: {text}" if path else text)


def render_content(content: Any, field: str) -> str:
    """Render message content: a string, or a list of content parts (text parts kept)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping) and "image" in str(part.get("type", "")):
                parts.append("[image]")
            else:
                parts.append(render_value(part, field))
        return " ".join(p for p in parts if p)
    return render_value(content, field)


def render_messages(messages: Sequence[Any], field: str = "state") -> str:
    """Render chat messages as ``role: content`` lines."""
    out = []
    for i, message in enumerate(messages):
        as_dict = message_to_dict(message)
        if as_dict is None:
            raise InvalidRequestError("not a chat message", field=f"{field}[{i}]")
        out.append(f"{as_dict['role']}: {render_content(as_dict['content'], f'{field}[{i}]')}")
    return "\n".join(out)


def render_value(value: Any, field: str = "state") -> str:
    """Render a state, instructions or description value to text, deterministically."""
    if isinstance(value, str):
        return value
    if is_message_list(value):
        return render_messages(value, field)
    if (
        isinstance(value, (Mapping, list, tuple))
        or value is None
        or isinstance(value, (int, float, bool))
    ):
        lines: list[str] = []
        _render_json(value, "", lines, 0, field)
        return "\n".join(lines)
    raise InvalidRequestError(
        f"unsupported type {type(value).__name__}; use a string, JSON object/array or messages",
        field=field,
    )


def canonical_json(value: Any) -> str:
    """Stable JSON text of a value (sorted keys), used for cache keys."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def question_cache_key(question: Any, **extra: Any) -> str:
    """Cache key of a question's prepared form: its content and its options *in the order
    asked*. Sorted JSON keys alone would give ``criteria={"a": .., "b": ..}`` and
    ``{"b": .., "a": ..}`` one key, and the second question would be scored in the first
    one's option order (a label index read against it points at another option). Fields
    applied to the answer after scoring (``temperature``, ``none_below``) are left out: a
    question fitted with them reuses the prepared form of the one it was fitted from."""
    names = [spec.name for spec in question.option_specs()]
    dumped = question.model_dump(mode="json", exclude=_AFTER_SCORING)
    return canonical_json({"q": dumped, "order": names, **extra})


_AFTER_SCORING = {"temperature", "none_below"}
