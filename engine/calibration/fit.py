"""Fit a :class:`Calibrator` on held-out labelled predictions.

Predictions are grouped by (question type, option-count bucket); each group gets the
temperature minimising its NLL and, optionally, top-label histogram binning fitted on the
temperature-scaled probabilities.

Example:
    >>> import torch
    >>> logits = [torch.tensor([4.0, 0.0, 0.0])] * 3 + [torch.tensor([0.0, 4.0, 0.0])]
    >>> cal = fit_calibrator(logits, [0, 1, 2, 1], ["choice"] * 4)
    >>> cal.temperature("choice", 3) > 1.0
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.calibration.histogram import DEFAULT_BINS, HistogramBinning
from engine.calibration.temperature import Calibrator, fit_temperature, key

MIN_HISTOGRAM_ITEMS = 50
"""Fewer held-out items than this in a group: temperature only (bins would be noise)."""
MIN_TEMPERATURE_ITEMS = 10
"""Fewer than this: keep the base temperature (a handful of items can push T to 0)."""


def fit_calibrator(
    logits: Sequence[torch.Tensor],
    labels: Sequence[int],
    types: Sequence[str],
    *,
    histogram: bool = False,
    n_bins: int = DEFAULT_BINS,
    base: Calibrator | None = None,
    source: str = "fit_calibrator",
) -> Calibrator:
    """Temperatures (and histogram bins) per ``type/bucket`` key.

    Args:
        logits: Uncalibrated logits, one 1-D tensor per labelled question.
        labels: Index of the true option for each.
        types: Question type for each (``choice``, ``noul``, ``score``).
        histogram: Also fit top-label histogram binning per key.
        n_bins: Bins for histogram binning.
        base: Keys not fitted here are kept from ``base`` (e.g. one-sided yes/no biases).
        source: Provenance string stored with the calibration.
    """
    if not (len(logits) == len(labels) == len(types)) or not logits:
        raise ValueError("fit_calibrator needs as many labels and types as logits, at least one")
    groups: dict[str, list[int]] = {}
    for i, (row, qtype) in enumerate(zip(logits, types, strict=True)):
        groups.setdefault(key(qtype, int(row.numel())), []).append(i)
    cal = Calibrator(
        dict(base.temperatures) if base else {},
        dict(base.biases) if base else {},
        source,
        dict(base.histograms) if base else {},
    )
    for k, idx in groups.items():
        rows = [logits[i].detach().double().flatten() for i in idx]
        ys = [int(labels[i]) for i in idx]
        if len(idx) < MIN_TEMPERATURE_ITEMS:
            continue
        t = fit_temperature(rows, ys)
        cal.temperatures[k] = t
        cal.histograms.pop(k, None)
        if histogram and len(idx) >= MIN_HISTOGRAM_ITEMS:
            conf, hit = [], []
            for row, y in zip(rows, ys, strict=True):
                p = torch.softmax(row / t, dim=-1)
                conf.append(float(p.max()))
                hit.append(float(int(p.argmax()) == y))
            cal.histograms[k] = HistogramBinning.fit(conf, hit, n_bins=n_bins)
    return cal
