"""Weight-space average ("model soup") of general-model runs trained on the same split.

Each run's LoRA update ``s_i * B_i @ A_i`` (``s_i = lora_alpha / r``) is averaged over the
runs, which is again a LoRA update, of rank ``sum(r_i)``: the ``A_i`` stacked, the ``B_i``
side by side, each scaled by ``s_i / n`` (:func:`soup_adapters`). A module one run does not
adapt contributes zeros. The soup is written as a model dir (the first run's
``config.json``), and its fp32 and int8 temperatures are fitted again on the held-out
mixture rows of ``clef_engine.train.general`` (split seed 0, 10 %: every run must have
been trained with ``--seed 0`` or ``--split-seed 0``, so none saw them). Score it with
``python -m benchmarks.general_model --model OUT --name NAME``.

    python -m benchmarks.general_soup --models engine/data/general /tmp/l0/m --out /tmp/soup
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import mixture_roots
from clef_engine.backbones.adapter import ADAPTER_DIR, read_adapter_config
from clef_engine.train import general
from clef_engine.train.mixture import load_mixture

WEIGHTS = "adapter_model.safetensors"
A, B = ".lora_A.weight", ".lora_B.weight"


def soup_adapters(adapters: list[Path], out: Path) -> dict[str, Any]:
    """Write the average of the LoRA updates in ``adapters`` (peft dirs) to ``out``;
    returns its adapter config."""
    from safetensors.torch import load_file, save_file

    configs = [read_adapter_config(a) for a in adapters]
    for a, c in zip(adapters, configs, strict=True):
        if c.get("use_dora") or c.get("use_rslora") or c.get("fan_in_fan_out"):
            raise ValueError(f"{a}: only plain LoRA adapters can be averaged")
    weights = [load_file(str(a / WEIGHTS)) for a in adapters]
    ranks = [int(c["r"]) for c in configs]
    scales = [float(c.get("lora_alpha", r)) / r for c, r in zip(configs, ranks, strict=True)]
    modules = sorted({k[: -len(A)] for w in weights for k in w if k.endswith(A)})
    n = len(adapters)
    tensors: dict[str, torch.Tensor] = {}
    for module in modules:
        shapes = [(w[module + A].shape, w[module + B].shape) for w in weights if module + A in w]
        fan_in, fan_out = shapes[0][0][1], shapes[0][1][0]
        a_parts, b_parts = [], []
        for w, r, s in zip(weights, ranks, scales, strict=True):
            if module + A in w:
                a_parts.append(w[module + A].float())
                b_parts.append(w[module + B].float() * (s / n))
            else:
                a_parts.append(torch.zeros(r, fan_in))
                b_parts.append(torch.zeros(fan_out, r))
        tensors[module + A] = torch.cat(a_parts, 0).contiguous()
        tensors[module + B] = torch.cat(b_parts, 1).contiguous()
    rank = sum(ranks)
    layers = [c.get("layers_to_transform") for c in configs]
    config = {
        **configs[0],
        "r": rank,
        "lora_alpha": rank,  # scaling 1: the per-run scales are inside B
        "target_modules": sorted({t for c in configs for t in c["target_modules"]}),
        "layers_to_transform": None
        if any(x is None for x in layers)
        else sorted({i for x in layers for i in x}),  # type: ignore[union-attr]
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="model dirs (split seed 0)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    models = [Path(m) for m in args.models]
    out = Path(args.out)
    shutil.copytree(models[0], out, ignore=shutil.ignore_patterns("checkpoint", ADAPTER_DIR))
    soup_adapters([m / ADAPTER_DIR for m in models], out / ADAPTER_DIR)
    sets = load_mixture([str(mixture_roots()[0])], split="train")
    held = general.split_rows(sets, 0.1, 0)
    general.fit_calibrations(out, held, per_set=400, seed=0, excluded=[])
    print("wrote", out)


if __name__ == "__main__":
    main()
