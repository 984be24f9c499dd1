"""The ``decoder`` backbone: a local causal LM scores every option in one shared pass.

See :class:`DecoderBackbone` and ``docs/decoder.md``.
"""

from __future__ import annotations

from clef_engine.backbones.decoder.backbone import DecoderBackbone
from clef_engine.backbones.decoder.memory import MemoryEstimate, ModelTooLargeError
from clef_engine.backbones.decoder.tree import Group, Row, TreeScorer

__all__ = ["DecoderBackbone", "Group", "MemoryEstimate", "ModelTooLargeError", "Row", "TreeScorer"]
