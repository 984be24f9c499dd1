"""No readable content: a blank, tiny or text-free image gets a flat answer and a flag.

A page that is still loading (white, a spinner, a skeleton of grey bars), an image a few
pixels wide, or a photo without text gives the OCR nothing to read. Scoring the empty
textual state anyway produced confident guesses ("captcha" at 0.93-0.95). Instead, when
every image of a request is without readable text, the state has no text of its own
beside the images, and no image encoder can look at the pixels, each question is
answered with the flat distribution (choice and score: uniform; noul: 0.5; box: no box)
and ``x_no_content: true`` on the answer, so code can wait and screenshot again.

Example:
    >>> import io
    >>> from PIL import Image
    >>> from clef_engine import Choice, DecisionEngine
    >>> blank_png = io.BytesIO()
    >>> Image.new("RGB", (1280, 800), "white").save(blank_png, "PNG")  # a page still loading
    >>> page_question = Choice(instructions="What kind of page is this?",
    ...                        criteria=["login", "article", "captcha"])
    >>> result = DecisionEngine().decide(blank_png.getvalue(), {"page": page_question})
    >>> result.answers["page"].x_no_content
    True
    >>> result.answers["page"].probabilities
    {'login': 0.333..., 'article': 0.333..., 'captcha': 0.333...}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clef_engine.schema.answers import (
    Answer,
    BoxAnswer,
    ChoiceAnswer,
    NoulAnswer,
    ScoreAnswer,
    choice_confidence,
    score_confidence,
)

if TYPE_CHECKING:
    from clef_engine.backbones.vision.layout import ImageEvidence
    from clef_engine.heads.base import PreparedQuestion

MIN_READABLE_CHARS = 2
"""Letters or digits an image needs in all to count as readable (a lone glyph the
recogniser guessed from a spinner or an icon does not)."""


def readable(evidence: ImageEvidence) -> bool:
    """Whether OCR read any text from an image (at least :data:`MIN_READABLE_CHARS`)."""
    chars = sum(sum(c.isalnum() for c in e.text) for e in evidence.elements)
    return chars >= MIN_READABLE_CHARS


def no_readable_content(
    evidence: Sequence[ImageEvidence], text_beside: str, has_image_encoder: bool
) -> bool:
    """Whether a request has nothing to decide on: images only, none of them readable.

    Args:
        evidence: The request's images, read.
        text_beside: The state's own text beside its images (keys and roles left out).
        has_image_encoder: A CLIP/SigLIP encoder looks at the pixels, so a text-free
            image still has content.
    """
    if not evidence or has_image_encoder or text_beside.strip():
        return False
    return not any(readable(ev) for ev in evidence)


def flat_answer(prep: PreparedQuestion) -> Answer:
    """The uniform answer to a question, flagged ``x_no_content``."""
    n = max(1, len(prep.names))
    values = [1.0 / n] * n
    answer: Answer
    if prep.type == "noul":
        answer = NoulAnswer(noul=0.5)
    elif prep.type == "score":
        answer = ScoreAnswer(
            score=sum(i * p for i, p in enumerate(values)),
            legend=prep.legend or {},
            probabilities=dict(zip(prep.names, values, strict=True)),
            confidence=score_confidence(values),
        )
    else:
        answer = ChoiceAnswer(
            choice=prep.names[0],
            probabilities=dict(zip(prep.names, values, strict=True)),
            confidence=choice_confidence(values),
        )
    return flag(answer)


def flag(answer: Answer) -> Answer:
    """Mark an answer as given without readable content."""
    answer.x_no_content = True  # type: ignore[attr-defined]
    if isinstance(answer, BoxAnswer):
        answer.box, answer.confidence = None, None
    return answer
