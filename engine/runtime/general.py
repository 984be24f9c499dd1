"""The general decision model shipped inside the package: the engine's default scorer.

``engine/data/general/`` is a model dir (``config.json`` + ``adapter/``, a LoRA adapter
in peft's format) trained by :mod:`clef_engine.train.general` on the decision mixture. It sits
on top of the packaged all-MiniLM-L6-v2 weights: loading merges the adapter into the
encoder once (so it runs exactly as fast as the bare model), and the zero-shot head reads
option texts with the question's instructions in front (``prompted``), as the model was
trained. Its calibration was fitted on held-out mixture rows, separately for fp32 and int8.

``DecisionEngine(scorer="similarity")`` keeps the bare sentence-similarity scorer of
earlier releases (cosine similarity of the untouched model, temperatures fitted on
BANKING77's training split).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from clef_engine.calibration.temperature import Calibrator
from clef_engine.errors import ModelLoadError

GENERAL_DIR = Path(__file__).resolve().parent.parent / "data" / "general"
"""The packaged general model dir."""
SCORERS = ("general", "similarity")
"""``DecisionEngine(scorer=...)`` values: the general model (default) or bare similarity."""
PROMPTED = "prompted"
"""``config.json["scorer"]["option_texts"]`` of a model trained on prompted option texts."""


def read_general_config(directory: Path = GENERAL_DIR) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"the packaged general model is missing or damaged ({path}: {exc}); reinstall "
            "clef-agents, or use DecisionEngine(scorer='similarity')"
        ) from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def calibration_for(data: dict[str, Any], quantize: str | None) -> Calibrator:
    """The model dir's calibration for fp32, or its int8 one under ``quantize="int8"``."""
    field = (
        "calibration_int8" if quantize == "int8" and "calibration_int8" in data else "calibration"
    )
    return Calibrator.from_dict(data.get(field) or {})


def is_prompted(data: dict[str, Any]) -> bool:
    scorer = data.get("scorer") or {}
    return isinstance(scorer, dict) and scorer.get("option_texts") == PROMPTED


def adapt_backbone(backbone: Any, directory: Path, quantize: str | None) -> str:
    """Merge ``directory/adapter`` into the encoder ``backbone`` (built unquantized), then
    quantize it to int8 if asked; returns a digest of the adapter weights.

    The backbone remembers what was merged (``backbone.base = "general@<digest>"``, part of
    its ``config()``), so a model dir saved from it, or fine-tuned on it, loads on the same
    weights (:func:`check_base`)."""
    from clef_engine.backbones.adapter import ADAPTER_DIR, merge_lora

    adapter = directory / ADAPTER_DIR
    merge_lora(backbone.model, adapter)
    if quantize is not None:
        from clef_engine.backbones.encoder import _quantize_int8

        if quantize != "int8" or backbone.device.type != "cpu":
            raise ValueError("quantize: only 'int8' on the CPU is supported")
        backbone.model = _quantize_int8(backbone.model)
        backbone.quantize = "int8"
    digest = _adapter_digest(adapter)
    backbone.base = f"{BASE}@{digest}"
    return digest


BASE = "general"
"""The name a backbone's ``config()["base"]`` gives the general model's merged adapter."""
REFERENCE = "packaged:general"
"""``Trainer(backbone=...)`` / ``clef-agents finetune --backbone``: start from the general
model (the packaged MiniLM with the general adapter merged) instead of the bare MiniLM."""


def _adapter_digest(adapter: Path) -> str:
    return hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()[:16]


def base_tag() -> str:
    """``"general@<digest>"`` of the general adapter this install ships."""
    from clef_engine.backbones.adapter import ADAPTER_DIR

    return f"{BASE}@{_adapter_digest(GENERAL_DIR / ADAPTER_DIR)}"


def general_backbone(device: Any = None, dtype: Any = None) -> Any:
    """The packaged encoder with the general adapter merged (fp32 unless ``dtype``): the
    starting point of a fine-tune from the general model."""
    from clef_engine.backbones import load_backbone

    backbone = load_backbone("encoder", None, device=device, dtype=dtype)
    adapt_backbone(backbone, GENERAL_DIR, None)
    return backbone


def check_base(value: Any, where: Path, path: str) -> str | None:
    """The ``backbone.base`` entry of a model dir's config.json: ``None`` (the backbone as
    it is on disk) or the general adapter of this very install, on the packaged encoder.

    Raises:
        ModelLoadError: naming ``backbone.base`` when the entry is malformed, names another
            base, or was saved with another version of the general adapter (the answers
            would silently differ).
    """
    from clef_engine.backbones import PACKAGED

    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(f"{BASE}@"):
        raise ModelLoadError(
            f"{where}: field 'backbone.base' is {value!r}; known bases: '{BASE}@<digest>'"
        )
    if path != PACKAGED:
        raise ModelLoadError(
            f"{where}: field 'backbone.base' is {value!r}, which sits on the packaged encoder "
            f"only; but backbone.path is {path!r}"
        )
    shipped = base_tag()
    if value != shipped:
        raise ModelLoadError(
            f"{where}: field 'backbone.base' is {value!r}, but this install ships {shipped!r}; "
            "the model was saved with another release's general model: install that release, "
            "or fine-tune again"
        )
    return value
