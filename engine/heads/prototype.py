"""Prototype head: options taught by example utterances, no training run.

When option descriptions carry ``examples``, the engine embeds them and fits a small
multinomial logistic regression on the embeddings (seconds on a CPU for thousands of
examples). Its temperature is fitted on out-of-fold predictions of a k-fold split of the
same examples, so the probabilities are calibrated without touching any evaluation data.
Options without examples contribute their own description embedding as one example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.calibration.temperature import fit_temperature

DEFAULT_L2 = 1e-3
"""Weight decay of the fitted head; chosen on a validation split carved from BANKING77 train."""
DEFAULT_FOLDS = 5


def _fit(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.zeros(n_classes, x.shape[1])
    # Start from class centroids: the nearest-centroid classifier, then refine.
    w.index_add_(0, y, x)
    counts = torch.bincount(y, minlength=n_classes).clamp(min=1).unsqueeze(1).float()
    w = (w / counts * 10.0).requires_grad_(True)
    b = torch.zeros(n_classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=150, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


@dataclass
class PrototypeClassifier:
    """A fitted linear head over normalised embeddings: ``logits = (x @ W.T + b) / T``."""

    weight: torch.Tensor
    bias: torch.Tensor
    temperature: float
    n_examples: int

    @classmethod
    def fit(
        cls,
        x: torch.Tensor,
        y: torch.Tensor,
        n_classes: int,
        *,
        l2: float = DEFAULT_L2,
        folds: int = DEFAULT_FOLDS,
        seed: int = 0,
    ) -> PrototypeClassifier:
        # Fitting needs autograd even when called under ``torch.inference_mode`` (as
        # ``decide`` does); clone so inference tensors become ordinary ones.
        with torch.inference_mode(False), torch.enable_grad():
            x = x.detach().float().cpu().clone()
            y = y.detach().long().cpu().clone()
            weight, bias = _fit(x, y, n_classes, l2)
            temperature = 1.0
            if len(y) >= 2 * folds and folds >= 2:
                gen = torch.Generator().manual_seed(seed)
                # Stratified folds: shuffle within class, deal round-robin.
                fold_of = torch.empty_like(y)
                for c in range(n_classes):
                    idx = (y == c).nonzero().flatten()
                    idx = idx[torch.randperm(len(idx), generator=gen)]
                    fold_of[idx] = torch.arange(len(idx)) % folds
                oof = torch.empty(len(y), n_classes)
                for f in range(folds):
                    test = fold_of == f
                    if not test.any():
                        continue
                    w_f, b_f = _fit(x[~test], y[~test], n_classes, l2)
                    oof[test] = x[test] @ w_f.T + b_f
                temperature = fit_temperature(oof, y)
        return cls(weight, bias, temperature, len(y))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.device, x.dtype)
        b = self.bias.to(x.device, x.dtype)
        return (x @ w.T + b) / self.temperature

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature must be a positive number; got {self.temperature}")
