"""Merge a peft LoRA adapter (``adapter/``) into a backbone, without needing peft.

Inference merges ``W += scaling * B @ A`` into each targeted linear layer once at load
time, so a fine-tuned engine runs exactly as fast as the base model (and int8 dynamic
quantization applies to the merged weights). A DoRA adapter (``use_dora``, Liu et al.
2024) also carries a magnitude ``m`` per output feature: the merged weight is then
``m * V / ||V||`` with ``V = W + scaling * B @ A`` and the norm taken over each output
row, as peft merges it. Training writes the adapter with peft
(``clef_engine.train``); only that package's standard files are read here:
``adapter_config.json`` and ``adapter_model.safetensors``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from clef_engine.errors import ModelLoadError

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
_PREFIX = "base_model.model."


def read_adapter_config(directory: Path) -> dict[str, Any]:
    """``adapter_config.json`` of the adapter in ``directory``, its LoRA fields checked.

    Raises:
        ModelLoadError: naming the file and the field, for invalid JSON, a field of the
            wrong type or a rank below 1 (peft would raise TypeError or divide by zero).
    """
    path = directory / ADAPTER_CONFIG
    where = str(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})", file=where) from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: expected a JSON object", file=where)

    def bad(field: str, expected: str) -> ModelLoadError:
        got = config[field]
        return ModelLoadError(
            f"{path}: field {field!r} must be {expected}; got {got!r}", file=where, field=field
        )

    if "r" not in config:
        raise ModelLoadError(f"{path}: field 'r' (the LoRA rank) is missing", file=where, field="r")
    rank = config["r"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise bad("r", "a positive integer")
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise bad("lora_alpha", "a finite number")
    for field in ("use_rslora", "fan_in_fan_out", "use_dora"):
        if config.get(field) is not None and not isinstance(config[field], bool):
            raise bad(field, "true or false")
    if not isinstance(config.get("peft_type", "LORA"), str):
        raise bad("peft_type", "a string")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(
            f"{path}: field 'peft_type': only LoRA adapters are supported; got "
            f"{config['peft_type']!r}",
            file=where,
            field="peft_type",
        )
    return config


@torch.no_grad()
def merge_lora(model: torch.nn.Module, directory: Path) -> int:
    """Merge the LoRA adapter in ``directory`` into ``model``; returns the layers merged."""
    config_path = directory / "adapter_config.json"
    weights_path = directory / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise ModelLoadError(
            f"adapter dir {str(directory)!r} needs adapter_config.json and "
            "adapter_model.safetensors (peft format)"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_adapter_config(directory)
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    fan_in_fan_out = bool(config.get("fan_in_fan_out", False))
    dora = bool(config.get("use_dora", False))
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:  # a truncated or unreadable file
        raise ModelLoadError(
            f"{weights_path}: cannot read the adapter weights ({exc})", file=str(weights_path)
        ) from exc
    modules = dict(model.named_modules())
    merged = 0
    for name, a in weights.items():
        if not name.endswith(".lora_A.weight"):
            continue
        path = name[: -len(".lora_A.weight")]
        path = path[len(_PREFIX) :] if path.startswith(_PREFIX) else path
        b = weights.get(name.replace(".lora_A.", ".lora_B."))
        layer = modules.get(path)
        if b is None or not isinstance(layer, torch.nn.Linear):
            raise ModelLoadError(
                f"{weights_path}: adapter weight {name!r} does not match a linear layer of the "
                "backbone (was it trained on another model?)"
            )
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
            raise ModelLoadError(
                f"{weights_path}: {name} has shape {tuple(a.shape)} and its lora_B "
                f"{tuple(b.shape)}; they do not multiply",
                file=str(weights_path),
            )
        delta = (b.float() @ a.float()) * scaling
        if fan_in_fan_out:
            delta = delta.T
        if delta.shape != layer.weight.shape:
            raise ModelLoadError(
                f"{weights_path}: {path} has shape {tuple(layer.weight.shape)}, adapter "
                f"{tuple(delta.shape)}"
            )
        if dora:
            magnitude = weights.get(f"{name[: -len('.lora_A.weight')]}.lora_magnitude_vector")
            if magnitude is None or magnitude.numel() != layer.weight.shape[0]:
                raise ModelLoadError(
                    f"{weights_path}: DoRA adapter (use_dora) without a magnitude vector of "
                    f"{layer.weight.shape[0]} values for {path}"
                )
            direction = layer.weight.float() + delta.to(layer.weight.device)
            norm = direction.norm(p=2, dim=1, keepdim=True)
            scaled = direction * (magnitude.float().to(norm.device).view(-1, 1) / norm)
            layer.weight.copy_(scaled.to(layer.weight.dtype))
        else:
            layer.weight += delta.to(layer.weight.device, layer.weight.dtype)
        merged += 1
    if merged == 0:
        raise ModelLoadError(f"{weights_path}: no LoRA weights found")
    return merged
