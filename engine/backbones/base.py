"""The backbone protocol: texts in, token states and pooled vectors out.

A backbone runs the expensive forward pass; heads score options on what it returns.
Other kinds (``decoder``, ``vision``) register themselves in :mod:`clef_engine.backbones`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class Encoded:
    """The backbone's output for a batch of texts (after windowing is undone).

    Attributes:
        pooled: ``[B, H]`` one vector per text (mean-pooled over all of its windows).
        windows: How many windows each text was split into.
        tokens: How many tokens each text had (all windows, special tokens excluded).
        token_states: Per text, ``[T, H]`` states of its tokens; only when asked for.
    """

    pooled: torch.Tensor
    windows: list[int]
    tokens: list[int]
    token_states: list[torch.Tensor] | None = None


@runtime_checkable
class Backbone(Protocol):
    """What the engine needs from a backbone."""

    kind: str
    name: str
    device: torch.device
    dtype: torch.dtype
    hidden_size: int
    max_length: int

    def encode(
        self, texts: list[str], *, return_tokens: bool = False, normalize: bool = True
    ) -> Encoded:
        """Encode texts; texts longer than ``max_length`` tokens are windowed."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts without a forward pass (for usage accounting)."""
        ...

    def config(self) -> dict[str, Any]:
        """JSON-serialisable reference to this backbone, for ``config.json``."""
        ...
