"""The stages of one decision around the scorer: render the state, and read images.

:class:`~clef_engine.runtime.engine.DecisionEngine` runs, for a batch of requests::

    render_state   text, JSON and chat states rendered to text; images read by the vision
                   pipeline (OCR evidence in place of each image)   -> RenderedState
    score          the head, or a backbone that scores by itself (heads.base.Scorer),
                   every option of every question, calibrated       -> Scored
    (with images)  score_with_images: box questions answered by the box head from the
                   evidence, the rest scored as above, an optional image encoder fused in

A rendered state carries its read images to the scoring stage, so each image is read once
per request, whatever path the request takes through the engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from clef_engine.backbones.vision import content
from clef_engine.backbones.vision import requests as vision
from clef_engine.backbones.vision.pipeline import VisionPipeline
from clef_engine.backbones.vision.requests import VisualRequest
from clef_engine.errors import InvalidRequestError, StateTooLargeError, UnsupportedQuestionError
from clef_engine.heads.base import Scored, ScoringContext
from clef_engine.heads.box import locate
from clef_engine.schema.render import render_value
from clef_engine.schema.request import DecisionRequest

ScoreFn = Callable[[list[str], list[DecisionRequest]], list[Scored]]
"""The engine's scoring stage: rendered states and their requests in, one Scored each."""


@dataclass
class RenderedState:
    """A request's state as the scorer reads it.

    Attributes:
        text: The state rendered to text (images replaced by their evidence text).
        visual: The request's images, read, when it has any (``None``: no images).
    """

    text: str
    visual: VisualRequest | None = None


def render_state(
    request: DecisionRequest, pipeline: Callable[[], VisionPipeline], max_chars: int
) -> RenderedState:
    """Render ``request``'s state; ``pipeline`` gives the vision pipeline, asked for only
    when the request has images.

    Raises:
        InvalidRequestError: The state renders to empty text (or an image is unreadable).
        StateTooLargeError: The rendered state is longer than ``max_chars``.
    """
    visual = None
    if vision.has_images(request):
        visual = vision.render(request, pipeline())  # OCR evidence in place of each image
        text = visual.text or ""
    else:
        text = render_value(request.state, "state")
    if not text.strip():
        raise InvalidRequestError("state renders to empty text", field="state")
    if len(text) > max_chars:
        raise StateTooLargeError(
            f"state renders to {len(text)} characters; the limit is {max_chars}",
            field="state",
            limit=max_chars,
        )
    return RenderedState(text, visual)


def check_supported(request: DecisionRequest) -> None:
    """Refuse a ``box`` question about a state without an image."""
    for qid, question in request.questions.items():
        if question.type == "box" and not vision.has_images(request):
            raise UnsupportedQuestionError(
                "box questions locate an element in an image; the state has no image "
                "(pass a screenshot, image bytes, a path, or an <image:...> asset)",
                field=f"questions.{qid}",
            )


def needs_vision(requests: Sequence[DecisionRequest]) -> bool:
    """Whether any request has images or box questions (else the plain scoring stage)."""
    return any(
        vision.has_images(r) or any(q.type == "box" for q in r.questions.values()) for r in requests
    )


def score_with_images(
    score: ScoreFn,
    context: ScoringContext,
    pipeline: Callable[[], VisionPipeline],
    rendered: Sequence[RenderedState],
    requests: list[DecisionRequest],
) -> list[Scored]:
    """The scoring stage for requests that may carry images or box questions.

    Box questions are answered by the box head (:func:`clef_engine.heads.box.locate`) from
    the image evidence, with the engine's cached ``embed``; every other question goes
    through ``score`` (one batch), then the optional image encoder is fused in.
    """
    box_answers: list[dict[str, Any]] = []
    batch: list[tuple[int, DecisionRequest]] = []
    for i, request in enumerate(requests):
        vis = rendered[i].visual
        if vis is not None:
            request = vision.resolve_questions(request, vis)
        answers: dict[str, Any] = {}
        for qid, question in request.questions.items():
            if question.type == "box":
                if vis is None:
                    raise InvalidRequestError(
                        "box questions need an image in the state", field=f"questions.{qid}"
                    )
                what = question.instructions_text().strip() or vision.text_beside_images(vis)
                answers[qid] = locate(context.embed, what, vis.evidence)
        box_answers.append(answers)
        rest = {q: v for q, v in request.questions.items() if q not in answers}
        if rest:
            batch.append((i, request.model_copy(update={"questions": rest})))
    texts = [r.text for r in rendered]
    # Each request's state, then the headline views of those asking choices about images,
    # scored as one batch (one padded forward pass instead of two).
    heads = _headlines(rendered, batch)
    scored_all = (
        score(
            [texts[i] for i, _ in batch] + [t for _, t, _ in heads],
            [r for _, r in batch] + [r for _, _, r in heads],
        )
        if batch
        else []
    )
    by_index = {i: s for (i, _), s in zip(batch, scored_all, strict=False)}
    for (i, _, _), head in zip(heads, scored_all[len(batch) :], strict=True):
        whole = by_index[i].probabilities
        for qid, probs in head.probabilities.items():
            whole[qid] = vision.fuse(whole[qid], probs.to(whole[qid].device), HEADLINE_WEIGHT)
        # The encoder read the view's text too (its options were counted with the state's).
        by_index[i].tokens += head.tokens - sum(p.tokens for p in head.prepared.values())
    reader = pipeline() if any(r.visual is not None for r in rendered) else None
    out = []
    for i, text in enumerate(texts):
        scored = by_index.get(i)
        vis = rendered[i].visual
        if scored is None:
            tokens = context.backbone.count_tokens([text])[0]
            windows = max(1, math.ceil(tokens / max(1, context.backbone.max_length)))
            scored = Scored({}, {}, windows, tokens)
        elif reader is not None and vis is not None:
            _fuse_image_encoder(reader, vis, scored)
        scored.answers = box_answers[i]
        if vis is not None and reader is not None and _no_content(reader, vis):
            # Nothing readable (a blank or loading page): flat answers, flagged.
            flat = {q: content.flat_answer(p) for q, p in scored.prepared.items()}
            scored.answers = {**flat, **{q: content.flag(a) for q, a in scored.answers.items()}}
        out.append(scored)
    return out


HEADLINE_WEIGHT = 0.5
"""Weight of a screenshot's headline view in its choice answers (log-linear pooling with
the whole page's, :func:`fuse`). Measured with ``HEADLINE_LINES`` = 3 on the 145 tune
template pages and the 44 fixture pages: page types 129 -> 136 and 39 -> 41 right at 0.5
(0.4 and 0.6 within one page of it), and a zero-shot choice over the type descriptions
96 -> 111 and 29 -> 27."""


def _headlines(
    rendered: Sequence[RenderedState], batch: list[tuple[int, DecisionRequest]]
) -> list[tuple[int, str, DecisionRequest]]:
    """The second view of each request in ``batch`` that asks choice questions about its
    images: its state with each image's headline in place
    (:func:`~clef_engine.backbones.vision.requests.headline_text`), and the request with
    only those questions. Its answers are pooled with the whole state's (log-linear, weight
    :data:`HEADLINE_WEIGHT`): a page's name sits in its first lines ("Profile", "503 Be
    right back."), and over the whole page a table's rows or a sidebar's menu outweigh it,
    so dashboards with a table read as data tables and settings pages as whatever their
    menu listed."""
    out: list[tuple[int, str, DecisionRequest]] = []
    for i, request in batch:
        vis = rendered[i].visual
        choices = {q: v for q, v in request.questions.items() if v.type == "choice"}
        if vis is None or not choices:
            continue
        text = vision.headline_text(vis)
        if text is not None:
            out.append((i, text, request.model_copy(update={"questions": choices})))
    return out


def _no_content(pipeline: VisionPipeline, vis: VisualRequest) -> bool:
    """Whether the request's images are all without readable text (see
    :mod:`clef_engine.backbones.vision.content`)."""
    return content.no_readable_content(
        vis.evidence, vision.text_beside_images(vis), pipeline.image_encoder is not None
    )


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
        scored.probabilities[qid] = vision.fuse(probs, p_image.to(probs.device), weight)
