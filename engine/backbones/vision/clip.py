"""Optional zero-shot image encoder: a local CLIP or SigLIP directory (transformers).

The encoder embeds the image and each option text into its joint space and gives
``softmax(scale * cos(image, option))`` over a question's options, with ``scale`` the
model's own learned ``logit_scale`` (CLIP's contrastive temperature; SigLIP's bias is a
constant shift over options and drops out of the softmax). The vision pipeline fuses
this distribution with the OCR-text distribution (see :mod:`clef_engine.backbones.vision.fusion`).

Nothing is downloaded: the directory must hold ``config.json``, safetensors weights, a
tokenizer and an image processor (what ``save_pretrained`` writes).

Example:
    >>> from clef_engine.backbones.vision.testing import write_tiny_clip
    >>> clip_dir = write_tiny_clip("tiny-clip")  # random weights; use a real CLIP or SigLIP dir
    >>> enc = ClipImageEncoder(clip_dir)
    >>> probs = enc.probabilities([screenshot], ["a login form", "a news article"])  # PIL images
    >>> probs.shape, probs.sum(dim=-1)           # one distribution over the texts per image
    (torch.Size([1, 2]), tensor([1.], dtype=torch.float64))
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from clef_engine.backbones.encoder import _quiet_transformers
from clef_engine.backbones.hf_dir import NO_REMOTE_CODE, check_hf_dir
from clef_engine.devices import select_device, select_dtype
from clef_engine.errors import ModelLoadError

SUPPORTED = ("clip", "siglip", "siglip2")


def _features(output: Any) -> torch.Tensor:
    # transformers 5 returns a model output whose pooler_output is the projected vector.
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        raise ModelLoadError("the image encoder returned no pooled features")
    return pooled


class ClipImageEncoder:
    """A local CLIP or SigLIP model for zero-shot image-to-option similarity.

    Args:
        path: Local model directory (``config.json`` with ``model_type`` clip or siglip).
        device: ``"auto"``/``None`` (cuda, then mps, then cpu) or an explicit device.
        dtype: ``"auto"``/``None`` (bf16 on CUDA, fp32 elsewhere) or a dtype.
        template: Format string applied to each option text, e.g. ``"a screenshot of {}"``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        template: str = "a screenshot of {}",
        cache_size: int = 4096,
    ) -> None:
        from safetensors import SafetensorError
        from transformers import AutoConfig, AutoModel, AutoProcessor

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        directory = Path(path).expanduser()
        if not (directory / "config.json").is_file():
            raise ModelLoadError(
                f"image encoder path {str(directory)!r} has no config.json; pass a local CLIP "
                "or SigLIP directory (nothing is downloaded)"
            )
        check_hf_dir(directory, tokenizer=False)  # refuses auto_map before transformers reads
        try:
            config = AutoConfig.from_pretrained(str(directory), **NO_REMOTE_CODE)
        except (OSError, ValueError, KeyError) as exc:
            where = directory / "config.json"
            raise ModelLoadError(f"{where}: not a usable config ({exc})") from exc
        if config.model_type not in SUPPORTED:
            raise ModelLoadError(
                f"image encoder {str(directory)!r} is a {config.model_type!r} model; "
                f"expected one of {', '.join(SUPPORTED)}"
            )
        self.directory = directory
        self.model_type = str(config.model_type)
        self.template = template
        self.device = select_device(device)
        self.dtype = select_dtype(self.device, dtype)
        try:
            with _quiet_transformers():
                self.processor = AutoProcessor.from_pretrained(str(directory), **NO_REMOTE_CODE)
                self.model = AutoModel.from_pretrained(
                    str(directory), dtype=self.dtype, use_safetensors=True, **NO_REMOTE_CODE
                )
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelLoadError(
                f"cannot load image encoder from {str(directory)!r}: {exc}"
            ) from exc
        self.model.to(self.device).eval()
        self.scale = float(self.model.logit_scale.detach().float().exp().item())
        self._texts: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def config(self) -> dict[str, Any]:
        return {"path": str(self.directory.resolve()), "template": self.template}

    @torch.inference_mode()
    def image_vectors(self, images: list[Image.Image]) -> torch.Tensor:
        """``[N, D]`` normalised image embeddings."""
        inputs = self.processor(images=images, return_tensors="pt")
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        vectors = _features(self.model.get_image_features(pixel_values=pixels)).float()
        return torch.nn.functional.normalize(vectors, dim=-1).cpu()

    @torch.inference_mode()
    def text_vectors(self, texts: list[str]) -> torch.Tensor:
        """``[M, D]`` normalised embeddings of option texts (cached by text)."""
        prompts = [self.template.format(t) for t in texts]
        with self._lock:
            missing = [p for p in dict.fromkeys(prompts) if p not in self._texts]
        if missing:
            padding = "max_length" if self.model_type.startswith("siglip") else True
            inputs = self.processor(
                text=missing, return_tensors="pt", padding=padding, truncation=True
            )
            inputs = {k: v.to(self.device) for k, v in inputs.items() if k != "pixel_values"}
            vectors = _features(self.model.get_text_features(**inputs)).float()
            vectors = torch.nn.functional.normalize(vectors, dim=-1).cpu()
            with self._lock:
                for prompt, vec in zip(missing, vectors, strict=True):
                    self._texts[prompt] = vec
                while len(self._texts) > self._cache_size:
                    self._texts.popitem(last=False)
        with self._lock:
            return torch.stack([self._texts[p] for p in prompts])

    def probabilities(self, images: list[Image.Image], texts: list[str]) -> torch.Tensor:
        """``[N, M]``: for each image, a distribution over ``texts`` (rows sum to 1)."""
        return self.distribution(self.image_vectors(images), texts)

    def distribution(self, vectors: torch.Tensor, texts: list[str]) -> torch.Tensor:
        """``[N, M]`` distributions over ``texts`` for precomputed image ``vectors``."""
        logits = self.scale * vectors.float() @ self.text_vectors(texts).T
        return torch.softmax(logits.double(), dim=-1)
