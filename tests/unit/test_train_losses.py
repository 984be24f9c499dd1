"""Training losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from clef_engine.train.contrastive import MAX_BATCH, contrastive_batch, supervised_contrastive_loss
from clef_engine.train.losses import (
    brier,
    decision_loss,
    partial_credit,
    ranked_probability_score,
    symmetric_kl,
)
from clef_engine.train.rl import rl_loss


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


def test_supervised_contrastive_loss_hand_computed() -> None:
    z = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]]), dim=-1)
    s01, s12 = float(z[0] @ z[1]), float(z[1] @ z[2])  # z0 . z2 = 0
    # Anchor 2 has no positive and is left out; anchors 0 and 1 each have one.
    a0 = -math.log(math.exp(s01) / (math.exp(s01) + 1.0))
    a1 = -math.log(math.exp(s01) / (math.exp(s01) + math.exp(s12)))
    got = supervised_contrastive_loss(z, torch.tensor([0, 0, 1]), 1.0)
    assert float(got) == pytest.approx((a0 + a1) / 2, abs=1e-6)
    # A lower temperature sharpens: the same, well separated batch costs less.
    assert float(supervised_contrastive_loss(z, torch.tensor([0, 0, 1]), 0.1)) < float(got)


def test_supervised_contrastive_loss_rewards_clustered_labels() -> None:
    labels = torch.tensor([0, 0, 1, 1])
    together = torch.tensor([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0], [0.14, 0.99]])
    mixed = together[[0, 2, 1, 3]]
    loss = supervised_contrastive_loss
    assert float(loss(together, labels, 0.1)) < float(loss(mixed, labels, 0.1))


def test_supervised_contrastive_loss_without_positives_and_bad_temperature() -> None:
    z = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1).requires_grad_(True)
    loss = supervised_contrastive_loss(z, torch.tensor([0, 1, 2]), 0.05)
    assert float(loss.detach()) == 0.0
    loss.backward()  # still part of the graph
    assert z.grad is not None and float(z.grad.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="temperature must be positive; got 0"):
        supervised_contrastive_loss(z, torch.tensor([0, 0, 1]), 0)


def test_contrastive_batch_samples_every_label() -> None:
    import random

    members = [[0, 1, 2, 3], [4], [], [5, 6, 7]]
    batch = contrastive_batch(members, 2, random.Random(0))
    by_label: dict[int, list[int]] = {}
    for item, label in batch:
        assert item in members[label]
        by_label.setdefault(label, []).append(item)
    # Two distinct members of each label; a label with one member gives it; empty: skipped.
    assert {k: len(set(v)) for k, v in by_label.items()} == {0: 2, 1: 1, 3: 2}
    many = [[2 * c, 2 * c + 1] for c in range(500)]
    big = contrastive_batch(many, 2, random.Random(0))
    assert len(big) == MAX_BATCH
    assert all(sum(1 for _, c in big if c == label) == 2 for label in {c for _, c in big})


def test_symmetric_kl_hand_computed() -> None:
    # p = (1/2, 1/2), q = (3/4, 1/4): KL(p||q) = 0.143841, KL(q||p) = 0.130812.
    a = torch.tensor([[0.0, 0.0]])
    b = torch.tensor([[math.log(3.0), 0.0]])
    expected = (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)) / 2 + (
        0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    ) / 2
    assert float(symmetric_kl(a, b)) == pytest.approx(expected, abs=1e-6)
    assert float(symmetric_kl(b, a)) == pytest.approx(expected, abs=1e-6)
    assert float(symmetric_kl(b, b + 5.0)) == pytest.approx(0.0, abs=1e-6)  # shift-invariant
    # Mean over rows.
    rows = symmetric_kl(torch.cat([a, a]), torch.cat([b, a]))
    assert float(rows) == pytest.approx(expected / 2, abs=1e-6)
