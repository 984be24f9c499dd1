"""Prototype head: options taught by example utterances, no training run.

When option descriptions carry ``examples``, the engine embeds them and fits a small
multinomial logistic regression on the embeddings (seconds on a CPU for thousands of
examples). Its temperature is fitted on out-of-fold predictions of a k-fold split of the
same examples, so the probabilities are calibrated without touching any evaluation data;
the fit's targets are smoothed by the rule of succession, so a dozen examples that all
separate cleanly give about 0.93, not 1.00.
Options without examples contribute their own description embedding as one example.

With ``unlabeled`` vectors the fit is semi-supervised (pseudo-labelling, Lee 2013): the head
fitted on the labelled examples labels every unlabelled state with its top option (at most
``per_label`` per option, the most confident first), and the head is fitted again on both.
The temperature still comes from labelled examples only: each fold's head pseudo-labels the
unlabelled states itself, so no held-out label reaches its own prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from clef_engine.calibration.temperature import fit_temperature, succession_smoothing

DEFAULT_L2 = 1e-5
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


def pseudo_labels(
    weight: torch.Tensor,
    bias: torch.Tensor,
    unlabeled: torch.Tensor,
    per_label: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, labels)``: each unlabelled vector's top class under ``x @ W.T + b``.

    With ``per_label``, each class keeps only its ``per_label`` most confident states (the
    rest stay unlabelled), so no class floods the refit. Indices come sorted.
    """
    if per_label is not None and per_label < 1:
        raise ValueError(f"per_label must be at least 1 (or None); got {per_label}")
    logits = unlabeled @ weight.T + bias
    confidence, predicted = logits.softmax(dim=-1).max(dim=-1)
    if per_label is None:
        return torch.arange(len(predicted), device=predicted.device), predicted
    keep = []
    for c in predicted.unique():
        members = (predicted == c).nonzero().flatten()
        keep.append(members[confidence[members].argsort(descending=True)[:per_label]])
    if not keep:
        return torch.empty(0, dtype=torch.long, device=predicted.device), predicted[:0]
    index = torch.cat(keep).sort().values
    return index, predicted[index]


def _fit_semi(
    x: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    l2: float,
    unlabeled: torch.Tensor | None,
    per_label: int | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`_fit` on the labelled examples, then again with their pseudo-labels added."""
    w, b = _fit(x, y, n_classes, l2)
    if unlabeled is None or len(unlabeled) == 0:
        return w, b, 0
    index, labels = pseudo_labels(w, b, unlabeled, per_label)
    if len(index) == 0:
        return w, b, 0
    w, b = _fit(torch.cat([x, unlabeled[index]]), torch.cat([y, labels]), n_classes, l2)
    return w, b, len(index)


def _stratified_folds(
    y: torch.Tensor, n_classes: int, folds: int, seed: int, groups: torch.Tensor | None
) -> torch.Tensor:
    """The fold of each example: per class, its groups shuffled and dealt round-robin; a
    group belongs to the class of its first example and takes all its examples along."""
    gen = torch.Generator().manual_seed(seed)
    if groups is None:
        group_of = torch.arange(len(y))
    else:
        group_of = torch.unique(groups.detach().cpu(), return_inverse=True)[1]
    n_groups = int(group_of.max()) + 1 if len(y) else 0
    first = torch.full((n_groups,), len(y), dtype=torch.long)
    first.scatter_reduce_(0, group_of, torch.arange(len(y)), reduce="amin")
    group_class = y[first]
    fold_of_group = torch.empty(n_groups, dtype=torch.long)
    for c in range(n_classes):
        members = (group_class == c).nonzero().flatten()  # in order of first appearance
        members = members[first[members].argsort()]
        members = members[torch.randperm(len(members), generator=gen)]
        fold_of_group[members] = torch.arange(len(members)) % folds
    return fold_of_group[group_of]


@dataclass
class PrototypeClassifier:
    """A fitted linear head over normalised embeddings: ``logits = (x @ W.T + b) / T``."""

    weight: torch.Tensor
    bias: torch.Tensor
    temperature: float
    n_examples: int
    n_pseudo: int = 0
    """Unlabelled states that joined the fit with a pseudo-label."""
    folds: torch.Tensor | None = None
    """``[N]`` the fold of each example in the temperature's k-fold split (``None``: too
    few examples for one)."""
    out_of_fold: torch.Tensor | None = None
    """``[N, n]`` each example's logits from the head fitted without its fold, divided by
    the temperature (what a cross-fitted example memory is chosen on)."""

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
        unlabeled: torch.Tensor | None = None,
        per_label: int | None = None,
        groups: torch.Tensor | None = None,
        keep_folds: bool = False,
    ) -> PrototypeClassifier:
        """Fit on ``x`` (``[N, H]``) with labels ``y``; see the module docstring.

        ``unlabeled`` (``[M, H]``) adds pseudo-labelled states; ``per_label`` caps them per
        class (``None``: every unlabelled state joins with its predicted class).
        ``groups`` (``[N]``, e.g. one id per distinct text): examples of one group share a
        fold, so a copy of a held-out example is never on the other side of its split
        (default: every example its own group). ``keep_folds``: keep :attr:`folds` and
        :attr:`out_of_fold` (for a cross-fitted memory); by default they are dropped.
        """
        # Fitting may be asked for inside the engine's inference_mode; leave it for autograd
        # and copy the inputs out of inference tensors.
        with torch.inference_mode(False), torch.enable_grad():
            x = x.detach().float().cpu().clone()
            y = y.detach().long().cpu().clone()
            u = None if unlabeled is None else unlabeled.detach().float().cpu().clone()
            weight, bias, n_pseudo = _fit_semi(x, y, n_classes, l2, u, per_label)
            temperature = 1.0
            fold_of: torch.Tensor | None = None
            oof: torch.Tensor | None = None
            if len(y) >= 2 * folds and folds >= 2:
                fold_of = _stratified_folds(y, n_classes, folds, seed, groups)
                oof = torch.empty(len(y), n_classes)
                for f in range(folds):
                    test = fold_of == f
                    if not test.any():
                        continue
                    w_f, b_f, _ = _fit_semi(x[~test], y[~test], n_classes, l2, u, per_label)
                    oof[test] = x[test] @ w_f.T + b_f
                smoothing = succession_smoothing(len(y), n_classes)
                temperature = fit_temperature(oof, y, smoothing=smoothing)
                oof = oof / temperature
        if not keep_folds:
            fold_of, oof = None, None
        return cls(weight, bias, temperature, len(y), n_pseudo, fold_of, oof)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.device, x.dtype)
        b = self.bias.to(x.device, x.dtype)
        return (x @ w.T + b) / self.temperature

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature must be a positive number; got {self.temperature}")
