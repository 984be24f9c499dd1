"""benchmarks.general_soup: the averaged adapter merges to the mean of the runs' updates.

Lab code's test, kept beside it and out of the library's suite (tests/ never imports
benchmarks/): ``python -m pytest benchmarks/test_general_soup.py``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.general_soup import soup_adapters
from clef_engine.backbones.adapter import merge_lora
from clef_engine.testing import tiny_encoder

QUERY = "encoder.layer.{}.attention.self.query"


def _adapter(root: Path, rank: int, alpha: int, layers: list[int], seed: int) -> Path:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in layers:
        name = "base_model.model." + QUERY.format(i)
        tensors[f"{name}.lora_A.weight"] = torch.randn(rank, 32, generator=gen)
        tensors[f"{name}.lora_B.weight"] = torch.randn(32, rank, generator=gen)
    root.mkdir()
    save_file(tensors, str(root / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["query"],
              "layers_to_transform": layers}  # fmt: skip
    (root / "adapter_config.json").write_text(json.dumps(config))
    return root


def test_the_soup_merges_to_the_mean_of_the_updates(tmp_path: Path) -> None:
    base = tiny_encoder(max_length=32).model
    assert base.config.hidden_size == 32
    # Different ranks, scales and layers: layer 0 is adapted by one run only.
    one = _adapter(tmp_path / "one", 4, 8, [0, 1], seed=0)
    two = _adapter(tmp_path / "two", 2, 2, [1], seed=1)
    config = soup_adapters([one, two], tmp_path / "soup")
    assert config["r"] == 6 and config["layers_to_transform"] == [0, 1]

    def merged(adapter: Path) -> dict[str, torch.Tensor]:
        model = copy.deepcopy(base)
        merge_lora(model, adapter)
        return {i: model.get_submodule(QUERY.format(i)).weight.detach() for i in (0, 1)}

    bare = {i: base.get_submodule(QUERY.format(i)).weight.detach() for i in (0, 1)}
    a, b, soup = merged(one), merged(two), merged(tmp_path / "soup")
    for i in (0, 1):
        mean = bare[i] + ((a[i] - bare[i]) + (b[i] - bare[i])) / 2
        assert torch.allclose(soup[i], mean, atol=1e-4), i
    assert not torch.allclose(soup[0], a[0], atol=1e-3)  # half of run one's update
