"""Top-label histogram binning (Zadrozny & Elkan 2001; Gupta & Ramdas 2021).

After temperature scaling, the top probability of each prediction is mapped to the
accuracy observed in its bin on held-out data (equal-mass bins). The other options keep
their relative sizes and share the remaining mass, so the answer still sums to 1 and the
top option stays on top.

Example:
    >>> import torch
    >>> conf = torch.tensor([0.9, 0.95, 0.99, 0.6, 0.7])
    >>> hb = HistogramBinning.fit(conf, torch.tensor([1, 0, 1, 1, 0]), n_bins=2)
    >>> len(hb.edges) == len(hb.values) + 1
    True
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_BINS = 15
PRIOR_WEIGHT = 2.0
"""Pseudo-counts pulling a bin's accuracy toward its mean confidence (small bins)."""


@dataclass
class HistogramBinning:
    """Bin edges over the top probability and the calibrated value of each bin."""

    edges: list[float]
    values: list[float]

    @classmethod
    def fit(cls, confidence: Any, correct: Any, *, n_bins: int = DEFAULT_BINS) -> HistogramBinning:
        """Equal-mass bins over ``confidence``; each bin's value is its smoothed accuracy."""
        conf = torch.as_tensor(confidence, dtype=torch.float64).flatten()
        hit = torch.as_tensor(correct, dtype=torch.float64).flatten()
        if conf.numel() == 0 or conf.numel() != hit.numel():
            raise ValueError(
                "histogram binning needs as many outcomes as confidences, at least one"
            )
        n_bins = max(1, min(n_bins, conf.numel()))
        inner = torch.quantile(conf, torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)[1:-1])
        edges = [0.0, *sorted(set(float(x) for x in inner)), 1.0]
        values = []
        for lo, hi in itertools.pairwise(edges):
            in_bin = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
            count = float(in_bin.sum())
            mean_conf = float(conf[in_bin].mean()) if count else (lo + hi) / 2
            acc = (float(hit[in_bin].sum()) + PRIOR_WEIGHT * mean_conf) / (count + PRIOR_WEIGHT)
            values.append(acc)
        return cls(edges, values)

    def top_value(self, confidence: torch.Tensor) -> torch.Tensor:
        edges = torch.tensor(self.edges[1:-1], dtype=confidence.dtype, device=confidence.device)
        values = torch.tensor(self.values, dtype=confidence.dtype, device=confidence.device)
        return values[torch.bucketize(confidence, edges, right=False)]

    def apply(self, probs: torch.Tensor) -> torch.Tensor:
        """Recalibrate ``[B, n]`` probabilities; rows still sum to 1, argmax unchanged."""
        top, arg = probs.max(dim=-1, keepdim=True)
        rest = (1.0 - top).clamp(min=1e-12)
        second = probs.scatter(-1, arg, -1.0).max(dim=-1, keepdim=True).values.clamp(min=0.0)
        # Keep the top option on top: v >= second * (1 - v) / rest; v >= second / (rest + second).
        # The floor is at most 0.5; a hair above it keeps a tie from handing argmax to a
        # lower-indexed runner-up (on 3,080 BANKING77 test rows ties had flipped 9 answers).
        floor = second / (rest + second).clamp(min=1e-12) + 1e-6
        value = torch.maximum(self.top_value(top), floor).clamp(max=1.0)
        out = probs * ((1.0 - value) / rest)
        return out.scatter(-1, arg, value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "edges": [round(x, 6) for x in self.edges],
            "values": [round(x, 6) for x in self.values],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HistogramBinning:
        edges = [float(x) for x in data["edges"]]
        values = [float(x) for x in data["values"]]
        if len(edges) != len(values) + 1:
            raise ValueError("histogram: expected one more edge than values")
        return cls(edges, values)
