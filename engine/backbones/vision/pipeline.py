"""The vision pipeline: images → OCR evidence (cached) and, optionally, CLIP image vectors.

One :class:`VisionPipeline` holds the OCR models (loaded once, on first use) and an LRU
cache of evidence keyed by image content, so a screenshot seen twice (a retry, a batch
that validates before it runs, a second question set) is read once.

Example:
    >>> from PIL import Image
    >>> from clef_engine.backbones.vision.images import from_pil
    >>> pipeline = VisionPipeline()
    >>> [ev] = pipeline.evidence([from_pil(Image.new("RGB", (64, 32), "white"), "state")])
    >>> ev.elements, (ev.width, ev.height)                      # a blank image: no text
    ([], (64, 32))
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clef_engine.backbones.vision.images import ImageRef
from clef_engine.backbones.vision.layout import ImageEvidence, analyse, read_placeholders
from clef_engine.backbones.vision.ocr import OcrEngine, RapidOcr

if TYPE_CHECKING:
    from clef_engine.backbones.vision.clip import ClipImageEncoder

DEFAULT_CLIP_WEIGHT = 0.5
"""Weight of the image encoder in the log-linear fusion with the OCR-text distribution."""


class VisionPipeline:
    """OCR evidence for images, plus an optional CLIP/SigLIP image encoder.

    Args:
        ocr: The OCR engine; default :class:`RapidOcr` (the ``[vision]`` extra).
        image_encoder: Optional zero-shot image encoder (:class:`ClipImageEncoder`).
        clip_weight: Weight ``w`` of the image encoder when fusing: ``log p = (1 - w) log
            p_text + w log p_image`` (renormalised). Images without any text use ``w = 1``.
        cache_size: How many images' evidence to keep.
    """

    def __init__(
        self,
        ocr: OcrEngine | None = None,
        image_encoder: ClipImageEncoder | None = None,
        *,
        clip_weight: float = DEFAULT_CLIP_WEIGHT,
        cache_size: int = 128,
    ) -> None:
        if not 0.0 <= clip_weight <= 1.0:
            raise ValueError(f"clip_weight must be in [0, 1]; got {clip_weight}")
        self.ocr: OcrEngine = ocr if ocr is not None else RapidOcr()
        self.image_encoder = image_encoder
        self.clip_weight = float(clip_weight)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, ImageEvidence] = OrderedDict()
        self._lock = threading.Lock()

    def with_threads(self, threads: int) -> VisionPipeline:
        """This pipeline with its OCR on ``threads`` CPU threads (``self`` when it already
        is, or when the OCR engine has no thread setting); the image encoder is shared."""
        with_threads = getattr(self.ocr, "with_threads", None)
        if with_threads is None:
            return self
        ocr = with_threads(threads)
        if ocr is self.ocr:
            return self
        return VisionPipeline(
            ocr, self.image_encoder, clip_weight=self.clip_weight, cache_size=self.cache_size
        )

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.ocr.config()}
        if self.image_encoder is not None:
            out["image_encoder"] = self.image_encoder.config()
            out["clip_weight"] = self.clip_weight
        return out

    def _cached(self, digest: str) -> ImageEvidence | None:
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
            return hit

    def _store(self, evidence: ImageEvidence) -> None:
        with self._lock:
            self._cache[evidence.digest] = evidence
            self._cache.move_to_end(evidence.digest)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def read(self, ref: ImageRef) -> ImageEvidence:
        """Evidence for one image (OCR + layout), from the cache when seen before."""
        cached = self._cached(ref.digest)
        if cached is not None:
            return cached
        image = ref.decode()
        started = time.perf_counter()
        lines = self.ocr.read(image)
        elements = read_placeholders(self.ocr, image, analyse(image, lines))
        ms = (time.perf_counter() - started) * 1000.0
        evidence = ImageEvidence(ref.digest, ref.width, ref.height, elements, ms)
        if self.image_encoder is not None:
            evidence.image_vector = self.image_encoder.image_vectors([image])[0]
        self._store(evidence)
        return evidence

    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        """Evidence for several images, in order (each distinct image read once)."""
        seen: dict[str, ImageEvidence] = {}
        out = []
        for ref in refs:
            if ref.digest not in seen:
                seen[ref.digest] = self.read(ref)
            out.append(seen[ref.digest])
        return out
