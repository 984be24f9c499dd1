"""A tiny random CLIP model written to a directory in code (tests; nothing downloads)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch


def write_tiny_clip(directory: str | Path, *, seed: int = 0, image_size: int = 32) -> Path:
    """Save a random CLIP (2-layer towers, 32-d) with a character-level BPE tokenizer."""
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPTokenizer,
        CLIPVisionConfig,
    )

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = ["<|startoftext|>", "<|endoftext|>", *chars, *(c + "</w>" for c in chars)]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (out / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"))
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": image_size},
            crop_size={"height": image_size, "width": image_size},
        ),
        tokenizer=tokenizer,
    )
    config = CLIPConfig(
        text_config=CLIPTextConfig(
            vocab_size=len(tokens),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        ).to_dict(),
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=image_size,
            patch_size=8,
        ).to_dict(),
        projection_dim=16,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config)
    model.save_pretrained(str(out), safe_serialization=True)
    processor.save_pretrained(str(out))
    return out
