"""The ``vision`` backbone: a text encoder for scoring, OCR evidence, optional CLIP/SigLIP.

``DecisionEngine(backbone="vision", path=..., clip_path=...)``. Text goes through the
encoder exactly as with the ``encoder`` kind; images become OCR evidence rendered as text
(see :mod:`clef_engine.backbones.vision.requests`) and, when ``clip_path`` names a local CLIP or
SigLIP directory, a zero-shot image distribution fused with the text one.

Any engine reads images (it builds a default OCR-only pipeline on first use); this kind
adds the image encoder, the OCR settings, and puts them into ``config.json`` and the
model version.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from clef_engine.backbones.base import Encoded
from clef_engine.backbones.encoder import EncoderBackbone
from clef_engine.backbones.vision.ocr import DEFAULT_MAX_SIDE, OcrEngine, RapidOcr
from clef_engine.backbones.vision.pipeline import DEFAULT_CLIP_WEIGHT, VisionPipeline


class VisionBackbone:
    """Text encoder + OCR + optional image encoder.

    Args:
        path: Local text-encoder directory; ``None`` is the embedded all-MiniLM-L6-v2.
        clip_path: Optional local CLIP or SigLIP directory (zero-shot image evidence).
        device: Device for both models (``"auto"``/``None``: cuda, then mps, then cpu).
        dtype: Dtype for both models.
        quantize: ``"int8"`` for the text encoder (CPU).
        ocr_max_side: Longest side images are downscaled to before OCR.
        clip_weight: Weight of the image encoder in the fusion (see ``VisionPipeline``).
        ocr: A custom OCR engine (default: RapidOCR).

    Example:
        >>> from clef_engine import Choice, DecisionEngine
        >>> engine = DecisionEngine("vision")
        >>> questions = {"page": Choice(instructions="What kind of page is this?", criteria={
        ...     "login": "a sign-in form with email and password",
        ...     "article": "a news article with paragraphs"})}
        >>> shot = open("shot.png", "rb").read()                     # a sign-in page
        >>> engine.decide(shot, questions).answers["page"].choice
        'login'
    """

    kind = "vision"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        clip_path: str | os.PathLike[str] | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
        max_length: int | None = None,
        ocr_max_side: int = DEFAULT_MAX_SIDE,
        clip_weight: float = DEFAULT_CLIP_WEIGHT,
        ocr: OcrEngine | None = None,
        text: EncoderBackbone | None = None,
    ) -> None:
        self.text = text or EncoderBackbone(
            path, device=device, dtype=dtype, quantize=quantize, max_length=max_length
        )
        encoder = None
        if clip_path is not None:
            from clef_engine.backbones.vision.clip import ClipImageEncoder

            encoder = ClipImageEncoder(clip_path, device=self.text.device, dtype=dtype)
        self.vision = VisionPipeline(
            ocr if ocr is not None else RapidOcr(max_side=ocr_max_side),
            encoder,
            clip_weight=clip_weight,
        )
        self.name = self.text.name
        self.device = self.text.device
        self.dtype = self.text.dtype
        self.hidden_size = self.text.hidden_size
        self.max_length = self.text.max_length

    def encode(
        self, texts: list[str], *, return_tokens: bool = False, normalize: bool = True
    ) -> Encoded:
        return self.text.encode(texts, return_tokens=return_tokens, normalize=normalize)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.text.count_tokens(texts)

    def config(self) -> dict[str, Any]:
        out = {**self.text.config(), "kind": self.kind, "vision": self.vision.config()}
        if self.vision.image_encoder is not None:
            out["clip_path"] = self.vision.image_encoder.config()["path"]
        return out
