"""Requests with images: find them, check limits, read them, and render a textual state.

This is the vision state renderer: :func:`render` reads a request's images with a
:class:`~clef_engine.backbones.vision.pipeline.VisionPipeline` and renders its state to
text; it knows nothing of the engine.
An image may be the whole state (a PIL image, bytes, a path, a base64 string or
a data URL), sit anywhere inside a JSON state or a chat message's content parts, or be a
wire ``asset``, referenced by its key (an opaque placeholder the caller chose: the SDK's
``<image:32 hex>``, a UUID, an alias such as ``screen``) wherever that key occurs as or
inside a string of the state, the instructions or the criteria. Every image becomes OCR
evidence; the state is rendered with
each image replaced by its text (reading order plus a layout summary), and scored by the
same engine path as any text state. ``box`` questions are answered from the evidence by
:mod:`clef_engine.heads.box`, and an optional CLIP/SigLIP encoder is fused in (see
:func:`fuse`); the engine's stage that does both is
:func:`clef_engine.runtime.stages.score_with_images`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from clef_engine.backbones.vision.images import (
    ImageRef,
    decode_base64,
    from_bytes,
    is_image,
    open_image,
)
from clef_engine.backbones.vision.layout import ImageEvidence
from clef_engine.backbones.vision.pipeline import VisionPipeline
from clef_engine.errors import InvalidRequestError
from clef_engine.schema.image_limits import MAX_IMAGES, MAX_TOTAL_PIXELS
from clef_engine.schema.render import render_value
from clef_engine.schema.request import IMAGE_PLACEHOLDER, DecisionRequest

_PART_KEYS = ("image_url", "image", "url", "data", "source", "base64", "image_base64")


@dataclass(frozen=True)
class _Slot:
    """Where an image sat in the state; replaced by its evidence text when rendering."""

    index: int


@dataclass
class VisualRequest:
    """The images of one request and the state with image slots.

    Attributes:
        refs: State images in the order met, then assets in key order.
        template: The state with every image replaced by a :class:`_Slot`.
        assets: Asset key, exactly as the request gave it → index into ``refs``.
        evidence: OCR evidence per ref (filled by :func:`read`).
    """

    refs: list[ImageRef]
    template: Any
    assets: dict[str, int]
    n_state: int
    evidence: list[ImageEvidence] = field(default_factory=list)
    text: str | None = None
    appended: list[int] = field(default_factory=list)
    """Indices into ``refs`` of the assets that neither the state nor any question
    references: their text is appended to the state's (set by :func:`render`)."""

    def __post_init__(self) -> None:
        self.keys = _KeyMatcher(self.assets)


class _KeyMatcher:
    """Finds asset keys inside strings by exact match.

    Longer keys are tried first, so that with the keys ``screen`` and ``screen-2`` the
    text ``screen-2`` is the second image. The SDK's reference form ``<image:32 hex>`` is
    matched even when it is no key, so that a reference whose asset is missing is an error
    rather than text.
    """

    def __init__(self, keys: Mapping[str, int]) -> None:
        alternatives = [re.escape(k) for k in sorted(keys, key=lambda k: (-len(k), k))]
        alternatives.append(IMAGE_PLACEHOLDER.pattern)
        self.pattern = re.compile("|".join(alternatives))

    def found(self, text: str) -> list[str]:
        return [m.group(0) for m in self.pattern.finditer(text)]

    def sub(self, replace: Any, text: str) -> str:
        return self.pattern.sub(replace, text)


def _contains(value: Any, top: bool, depth: int = 0, paths: bool = True) -> bool:
    if depth > 64:
        return False
    if is_image(value, top_level=top, allow_paths=paths):
        return True
    if isinstance(value, str):
        # Only the SDK's reference form is looked for: other keys come with ``assets``.
        return "<image:" in value and IMAGE_PLACEHOLDER.search(value) is not None
    if isinstance(value, Mapping):
        return any(_contains(v, False, depth + 1, paths) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains(v, False, depth + 1, paths) for v in value)
    return False


def has_images(request: DecisionRequest) -> bool:
    """Whether a request carries images (state images, assets or placeholders)."""
    return bool(request.assets) or _contains(request.state, True, paths=request.allow_paths)


def _part_image(part: Mapping[str, Any], paths: bool = True) -> Any:
    """The image inside a chat content part (OpenAI, Anthropic and LangChain shapes)."""
    for key in _PART_KEYS:
        value = part.get(key)
        if isinstance(value, Mapping):
            value = value.get("url") or value.get("data")
        if value is not None and is_image(
            value, top_level=isinstance(value, str), allow_paths=paths
        ):
            return value
    return None


class _Collector:
    def __init__(self, paths: bool = True) -> None:
        self.refs: list[ImageRef] = []
        self.paths = paths  # False over HTTP: path-like strings stay text

    def add(self, value: Any, where: str) -> _Slot:
        if len(self.refs) >= MAX_IMAGES:
            raise InvalidRequestError(
                f"more than {MAX_IMAGES} images in one request", field=where, limit=MAX_IMAGES
            )
        self.refs.append(open_image(value, where, allow_paths=self.paths))
        return _Slot(len(self.refs) - 1)

    def walk(self, value: Any, where: str, top: bool = False) -> Any:
        if is_image(value, top_level=top, allow_paths=self.paths):
            return self.add(value, where)
        if isinstance(value, Mapping):
            if "image" in str(value.get("type", "")):
                found = _part_image(value, self.paths)
                if found is not None:
                    return {"type": "text", "text": self.add(found, where)}
            return {k: self.walk(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value


def collect(request: DecisionRequest) -> VisualRequest:
    """Open (but do not decode) every image of ``request`` and check the request limits."""
    collector = _Collector(request.allow_paths)
    template = collector.walk(request.state, "state", top=True)
    n_state = len(collector.refs)
    assets: dict[str, int] = {}
    for key, asset in (request.assets or {}).items():
        if len(collector.refs) >= MAX_IMAGES:
            raise InvalidRequestError(
                f"{n_state + len(request.assets or {})} images in one request; the limit is "
                f"{MAX_IMAGES}",
                field="assets",
                limit=MAX_IMAGES,
            )
        data = asset.data_base64.strip()
        if data.startswith("data:"):
            ref = open_image(data, f"assets.{key}", declared=asset.format, allow_paths=False)
        else:
            raw = decode_base64(data, f"assets.{key}.data_base64")
            ref = from_bytes(raw, f"assets.{key}", declared=asset.format)
        collector.refs.append(ref)
        assets[key] = len(collector.refs) - 1
    total = sum(r.pixels for r in collector.refs)
    if total > MAX_TOTAL_PIXELS:
        raise InvalidRequestError(
            f"images total {total} px; the limit is {MAX_TOTAL_PIXELS} px per request",
            field="assets" if request.assets else "state",
            limit=MAX_TOTAL_PIXELS,
        )
    return VisualRequest(collector.refs, template, assets, n_state)


def _view(evidence: ImageEvidence, label: str, inline: bool, headline: bool) -> str:
    """One image's text: inline (in a question), its headline view, or the whole page."""
    if inline:
        return evidence.inline()
    if headline:
        return evidence.headline(label) or evidence.text(label)
    return evidence.text(label)


def _placeholders(
    text: str, visual: VisualRequest, where: str, inline: bool, headline: bool = False
) -> str:
    def replace(match: re.Match[str]) -> str:
        index = visual.assets.get(match.group(0))
        if index is None:
            raise InvalidRequestError(f"{match.group(0)} has no entry in assets", field=where)
        return _view(visual.evidence[index], "image", inline, headline)

    return visual.keys.sub(replace, text)


def _fill(
    value: Any, visual: VisualRequest, where: str, inline: bool, headline: bool = False
) -> Any:
    if isinstance(value, _Slot):
        label = "screenshot" if visual.n_state == 1 else f"image {value.index + 1}"
        return _view(visual.evidence[value.index], label, inline, headline)
    if isinstance(value, str):
        return _placeholders(value, visual, where, inline, headline)
    if isinstance(value, Mapping):
        return {k: _fill(v, visual, f"{where}.{k}", inline, headline) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, visual, f"{where}[{i}]", inline, headline) for i, v in enumerate(value)]
    return value


def _referenced(value: Any, keys: _KeyMatcher, out: set[str]) -> None:
    if isinstance(value, str):
        out.update(keys.found(value))
    elif isinstance(value, Mapping):
        for v in value.values():
            _referenced(v, keys, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _referenced(v, keys, out)


def _question_text(question: Any) -> dict[str, Any]:
    """The parts of a question an asset key may occur in: instructions and criteria."""
    dumped = question.model_dump(mode="python")
    return {k: dumped[k] for k in ("instructions", "criteria") if dumped.get(k) is not None}


def render(request: DecisionRequest, pipeline: VisionPipeline) -> VisualRequest:
    """Read the images of ``request`` with ``pipeline`` and render its state to text
    (:attr:`VisualRequest.text`: each image's evidence text in its place, images of assets
    that nothing references appended)."""
    result = collect(request)
    result.evidence = pipeline.evidence(result.refs)
    referenced: set[str] = set()
    _referenced(request.state, result.keys, referenced)
    for question in request.questions.values():
        _referenced(_question_text(question), result.keys, referenced)
    result.appended = [i for key, i in result.assets.items() if key not in referenced]
    result.text = _state_text(result, headline=False)
    return result


def headline_text(vis: VisualRequest) -> str | None:
    """The state rendered with each image's headline view in its place
    (:meth:`~.layout.ImageEvidence.headline`: its first lines and layout summary) instead of
    its whole text; ``None`` when that comes out as the whole text again (pages of a few
    lines without chrome, images without text outside their chrome, images named only in
    questions): there is no second view to read."""
    text = _state_text(vis, headline=True)
    return None if text == vis.text else text


def _state_text(vis: VisualRequest, headline: bool) -> str:
    """The state with each image's text (or headline view) in its place, then the images
    of assets nothing referenced (:attr:`VisualRequest.appended`)."""
    filled = _fill(vis.template, vis, "state", inline=False, headline=headline)
    text = render_value(filled, "state")
    extra = [_view(vis.evidence[i], "image", False, headline) for i in vis.appended]
    return "\n\n".join([text, *extra]) if extra else text


def resolve_questions(request: DecisionRequest, vis: VisualRequest) -> DecisionRequest:
    """``request`` with asset keys in its questions replaced by the images' text."""
    changed = {}
    for qid, question in request.questions.items():
        # Keys are looked for in instructions and criteria only, never in ``type``.
        dumped = _question_text(question)
        found: set[str] = set()
        _referenced(dumped, vis.keys, found)
        if not found:
            continue
        filled = _fill(dumped, vis, f"questions.{qid}", inline=True)
        changed[qid] = type(question).model_validate({**question.model_dump(), **filled})
    if not changed:
        return request
    return request.model_copy(update={"questions": {**request.questions, **changed}})


def text_beside_images(vis: VisualRequest) -> str:
    """The state's own strings with its images and asset keys left out.

    What a ``box`` question without instructions locates: ``{"task": "the sign-in
    button", "screen": "<key>"}`` asks for the sign-in button. Object keys and message
    roles are left out; they name fields, not things on screen.
    """
    out: list[str] = []

    def walk(value: Any, depth: int) -> None:
        if depth > 64:
            return
        if isinstance(value, str):
            out.append(vis.keys.sub("", value) if vis.assets else value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if key not in ("role", "type"):
                    walk(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)

    walk(vis.template, 0)
    return " ".join(" ".join(out).split())


def fuse(p_text: torch.Tensor, p_image: torch.Tensor, weight: float) -> torch.Tensor:
    """Log-linear pooling: ``p ∝ p_text^(1-w) · p_image^w`` (renormalised)."""
    logp = (1.0 - weight) * torch.log(p_text.double().clamp_min(1e-12)) + weight * torch.log(
        p_image.double().clamp_min(1e-12)
    )
    return torch.softmax(logp, dim=-1)
