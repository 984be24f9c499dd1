"""The training stages' learning-rate schedule: transformers' linear warm-up and decay."""

from __future__ import annotations

import pytest
import torch

from clef_engine.train.schedule import linear_schedule


def _rates(warmup: int, total: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = linear_schedule(opt, warmup, total)
    rates = []
    for _ in range(total + 1):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_the_rate_rises_from_zero_over_the_warmup_then_falls_to_zero_at_the_end() -> None:
    rates = _rates(warmup=4, total=20)
    # Warm-up: 0, 1/4, 2/4, 3/4 of the peak; the peak at step 4; then linear to 0 at step 20.
    assert rates[:5] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert rates[4:] == pytest.approx([2.0 * (20 - s) / 16 for s in range(4, 21)])
    assert rates[-1] == 0.0


def test_no_warmup_starts_at_the_peak() -> None:
    assert _rates(warmup=0, total=4) == pytest.approx([2.0, 1.5, 1.0, 0.5, 0.0])


def test_a_schedule_needs_a_step() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="at least one step; got total=0"):
        linear_schedule(opt, 0, 0)
