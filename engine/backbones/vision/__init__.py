"""Vision input: image decoding and limits, OCR evidence, layout, optional CLIP/SigLIP.

Nothing here imports ``rapidocr_onnxruntime`` at import time: ``engine`` imports without
the ``[vision]`` extra, and the first image read raises
:class:`~clef_engine.errors.MissingDependencyError` with the install line.
"""

from __future__ import annotations

from clef_engine.backbones.vision.backbone import VisionBackbone
from clef_engine.backbones.vision.images import ImageRef, is_image, open_image
from clef_engine.backbones.vision.layout import Element, ImageEvidence
from clef_engine.backbones.vision.ocr import OcrLine, RapidOcr
from clef_engine.backbones.vision.pipeline import VisionPipeline

__all__ = [
    "Element",
    "ImageEvidence",
    "ImageRef",
    "OcrLine",
    "RapidOcr",
    "VisionBackbone",
    "VisionPipeline",
    "is_image",
    "open_image",
]
