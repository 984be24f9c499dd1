"""Calibration metrics: expected calibration error, Brier score, NLL, reliability diagram."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_BINS = 15


def _as_arrays(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.ndim != 1 or p.shape[0] != y.shape[0]:
        raise ValueError(f"probs must be [N, C] and labels [N]; got {p.shape} and {y.shape}")
    if p.shape[0] == 0:
        raise ValueError("no predictions to score")
    return p, y


def expected_calibration_error(probs: Any, labels: Any, n_bins: int = DEFAULT_BINS) -> float:
    """Top-label ECE with ``n_bins`` equal-width confidence bins (15 by default)."""
    p, y = _as_arrays(probs, labels)
    return top_label_ece(p.max(axis=1), p.argmax(axis=1) == y, n_bins)


def top_label_ece(confidence: Any, correct: Any, n_bins: int = DEFAULT_BINS) -> float:
    """ECE from each prediction's top probability and whether that option was right."""
    conf = np.asarray(confidence, dtype=np.float64).ravel()
    correct = np.asarray(correct, dtype=np.float64).ravel()
    if conf.size == 0 or conf.size != correct.size:
        raise ValueError("top_label_ece needs as many outcomes as confidences, at least one")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    ece = 0.0
    for lo, hi in itertools.pairwise(edges):
        in_bin = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - conf[in_bin].mean())
    return float(ece)


def brier_score(probs: Any, labels: Any) -> float:
    """Multi-class Brier score: mean over items of ``sum_c (p_c - y_c)^2``."""
    p, y = _as_arrays(probs, labels)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return float(((p - onehot) ** 2).sum(axis=1).mean())


def negative_log_likelihood(probs: Any, labels: Any) -> float:
    """Mean negative log probability of the true label (clipped at 1e-12)."""
    p, y = _as_arrays(probs, labels)
    return float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, 1.0)).mean())


def accuracy(probs: Any, labels: Any) -> float:
    p, y = _as_arrays(probs, labels)
    return float((p.argmax(axis=1) == y).mean())


def macro_f1(predicted: Sequence[int], labels: Sequence[int], n_classes: int) -> float:
    """Unweighted mean of per-class F1 over the classes that occur in labels or predictions."""
    pred = np.asarray(predicted)
    gold = np.asarray(labels)
    scores = []
    for c in range(n_classes):
        tp = float(((pred == c) & (gold == c)).sum())
        fp = float(((pred == c) & (gold != c)).sum())
        fn = float(((pred != c) & (gold == c)).sum())
        if tp + fp + fn == 0:
            continue
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else math.nan


def reliability_bins(probs: Any, labels: Any, n_bins: int = DEFAULT_BINS) -> list[dict[str, float]]:
    """Per bin: lower/upper edge, count, mean confidence, accuracy."""
    p, y = _as_arrays(probs, labels)
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    out = []
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        in_bin = (conf > lo) & (conf <= hi) if i else (conf >= lo) & (conf <= hi)
        n = int(in_bin.sum())
        out.append(
            {
                "lower": float(lo),
                "upper": float(hi),
                "count": n,
                "confidence": float(conf[in_bin].mean()) if n else math.nan,
                "accuracy": float(correct[in_bin].mean()) if n else math.nan,
            }
        )
    return out


def reliability_diagram(
    probs: Any,
    labels: Any,
    path: str | Path,
    *,
    title: str = "Reliability",
    n_bins: int = DEFAULT_BINS,
) -> Path:
    """Write a reliability diagram PNG (needs matplotlib: ``pip install 'clef-agents[eval]'``)."""
    from clef_engine.errors import require

    require("matplotlib", package="matplotlib", extra="eval", feature="reliability diagrams")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    bins = reliability_bins(probs, labels, n_bins)
    ece = expected_calibration_error(probs, labels, n_bins)
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=110)
    centers = [(b["lower"] + b["upper"]) / 2 for b in bins]
    accs = [0.0 if b["count"] == 0 else b["accuracy"] for b in bins]
    ax.bar(centers, accs, width=1.0 / n_bins, edgecolor="black", alpha=0.75, label="accuracy")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (top probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\nECE={ece:.3f}, n={len(np.asarray(labels))}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
