"""Temperature scaling per (question type, option-count bucket).

Raw option scores (cosine similarities for the zero-shot head, logits for a trained head)
are divided by a temperature ``T`` chosen by the question's type and how many options it
has. One-sided yes/no questions also get a threshold: ``P(yes) = sigmoid((s - b) / T)``.

Buckets are powers of two: ``b1`` = 2 options, ``b2`` = 3..4, ``b3`` = 5..8, ... ``b8`` =
129..255. A missing key is interpolated (log-linearly) between the fitted buckets of the
same type on either side of it, else takes the nearest fitted bucket, then the type's
default, then :data:`DEFAULT_TEMPERATURE`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clef_engine.calibration.histogram import HistogramBinning

DEFAULT_TEMPERATURE = 1.0
BUNDLED = Path(__file__).resolve().parent.parent / "data" / "zero_shot_calibration.json"
"""Zero-shot temperatures for the embedded model; see ``benchmarks/fit_zero_shot.py``."""
BUNDLED_INT8 = BUNDLED.with_name("zero_shot_calibration_int8.json")
"""The same for the embedded model under dynamic int8 quantization (``--int8``)."""


def bucket(n_options: int) -> int:
    """Option-count bucket: ``ceil(log2(n))``, so 2 -> 1, 3..4 -> 2, 5..8 -> 3, ..."""
    return max(1, math.ceil(math.log2(max(2, n_options))))


def key(question_type: str, n_options: int) -> str:
    return f"{question_type}/b{bucket(n_options)}"


def _between(fitted: dict[int, float], b: int) -> float:
    """The temperature of missing bucket ``b`` from the fitted ones of its type: log-linear
    between the nearest fitted buckets on each side, else the nearest one."""
    lower = [x for x in fitted if x < b]
    upper = [x for x in fitted if x > b]
    if lower and upper:
        lo, hi = max(lower), min(upper)
        t_lo, t_hi = fitted[lo], fitted[hi]
        if t_lo > 0 and t_hi > 0:
            w = (b - lo) / (hi - lo)
            return math.exp((1 - w) * math.log(t_lo) + w * math.log(t_hi))
    return fitted[min(fitted, key=lambda x: (abs(x - b), x))]


@dataclass
class Calibrator:
    """Temperatures (and one-sided yes/no thresholds) by ``type/bucket`` key.

    Example:
        >>> cal = Calibrator({"choice/b7": 0.05})
        >>> cal.temperature("choice", 77)
        0.05
    """

    temperatures: dict[str, float] = field(default_factory=dict)
    biases: dict[str, float] = field(default_factory=dict)
    """Thresholds for one-sided scores, keyed like temperatures (``noul/one_sided``)."""
    source: str = "identity"
    """Where the numbers came from (a data set and command), kept in ``config.json``."""
    histograms: dict[str, Any] = field(default_factory=dict)
    """Optional top-label histogram binning after the temperature, keyed like temperatures
    (:class:`clef_engine.calibration.histogram.HistogramBinning`); applied by :meth:`adjust`."""

    def temperature(self, question_type: str, n_options: int) -> float:
        exact = key(question_type, n_options)
        if exact in self.temperatures:
            return self.temperatures[exact]
        same_type = {
            int(k.split("/b")[1]): v
            for k, v in self.temperatures.items()
            if k.startswith(f"{question_type}/b")
        }
        if same_type:
            return _between(same_type, bucket(n_options))
        if question_type in self.temperatures:
            return self.temperatures[question_type]
        if question_type == "score":
            return self.temperature("choice", n_options) if self._has("choice") else 1.0
        return self.temperatures.get("default", DEFAULT_TEMPERATURE)

    def _has(self, question_type: str) -> bool:
        return any(
            k.startswith(f"{question_type}/") or k == question_type for k in self.temperatures
        )

    def bias(self, name: str, default: float = 0.0) -> float:
        return self.biases.get(name, default)

    def scale(self, logits: torch.Tensor, question_type: str, n_options: int) -> torch.Tensor:
        return logits / self.temperature(question_type, n_options)

    def adjust(self, probs: torch.Tensor, question_type: str, n_options: int) -> torch.Tensor:
        """Histogram binning of softmax output, where fitted for this type/bucket."""
        binning = self.histograms.get(key(question_type, n_options))
        return probs if binning is None else binning.apply(probs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "temperatures": dict(sorted(self.temperatures.items())),
            "biases": dict(sorted(self.biases.items())),
            "source": self.source,
        }
        if self.histograms:
            out["histograms"] = {k: v.to_dict() for k, v in sorted(self.histograms.items())}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibrator:
        return cls(
            {str(k): float(v) for k, v in data.get("temperatures", {}).items()},
            {str(k): float(v) for k, v in data.get("biases", {}).items()},
            str(data.get("source", "unknown")),
            {
                str(k): HistogramBinning.from_dict(v)
                for k, v in (data.get("histograms") or {}).items()
            },
        )

    @classmethod
    def bundled(cls, quantize: str | None = None) -> Calibrator:
        """The zero-shot calibration shipped for the embedded model (fp32 or int8)."""
        if quantize == "int8" and BUNDLED_INT8.is_file():
            return cls.from_dict(json.loads(BUNDLED_INT8.read_text()))
        if BUNDLED.is_file():
            return cls.from_dict(json.loads(BUNDLED.read_text()))
        return cls(source="identity (bundled calibration missing)")


def fit_temperature(
    logits: torch.Tensor | list[torch.Tensor],
    labels: torch.Tensor | list[int],
    *,
    init: float = 1.0,
    smoothing: float = 0.0,
) -> float:
    """Temperature ``T`` minimising the NLL of ``softmax(logits / T)``.

    ``logits`` is ``[N, C]`` or a list of 1-D tensors of varying length (questions with
    different option counts share one temperature). ``smoothing`` moves that much of each
    target's mass evenly over its row's options (label smoothing), so a handful of
    perfectly separated rows does not drive ``T`` to zero (see :func:`succession_smoothing`).
    """
    with torch.inference_mode(False), torch.enable_grad():
        if isinstance(logits, torch.Tensor):
            rows = [r.clone() for r in logits.detach().float()]
        else:
            rows = [t.detach().float().clone() for t in logits]
        y = [int(v) for v in labels]
        if not rows or len(rows) != len(y):
            raise ValueError("fit_temperature needs as many labels as logit rows, at least one")
        width = max(r.numel() for r in rows)
        padded = torch.zeros((len(rows), width))
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            padded[i, : r.numel()] = r
            valid[i, : r.numel()] = True
        target = torch.tensor(y)
        log_t = torch.tensor([math.log(init)], requires_grad=True)
        opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            scaled = (padded / log_t.exp()).masked_fill(~valid, float("-inf"))
            loss = torch.nn.functional.cross_entropy(scaled, target)
            if smoothing:
                logp = torch.log_softmax(scaled, dim=1).masked_fill(~valid, 0.0)
                spread = -(logp.sum(1) / valid.sum(1)).mean()
                loss = (1.0 - smoothing) * loss + smoothing * spread
            loss.backward()
            return loss

        opt.step(closure)
    value = float(log_t.exp().item())
    return min(max(value, 1e-4), 1e4)


def succession_smoothing(n: int, n_classes: int) -> float:
    """Label smoothing that caps a perfectly separated set's target at ``(n + 1) / (n + 2)``
    (Laplace's rule of succession): 12 examples all right out of fold are evidence for about
    93 % accuracy, not 100 %. Vanishes as ``n`` grows (0.0013 for 770 examples, 77 classes).
    On sets that are not separated it pulls slightly further towards ``1 / C`` than the rule
    would (12 examples, 6 right, 3 classes: 0.482 where ``(k + 1) / (n + 2)`` is 0.5).
    """
    if n_classes < 2 or n < 0:
        raise ValueError(f"succession_smoothing needs n >= 0 and 2+ classes; got {n}, {n_classes}")
    return n_classes / ((n + 2) * (n_classes - 1))


def fit_threshold(scores: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """``(T, b)`` minimising the NLL of ``sigmoid((scores - b) / T)`` (one-sided yes/no)."""
    with torch.inference_mode(False), torch.enable_grad():
        s = scores.detach().float().clone()
        y = labels.detach().float().clone()
        log_t = torch.tensor([math.log(max(float(s.std()), 1e-3))], requires_grad=True)
        b = torch.tensor([float(s.mean())], requires_grad=True)
        opt = torch.optim.LBFGS([log_t, b], lr=0.5, max_iter=300, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            z = (s - b) / log_t.exp()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
            loss.backward()
            return loss

        opt.step(closure)
    return float(log_t.exp().item()), float(b.item())
