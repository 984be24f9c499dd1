"""Calibration: temperature scaling per (type, option-count bucket) and its metrics."""

from __future__ import annotations

from clef_engine.calibration.fit import fit_calibrator
from clef_engine.calibration.histogram import HistogramBinning
from clef_engine.calibration.metrics import (
    accuracy,
    brier_score,
    expected_calibration_error,
    macro_f1,
    negative_log_likelihood,
    reliability_bins,
    reliability_diagram,
)
from clef_engine.calibration.temperature import Calibrator, bucket, fit_temperature, fit_threshold

__all__ = [
    "Calibrator",
    "HistogramBinning",
    "accuracy",
    "brier_score",
    "bucket",
    "expected_calibration_error",
    "fit_calibrator",
    "fit_temperature",
    "fit_threshold",
    "macro_f1",
    "negative_log_likelihood",
    "reliability_bins",
    "reliability_diagram",
]
