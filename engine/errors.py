"""Typed errors of the decision engine.

Every error a caller can cause names the field (a dotted/indexed location such as
``questions.route.criteria``) and, where one applies, the limit it broke. The CLI turns
them into one line and exit code 2; the HTTP server turns them into 4xx responses.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any


class ClefError(Exception):
    """Base class of every error raised by clef-agents."""

    #: A short machine-readable kind, used by the server's ``error_type`` field.
    error_type: str = "clef_error"


class InvalidRequestError(ClefError, ValueError):
    """A request, question or state is malformed or breaks a limit.

    Attributes:
        field: Where the problem is, e.g. ``"questions.route.criteria"``.
        limit: The limit that was broken, if any (e.g. ``255``).
        errors: Structured entries ``{"loc", "msg", "type"}`` (pydantic's shape), so
            the server can answer 422 with ``detail[]``.
    """

    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        limit: Any = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        self.field = field
        self.limit = limit
        self.message = message
        if errors is None:
            loc = tuple(field.split(".")) if field else ()
            errors = [{"loc": loc, "msg": message, "type": "value_error"}]
        self.errors = errors
        prefix = f"{field}: " if field else ""
        super().__init__(f"{prefix}{message}")


class StateTooLargeError(InvalidRequestError):
    """The state is larger than the engine's cap (``max_state_chars``)."""

    error_type = "request_too_large"


class UnsupportedQuestionError(ClefError):
    """A question type this engine's backbone cannot answer (e.g. ``box`` without vision)."""

    error_type = "unsupported_question"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class ModelLoadError(ClefError, OSError):
    """A model directory or weight file is missing or not usable.

    Attributes:
        file: The file at fault (``.../config.json``), where one is known.
        field: The field of that file at fault (``backbone.path``), where one is known.
    """

    error_type = "model_load_error"

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        self.file = file
        self.field = field
        super().__init__(message)


class DeviceUnavailableError(ClefError, RuntimeError):
    """A device was requested explicitly but is not available on this machine."""

    error_type = "device_unavailable"


class MissingDependencyError(ClefError, ImportError):
    """An optional dependency is missing; the message holds the exact install line."""

    error_type = "missing_dependency"

    def __init__(self, package: str, extra: str, feature: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{feature} needs the optional dependency '{package}'. "
            f"Install it with: pip install 'clef-agents[{extra}]'"
        )


def require(module: str, *, package: str, extra: str, feature: str) -> Any:
    """Import ``module`` or raise :class:`MissingDependencyError` with the install line."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(package, extra, feature) from exc


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """Wrap peft model construction: peft reads transformers' deprecated
    ``is_gradient_checkpointing`` while wrapping a model, and transformers 5 answers with a
    FutureWarning on every call that the user can do nothing about. Only that warning is
    silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield
