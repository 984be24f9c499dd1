"""The server's OpenAPI document, with the real request and response schemas.

The routes read their bodies themselves (size caps, compression, multipart), so FastAPI
cannot infer the schemas; :func:`openapi` puts the pydantic models the server validates
with (:class:`~clef_engine.schema.request.DecisionRequest`) and answers with
(:class:`~clef_engine.schema.answers.DecisionResult`) into ``/openapi.json``.

Example:
    >>> from fastapi import FastAPI
    >>> doc = openapi(FastAPI())
    >>> "DecisionRequest" in doc["components"]["schemas"]
    True
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from clef_engine.schema.answers import DecisionResult, Usage
from clef_engine.schema.questions import Question
from clef_engine.schema.request import DEFAULT_MODEL, DecisionRequest, ImageAsset

_STATE = {
    "anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}],
    "description": "Text, a JSON object or array, or chat messages. Images go in as data "
    "URLs, base64 or assets (multipart parts too); a string is never read as a file path.",
}


class BatchRequest(BaseModel):
    """``POST /v1/systemone/batch``: the same questions about many states."""

    model_config = ConfigDict(extra="ignore")

    model: str = DEFAULT_MODEL
    states: list[Any] = Field(min_length=1)
    questions: dict[str, Question]
    assets: dict[str, ImageAsset] | None = None


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorResponse(BaseModel):
    """Every error but a validation failure (401, 404, 405, 408, 413, 415, 503, ...)."""

    detail: ErrorDetail


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorResponse(BaseModel):
    """A 422: where the request broke the question model or the compute budget."""

    detail: list[ValidationErrorItem]


class BatchItemError(BaseModel):
    """A batch item that failed; the others are still answered."""

    status: int
    detail: ErrorDetail | list[ValidationErrorItem]


class BatchItemFailure(BaseModel):
    error: BatchItemError


class BatchResponse(BaseModel):
    model: str
    results: list[DecisionResult | BatchItemFailure]
    """One entry per state, in order: an answer or its own error."""
    usage: Usage


class ModelEntry(BaseModel):
    name: str
    description: str
    release_date: str


class ModelsResponse(BaseModel):
    models: list[ModelEntry]


_MODELS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (DecisionRequest, "validation"),
    (BatchRequest, "validation"),
    (DecisionResult, "serialization"),
    (BatchResponse, "serialization"),
    (ErrorResponse, "serialization"),
    (ValidationErrorResponse, "serialization"),
    (ModelsResponse, "serialization"),
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        401: "Missing or invalid API key (`WWW-Authenticate: Bearer`)",
        404: "The model is not served here",
        408: "The body did not arrive in time",
        413: "The body or the state is over its limit",
        415: "Unsupported Content-Encoding",
        422: "Validation failed (question model, compute budget)",
        503: "Overloaded or shutting down (`Retry-After`)",
    }
    return {
        str(s): _json("ValidationErrorResponse" if s == 422 else "ErrorResponse", text[s])
        for s in statuses
    }


def _body(name: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": _ref(name)},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["request"],
                    "properties": {"request": _ref(name)},
                    "additionalProperties": {"type": "string", "format": "binary"},
                },
            },
        },
    }


def openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app`` with the ``/v1`` schemas filled in (cached)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    _, defs = models_json_schema(_MODELS, ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(defs.get("$defs", {}))
    schemas["DecisionRequest"]["properties"]["state"] = dict(_STATE)
    schemas["BatchRequest"]["properties"]["states"]["items"] = dict(_STATE)
    errors = _errors(401, 404, 408, 413, 415, 422, 503)
    routes = {
        "/v1/systemone": ("post", "DecisionRequest", "DecisionResult"),
        "/v1/systemone/batch": ("post", "BatchRequest", "BatchResponse"),
        "/v1/models": ("get", None, "ModelsResponse"),
    }
    for path, (method, request, response) in routes.items():
        operation = doc.get("paths", {}).get(path, {}).get(method)
        if operation is None:
            continue
        if request is not None:
            operation["requestBody"] = _body(request)
            operation["responses"] = {"200": _json(response, "The answers"), **errors}
        else:
            operation["responses"] = {"200": _json(response, "Served models"), **_errors(401)}
    app.openapi_schema = doc
    return doc
