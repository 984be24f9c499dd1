"""Box head: candidate roles (checkbox, link) and the calibrated hit probability."""

from __future__ import annotations

import pytest
import torch

from clef_engine.backbones.vision.layout import Element, ImageEvidence
from clef_engine.heads import box


def _embed(texts):  # a bag of characters: enough to rank by overlap, no model needed
    out = torch.zeros(len(texts), 64)
    for i, text in enumerate(texts):
        for ch in text.lower():
            out[i, ord(ch) % 64] += 1.0
    return out


def _el(text: str, role: str, left: float, label: str | None = None) -> Element:
    rect = (left, 100.0, left + 100.0, 130.0)
    return Element(text, rect, rect, role, 1.0, label)


def test_roles_asked_for() -> None:
    assert box.wanted_roles("the terms check box") == {"checkbox"}
    assert box.wanted_roles("the remember me checkbox") == {"checkbox"}
    assert box.wanted_roles("the forgot password link") == {"link"}
    assert box.wanted_roles("the password field") == {"field"}


def test_a_checkbox_question_finds_the_checkbox_not_its_label() -> None:
    elements = [_el("Remember me", "text", 120), _el("", "checkbox", 90, label="Remember me")]
    evidence = ImageEvidence("d", 1280, 800, elements)
    answer = box.locate(_embed, "the remember me checkbox", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(90 / 1280, abs=1e-4)


def test_hit_probability_is_a_probability_that_grows_with_the_evidence() -> None:
    for source in ("pixels", "dom"):
        values = [box.hit_probability(p, source) for p in (0.1, 0.3, 0.6, 0.9, 0.99)]
        assert all(0.0 < v < 1.0 for v in values)
        assert values == sorted(values) and values[0] < values[-1]
    assert box.hit_probability(0.9, "unknown") == box.hit_probability(0.9, "pixels")


def test_dom_evidence_is_calibrated_as_dom() -> None:
    elements = [_el("Sign in", "button", 100), _el("Help", "text", 400)]
    pixels = box.locate(_embed, "the sign in button", [ImageEvidence("d", 1280, 800, elements)])
    dom = box.locate(
        _embed, "the sign in button", [ImageEvidence("d", 1280, 800, elements, source="dom")]
    )
    assert pixels.box == dom.box
    assert pixels.confidence != dom.confidence
