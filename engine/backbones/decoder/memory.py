"""Memory estimate before a causal LM is loaded, and a clear error when it will not fit.

The parameter count is read from the safetensors headers (a few kilobytes per file; no
weights are read), so a 70B checkpoint is refused in milliseconds instead of after minutes
of loading and an out-of-memory crash.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_engine.errors import ModelLoadError

GIB = 1024**3
OVERHEAD = 1.10
"""Allocator slack and framework buffers on top of weights and working memory."""


class ModelTooLargeError(ModelLoadError):
    """The model (plus working memory) needs more memory than the device has free."""

    error_type = "model_too_large"


@dataclass(frozen=True)
class MemoryEstimate:
    """What loading and running a causal LM is expected to take.

    Attributes:
        parameters: Parameter count (from the safetensors headers).
        weight_bytes: Parameters at the dtype they will be loaded in.
        working_bytes: KV cache + activations + logits of one scoring batch.
    """

    parameters: int
    weight_bytes: int
    working_bytes: int

    @property
    def total_bytes(self) -> int:
        return int((self.weight_bytes + self.working_bytes) * OVERHEAD)


def count_parameters(directory: Path) -> int:
    """Parameters stored in ``directory``'s safetensors files (headers only)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{str(directory)!r} has no *.safetensors weights (only safetensors are loaded)"
        )
    total = 0
    for path in files:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for d in entry.get("shape", []):
                n *= int(d)
            total += n
    return total


def estimate(
    directory: Path, hf_config: dict[str, Any], dtype: torch.dtype, max_batch_tokens: int
) -> MemoryEstimate:
    """Memory to load ``directory`` in ``dtype`` and score ``max_batch_tokens`` at once."""
    text = hf_config.get("text_config") or hf_config
    params = count_parameters(directory)
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 1
    hidden = int(text.get("hidden_size", 0) or 0)
    layers = int(text.get("num_hidden_layers", 0) or 0)
    heads = int(text.get("num_attention_heads", 1) or 1)
    kv_heads = int(text.get("num_key_value_heads", heads) or heads)
    head_dim = int(text.get("head_dim", 0) or (hidden // heads if heads else 0))
    inter = int(text.get("intermediate_size", 4 * hidden) or 4 * hidden)
    kv = 2 * layers * kv_heads * head_dim * max_batch_tokens * size
    activations = max_batch_tokens * (4 * hidden + 2 * inter) * size
    vocab = int(text.get("vocab_size", 0) or 0)
    logits = 1024 * vocab * 4 * 2  # one LM-head chunk in fp32 + its log-softmax
    return MemoryEstimate(params, params * size, kv + activations + logits)


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (``None`` when it cannot be told)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return None


def check_fits(
    directory: Path, est: MemoryEstimate, device: torch.device, dtype: torch.dtype
) -> None:
    """Raise :class:`ModelTooLargeError` when ``est`` does not fit on ``device``."""
    free = available_bytes(device)
    if free is None or est.total_bytes <= free:
        return
    hints = []
    if dtype == torch.float32:
        hints.append("dtype='bfloat16' halves the weights")
    hints.append("a smaller checkpoint, or a lower max_batch_tokens")
    if device.type == "cuda":
        hints.append("or device='cpu'")
    raise ModelTooLargeError(
        f"the causal LM at {str(directory)!r} ({est.parameters / 1e9:.2f}B parameters) needs "
        f"about {est.total_bytes / GIB:.1f} GiB on {device} in {str(dtype).replace('torch.', '')} "
        f"({est.weight_bytes / GIB:.1f} GiB weights + {est.working_bytes / GIB:.1f} GiB working "
        f"memory) but only {free / GIB:.1f} GiB is free; try " + ", ".join(hints)
    )
