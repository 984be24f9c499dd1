"""Requests with images: find them, check limits, read them, and render a textual state.

This is the seam between :class:`~clef_engine.runtime.engine.DecisionEngine` and the vision
pipeline. An image may be the whole state (a PIL image, bytes, a path, a base64 string or
a data URL), sit anywhere inside a JSON state or a chat message's content parts, or be a
wire ``asset``, referenced by its key (an opaque placeholder the caller chose: the SDK's
``<image:32 hex>``, a UUID, an alias such as ``screen``) wherever that key occurs as or
inside a string of the state, the instructions or the criteria. Every image becomes OCR
evidence; the state is rendered with
each image replaced by its text (reading order plus a layout summary), and scored by the
same engine path as any text state. ``box`` questions are answered from the evidence by
:mod:`clef_engine.heads.box`, and an optional CLIP/SigLIP encoder is fused in (see
:func:`fuse`).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from clef_engine.heads.base import Scored
    from clef_engine.runtime.engine import DecisionEngine

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


def _placeholders(text: str, visual: VisualRequest, where: str, inline: bool) -> str:
    def replace(match: re.Match[str]) -> str:
        index = visual.assets.get(match.group(0))
        if index is None:
            raise InvalidRequestError(f"{match.group(0)} has no entry in assets", field=where)
        evidence = visual.evidence[index]
        return evidence.inline() if inline else evidence.text("image")

    return visual.keys.sub(replace, text)


def _fill(value: Any, visual: VisualRequest, where: str, inline: bool) -> Any:
    if isinstance(value, _Slot):
        label = "screenshot" if visual.n_state == 1 else f"image {value.index + 1}"
        evidence = visual.evidence[value.index]
        return evidence.inline() if inline else evidence.text(label)
    if isinstance(value, str):
        return _placeholders(value, visual, where, inline)
    if isinstance(value, Mapping):
        return {k: _fill(v, visual, f"{where}.{k}", inline) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, visual, f"{where}[{i}]", inline) for i, v in enumerate(value)]
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


def pipeline_for(engine: DecisionEngine) -> VisionPipeline:
    """The engine's vision pipeline: the vision backbone's, or one made on first use."""
    pipeline = getattr(engine.backbone, "vision", None)
    if isinstance(pipeline, VisionPipeline):
        return pipeline
    pipeline = engine.__dict__.get("_vision_pipeline")
    if pipeline is None:
        pipeline = VisionPipeline()
        engine.__dict__["_vision_pipeline"] = pipeline
    return pipeline


def attach(engine: DecisionEngine, pipeline: VisionPipeline) -> None:
    """Use ``pipeline`` for this engine's images (e.g. a different OCR resolution)."""
    engine.__dict__["_vision_pipeline"] = pipeline


_MEMO: OrderedDict[int, tuple[DecisionRequest, VisualRequest]] = OrderedDict()
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 64


def visual(engine: DecisionEngine, request: DecisionRequest) -> VisualRequest:
    """Images of ``request`` read and its state rendered (memoised per request object)."""
    with _MEMO_LOCK:
        hit = _MEMO.get(id(request))
        if hit is not None and hit[0] is request:
            return hit[1]
    result = collect(request)
    result.evidence = pipeline_for(engine).evidence(result.refs)
    filled = _fill(result.template, result, "state", inline=False)
    text = render_value(filled, "state")
    referenced: set[str] = set()
    _referenced(request.state, result.keys, referenced)
    for question in request.questions.values():
        _referenced(_question_text(question), result.keys, referenced)
    extra = [
        result.evidence[i].text("image")
        for key, i in result.assets.items()
        if key not in referenced
    ]
    result.text = "\n\n".join([text, *extra]) if extra else text
    with _MEMO_LOCK:
        _MEMO[id(request)] = (request, result)
        _MEMO.move_to_end(id(request))
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return result


def state_text(engine: DecisionEngine, request: DecisionRequest) -> str:
    """The textual state of a request with images (OCR evidence in place of each image)."""
    text = visual(engine, request).text
    assert text is not None
    return text


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


def _fuse_image_encoder(pipeline: VisionPipeline, vis: VisualRequest, scored: Scored) -> None:
    encoder = pipeline.image_encoder
    vectors = [e.image_vector for e in vis.evidence if e.image_vector is not None]
    if encoder is None or not vectors:
        return
    vec = torch.nn.functional.normalize(torch.stack(vectors).float().mean(0), dim=-1)
    has_text = any(e.elements for e in vis.evidence)
    weight = pipeline.clip_weight if has_text else 1.0
    for qid, probs in scored.probabilities.items():
        prep = scored.prepared[qid]
        if prep.type == "noul" and prep.sides != (True, True):
            continue  # one-sided yes/no has no second text to compare the image with
        p_image = encoder.distribution(vec.unsqueeze(0), list(prep.texts))[0]
        scored.probabilities[qid] = fuse(probs, p_image.to(probs.device), weight)


def score_requests(
    engine: DecisionEngine, texts: list[str], requests: list[DecisionRequest]
) -> list[Scored]:
    """:meth:`DecisionEngine.score` for requests that may carry images or box questions.

    Box questions are answered from the OCR evidence; every other question goes through
    ``engine.score`` (one batch), then the optional image encoder is fused in.
    """
    from clef_engine.heads.base import Scored
    from clef_engine.heads.box import locate

    visuals = [visual(engine, r) if has_images(r) else None for r in requests]
    box_answers: list[dict[str, Any]] = []
    batch: list[tuple[int, DecisionRequest]] = []
    for i, request in enumerate(requests):
        vis = visuals[i]
        if vis is not None:
            request = resolve_questions(request, vis)
        answers: dict[str, Any] = {}
        for qid, question in request.questions.items():
            if question.type == "box":
                if vis is None:
                    raise InvalidRequestError(
                        "box questions need an image in the state", field=f"questions.{qid}"
                    )
                what = question.instructions_text().strip() or text_beside_images(vis)
                answers[qid] = locate(engine.scoring_context().embed, what, vis.evidence)
        box_answers.append(answers)
        rest = {q: v for q, v in request.questions.items() if q not in answers}
        if rest:
            batch.append((i, request.model_copy(update={"questions": rest})))
    scored_batch = (
        engine.score([texts[i] for i, _ in batch], [r for _, r in batch]) if batch else []
    )
    by_index = {i: s for (i, _), s in zip(batch, scored_batch, strict=True)}
    pipeline = pipeline_for(engine) if any(v is not None for v in visuals) else None
    out = []
    for i, text in enumerate(texts):
        scored = by_index.get(i)
        if scored is None:
            tokens = engine.backbone.count_tokens([text])[0]
            windows = max(1, math.ceil(tokens / max(1, engine.backbone.max_length)))
            scored = Scored({}, {}, windows, tokens)
        elif pipeline is not None and visuals[i] is not None:
            _fuse_image_encoder(pipeline, visuals[i], scored)  # type: ignore[arg-type]
        scored.answers = box_answers[i]
        out.append(scored)
    return out


def needs_vision(requests: list[DecisionRequest]) -> bool:
    """Whether any request has images or box questions (else plain ``engine.score``)."""
    return any(
        has_images(r) or any(q.type == "box" for q in r.questions.values()) for r in requests
    )
