"""Contrastive stage: pull states with the same label together in embedding space.

Before a head is fitted, the backbone's LoRA adapters can be trained with a supervised
contrastive loss (Khosla et al. 2020) on the pooled, normalised state vectors, in the
spirit of SetFit (Tunstall et al. 2022): each step samples ``per_label`` states of every
label of one question (plus the option's own text, which counts as one more state of
its label), and every state is pulled towards the others of its label and pushed from
the rest of the batch. A prototype head (:mod:`clef_engine.heads.prototype`) fitted on the
adapted vectors then separates the labels better than on the base vectors: on BANKING77
with 10 examples per intent, 85.90 % before and 87.11 % after 30 steps (mean of 3 seeds,
``docs/finetune.md``).

Example:
    >>> import torch
    >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    >>> z = torch.nn.functional.normalize(z, dim=-1)
    >>> round(float(supervised_contrastive_loss(z, torch.tensor([0, 0, 1]), 1.0)), 4)
    0.3285
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

MAX_BATCH = 256
"""States per contrastive step at most; with more labels a step samples a subset of them."""


def supervised_contrastive_loss(
    z: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Mean over anchors with a positive of ``-mean_p log softmax_{a != i}(z_i . z_a / t)[p]``.

    ``z`` are ``[B, H]`` normalised vectors, ``labels`` ``[B]``. Anchors whose label occurs
    once in the batch have no positive and are left out; a batch without any positive
    pair gives a zero loss that still carries a gradient graph.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    n = z.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    sim = (z @ z.T / temperature).masked_fill(eye, float("-inf"))
    positives = (labels[:, None] == labels[None, :]) & ~eye
    has_positive = positives.any(dim=1)
    if not bool(has_positive.any()):
        return z.sum() * 0.0
    log_prob = sim.log_softmax(dim=-1).masked_fill(eye, 0.0)
    per_anchor = -(log_prob * positives).sum(dim=1) / positives.sum(dim=1).clamp(min=1)
    return per_anchor[has_positive].mean()


def contrastive_batch(
    members: Sequence[Sequence[int]], per_label: int, rng: random.Random
) -> list[tuple[int, int]]:
    """One step's ``(member, label)`` pairs: ``per_label`` members of each label.

    ``members[c]`` lists the items of label ``c`` (indices into any list the caller keeps).
    Labels with fewer members give all of them; labels without members are skipped. When
    the batch would exceed :data:`MAX_BATCH`, a random subset of the labels is taken.
    """
    labels = [c for c, m in enumerate(members) if m]
    most = max(2, MAX_BATCH // max(1, per_label))
    if len(labels) > most:
        labels = rng.sample(labels, most)
    batch: list[tuple[int, int]] = []
    for c in labels:
        pool = list(members[c])
        batch.extend((i, c) for i in rng.sample(pool, min(per_label, len(pool))))
    return batch


__all__ = ["MAX_BATCH", "contrastive_batch", "supervised_contrastive_loss"]
