"""Checks on a local Hugging Face directory before transformers reads it.

A model dir is data, never code. Transformers runs Python shipped in a model dir when a
JSON file there names it under ``auto_map`` and the caller passes ``trust_remote_code``
(or answers yes to its interactive prompt). Every transformers call in the engine passes
``trust_remote_code=False`` (:data:`NO_REMOTE_CODE`), and :func:`check_hf_dir` refuses a
dir that asks for remote code before transformers sees it, so neither the code nor the
prompt is ever reached.

Example:
    >>> from clef_engine.testing import write_tiny_bert
    >>> import tempfile
    >>> check_hf_dir(write_tiny_bert(tempfile.mkdtemp()))   # a clean encoder dir passes
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clef_engine.errors import ModelLoadError

NO_REMOTE_CODE: dict[str, Any] = {"trust_remote_code": False, "local_files_only": True}
"""Keyword arguments every transformers ``from_pretrained`` call in the engine passes."""

CODE_CONFIGS = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
"""The files where transformers looks for ``auto_map`` (model, tokenizer, processors)."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""A tokenizer's vocabulary, in any of the formats transformers reads. Without one,
``AutoTokenizer`` builds a tokenizer that knows only its special tokens, and every text
encodes to the same vector (every answer uniform)."""


def check_hf_dir(directory: Path, *, tokenizer: bool = True) -> None:
    """Refuse ``directory`` if it asks for remote code or (``tokenizer``) has no vocabulary.

    Raises:
        ModelLoadError: naming the file and the field (``auto_map``), or the missing files.
    """
    for name in CODE_CONFIGS:
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path}: not valid JSON ({exc})", file=str(path)) from exc
        if isinstance(data, dict) and "auto_map" in data:
            raise ModelLoadError(
                f"{path}: field 'auto_map' asks to run Python code shipped in the model dir; "
                "clef-agents never runs model-dir code (trust_remote_code=False). Use a "
                "checkpoint whose architecture transformers implements itself",
                file=str(path),
                field="auto_map",
            )
    if tokenizer and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"model dir {str(directory)!r} has no tokenizer files (one of "
            f"{', '.join(TOKENIZER_FILES)}); copy the tokenizer that belongs to these weights "
            "into the dir (tokenizer.save_pretrained(dir))"
        )


__all__ = ["CODE_CONFIGS", "NO_REMOTE_CODE", "TOKENIZER_FILES", "check_hf_dir"]
