"""Training losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from engine.train.losses import brier, decision_loss, partial_credit, ranked_probability_score
from engine.train.rl import rl_loss


def test_brier_hand_computed() -> None:
    probs = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    # (0.75^2 + 0.75^2) and (0.5^2 + 0.5^2), averaged.
    assert float(brier(probs, torch.tensor([0, 1]))) == pytest.approx((1.125 + 0.5) / 2)


def test_rps_hand_computed() -> None:
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    # CDF (0.2, 0.7); truth CDF for level 2 is (0, 0), for level 0 (1, 1).
    assert float(ranked_probability_score(probs, torch.tensor([2]))) == pytest.approx(0.53 / 2)
    assert float(ranked_probability_score(probs, torch.tensor([0]))) == pytest.approx(0.73 / 2)


def test_rps_prefers_near_misses() -> None:
    near = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    far = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    target = torch.tensor([3])
    assert ranked_probability_score(near, target) < ranked_probability_score(far, target)
    # Plain Brier cannot tell the two apart.
    assert float(brier(near, target)) == pytest.approx(float(brier(far, target)))


def test_decision_loss_is_smoothed_ce_plus_weighted_brier() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (0.25, 0.75)
    target = torch.tensor([0])
    ce = -(0.95 * math.log(0.25) + 0.05 * math.log(0.75))
    got = decision_loss(logits, target, "choice", label_smoothing=0.1, brier_weight=0.5)
    assert float(got) == pytest.approx(ce + 0.5 * 1.125, rel=1e-5)
    plain = decision_loss(logits, target, "choice", label_smoothing=0.0, brier_weight=0.0)
    assert float(plain) == pytest.approx(-math.log(0.25), rel=1e-5)


def test_score_questions_add_the_ordinal_term() -> None:
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    target = torch.tensor([2])
    as_choice = decision_loss(logits, target, "choice", ordinal_weight=2.0)
    as_score = decision_loss(logits, target, "score", ordinal_weight=2.0)
    assert float(as_score - as_choice) == pytest.approx(2.0 * 0.265, rel=1e-5)


def test_partial_credit_matrices() -> None:
    score = partial_credit("score", 5)
    assert float(score[0, 4]) == 0.0 and float(score[2, 3]) == pytest.approx(0.75)
    assert torch.equal(partial_credit("choice", 3), torch.eye(3))
    sim = [[1.0, 0.5], [0.5, 1.0]]
    assert float(partial_credit("choice", 2, sim)[0, 1]) == 0.5
    with pytest.raises(ValueError, match="2x2"):
        partial_credit("choice", 2, [[1.0]])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        partial_credit("choice", 2, [[1.0, 2.0], [0.0, 1.0]])


def test_rl_loss_pushes_towards_the_right_answer() -> None:
    torch.manual_seed(0)
    logits = torch.zeros(64, 3, requires_grad=True)
    target = torch.zeros(64, dtype=torch.long)
    loss = rl_loss(logits, logits.detach(), target, torch.eye(3), samples=8, kl_weight=0.0)
    loss.backward()
    assert logits.grad is not None
    # Gradient descent raises the logit of the rewarded option, on average.
    assert float(logits.grad[:, 0].mean()) < 0
    assert float(logits.grad[:, 1:].mean()) > 0


def test_rl_kl_term_is_zero_at_the_reference() -> None:
    logits = torch.randn(4, 5)
    gen = torch.Generator().manual_seed(1)
    with_kl = rl_loss(logits, logits, torch.tensor([0, 1, 2, 3]), torch.eye(5), generator=gen)
    gen = torch.Generator().manual_seed(1)
    without = rl_loss(
        logits, logits, torch.tensor([0, 1, 2, 3]), torch.eye(5), kl_weight=0.0, generator=gen
    )
    assert float(with_kl) == pytest.approx(float(without), abs=1e-6)
