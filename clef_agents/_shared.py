"""Helpers shared by the framework adapters (no framework imports here)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.answers import DecisionResult
from clef_engine.schema.questions import Choice

_DEFAULT: Any = None
_LOCK = threading.Lock()

StateFrom = str | Callable[[Any], Any] | None
"""Where the decision state comes from in an input: the input itself (``None``), a key
of a dict input (``"ticket"``), or a function of the input."""


def default_engine() -> Any:
    """The process-wide engine on the embedded model, built on first use and shared.

    Every adapter that is given no engine uses this one: routers, graph edges, selectors,
    workflow steps and :class:`~clef_agents.vision.ScreenshotClassifier` (whose
    ``clef_agents.vision.default_engine`` is this function), so the model loads once per
    process.
    """
    global _DEFAULT
    if _DEFAULT is None:
        with _LOCK:
            if _DEFAULT is None:
                from clef_engine import DecisionEngine

                _DEFAULT = DecisionEngine()
    return _DEFAULT


def extract_state(value: Any, state_from: StateFrom) -> Any:
    """Pull the decision state out of an adapter's input.

    A sync Playwright page is screenshotted and LlamaIndex image objects give their image
    (see :func:`clef_agents.vision.as_state`); an async page must be awaited first with
    ``await clef_agents.vision.aas_state(page)``.
    """
    if state_from is None:
        state = value
    elif callable(state_from):
        state = state_from(value)
    elif isinstance(value, Mapping) and state_from in value:
        state = value[state_from]
    else:
        state = getattr(value, state_from, None)
        if state is None:
            raise InvalidRequestError(
                f"the input has no {state_from!r} to decide on", field="state"
            )
    return _browser_state(state)


def _browser_state(state: Any) -> Any:
    if isinstance(state, (str, bytes, Mapping, list, tuple)):
        return state
    from clef_agents.vision import as_state

    try:
        return as_state(state)
    except TypeError as exc:  # an async Playwright page in a sync code path
        raise InvalidRequestError(
            f"{exc}; screenshot it first with `await clef_agents.vision.aas_state(page)`",
            field="state",
        ) from None


def as_choice(question: Any, *, instructions: str = "Which route fits the input best?") -> Choice:
    """A :class:`Choice` from a ``Choice``, a wire dict, ``{option: description}`` or names."""
    if isinstance(question, Choice):
        return question
    if isinstance(question, Mapping) and question.get("type") == "choice":
        return Choice.model_validate(dict(question))
    if isinstance(question, Mapping):
        return Choice(instructions=instructions, criteria=dict(question))
    if isinstance(question, (list, tuple)) and all(isinstance(q, str) for q in question):
        return Choice(instructions=instructions, criteria=dict.fromkeys(question))
    raise InvalidRequestError(
        f"a router question must be a Choice or an {{option: description}} mapping; "
        f"got {type(question).__name__}",
        field="question",
    )


def decision_record(result: DecisionResult, qid: str | None = None) -> dict[str, Any]:
    """A JSON-friendly summary for callbacks, metadata and tools.

    With ``qid`` the summary is about that one question only (cheaper: routers call it
    on every decision).
    """
    record: dict[str, Any] = {
        "source": result.x_source,
        "model_version": result.x_model_version,
    }
    if qid is None:
        record["answers"] = {q: a.model_dump(mode="json") for q, a in result.answers.items()}
    else:
        answer = result.answers[qid]
        record["question_id"] = qid
        record["choice"] = getattr(answer, "choice", None)
        record["probabilities"] = dict(getattr(answer, "probabilities", {}) or {})
        record["probability"] = answer.top_probability()
    return record
