"""Calibration: temperature fitting, buckets, metrics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clef_engine.calibration import (
    Calibrator,
    brier_score,
    bucket,
    expected_calibration_error,
    fit_temperature,
    fit_threshold,
    macro_f1,
    negative_log_likelihood,
    reliability_bins,
    reliability_diagram,
)


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (2, 3, 4, 5, 8, 9, 77, 128, 129, 255)] == [
        1,
        2,
        2,
        3,
        3,
        4,
        7,
        7,
        8,
        8,
    ]


def test_temperature_lookup_interpolates_or_falls_back_to_nearest_bucket():
    cal = Calibrator({"choice/b1": 0.1, "choice/b7": 0.05, "noul/one_sided": 0.3})
    assert cal.temperature("choice", 2) == 0.1
    assert cal.temperature("choice", 77) == 0.05
    assert cal.temperature("choice", 255) == 0.05  # b8 missing, none above -> nearest b7
    # b2 missing between b1 and b7: log-linear, 1/6 of the way (not the lower neighbour,
    # which made a left-out 7-option set take a 3-option temperature: underconfident).
    assert cal.temperature("choice", 3) == pytest.approx(0.1 ** (5 / 6) * 0.05 ** (1 / 6))
    assert Calibrator({"choice/b3": 0.2}).temperature("choice", 2) == 0.2  # below: nearest
    assert cal.temperature("score", 5) == cal.temperature("choice", 5)
    assert cal.temperature("noul/one_sided", 2) == 0.3
    assert Calibrator().temperature("choice", 4) == 1.0


def test_calibrator_round_trips_through_dict():
    cal = Calibrator({"choice/b3": 0.07}, {"noul/one_sided": 0.4}, source="unit test")
    assert Calibrator.from_dict(cal.to_dict()) == cal


def test_bundled_calibration_is_fitted_and_documented():
    cal = Calibrator.bundled()
    assert "train.csv" in cal.source
    assert 0 < cal.temperature("choice", 77) < 1


@pytest.mark.parametrize("true_t", [0.05, 0.5, 3.0])
def test_fit_temperature_recovers_a_known_temperature(true_t):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 5, generator=gen) * 2.0 * true_t
    probs = torch.softmax(logits / true_t, dim=-1)
    labels = torch.multinomial(probs, 1, generator=gen).flatten()
    fitted = fit_temperature(logits, labels)
    assert fitted == pytest.approx(true_t, rel=0.15)


def test_fit_temperature_accepts_ragged_rows_and_inference_mode():
    rows = [torch.tensor([2.0, 0.0]), torch.tensor([0.0, 2.0, 1.0]), torch.tensor([1.0, 0.5])]
    with torch.inference_mode():
        t = fit_temperature(rows, [0, 1, 0])
    assert t > 0
    with pytest.raises(ValueError, match="as many labels"):
        fit_temperature(rows, [0])


def test_fit_threshold_recovers_a_logistic():
    gen = torch.Generator().manual_seed(1)
    s = torch.rand(5000, generator=gen)
    y = (torch.rand(5000, generator=gen) < torch.sigmoid((s - 0.4) / 0.1)).float()
    t, b = fit_threshold(s, y)
    assert t == pytest.approx(0.1, rel=0.2)
    assert b == pytest.approx(0.4, abs=0.03)


def test_ece_of_a_perfectly_calibrated_set_is_small_and_of_an_overconfident_one_large():
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.5, 1.0, 20000)
    correct = rng.uniform(size=conf.size) < conf
    probs = np.stack([conf, 1 - conf], axis=1)
    labels = np.where(correct, 0, 1)
    assert expected_calibration_error(probs, labels) < 0.02
    over = np.stack([np.full(conf.size, 0.99), np.full(conf.size, 0.01)], axis=1)
    assert expected_calibration_error(over, labels) > 0.15


def test_metrics_against_hand_computed_values():
    probs = np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7]])
    labels = np.array([0, 0, 1])
    # Brier: (0.04+0.04) + (0.36+0.36) + (0.09+0.09) = 0.98 / 3
    assert brier_score(probs, labels) == pytest.approx(0.98 / 3)
    assert negative_log_likelihood(probs, labels) == pytest.approx(
        -(np.log(0.8) + np.log(0.4) + np.log(0.7)) / 3
    )
    # ECE, 15 bins: bins hold 0.6 (wrong), 0.7 (right), 0.8 (right) separately.
    assert expected_calibration_error(probs, labels) == pytest.approx((0.6 + 0.3 + 0.2) / 3)
    # predictions 0,1,1 vs gold 0,0,1: F1 class0 = 2/3, class1 = 2/3
    assert macro_f1([0, 1, 1], [0, 0, 1], 2) == pytest.approx(2 / 3)
    bins = reliability_bins(probs, labels)
    assert sum(b["count"] for b in bins) == 3


def test_reliability_diagram_writes_a_png(tmp_path):
    probs = np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7]])
    out = reliability_diagram(probs, [0, 0, 1], tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
