"""Backbones by kind. ``encoder`` is built in; other kinds register by import path.

Register a new kind by adding ``"kind": "module:Class"`` to :data:`BACKBONES` (lazy, so
heavy or optional dependencies load only when that kind is used), or at run time with
:func:`register_backbone`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from clef_engine.backbones.base import Backbone, Encoded
from clef_engine.backbones.encoder import PACKAGED, EncoderBackbone, packaged_model_path

BACKBONES: dict[str, str | Callable[..., Backbone]] = {
    "encoder": EncoderBackbone,
    "decoder": "clef_engine.backbones.decoder:DecoderBackbone",
    "vision": "clef_engine.backbones.vision.backbone:VisionBackbone",
}


def register_backbone(kind: str, factory: str | Callable[..., Backbone]) -> None:
    """Make ``DecisionEngine(backbone=kind)`` build backbones with ``factory``."""
    BACKBONES[kind] = factory


def backbone_factory(kind: str) -> Callable[..., Backbone]:
    """The class (or factory) registered for ``kind``, imported on first use."""
    if kind not in BACKBONES:
        raise ValueError(f"backbone: unknown kind {kind!r}; known kinds: {sorted(BACKBONES)}")
    factory = BACKBONES[kind]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory


def load_backbone(kind: str = "encoder", path: Any = None, **kwargs: Any) -> Backbone:
    """Build a backbone of ``kind`` from a local ``path`` (``None``: the packaged default)."""
    return backbone_factory(kind)(path, **kwargs)


__all__ = [
    "BACKBONES",
    "PACKAGED",
    "Backbone",
    "Encoded",
    "EncoderBackbone",
    "load_backbone",
    "packaged_model_path",
    "register_backbone",
]
