"""Training losses: label-smoothed cross-entropy + Brier, and an ordinal term for scores.

- ``choice`` / ``noul``: ``CE_eps(logits, y) + lambda * Brier(softmax(logits), y)``.
  Cross-entropy drives accuracy; the Brier term is bounded and penalises confident
  mistakes less explosively than log loss, which keeps the probabilities honest.
- ``score``: the same plus ``mu * RPS``, the ranked probability score: squared distance
  between the predicted and true cumulative distributions over the ordered levels, so
  predicting level 3 when the truth is 4 costs less than predicting level 0.

Example:
    >>> import torch
    >>> float(brier(torch.tensor([[0.5, 0.5]]), torch.tensor([0])))
    0.5
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def brier(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``sum_c (p_c - 1[c = y])^2``."""
    onehot = F.one_hot(target, probs.shape[-1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(dim=-1).mean()


def ranked_probability_score(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean RPS: ``sum_k (CDF_p(k) - CDF_y(k))^2 / (n - 1)`` over the first ``n - 1`` levels."""
    n = probs.shape[-1]
    if n < 2:
        return probs.new_zeros(())
    cdf = probs.cumsum(dim=-1)[:, :-1]
    levels = torch.arange(n - 1, device=probs.device).unsqueeze(0)
    truth = (levels >= target.unsqueeze(1)).to(probs.dtype)
    return ((cdf - truth) ** 2).sum(dim=-1).div(n - 1).mean()


def decision_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    question_type: str,
    *,
    label_smoothing: float = 0.1,
    brier_weight: float = 0.5,
    ordinal_weight: float = 1.0,
) -> torch.Tensor:
    """The supervised loss for one question over a batch of ``[B, n]`` logits."""
    loss = F.cross_entropy(logits, target, label_smoothing=label_smoothing)
    probs = torch.softmax(logits, dim=-1)
    if brier_weight:
        loss = loss + brier_weight * brier(probs, target)
    if question_type == "score" and ordinal_weight:
        loss = loss + ordinal_weight * ranked_probability_score(probs, target)
    return loss


def symmetric_kl(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``(KL(p_a || p_b) + KL(p_b || p_a)) / 2`` (the R-Drop term)."""
    log_a = F.log_softmax(logits_a, dim=-1)
    log_b = F.log_softmax(logits_b, dim=-1)
    kl_ab = (log_a.exp() * (log_a - log_b)).sum(dim=-1)
    kl_ba = (log_b.exp() * (log_b - log_a)).sum(dim=-1)
    return ((kl_ab + kl_ba) / 2).mean()


def partial_credit(question_type: str, n: int, similarity: Any = None) -> torch.Tensor:
    """``[n, n]`` credit of answering column ``a`` when the truth is row ``y``.

    1 on the diagonal; for ``score`` ``1 - |a - y| / (n - 1)``; for ``choice`` the user's
    option-similarity matrix when given (values in [0, 1]), else exact match only.
    """
    if similarity is not None:
        sim = torch.as_tensor(similarity, dtype=torch.float32)
        if sim.shape != (n, n):
            raise ValueError(f"similarity matrix must be {n}x{n}; got {tuple(sim.shape)}")
        if bool((sim < 0).any() or (sim > 1).any()):
            raise ValueError("similarity values must lie in [0, 1]")
        return sim.clone().fill_diagonal_(1.0)
    if question_type == "score":
        idx = torch.arange(n, dtype=torch.float32)
        return 1.0 - (idx.unsqueeze(0) - idx.unsqueeze(1)).abs() / max(1, n - 1)
    return torch.eye(n)
