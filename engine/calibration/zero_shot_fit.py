"""Fit the zero-shot temperatures of an engine on labelled single-label data.

For every option-count bucket the fit draws questions from the data: each item's own
label plus ``n - 1`` random other labels as options, so the temperature matches how
peaked similarities are at that many options. Yes/no questions are drawn from the same
labels: two-sided ("is it A or B?") and one-sided ("is this about A?", half the time A
is the item's label).

The bundled ``engine/data/zero_shot_calibration.json`` was fitted this way on
BANKING77's ``train.csv`` (never on an evaluation set) by ``benchmarks/fit_zero_shot.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from clef_engine.calibration.temperature import Calibrator, fit_temperature, fit_threshold
from clef_engine.heads.zero_shot import NOUL_ONE_SIDED, option_texts
from clef_engine.schema.questions import Choice, Noul

MAX_BUCKET = 8


def _vectors(engine: Any, texts: Sequence[str], batch: int = 256) -> torch.Tensor:
    parts = [
        engine.backbone.encode(list(texts[i : i + batch])).pooled.float().cpu()
        for i in range(0, len(texts), batch)
    ]
    return torch.cat(parts)


def fit_zero_shot(
    engine: Any,
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    samples_per_bucket: int = 3000,
    seed: int = 0,
    source: str = "",
    state_vectors: torch.Tensor | None = None,
) -> Calibrator:
    """Return a :class:`Calibrator` with ``choice/b*``, ``noul/b1`` and one-sided terms.

    Args:
        engine: A :class:`~engine.DecisionEngine` (its backbone and option texts are used).
        texts: States.
        labels: One label per state; at least 3 distinct labels.
        samples_per_bucket: Questions drawn per bucket.
        state_vectors: Precomputed pooled state vectors (skips encoding ``texts``).
    """
    names = sorted(set(labels))
    if len(names) < 3:
        raise ValueError(f"zero-shot fitting needs at least 3 distinct labels; got {len(names)}")
    index = {n: i for i, n in enumerate(names)}
    y = [index[label] for label in labels]
    x = state_vectors if state_vectors is not None else _vectors(engine, texts)
    choice_texts = option_texts(Choice(instructions="x", criteria=dict.fromkeys(names)))
    options = _vectors(engine, choice_texts)
    sims = x @ options.T  # [N, L]
    rng = random.Random(seed)
    temperatures: dict[str, float] = {}
    n_items = len(y)
    for b in range(1, MAX_BUCKET + 1):
        lo, hi = 2 ** (b - 1) + 1 if b > 1 else 2, 2**b
        if lo > len(names):
            break
        rows, targets = [], []
        for _ in range(samples_per_bucket):
            i = rng.randrange(n_items)
            n = rng.randint(lo, min(hi, len(names)))
            others = rng.sample([j for j in range(len(names)) if j != y[i]], n - 1)
            opts = [y[i], *others]
            rng.shuffle(opts)
            rows.append(sims[i, opts])
            targets.append(opts.index(y[i]))
        temperatures[f"choice/b{b}"] = fit_temperature(rows, targets, init=0.05)

    # Two-sided yes/no: the true side is the item's label half the time.
    rows, targets = [], []
    for _ in range(samples_per_bucket):
        i = rng.randrange(n_items)
        other = rng.choice([j for j in range(len(names)) if j != y[i]])
        yes_is_label = rng.random() < 0.5
        pair = [y[i], other] if yes_is_label else [other, y[i]]
        rows.append(sims[i, pair])
        targets.append(0 if yes_is_label else 1)
    temperatures["noul/b1"] = fit_temperature(rows, targets, init=0.05)

    # One-sided yes/no with instructions only, phrased as a question.
    questions = [Noul(instructions=f"Is this about {choice_texts[j]}?") for j in range(len(names))]
    yes_vectors = _vectors(engine, [option_texts(q)[0] for q in questions])
    yes_sims = x @ yes_vectors.T
    scores, answers = [], []
    for _ in range(samples_per_bucket):
        i = rng.randrange(n_items)
        positive = rng.random() < 0.5
        j = y[i] if positive else rng.choice([k for k in range(len(names)) if k != y[i]])
        scores.append(float(yes_sims[i, j]))
        answers.append(1.0 if positive else 0.0)
    t_one, b_one = fit_threshold(torch.tensor(scores), torch.tensor(answers))
    temperatures[NOUL_ONE_SIDED] = t_one
    return Calibrator(
        temperatures={k: round(v, 6) for k, v in temperatures.items()},
        biases={NOUL_ONE_SIDED: round(b_one, 6)},
        source=source or f"fit_zero_shot on {len(y)} labelled states, seed {seed}",
    )
