"""Calibration fitting: temperatures and histogram binning per (type, bucket)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clef_engine.calibration import (
    Calibrator,
    HistogramBinning,
    expected_calibration_error,
    fit_calibrator,
)
from clef_engine.calibration.fit import histogram_helps


def overconfident(n: int = 2000, classes: int = 10, seed: int = 0):
    """Logits whose softmax is far more confident than the ~60% accuracy behind it."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    logits = torch.randn(n, classes, generator=gen)
    right = torch.rand(n, generator=gen) < 0.6
    top = torch.where(right, labels, (labels + 1) % classes)
    logits[torch.arange(n), top] += 3.0
    return logits * 4.0, labels


def test_fit_calibrator_lowers_ece_on_an_overconfident_set() -> None:
    logits, labels = overconfident()
    fit_l, fit_y, test_l, test_y = logits[:1000], labels[:1000], logits[1000:], labels[1000:]
    before = expected_calibration_error(torch.softmax(test_l, -1).numpy(), test_y.numpy())
    cal = fit_calibrator(list(fit_l), fit_y.tolist(), ["choice"] * 1000)
    assert cal.temperature("choice", 10) > 1.5
    after = expected_calibration_error(
        torch.softmax(cal.scale(test_l, "choice", 10), -1).numpy(), test_y.numpy()
    )
    assert before > 0.2
    assert after < before / 3


def test_histogram_binning_keeps_rows_normalised_and_argmax() -> None:
    logits, labels = overconfident(seed=1)
    cal = fit_calibrator(
        list(logits[:1000]), labels[:1000].tolist(), ["choice"] * 1000, histogram=True
    )
    assert "choice/b4" in cal.histograms
    probs = torch.softmax(cal.scale(logits[1000:].double(), "choice", 10), -1)
    adjusted = cal.adjust(probs, "choice", 10)
    assert torch.allclose(adjusted.sum(-1), torch.ones(len(adjusted), dtype=adjusted.dtype))
    assert torch.equal(adjusted.argmax(-1), probs.argmax(-1))
    ece_t = expected_calibration_error(probs.numpy(), labels[1000:].numpy())
    ece_h = expected_calibration_error(adjusted.numpy(), labels[1000:].numpy())
    assert ece_h < 0.05
    assert ece_h < ece_t


def calibrated(n: int = 300, classes: int = 10, seed: int = 0):
    """Labels drawn from the softmax itself: the temperature alone is already right."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=gen) * 3
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
    return logits, labels


def test_histogram_bins_are_kept_only_where_they_help_out_of_fold() -> None:
    logits, labels = calibrated()
    rows, ys = list(logits.double()), labels.tolist()
    assert not histogram_helps(rows, ys)
    cal = fit_calibrator(rows, ys, ["choice"] * len(ys), histogram=True)
    assert cal.histograms == {} and "choice/b4" in cal.temperatures
    forced = fit_calibrator(rows, ys, ["choice"] * len(ys), histogram=True, check_histogram=False)
    assert set(forced.histograms) == {"choice/b4"}
    # Over-confidence that one temperature cannot undo: the bins stay.
    over, over_labels = overconfident(n=400)
    assert histogram_helps(list(over.double()), over_labels.tolist())


def test_histogram_binning_never_hands_the_answer_to_the_runner_up() -> None:
    # Bins that map every confidence to 0.2: the floor must keep the top option on top,
    # also when the runner-up has the lower index (argmax takes the first of a tie).
    low = HistogramBinning([0.0, 1.0], [0.2])
    for dtype in (torch.float32, torch.float64):
        probs = torch.tensor([[0.30, 0.50, 0.20], [0.45, 0.05, 0.50], [0.2, 0.2, 0.6]], dtype=dtype)
        out = low.apply(probs)
        assert torch.equal(out.argmax(-1), probs.argmax(-1))
        assert torch.allclose(out.sum(-1), torch.ones(3, dtype=dtype))
        top = out.max(-1).values
        runner_up = out.topk(2, -1).values[:, 1]
        assert bool((top > runner_up).all())


def test_histogram_maps_confidence_to_bin_accuracy() -> None:
    conf = np.r_[np.full(100, 0.9), np.full(100, 0.6)]
    hit = np.r_[np.ones(50), np.zeros(50), np.ones(60), np.zeros(40)]
    hb = HistogramBinning.fit(conf, hit, n_bins=2)
    values = hb.top_value(torch.tensor([0.9, 0.6], dtype=torch.float64))
    assert float(values[0]) == pytest.approx(0.5, abs=0.01)
    assert float(values[1]) == pytest.approx(0.6, abs=0.01)


def test_calibrator_round_trips_histograms_and_old_dicts_still_load() -> None:
    logits, labels = overconfident(n=400)
    cal = fit_calibrator(list(logits), labels.tolist(), ["choice"] * 400, histogram=True)
    assert "choice/b4" in cal.histograms
    again = Calibrator.from_dict(cal.to_dict())
    probs = torch.softmax(logits[:5].double(), -1)
    assert torch.allclose(again.adjust(probs, "choice", 10), cal.adjust(probs, "choice", 10))
    old = Calibrator.from_dict({"temperatures": {"choice/b4": 0.5}})
    assert old.histograms == {} and "histograms" not in old.to_dict()
    assert torch.equal(old.adjust(probs, "choice", 10), probs)


def test_fit_calibrator_groups_by_bucket_and_keeps_base_keys() -> None:
    two = [torch.tensor([3.0, 0.0]), torch.tensor([0.0, 3.0])] * 6
    five = [torch.tensor([5.0, 0, 0, 0, 0])] * 12
    tiny = [torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])] * 3
    base = Calibrator({"noul/b1": 0.3, "choice/b5": 0.7}, {"noul/one_sided": 0.2}, "bundled")
    labels = [0, 1] * 3 + [1, 0] * 3 + [0, 1, 2] * 4 + [0, 1, 2]
    cal = fit_calibrator(two + five + tiny, labels, ["choice"] * 27, base=base)
    assert set(cal.temperatures) == {"noul/b1", "choice/b1", "choice/b3", "choice/b5"}
    # Three held-out items are too few to move a temperature: the base value stays.
    assert cal.temperatures["choice/b5"] == 0.7
    assert cal.bias("noul/one_sided") == 0.2
    with pytest.raises(ValueError, match="as many"):
        fit_calibrator(two, [0], ["choice"] * 12)
