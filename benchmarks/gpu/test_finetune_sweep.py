"""The GPU sweep's bookkeeping: run order under a budget and the scoring of ensembles.

Lab code, so it lives beside the sweep and not in tests/ (the library's suite never imports
benchmarks/): ``python -m pytest benchmarks/gpu/test_finetune_sweep.py``."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.gpu.finetune_sweep import score_ensembles, tasks


def test_tasks_go_out_seed_major_with_own_seeds() -> None:
    order = tasks(["default (4 epochs)@0,1,2", "3 epochs@5,6"], "full", None)
    assert [(name, seed) for _, name, _, seed in order] == [
        ("default (4 epochs)", 0),
        ("3 epochs", 5),
        ("default (4 epochs)", 1),
        ("3 epochs", 6),
        ("default (4 epochs)", 2),
    ]
    assert order[1][2] == {"epochs": 3}


def test_tasks_refuse_an_unknown_variant() -> None:
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        tasks(["nope@0"], None, None)


def _one_hot(rows: list[int], n: int = 3) -> np.ndarray:
    out = np.full((len(rows), n), 0.1 / (n - 1))
    out[np.arange(len(rows)), rows] = 0.9
    return out


def test_score_ensembles_averages_members_as_the_engine_does() -> None:
    labels = np.array([0, 1, 2, 0])
    # Seed 0 is right on items 0-2, seed 1 on items 1-3, seed 2 on none but item 0.
    # Seed 1 is surer than seeds 0 and 2, so its answer wins every two-way tie.
    surer = np.full((4, 3), 0.01)
    surer[np.arange(4), [2, 1, 2, 0]] = 0.98
    probabilities = {
        "labels": labels,
        "v|0": _one_hot([0, 1, 2, 1]),
        "v|1": surer,
        "v|2": _one_hot([0, 0, 0, 1]),
    }
    out = score_ensembles(probabilities, sizes=(2, 3))["variants"]["v"]
    assert out["seeds"] == [0, 1, 2]
    assert out["single"]["n"] == 3
    # Seeds 0+1 answer [2, 1, 2, 0] (3 of 4 right), and so do seeds 1+2.
    pair = score_ensembles({"labels": labels, "v|0": probabilities["v|0"], "v|1": surer})
    both = pair["variants"]["v"]["k2_consecutive"]
    assert both["n"] == 1
    assert both["macro_f1_mean"] == pytest.approx(
        100 * np.mean([2 / 3, 1.0, 2 / 3]), abs=1e-3
    )  # class 0: P=1 R=1/2; class 1: 1; class 2: P=1/2 R=1
    assert out["k2_consecutive"]["n"] == 2  # (0, 1) and (1, 2)
    assert out["k2_consecutive"]["macro_f1_mean"] == both["macro_f1_mean"]
    assert out["k2_combinations"]["n"] == 3
    assert out["k3_consecutive"]["n"] == 1
    assert "k4_consecutive" not in out


def test_score_ensembles_pairs_across_variants_skip_equal_seeds() -> None:
    labels = np.array([0, 1])
    probabilities = {
        "labels": labels,
        "a|0": _one_hot([0, 1], n=2),
        "a|1": _one_hot([1, 0], n=2),  # all wrong: would pull a pair with b|1 down
        "b|1": np.array([[0.3, 0.7], [0.3, 0.7]]),
    }
    pairs = score_ensembles(probabilities)["pairs_across_variants"]
    # Only a|0 + b|1 counts (a|1 shares b|1's seed): means [0.6, 0.4] and [0.2, 0.8].
    assert pairs["a + b"]["n"] == 1
    assert pairs["a + b"]["macro_f1_mean"] == 100.0
    assert pairs["a + b"]["share_at_least_94.2"] == 1.0
