"""RL stage for calibrated decisions: a proper-scoring reward with partial credit.

The policy is the head's distribution over options. For each labelled state we sample
``K`` decisions ``a ~ p``; decision ``a`` earns credit ``c = C[y, a]`` (1 for the right
option, partial credit for near misses: ordinal distance for scores, a user-supplied
option-similarity matrix for choices), and the stated confidence ``q = p(a)`` is scored
with the Brier rule ``-(q - c)^2``, which is proper: its expectation is maximised by
reporting the true probability of being right. So the reward ``c - (q - c)^2`` pays for
good decisions *and* for honest confidence.

The loss is REINFORCE with a per-state mean baseline over the ``K`` samples, the direct
gradient of the Brier term through ``q``, and ``beta * KL(p || p_ref)`` toward the
supervised model, which keeps the policy from drifting away from what it learned.

Example:
    >>> import torch
    >>> logits = torch.zeros(2, 3, requires_grad=True)
    >>> loss = rl_loss(logits, logits.detach(), torch.tensor([0, 2]), torch.eye(3))
    >>> loss.backward()
"""

from __future__ import annotations

import torch


def rl_loss(
    logits: torch.Tensor,
    reference: torch.Tensor,
    target: torch.Tensor,
    credit: torch.Tensor,
    *,
    samples: int = 4,
    kl_weight: float = 0.5,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Loss of one question over a batch: ``[B, n]`` logits, ``[B, n]`` reference logits."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    actions = torch.multinomial(p.detach(), samples, replacement=True, generator=generator)
    c = credit[target].gather(1, actions)  # [B, K] credit of each sampled decision
    q = p.gather(1, actions)  # stated confidence in it
    reward = c - (q.detach() - c) ** 2
    advantage = reward - reward.mean(dim=1, keepdim=True)
    policy = -(advantage * logp.gather(1, actions)).mean()
    honesty = ((q - c) ** 2).mean()
    ref_logp = torch.log_softmax(reference, dim=-1)
    kl = (p * (logp - ref_logp)).sum(dim=-1).mean()
    return policy + honesty + kl_weight * kl
