"""Merge a peft LoRA adapter (``adapter/``) into a backbone, without needing peft.

Inference merges ``W += scaling * B @ A`` into each targeted linear layer once at load
time, so a fine-tuned engine runs exactly as fast as the base model (and int8 dynamic
quantization applies to the merged weights). A DoRA adapter (``use_dora``, Liu et al.
2024) also carries a magnitude ``m`` per output feature: the merged weight is then
``m * V / ||V||`` with ``V = W + scaling * B @ A`` and the norm taken over each output
row, as peft merges it. Training writes the adapter with peft
(``engine.train``); only that package's standard files are read here:
``adapter_config.json`` and ``adapter_model.safetensors``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from engine.errors import ModelLoadError

ADAPTER_DIR = "adapter"
_PREFIX = "base_model.model."


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
    from safetensors.torch import load_file

    config = json.loads(config_path.read_text())
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(f"{config_path}: only LoRA adapters are supported")
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    fan_in_fan_out = bool(config.get("fan_in_fan_out", False))
    dora = bool(config.get("use_dora", False))
    weights = load_file(str(weights_path))
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
