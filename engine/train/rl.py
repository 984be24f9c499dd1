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

import copy
import random

import torch

from clef_engine.train.data import TrainingSet
from clef_engine.train.forward import ModelForward
from clef_engine.train.losses import partial_credit


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


class ReinforceStage(ModelForward):
    """The RL stage of :class:`clef_engine.train.trainer.Trainer` (``rl_epochs > 0``): the head
    is trained on :func:`rl_loss` over the trainer's features, the adapters stay fixed."""

    def reinforce(self, train: TrainingSet, val: TrainingSet) -> list[dict[str, float]]:
        """Policy-gradient fine-tuning of the head with a proper-scoring reward (see rl.py)."""
        cfg = self.config
        from tqdm.auto import tqdm

        reference = copy.deepcopy(self.head).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        params = [p for p in self.head.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.rl_lr, weight_decay=0.0)
        credits = {
            qid: partial_credit(
                str(q.type),  # type: ignore[attr-defined]
                len(train.names(qid)),
                cfg.similarity.get(qid),
            ).to(self.device)
            for qid, q in train.questions.items()
        }
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        history = []
        # The adapters stay fixed here: each state goes through the backbone once.
        with self.fixed_adapters():
            for epoch in range(cfg.rl_epochs):
                order = list(range(len(train)))
                random.Random(cfg.seed + 7919 * (epoch + 1)).shuffle(order)
                self.head.train()
                running, steps = 0.0, 0
                for start in tqdm(
                    range(0, len(order), cfg.batch_size),
                    desc=f"RL {epoch + 1}/{cfg.rl_epochs}",
                    disable=not cfg.progress,
                    leave=False,
                ):
                    batch = order[start : start + cfg.batch_size]
                    with torch.no_grad():
                        tokens, mask, pooled = self.features(
                            [train.examples[i].state for i in batch]
                        )
                        ref = {
                            q: lg
                            for q, lg, _ in self._question_logits(
                                train, batch, tokens, mask, pooled, reference
                            )
                        }
                    loss = torch.zeros((), device=self.device)
                    for qid, logits, target in self._question_logits(
                        train, batch, tokens, mask, pooled
                    ):
                        part = rl_loss(
                            logits,
                            ref[qid],
                            target,
                            credits[qid],
                            samples=cfg.rl_samples,
                            kl_weight=cfg.rl_kl,
                            generator=gen,
                        )
                        loss = loss + part * (len(target) / len(batch))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    optimizer.step()
                    running += float(loss.detach())
                    steps += 1
                record = {
                    "epoch": float(self.config.epochs + epoch + 1),
                    "rl_loss": running / max(1, steps),
                }
                if val.examples:
                    record.update({f"val_{k}": v for k, v in self.evaluate(val)[0].items()})
                history.append(record)
        return history
