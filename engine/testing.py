"""Tiny random models built from configs in code, for tests (ours and users').

Nothing here downloads: the tokenizer's vocabulary is written from a word list and the
model's weights are random.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from clef_engine.backbones.encoder import EncoderBackbone

_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = (
    "the a an is are was be to of and or in on for with my card not has have arrived money "
    "refund payment help please yes no bug error login page account transfer cash top up "
    "exchange rate pin blocked lost stolen angry happy urgent low medium high billing tech "
    "sales human review question answer state option route ticket image text hello world"
).split()


def tiny_vocab() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    digits = [str(d) for d in range(10)]
    punct = list(".,!?:;'\"()[]{}-_/@#$%&*+=<>")
    pieces = ["##" + x for x in letters + digits]
    return list(dict.fromkeys(_SPECIAL + _WORDS + letters + digits + punct + pieces))


def write_tiny_bert(
    directory: str | Path,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 128,
) -> Path:
    """Save a random BERT encoder + WordPiece tokenizer to ``directory`` (safetensors)."""
    # transformers 5 keeps BertTokenizerFast as an alias of BertTokenizer at run time but
    # not in its type stubs; 4.x (also supported) has the name for real.
    from transformers import BertConfig, BertModel, BertTokenizerFast  # type: ignore[attr-defined]

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(tiny_vocab())}
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden_size * 2,
        max_position_embeddings=max_position_embeddings,
    )
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def tiny_encoder(*, max_length: int | None = None, **kwargs: Any) -> EncoderBackbone:
    """A tiny random encoder backbone, built in a temporary directory."""
    directory = write_tiny_bert(tempfile.mkdtemp(prefix="clef-tiny-"), **kwargs)
    return EncoderBackbone(directory, device="cpu", max_length=max_length)
