"""Merging a peft LoRA adapter without peft gives the adapted model's outputs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from clef_engine.backbones.adapter import merge_lora
from clef_engine.errors import ModelLoadError, peft_quietly
from clef_engine.testing import write_tiny_bert

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("dora", [False, True])
def test_merge_matches_peft_outputs(tmp_path, dora) -> None:
    from transformers import BertModel

    base = BertModel.from_pretrained(str(write_tiny_bert(tmp_path / "bert"))).eval()
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value", "dense"], use_dora=dora
    )
    with peft_quietly():
        adapted = peft.get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():  # LoRA B starts at zero (DoRA: m at ||W||); make them do something
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
            if "lora_magnitude_vector" in name:
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
    adapted.eval()
    adapted.save_pretrained(str(tmp_path / "adapter"))
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    expected = adapted(input_ids=ids).last_hidden_state
    merged = copy.deepcopy(base)
    n = merge_lora(merged, tmp_path / "adapter")
    # Per layer: query, value and three dense layers; plus the pooler's dense.
    assert n == 2 * 5 + 1
    got = merged(input_ids=ids).last_hidden_state
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, base(input_ids=ids).last_hidden_state, atol=1e-3)


def test_merge_refuses_adapters_of_another_model(tmp_path) -> None:
    from transformers import BertModel

    small = BertModel.from_pretrained(str(write_tiny_bert(tmp_path / "a", hidden_size=32)))
    other = BertModel.from_pretrained(str(write_tiny_bert(tmp_path / "b", hidden_size=48)))
    with peft_quietly():
        adapted = peft.get_peft_model(other, peft.LoraConfig(r=2, target_modules=["query"]))
    adapted.save_pretrained(str(tmp_path / "adapter"))
    with pytest.raises(ModelLoadError, match="shape"):
        merge_lora(small, tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="peft format"):
        merge_lora(small, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 2


def test_merge_refuses_a_dora_adapter_without_its_magnitudes(tmp_path) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import BertModel

    base = BertModel.from_pretrained(str(write_tiny_bert(tmp_path / "bert")))
    config = peft.LoraConfig(r=2, target_modules=["query"], use_dora=True)
    with peft_quietly():
        adapted = peft.get_peft_model(copy.deepcopy(base), config)
    adapted.save_pretrained(str(tmp_path / "adapter"))
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    weights = load_file(str(path))
    kept = {k: v for k, v in weights.items() if "magnitude" not in k}
    assert len(kept) < len(weights)
    save_file(kept, str(path))
    with pytest.raises(ModelLoadError, match=r"DoRA adapter \(use_dora\) without a magnitude"):
        merge_lora(base, tmp_path / "adapter")
