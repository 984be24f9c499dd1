"""The prototype head's logistic regression, supervised and with pseudo-labelled states."""

from __future__ import annotations

import pytest
import torch

import clef_engine.heads.prototype as prototype
from clef_engine.heads.prototype import PrototypeClassifier, pseudo_labels


def off_centre_labels(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Two Gaussian classes at x = -1 and x = +1; the labelled points sit at -0.2 and +1.8.

    The head fitted on the four labelled points alone puts its boundary near x = 0.8 and
    calls a tenth of class 1 class 0; the 400 unlabelled points show where the classes are.
    """
    gen = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[-1.0, 0.0]] * 200 + [[1.0, 0.0]] * 200)
    unlabeled = torch.randn(400, 2, generator=gen) * 0.3 + centres
    truth = torch.cat([torch.zeros(200), torch.ones(200)]).long()
    labelled = torch.tensor([[-0.2, 0.1], [-0.2, -0.1], [1.8, 0.1], [1.8, -0.1]])
    return labelled, torch.tensor([0, 0, 1, 1]), unlabeled, truth


def test_pseudo_labels_take_the_top_class_and_cap_the_most_confident() -> None:
    weight = torch.eye(2) * 4.0
    bias = torch.zeros(2)
    u = torch.tensor([[1.0, 0.0], [0.6, 0.4], [0.0, 1.0], [0.9, 0.1], [0.2, 0.8]])
    index, labels = pseudo_labels(weight, bias, u)
    assert index.tolist() == [0, 1, 2, 3, 4]
    assert labels.tolist() == [0, 0, 1, 0, 1]
    # One per class: the most confident of each (rows 0 and 2), in index order.
    index, labels = pseudo_labels(weight, bias, u, per_label=1)
    assert index.tolist() == [0, 2]
    assert labels.tolist() == [0, 1]
    index, _ = pseudo_labels(weight, bias, u, per_label=2)
    assert index.tolist() == [0, 2, 3, 4]


def test_confident_pseudo_labels_move_the_boundary_towards_the_gap() -> None:
    x, y, u, truth = off_centre_labels()

    def accuracy(head: PrototypeClassifier) -> float:
        return float((head.logits(u).argmax(-1) == truth).float().mean())

    alone = PrototypeClassifier.fit(x, y, 2, folds=2)
    capped = PrototypeClassifier.fit(x, y, 2, folds=2, unlabeled=u, per_label=50)
    assert alone.n_pseudo == 0 and capped.n_pseudo == 100
    # The 50 most confident of each class lie away from the old boundary; fitted with them,
    # the boundary moves into the gap between the classes.
    assert accuracy(alone) < 0.9
    assert accuracy(capped) > 0.97
    # Without a cap every unlabelled point joins with its predicted class: here the
    # pseudo-labels are separable at the old boundary, so the refit keeps it.
    every = PrototypeClassifier.fit(x, y, 2, folds=2, unlabeled=u)
    assert every.n_pseudo == len(u)
    assert accuracy(every) == accuracy(alone)
    # The fit is the labelled head's pseudo-labels added to the labelled points.
    w0, b0 = prototype._fit(x, y, 2, prototype.DEFAULT_L2)
    index, labels = pseudo_labels(w0, b0, u)
    w, b = prototype._fit(torch.cat([x, u[index]]), torch.cat([y, labels]), 2, prototype.DEFAULT_L2)
    assert torch.allclose(every.weight, w) and torch.allclose(every.bias, b)


def test_the_temperature_is_fitted_on_labelled_examples_only(monkeypatch) -> None:
    x, y, u, _ = off_centre_labels()
    x, y = torch.cat([x, x * 0.99]), torch.cat([y, y])  # 8 labelled: 2 folds of 4
    seen: list[int] = []

    def spy(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> float:
        seen.append(len(labels))
        assert smoothing == pytest.approx(2 / (10 * 1))  # rule of succession, n = 8, 2 classes
        return 1.5

    monkeypatch.setattr(prototype, "fit_temperature", spy)
    fitted = PrototypeClassifier.fit(x, y, 2, folds=2, unlabeled=u, per_label=50)
    assert seen == [len(y)]  # out-of-fold logits of the 8 labelled points, not the 100 pseudo
    assert fitted.temperature == 1.5
    assert fitted.n_pseudo == 100


def test_a_dozen_cleanly_separated_examples_do_not_claim_certainty() -> None:
    """12 examples, every one right out of fold: the rule of succession caps the evidence at
    13/14 = 0.93, so the head answers about that, not p = 1.00 (what an unsmoothed NLL fit
    gave: its temperature ran to the 1e-4 floor)."""
    torch.manual_seed(0)
    centres = torch.eye(3, 16) * 4.0
    y = torch.arange(3).repeat_interleave(4)
    x = centres[y] + 0.05 * torch.randn(12, 16)
    fitted = PrototypeClassifier.fit(x, y, 3, folds=2)
    top = torch.softmax(fitted.logits(centres), dim=1).max(dim=1).values
    assert torch.all(top < 0.99), top
    assert torch.all(top > 0.8), top
    assert 13 / 14 - 0.05 < float(top.mean()) < 13 / 14 + 0.05


def test_each_fold_pseudo_labels_with_a_head_that_never_saw_the_fold(monkeypatch) -> None:
    """A held-out label must not reach the pseudo-labels that its own prediction is fitted on."""
    x, y, u, _ = off_centre_labels()
    x, y = torch.cat([x, x * 0.99]), torch.cat([y, y])
    fitted_on: dict[int, int] = {}  # id(weight) -> labelled points the head was fitted on
    labelling: list[int] = []  # for every pseudo-labelling, the points its head saw
    real_fit, real_pseudo = prototype._fit, prototype.pseudo_labels

    def fit(xs, ys, n_classes, l2):
        weight, bias = real_fit(xs, ys, n_classes, l2)
        fitted_on[id(weight)] = len(xs)
        return weight, bias

    def pseudo(weight, bias, unlabeled, per_label=None):
        labelling.append(fitted_on[id(weight)])
        return real_pseudo(weight, bias, unlabeled, per_label)

    monkeypatch.setattr(prototype, "_fit", fit)
    monkeypatch.setattr(prototype, "pseudo_labels", pseudo)
    PrototypeClassifier.fit(x, y, 2, folds=2, unlabeled=u, per_label=50)
    # The final head labels with all 8; each of the 2 folds with its own 4 training points.
    assert labelling == [8, 4, 4]


def test_bad_pseudo_label_cap_is_refused() -> None:
    x, y, u, _ = off_centre_labels()
    with pytest.raises(ValueError, match="per_label must be at least 1"):
        PrototypeClassifier.fit(x, y, 2, unlabeled=u, per_label=0)
    with pytest.raises(ValueError, match="per_label must be at least 1"):
        pseudo_labels(torch.eye(2), torch.zeros(2), u, per_label=-1)


def test_out_of_fold_logits_come_from_the_head_fitted_without_the_fold() -> None:
    x, y, _, _ = off_centre_labels()
    x = torch.cat([x, x * 0.99, x * 0.98])
    y = torch.cat([y, y, y])  # 12 points, 3 folds of 4
    fitted = PrototypeClassifier.fit(x, y, 2, folds=3, seed=1, keep_folds=True)
    assert fitted.folds is not None and fitted.out_of_fold is not None
    assert sorted(torch.bincount(fitted.folds).tolist()) == [4, 4, 4]
    for f in range(3):
        held = fitted.folds == f
        assert torch.bincount(y[held], minlength=2).tolist() == [2, 2]  # stratified
        w, b = prototype._fit(x[~held], y[~held], 2, prototype.DEFAULT_L2)
        expected = (x[held] @ w.T + b) / fitted.temperature
        torch.testing.assert_close(fitted.out_of_fold[held], expected, atol=1e-5, rtol=0)
    # Too few points for the folds: no temperature, nothing out of fold.
    small = PrototypeClassifier.fit(x[:4], y[:4], 2, folds=3, keep_folds=True)
    assert small.temperature == 1.0 and small.folds is None and small.out_of_fold is None
    # Not asked for: not kept (the engine caches its classifiers).
    plain = PrototypeClassifier.fit(x, y, 2, folds=3, seed=1)
    assert plain.folds is None and plain.out_of_fold is None
    assert plain.temperature == fitted.temperature


def test_examples_of_one_group_share_a_fold() -> None:
    """Copies of one text (one group) never sit on both sides of a fold's split, where the
    copy outside the fold would answer for the one held out."""
    gen = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(30, 4, generator=gen), dim=-1)
    y = torch.arange(30) % 3
    x, y = torch.cat([x, x]), torch.cat([y, y])  # every example twice
    groups = torch.cat([torch.arange(30), torch.arange(30)])
    grouped = PrototypeClassifier.fit(x, y, 3, groups=groups, keep_folds=True)
    assert grouped.folds is not None
    assert torch.equal(grouped.folds[:30], grouped.folds[30:])
    assert sorted(torch.bincount(grouped.folds).tolist()) == [12] * 5  # 2 groups x 3 classes
    ungrouped = PrototypeClassifier.fit(x, y, 3, keep_folds=True)
    assert ungrouped.folds is not None
    assert not torch.equal(ungrouped.folds[:30], ungrouped.folds[30:])
