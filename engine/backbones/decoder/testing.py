"""Tiny random causal LMs (Qwen3, Llama) with a byte-level BPE tokenizer, built in code.

Nothing is downloaded: the tokenizer is trained on a small word list in memory and the
weights are random. Used by the tests and the CPU benchmark; also handy for users'
tests of code that runs on the decoder backbone.

Example:
    >>> from clef_engine.backbones.decoder.testing import write_tiny_causal_lm
    >>> path = write_tiny_causal_lm("/tmp/tiny-qwen3", arch="qwen3")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from clef_engine.testing import _WORDS

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
BOS = "<s>"
QWEN_LIKE_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
_CORPUS = [
    " ".join(_WORDS),
    "State: Question: Options: Answer with the name of exactly one option.",
    "Rate on this scale: Answer with the number of exactly one level. Answer yes or no.",
    '"yes" means: "no" means: Is the following true? for example',
    "billing bug shipping refund card_arrival exchange_rate lost_or_stolen_card",
    "0 1 2 3 4 5 6 7 8 9 low medium high N/A <think> </think>",
]


def tiny_tokenizer(*, chat_template: bool = True, vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer (any text, no unknown tokens) trained on a word list."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, IM_START, IM_END, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END if chat_template else EOT,
        pad_token=EOT,
        bos_token=None if chat_template else BOS,
    )
    if chat_template:
        fast.chat_template = QWEN_LIKE_TEMPLATE
    return fast


def write_tiny_causal_lm(
    directory: str | Path,
    *,
    arch: str = "qwen3",
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.2,
    seed: int = 0,
    chat_template: bool | None = None,
) -> Path:
    """Save a random ``arch`` (``qwen3`` or ``llama``) causal LM + tokenizer (safetensors).

    ``chat_template`` defaults to True for Qwen3 and False for Llama, so both prompt paths
    (chat template; plain ``Answer:`` with BOS) are exercised. A larger
    ``initializer_range`` than the usual 0.02 keeps option scores apart in a random model.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    use_template = arch == "qwen3" if chat_template is None else chat_template
    tokenizer = tiny_tokenizer(chat_template=use_template)
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate_size or 3 * hidden_size,
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": initializer_range,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    torch.manual_seed(seed)
    if arch == "qwen3":
        qwen = Qwen3Config(head_dim=hidden_size // heads, tie_word_embeddings=True, **common)
        model: Any = Qwen3ForCausalLM(qwen)
    elif arch == "llama":
        llama = LlamaConfig(bos_token_id=tokenizer.bos_token_id, **common)
        model = LlamaForCausalLM(llama)
    else:
        raise ValueError(f"arch: use 'qwen3' or 'llama'; got {arch!r}")
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out
