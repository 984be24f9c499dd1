"""The learning-rate schedule of every training stage: transformers' linear warm-up and decay.

One schedule for the option-evidence epochs and the contrastive stage, taken from
transformers (:func:`transformers.get_linear_schedule_with_warmup`) rather than written
again: the rate rises linearly from 0 over ``warmup`` steps to the optimizer's rate, then
falls linearly to 0 at step ``total``.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> LambdaLR:
    """Transformers' linear schedule with warm-up on ``optimizer`` (``total`` steps in all).

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = linear_schedule(opt, warmup=2, total=6)
        >>> rates = []
        >>> for _ in range(6):
        ...     rates.append(round(opt.param_groups[0]["lr"], 3))
        ...     opt.step()
        ...     sched.step()
        >>> rates
        [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    """
    from transformers import get_linear_schedule_with_warmup

    if total < 1:
        raise ValueError(f"a schedule needs at least one step; got total={total}")
    warmup = max(0, min(warmup, total))
    return get_linear_schedule_with_warmup(optimizer, warmup, total)  # type: ignore[no-any-return]
