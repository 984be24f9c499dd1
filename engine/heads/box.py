"""Box head: locate the element that a ``box`` question's instructions describe.

Candidates are the text elements the vision pipeline found (OCR lines with their layout
role and region). Each candidate is described as ``"<text> <role>"`` (``"Sign in button"``,
``"Search products input field"``) and scored against the instructions by three pieces of
evidence, added as logits:

- semantic similarity: cosine of the engine backbone's embeddings of the instructions and
  the candidate description (``SEMANTIC`` per unit of cosine);
- word overlap: the share of the instructions' content words found in the candidate's
  text (``LEXICAL``), which rewards exact labels ("Add to cart"). Only the words naming
  the element count, not those saying where it is (:func:`split_context`: "the next page
  link under the first table" is matched as "the next page link", so the table's title
  does not win on the word "table"); the roles asked for are read from them too;
- role match: the instructions name a role (button, field/input/search box, heading)
  and the candidate has it (``+ROLE``), or has the other control role (a button when a
  field was asked for, or the reverse: ``-ROLE``). Asked for a field or checkbox, the
  text that labels one ("Email" above its input) also gets ``-ROLE``: the control it
  labels is the answer, and carries that text as its label;
- where it is: when the instructions place the element relative to one the page shows
  ("the next page link under the simple table", "the settings button of the edit
  profile form"), candidates named alike are told apart by their distance to that
  element (:func:`context_term`);
- page chrome: a candidate in the page's top bar or left sidebar
  (:func:`~clef_engine.backbones.vision.chrome.chrome`) gets
  ``-CHROME`` unless the instructions name the menu, sidebar, header or navigation, so
  "the search field" is the page's own, not the sidebar's.

The confidence of the box returned is a calibrated probability that it is a hit (holds
the element asked for): :func:`hit_probability` of the best candidate's softmax
probability, with parameters per evidence source (:data:`CALIBRATION`).
The box is the element's region (a button's or field's rectangle when the layout analysis
found one, else the text's box), as fractions (0-1) of the image's height (``top``,
``bottom``) and width (``left``, ``right``), as the wire schema defines it;
:meth:`~clef_engine.schema.answers.BoxCoords.to_pixels` turns it back into pixels.

Without instructions there is nothing to rank candidates by: the answer is the whole
image (``0, 1, 0, 1``) with ``confidence`` null.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from itertools import pairwise
from typing import TYPE_CHECKING

import torch

from clef_engine.schema.answers import BoxAnswer, BoxCoords

if TYPE_CHECKING:
    from clef_engine.backbones.vision.layout import Element, ImageEvidence

SEMANTIC = 10.0
LEXICAL = 4.0
ROLE = 2.5
CHROME = 1.5

_ROLE_WORDS = {
    "button": ("button", "btn", "click", "press", "tap", "submit", "icon"),
    "field": ("field", "input", "textbox", "box", "bar", "type", "enter", "fill"),
    "heading": ("heading", "title", "headline", "header"),
    "checkbox": ("checkbox", "check", "tick", "checkmark", "radio", "toggle", "option"),
    "link": ("link", "hyperlink"),
}
_ROLE_TEXT = {
    "button": "button",
    "field": "input field",
    "heading": "heading",
    "checkbox": "checkbox",
    "link": "link",
    "text": "",
}
_CONTROLS = ("button", "field", "checkbox")
_DROPDOWN = ("dropdown", "select", "selector", "picker", "combobox")
_STOP = {
    "the", "a", "an", "to", "of", "on", "in", "for", "and", "or", "with", "where", "that",
    "this", "page", "element", "area", "link", "which", "you", "can", "is", "it", "at", "your",
    *(w for words in _ROLE_WORDS.values() for w in words), *_DROPDOWN,
}  # fmt: skip
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CHROME_WORDS = {
    "menu", "nav", "navigation", "navbar", "sidebar", "side", "header", "top", "toolbar",
    "topbar", "logo", "brand", "breadcrumb", "breadcrumbs", "drawer",
}  # fmt: skip


def words(text: str) -> list[str]:
    """Lower-case word tokens (``sign-in`` → ``sign``, ``in``)."""
    return [w.lower() for w in _WORD.findall(text)]


def wanted_roles(instructions: str) -> set[str]:
    """Roles the instructions ask for (``"the search field"`` → ``{"field"}``; a dropdown
    is read off the pixels as either control, a button or a field)."""
    tokens = set(words(instructions))
    roles = {role for role, keys in _ROLE_WORDS.items() if tokens & set(keys)}
    if tokens & set(_DROPDOWN):
        roles |= {"button", "field"}
    if "checkbox" in roles:
        roles.discard("field")  # "the terms check box"
    return roles


_DOUBLE = re.compile(r"(.)\1")
_LETTERS = re.compile(r"[^\W\d_]+", re.UNICODE)
_PHRASAL = {"sign", "log"}
"""Words after which "in" and "on" are content words: "the sign in link" is not the "Sign
up" one."""
PART = 0.85
"""Credit for a word found only inside a much longer word ("name" in "Username"; OCR's
run-together "sendresetlink"), against 1 for a word of the text's own or a near miss
(a :class:`~difflib.SequenceMatcher` ratio of 0.8: "Names", "Verifty"): "the name field"
is the "Name" field, not the "Username" one. Words under three letters count only whole."""


DIGIT_MISS = 0.1
"""Share of its word overlap a text loses when it lacks a one-digit number the
instructions give (:func:`lexical_overlap`)."""
_DIGITS = frozenset("0123456789")


def _match(word: str, have: list[str], joined: str) -> float:
    """How well ``have`` (a text's words, ``joined`` run together) contains ``word``."""
    if word in have or any(a + b == word for a, b in pairwise(have)):
        return 1.0
    if all(c in _DIGITS for c in word):
        return 0.0  # a number is the same number or another one ("11" is not "1")
    if any(word in _LETTERS.findall(h) for h in have if not h.isalpha()):
        return 1.0  # OCR ran a number into its words: "Show10entries"
    single = _DOUBLE.sub(r"\1", word)
    for h in have:
        # OCR drops one of two equal letters ("Ad to cart") and cuts a word short at
        # the end of a box ("Back to dash", "Save chang").
        if _DOUBLE.sub(r"\1", h) == single:
            return 1.0
        if len(h) >= 4 and word.startswith(h) and len(h) >= 0.4 * len(word):
            return 1.0
        if len(h) >= 3 and SequenceMatcher(None, word, h).ratio() >= 0.8:
            return 1.0
    return PART if len(word) >= 3 and word in joined else 0.0


def lexical_overlap(instructions: str, text: str) -> float:
    """How well ``text`` covers the instructions' content words, in [0, 1].

    Recall of the content words (a word of the text, two of its words run together, a
    near miss such as OCR's "Verifty", or, for :data:`PART`, inside a longer word; "in"
    and "on" count after "sign" and "log"),
    discounted for long texts that mention a word in passing. A one-digit number tells
    rows apart ("the category 2 link"): a text without it loses :data:`DIGIT_MISS` of its
    score (a number may also be a value to type: "set the quantity to 3"); asked alone
    ("the 2 link"), it is the word to match. Numbers match only whole.
    """
    asked = words(instructions)
    wanted = {
        w
        for i, w in enumerate(asked)
        if len(w) >= 2
        and (w not in _STOP or (w in ("in", "on") and i > 0 and asked[i - 1] in _PHRASAL))
    }
    digits = {w for w in asked if len(w) == 1 and w in _DIGITS}
    have = words(text)
    if not have or not (wanted or digits):
        return 0.0
    if not wanted:
        recall = sum(d in have for d in digits) / len(digits)
        return recall * (0.5 + 0.5 * min(1.0, len(digits) / len(have)))
    joined = "".join(have)
    score = {w: _match(w, have, joined) for w in wanted}
    pairs = set(pairwise(have))
    for a, b in pairwise(asked):
        if a in _PHRASAL and b in ("in", "on") and (a + b in have or (a, b) in pairs):
            score[a] = score[b] = 1.0  # "the log in button" on a "Login" button
    recall = sum(score.values()) / len(wanted)
    if not all(d in have for d in digits):
        recall *= 1.0 - DIGIT_MISS
    return recall * (0.5 + 0.5 * min(1.0, (len(wanted) + len(digits)) / len(have)))


def describe(element: Element) -> str:
    """The text a candidate is embedded as."""
    role = _ROLE_TEXT.get(element.role, "")
    text = _words_of(element)
    return f"{text} {role}".strip()


def _words_of(element: Element) -> str:
    if element.label and element.label != element.text:
        return f"{element.label} {element.text}".strip()
    return element.text


def _lexical(instructions: str, element: Element) -> float:
    """Word overlap with the element's words; a field's label or its text alone may
    match better than both (a placeholder does not dilute the label that names it)."""
    score = lexical_overlap(instructions, _words_of(element))
    if element.label and element.text:
        score = max(
            score,
            lexical_overlap(instructions, element.label),
            lexical_overlap(instructions, element.text),
        )
    return score


def _role_term(element: Element, roles: set[str], labels: set[str]) -> float:
    asked = roles & set(_CONTROLS)
    if element.role in roles:
        return 1.0
    # Asked for one kind of control, another kind counts against a candidate.
    if asked and element.role in _CONTROLS:
        return -1.0
    # So does the text that labels a control of the kind asked for.
    text = element.text
    if text and any(label == text or label.startswith(text + " ") for label in labels):
        return -1.0
    return 0.0


_CONTEXT = re.compile(
    r"\s+(?:under|below|above|beneath|inside|within|on|in|of|at|near|beside|next to)"
    r"\s+(?:the|a|an|this|that|its|each)\b",
    re.IGNORECASE,
)
_CONTEXT_WORDS = {
    "under", "below", "above", "beneath", "inside", "within", "on", "in", "of", "at", "near",
    "beside", "next", "to", "the", "a", "an", "this", "that", "its", "each",
}  # fmt: skip


_AFTER_ROLE = re.compile(
    r"\b(?:button|btn|link|field|input|textbox|checkbox|toggle|dropdown|icon|tab)"
    r"(\s+(?:of|for|under|below|above|beneath|inside|within|near|beside|next\s+to)\s+\S)",
    re.IGNORECASE,
)
"""A preposition right after the kind of control asked for, with no article: "the add to
cart button of item one"."""


def split_context(instructions: str) -> tuple[str, str]:
    """The element the instructions name and where they say it is: ``"the next page link
    under the first table"`` → ``("the next page link", "under the first table")``. A
    preposition counts only before an article ("the sign in button" is one name) or right
    after the kind of control asked for ("the add to cart button of item one"; "the
    terms of service link" is one name)."""
    match = _CONTEXT.search(instructions)
    at = match.start() if match is not None else None
    role = _AFTER_ROLE.search(instructions)
    if role is not None and (at is None or role.start(1) < at):
        at = role.start(1)
    if at is None or not instructions[:at].strip():
        return instructions, ""
    return instructions[:at], instructions[at:].strip()


def candidate_features(
    embed: Callable[[Sequence[str]], torch.Tensor],
    instructions: str,
    elements: Sequence[Element],
    in_chrome: Sequence[bool] | None = None,
) -> torch.Tensor:
    """Per element, the evidence terms of the module docstring as columns: cosine, word
    overlap, role term (+1 / 0 / -1) and minus the chrome flag (0 when the instructions
    name a menu, sidebar, header or navigation). :data:`WEIGHTS` turns them into logits.

    ``in_chrome`` marks elements of the page's top bar or sidebar (:func:`page_chrome`).
    """
    target, _ = split_context(instructions)
    texts = [instructions, *(describe(e) for e in elements)]
    # ``embed`` is the engine's cached one: a page's candidates are embedded once, however
    # many box questions are asked about it.
    vectors = torch.nn.functional.normalize(embed(texts).float(), dim=-1)
    cosine = (vectors[1:] @ vectors[0]).cpu()
    lexical = torch.tensor([_lexical(target, e) for e in elements])
    roles = wanted_roles(target)
    asked = roles & {"field", "checkbox"}
    labels = {e.label for e in elements if e.role in asked and e.label}
    role = torch.tensor([_role_term(e, roles, labels) for e in elements])
    chrome = torch.zeros(len(elements))
    if in_chrome is not None and not set(words(instructions)) & _CHROME_WORDS:
        chrome = -torch.tensor([float(c) for c in in_chrome])
    return torch.stack([cosine, lexical.float(), role.float(), chrome], dim=1)


WEIGHTS = (SEMANTIC, LEXICAL, ROLE, CHROME)
"""Weights of :func:`candidate_features`' columns, set by hand on the fixture pages. Fit by
conditional logit on the tune template targets they do no better
(``benchmarks/vision_box_ranker.py``)."""


def candidate_logits(
    embed: Callable[[Sequence[str]], torch.Tensor],
    instructions: str,
    elements: Sequence[Element],
    in_chrome: Sequence[bool] | None = None,
    images: Sequence[int] | None = None,
) -> torch.Tensor:
    """One logit per element: :func:`candidate_features` weighted by :data:`WEIGHTS`, then
    :func:`context_term` where the instructions say where the element is (``images``:
    which image of a request each element is on; all on one by default)."""
    features = candidate_features(embed, instructions, elements, in_chrome)
    logits = features @ torch.tensor(WEIGHTS, dtype=features.dtype)
    return logits + context_term(instructions, elements, logits, images)


CONTEXT = 5.0
"""Logit lost per e-fold of distance from the context's anchor, beyond the nearest
candidate's (:func:`context_term`)."""
_NEAR = 3.0
"""Candidates this close (in logits) to the best one are what the context chooses among."""
_PLACES = {
    "table", "form", "card", "section", "panel", "list", "chart", "banner", "modal", "dialog",
    "column", "row", "widget", "box", "block", "group", "window", "popup", "first", "second",
    "third", "last", "top", "bottom", "left", "right", "upper", "lower", "middle",
}  # fmt: skip
"""Words of a context that name a kind of place or a position, not the anchor's text."""
_UNDER = {"under", "below", "beneath"}
_OVER = {"above"}


def context_anchor(context: str, elements: Sequence[Element]) -> int | None:
    """The element whose text a context names (``"under the simple table"`` → the "Simple
    Table" heading): the best :func:`lexical_overlap` with the context's own words, at
    least 0.5; ``None`` when the context names only a kind of place ("under the first
    table")."""
    named = " ".join(w for w in words(context) if w not in _PLACES and w not in _CONTEXT_WORDS)
    if not named:
        return None
    best: tuple[float, int] | None = None
    for i, e in enumerate(elements):
        if not e.text:
            continue
        score = lexical_overlap(named, e.text)
        if score >= 0.5 and (best is None or score > best[0]):
            best = (score, i)
    return None if best is None else best[1]


def context_term(
    instructions: str,
    elements: Sequence[Element],
    logits: torch.Tensor,
    images: Sequence[int] | None = None,
) -> torch.Tensor:
    """Where the instructions say the element is, relative to an element they name ("the
    next page link under the simple table", "the settings button of the edit profile
    form"): among the candidates within :data:`_NEAR` of the best logit whose words
    match the instructions' as well as any of them do, each loses
    :data:`CONTEXT` per e-fold of its distance to the anchor beyond the nearest one's. A
    candidate on the wrong side of it ("under": above the anchor) counts as three times
    as far. Only the anchor's image is ranked: positions on other images of a request
    are not comparable. Nothing changes when the context names no element on the page."""
    zero = torch.zeros_like(logits)
    target, context = split_context(instructions)
    if not context or len(elements) < 2:
        return zero
    anchor = context_anchor(context, elements)
    if anchor is None:
        return zero
    a_left, a_top, a_right, a_bottom = elements[anchor].region
    ax, ay = (a_left + a_right) / 2.0, (a_top + a_bottom) / 2.0
    relation = set(words(context)[:2])
    others = logits.clone()
    others[anchor] = -math.inf
    if images is not None:
        for i, image in enumerate(images):
            if image != images[anchor]:
                others[i] = -math.inf
    best = float(others.max())
    if not math.isfinite(best):
        return zero
    near = [i for i in range(len(elements)) if float(others[i]) >= best - _NEAR]
    # It chooses among candidates named alike ("Next" and OCR's "Nex"), not against the
    # name: a "Week" button near the anchor does not beat the "Month" asked for.
    overlap = {i: _lexical(target, elements[i]) for i in near}
    near = [i for i in near if overlap[i] >= max(overlap.values()) - 1e-6]
    if len(near) < 2:
        return zero
    distance = {}
    for i in near:
        left, top, right, bottom = elements[i].region
        x, y = (left + right) / 2.0, (top + bottom) / 2.0
        d = max(1.0, math.hypot(x - ax, y - ay))
        if (relation & _UNDER and y < a_top) or (relation & _OVER and y > a_bottom):
            d *= 3.0
        distance[i] = d
    nearest = min(distance.values())
    term = zero.clone()
    for i, d in distance.items():
        term[i] = -CONTEXT * math.log(d / nearest)
    return term


def page_chrome(evidence: ImageEvidence) -> list[bool]:
    """Which of an image's elements are page chrome for box questions: judged from the
    layout of a screenshot's pixels; a DOM's elements name their own landmarks, so none."""
    if evidence.source != "pixels":
        return [False] * len(evidence.elements)
    return evidence.chrome_flags


_TIE = 1e-4
"""Candidates whose logits are this close to the best one's are tied (float noise: the six
identical buttons of a fixture page differed by 1e-6)."""


def locate(
    embed: Callable[[Sequence[str]], torch.Tensor],
    instructions: str,
    evidence: Sequence[ImageEvidence],
) -> BoxAnswer:
    """The box of the element ``instructions`` describe, over all images of a request.

    The box is in fractions of the image's height and width. With several images the
    answer carries ``x_image`` (0-based index of the image the box is in). Empty
    instructions give the whole (first) image with ``confidence=None``; no text anywhere
    gives ``box=None, confidence=None``.
    """
    if evidence and not instructions.strip():
        answer = BoxAnswer(box=BoxCoords(top=0.0, bottom=1.0, left=0.0, right=1.0))
        if len(evidence) > 1:
            answer.x_image = 0  # type: ignore[attr-defined]
        return answer
    candidates = [(i, j, e) for i, ev in enumerate(evidence) for j, e in enumerate(ev.elements)]
    if not candidates:
        return BoxAnswer(box=None, confidence=None)
    in_chrome = [c for ev in evidence for c in page_chrome(ev)]
    logits = candidate_logits(
        embed, instructions, [e for _, _, e in candidates], in_chrome, [i for i, _, _ in candidates]
    )
    probs = torch.softmax(logits.double(), dim=0)
    # Identical elements (six "Add to cart" buttons) score the same up to float noise,
    # which made argmax pick a different one from run to run; the first in reading order
    # wins a tie, so "the first add to cart button" and repeated questions agree.
    best = int(torch.nonzero(logits >= logits.max() - _TIE).flatten()[0])
    image, index, _ = candidates[best]
    region = clickable_region(evidence[image], index)
    answer = BoxAnswer(
        box=fractions(region, evidence[image].width, evidence[image].height),
        confidence=hit_probability(float(probs[best]), evidence[image].source),
    )
    if len(evidence) > 1:
        answer.x_image = image  # type: ignore[attr-defined]
    return answer


def clickable_region(evidence: ImageEvidence, index: int) -> Sequence[float]:
    """The region to answer for element ``index``: its own, except that a line of text in
    a screenshot's left sidebar is a menu row, clickable across the sidebar's width."""
    element = evidence.elements[index]
    if evidence.source != "pixels" or element.role not in ("text", "heading"):
        return element.region
    side = evidence.sidebar
    if side is None or index not in side[0]:
        return element.region
    _, top, _, bottom = element.region
    return (min(side[1], element.region[0]), top, max(side[2], element.region[2]), bottom)


CALIBRATION: dict[str, tuple[float, float]] = {
    "pixels": (0.5877, 1.0394),
    "dom": (0.6436, 2.9965),
}
"""Per evidence source, ``(a, c)`` of ``P(hit) = sigmoid(a·logit(p) + c)`` (Platt scaling),
where ``p`` is the softmax probability of the best candidate. Fit by logistic regression
in ``benchmarks/vision_box_calibration.py`` on questions about the fixture pages and (for
pixels) the tune template pages; its JSON has the held-out reliability, and
docs/vision.md quotes it."""


def hit_probability(p_top: float, source: str = "pixels") -> float:
    """The calibrated probability that the best candidate's box is the element asked for."""
    a, c = CALIBRATION.get(source, CALIBRATION["pixels"])
    p = min(1.0 - 1e-6, max(1e-6, p_top))
    z = a * math.log(p / (1.0 - p)) + c
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def fractions(region: Sequence[float], width: int, height: int) -> BoxCoords:
    """A pixel region ``(left, top, right, bottom)`` as fractions of the image, in [0, 1].

    Rounded to 5 decimals: a tenth of a pixel on an image 10,000 pixels tall.
    """
    left, top, right, bottom = region

    def frac(value: float, size: int) -> float:
        return round(min(1.0, max(0.0, value / max(1, size))), 5)

    return BoxCoords(
        top=frac(top, height),
        bottom=frac(bottom, height),
        left=frac(left, width),
        right=frac(right, width),
    )
