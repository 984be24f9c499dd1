"""Example memory: a trained question's answers mixed with a vote of its nearest examples.

For a question the trainer saw, the memory keeps the adapted backbone's pooled vectors of
its labelled training states and their labels. At inference, the ``k`` memory states
nearest to a state (cosine) vote for their labels with weights ``exp(cos / tau)``, and the
vote is mixed with the head's calibrated probabilities (kNN-LM, Khandelwal et al. 2020)::

    p = softmax(log((1 - lam) * p_head + lam * p_vote) / T)

``k``, ``tau``, ``lam`` and the temperature ``T`` of the mixture are fitted on held-out
labelled states by NLL (:func:`fit_question_memory`; the trainer uses its validation
split, ``clef-agents calibrate`` the data it is given). When no mixture beats the head
alone on those states, no memory is kept for the question. A head fitted on a k-fold
split of its own examples (the prototype head of the few-shot recipe, which keeps no
validation split) has held-out answers for every example already: the memory is then
cross-fitted on them (:func:`fit_question_memory_cross`), each example voted on by the
examples of the other folds. The cost at inference is one
``[B, M]`` product with the ``M`` stored vectors and a top-``k``, next to nothing beside
the backbone forward for the ~9,000 states of BANKING77.

The memory lives in the model dir as ``memory.safetensors`` (``vectors.<fp>``,
``labels.<fp>``) plus ``config.json["head"]["memory"]`` (settings and option names per
question fingerprint).

Example:
    >>> import torch
    >>> vectors = torch.nn.functional.normalize(torch.eye(3, 4), dim=-1)
    >>> memory = QuestionMemory(vectors, torch.tensor([0, 1, 1]), ["a", "b"],
    ...                         MemorySettings(k=1, tau=0.1, lam=0.5))
    >>> head = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    >>> memory.mix(head, vectors[:1], ["a", "b"]).argmax(-1).item()   # the neighbour says "a"
    0
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from clef_engine.calibration.temperature import fit_temperature
from clef_engine.heads.option_evidence import fingerprint, load_weights

MEMORY_FILE = "memory.safetensors"
GRID_K = (5, 10, 20, 50)
GRID_TAU = (0.02, 0.05, 0.1)
GRID_LAMBDA = (0.1, 0.2, 0.3, 0.5, 0.7)
"""The settings tried on held-out states (the grid of the BANKING77 probe that found the
gain, ``benchmarks/finetune_probes.py knn``)."""
MIN_HELD_OUT = 50
"""Fewer held-out states than this: no memory (60 settings and a temperature chosen on a
handful of states overfit them; on 10 a tiny test model's mixture temperature went to
0.09)."""
FLOOR = 1e-12
"""Probabilities are clipped here before the log of the mixture."""
TEMPERATURE_RANGE = (0.25, 4.0)
"""The mixture temperature is kept in this range. The head is calibrated already, so a fit
far from 1 means the held-out states are not held out (copies of memory states vote for
themselves, and the fit sharpens the mixture); on BANKING77 it stayed within 0.98-1.03."""
CHUNK = 1024
"""Held-out states per similarity product while fitting (``[CHUNK, M]`` at a time)."""


@dataclass
class MemorySettings:
    """How a question's memory votes and mixes (stored in ``config.json``)."""

    k: int
    """Nearest memory states that vote."""
    tau: float
    """Temperature of the vote weights ``exp(cos / tau)``."""
    lam: float
    """Weight of the vote in the mixture, in (0, 1]."""
    temperature: float = 1.0
    """Temperature of the mixture's log-probabilities."""

    def check(self) -> None:
        if self.k < 1:
            raise ValueError(f"memory k must be at least 1; got {self.k}")
        for name in ("tau", "temperature"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"memory {name} must be a positive number; got {value}")
        if not 0.0 < self.lam <= 1.0:
            raise ValueError(f"memory lam must be in (0, 1]; got {self.lam}")


class QuestionMemory:
    """The labelled vectors of one trained question and how they vote.

    Args:
        vectors: ``[M, H]`` normalised pooled vectors of the memory states.
        labels: ``[M]`` option index of each, in the order of ``names``.
        names: The question's option names, in the order the labels index.
        settings: ``k``, ``tau``, ``lam`` and the mixture temperature.
    """

    def __init__(
        self,
        vectors: torch.Tensor,
        labels: torch.Tensor,
        names: Sequence[str],
        settings: MemorySettings,
    ) -> None:
        if vectors.ndim != 2 or labels.shape != (vectors.shape[0],) or not len(labels):
            raise ValueError(
                f"memory needs vectors [M, H] and labels [M] with M >= 1; got "
                f"{list(vectors.shape)} and {list(labels.shape)}"
            )
        if int(labels.min()) < 0 or int(labels.max()) >= len(names):
            raise ValueError(f"memory labels must index the {len(names)} options")
        settings.check()
        self.vectors = vectors.detach().float().cpu()
        self.labels = labels.detach().long().cpu()
        self.names = list(names)
        self.settings = settings
        # (device, vectors, labels) where the engine runs; one attribute, so a concurrent
        # caller never sees vectors and labels on different devices.
        self._placed = (self.vectors.device, self.vectors, self.labels)

    def __len__(self) -> int:
        return int(self.labels.numel())

    def extended(self, vectors: torch.Tensor, labels: torch.Tensor) -> QuestionMemory:
        """A memory with the same options and settings that also holds ``vectors``
        (``[N, H]``) labelled ``labels`` (``[N]``, in the order of :attr:`names`)."""
        return QuestionMemory(
            torch.cat([self.vectors, vectors.detach().float().cpu()]),
            torch.cat([self.labels, labels.detach().long().cpu()]),
            self.names,
            self.settings,
        )

    def vote(self, pooled: torch.Tensor) -> torch.Tensor:
        """Vote probabilities ``[B, n]`` (float64) of ``pooled`` ``[B, H]``, stored order."""
        device, vectors, labels = self._placed
        if device != pooled.device:  # copied there once, then kept
            device, vectors, labels = (
                pooled.device,
                vectors.to(pooled.device),
                labels.to(pooled.device),
            )
            self._placed = (device, vectors, labels)
        top = (pooled.float() @ vectors.T).topk(min(self.settings.k, len(self)), dim=-1)
        return _vote((top.values, top.indices), labels, len(self.names), self.settings.tau)

    def mix(
        self, probabilities: torch.Tensor, pooled: torch.Tensor, names: Sequence[str]
    ) -> torch.Tensor:
        """The head's ``probabilities`` ``[B, n]`` (options in the order of ``names``) mixed
        with the vote and scaled by the mixture temperature."""
        vote = self.vote(pooled)
        if list(names) != self.names:  # the same set asked in another order
            vote = vote[:, [self.names.index(name) for name in names]]
        return _mixture(probabilities, vote.to(probabilities.device), self.settings)


def _vote(
    top: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor, n: int, tau: float
) -> torch.Tensor:
    near, index = top
    weights = ((near - near.max(dim=-1, keepdim=True).values) / tau).double().exp()
    out = torch.zeros(near.shape[0], n, dtype=torch.float64, device=near.device)
    out.scatter_add_(1, labels[index], weights)
    return out / out.sum(dim=-1, keepdim=True)


def _mixture(head: torch.Tensor, vote: torch.Tensor, settings: MemorySettings) -> torch.Tensor:
    mixed = (1.0 - settings.lam) * head.double() + settings.lam * vote
    return torch.softmax(mixed.clamp(min=FLOOR).log() / settings.temperature, dim=-1)


def _nll(probabilities: torch.Tensor, labels: torch.Tensor) -> float:
    picked = probabilities.gather(1, labels.unsqueeze(1)).squeeze(1)
    return float(-picked.clamp(min=FLOOR).log().mean())


def _nearest(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    k: int,
    *,
    query_folds: torch.Tensor | None = None,
    vector_folds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and indices ``[N, min(k, M)]`` of each query's nearest vectors, nearest
    first, computed :data:`CHUNK` queries at a time.

    With ``query_folds`` and ``vector_folds`` (``[N]``, ``[M]`` fold ids), a query's
    neighbours come from the other folds only: the cosine of a vector in its own fold is
    ``-inf``, which :func:`_vote` weighs 0.
    """
    memory = vectors.detach().float().cpu()
    k = min(k, memory.shape[0])
    near, index = [], []
    for start in range(0, queries.shape[0], CHUNK):
        chunk = queries[start : start + CHUNK].detach().float().cpu()
        sim = chunk @ memory.T
        if query_folds is not None and vector_folds is not None:
            same = query_folds[start : start + CHUNK, None].cpu() == vector_folds[None, :].cpu()
            sim = sim.masked_fill(same, float("-inf"))
        top = sim.topk(k, dim=-1)
        near.append(top.values)
        index.append(top.indices)
    return torch.cat(near), torch.cat(index)


def fit_question_memory(
    vectors: torch.Tensor,
    labels: torch.Tensor,
    names: Sequence[str],
    held_vectors: torch.Tensor,
    held_probabilities: torch.Tensor,
    held_labels: torch.Tensor,
    *,
    grid_k: Sequence[int] = GRID_K,
    grid_tau: Sequence[float] = GRID_TAU,
    grid_lambda: Sequence[float] = GRID_LAMBDA,
) -> tuple[QuestionMemory | None, dict[str, float]]:
    """Choose ``k``, ``tau``, ``lam`` and the mixture temperature on held-out states.

    Args:
        vectors, labels: The memory states (``[M, H]``, ``[M]``), e.g. the training split.
        names: The question's option names (the order the labels index).
        held_vectors: ``[N, H]`` pooled vectors of held-out states (not in the memory).
        held_probabilities: ``[N, n]`` the head's calibrated probabilities for them.
        held_labels: ``[N]`` their labels.
        grid_k, grid_tau, grid_lambda: The settings tried (every combination).

    Returns:
        The memory, or ``None`` when there are fewer than :data:`MIN_HELD_OUT` held-out
        states or no mixture of the grid lowers their NLL under the head alone, and a
        report: ``states`` (memory), ``held_out``, ``nll_head`` and, with a memory, the chosen
        ``k``, ``tau``, ``lam``, ``temperature`` and ``nll_memory`` (all on the held-out
        states, which chose them, so ``nll_memory`` is optimistic).
    """
    if len(held_labels) == 0 or len(labels) == 0:
        raise ValueError("fitting a memory needs memory states and held-out states")
    if len(held_labels) < MIN_HELD_OUT:
        return None, _report(len(labels), held_probabilities, held_labels)[0]
    near = _nearest(held_vectors, vectors, max(grid_k))
    return _choose(
        vectors,
        labels,
        names,
        near,
        held_probabilities,
        held_labels,
        grid_k,
        grid_tau,
        grid_lambda,
    )


def fit_question_memory_cross(
    vectors: torch.Tensor,
    labels: torch.Tensor,
    names: Sequence[str],
    folds: torch.Tensor,
    probabilities: torch.Tensor,
    *,
    grid_k: Sequence[int] = GRID_K,
    grid_tau: Sequence[float] = GRID_TAU,
    grid_lambda: Sequence[float] = GRID_LAMBDA,
) -> tuple[QuestionMemory | None, dict[str, float]]:
    """:func:`fit_question_memory` without held-out states: cross-fitted on the memory.

    For a head fitted on a k-fold split of its own examples (the prototype head's
    temperature fit, :class:`clef_engine.heads.prototype.PrototypeClassifier`), every memory
    state is held out once: its neighbours are the states of the *other* folds, and its
    head probabilities those of the head fitted without its fold. The settings are chosen
    on those pairs; the memory then holds every state. This is what a run without a
    validation split (the few-shot recipe) fits its memory on.

    Args:
        vectors, labels, names: The memory states, their labels and the option names.
        folds: ``[M]`` the fold of each state.
        probabilities: ``[M, n]`` each state's out-of-fold head probabilities, under the
            calibration the memory will serve with.
        grid_k, grid_tau, grid_lambda: The settings tried.

    Returns:
        As :func:`fit_question_memory` (also ``None`` when every state is in one fold);
        ``held_out`` counts the memory states, and the report adds ``cross_fitted: 1``.
    """
    if len(labels) == 0:
        raise ValueError("fitting a memory needs memory states")
    if folds.shape != labels.shape or probabilities.shape[0] != len(labels):
        raise ValueError(
            f"folds {list(folds.shape)} and probabilities {list(probabilities.shape)} must "
            f"have one row per memory state ({len(labels)})"
        )
    if len(labels) < MIN_HELD_OUT or int(folds.unique().numel()) < 2:
        # Too few states to choose on, or no other fold to vote.
        memory, report = None, _report(len(labels), probabilities, labels)[0]
    else:
        near = _nearest(vectors, vectors, max(grid_k), query_folds=folds, vector_folds=folds)
        memory, report = _choose(
            vectors, labels, names, near, probabilities, labels, grid_k, grid_tau, grid_lambda
        )
    return memory, {**report, "cross_fitted": 1.0}


def _report(
    states: int, held_probabilities: torch.Tensor, held_labels: torch.Tensor
) -> tuple[dict[str, float], float]:
    """The fit's report before any setting is chosen, and the head's held-out NLL."""
    nll = _nll(held_probabilities.detach().double().cpu(), held_labels.detach().long().cpu())
    report = {
        "states": float(states),
        "held_out": float(len(held_labels)),
        "nll_head": round(nll, 4),
    }
    return report, nll


def _choose(
    vectors: torch.Tensor,
    labels: torch.Tensor,
    names: Sequence[str],
    near: tuple[torch.Tensor, torch.Tensor],
    held_probabilities: torch.Tensor,
    held_labels: torch.Tensor,
    grid_k: Sequence[int],
    grid_tau: Sequence[float],
    grid_lambda: Sequence[float],
) -> tuple[QuestionMemory | None, dict[str, float]]:
    """The grid search of :func:`fit_question_memory` over each held-out state's
    neighbours ``near`` (cosines and memory indices, nearest first)."""
    held_p = held_probabilities.detach().double().cpu()
    held_y = held_labels.detach().long().cpu()
    memory_y = labels.detach().long().cpu()
    report, head_nll = _report(len(memory_y), held_p, held_y)
    n = len(names)
    cosines, index = near
    best: tuple[float, MemorySettings] | None = None
    for k in sorted({min(k, len(memory_y)) for k in grid_k}):  # a small memory: k <= M
        top = (cosines[:, :k], index[:, :k])
        for tau in grid_tau:
            vote = _vote(top, memory_y, n, tau)
            for lam in grid_lambda:
                settings = MemorySettings(k=k, tau=tau, lam=lam)
                nll = _nll(_mixture(held_p, vote, settings), held_y)
                if best is None or nll < best[0]:
                    best = (nll, settings)
    assert best is not None
    settings = best[1]
    vote = _vote((cosines[:, : settings.k], index[:, : settings.k]), memory_y, n, settings.tau)
    mixed = (1.0 - settings.lam) * held_p + settings.lam * vote
    low, high = TEMPERATURE_RANGE
    settings.temperature = min(
        max(fit_temperature(mixed.clamp(min=FLOOR).log(), held_y), low), high
    )
    nll = _nll(_mixture(held_p, vote, settings), held_y)
    if not nll < head_nll:
        return None, report
    report.update({k: float(v) for k, v in asdict(settings).items()}, nll_memory=round(nll, 4))
    return QuestionMemory(vectors.detach().float().cpu(), memory_y, names, settings), report


def refit_question_memory(
    memory: QuestionMemory,
    held_vectors: torch.Tensor,
    held_probabilities: torch.Tensor,
    held_labels: torch.Tensor,
    names: Sequence[str],
    *,
    before: torch.Tensor | None = None,
) -> tuple[QuestionMemory | None, dict[str, float]]:
    """:func:`fit_question_memory` again on other held-out states, keeping the stored
    vectors.

    ``held_probabilities`` (the head's, under the calibration the memory will serve
    with), ``before`` (the same under the calibration it was fitted with) and
    ``held_labels`` follow the option order ``names``: the set of ``memory.names``, in
    any order. With fewer than :data:`MIN_HELD_OUT` held-out states the memory is kept as
    it is (the report says ``unchanged``), since so few states cannot show that it stopped
    helping. With ``before``, the report adds ``nll_before``: the held-out NLL of the
    answers the model gave before the refit (its old calibration and memory).
    """
    if sorted(names) != sorted(memory.names):
        raise ValueError(f"options {list(names)} are not those of the memory, {memory.names}")
    order = [list(names).index(name) for name in memory.names]
    relabel = torch.tensor([memory.names.index(name) for name in names])
    labels = relabel[held_labels.long().cpu()]
    nll_before: dict[str, float] = {}
    if before is not None:
        old = _mixture(
            before[:, order].double(), memory.vote(held_vectors.float()), memory.settings
        )
        nll_before["nll_before"] = round(_nll(old, labels), 4)
    if len(labels) < MIN_HELD_OUT:
        report = {"states": float(len(memory)), "held_out": float(len(labels)), "unchanged": 1.0}
        return memory, {**report, **nll_before}
    fitted, report = fit_question_memory(
        memory.vectors,
        memory.labels,
        memory.names,
        held_vectors,
        held_probabilities[:, order],
        labels,
    )
    return fitted, {**report, **nll_before}


def refit_memory(
    memory: ExampleMemory,
    rows: Sequence[tuple[str, str, Sequence[str], str, Sequence[float], Sequence[float], int]],
    encode: Callable[[list[str]], torch.Tensor],
) -> dict[str, dict[str, float]]:
    """Choose the settings of every question memory again on held-out rows, in place.

    ``rows`` are ``(question type, question context, option names, state, probabilities
    now, probabilities before, label)``, the context being
    :func:`~clef_engine.heads.option_evidence.question_context` and the probabilities the
    head's under the new and the old calibration; rows of questions with the same
    fingerprint are pooled, as their memory is one. ``encode`` turns states into pooled
    vectors. A memory that no longer lowers the held-out NLL is removed (see
    :func:`refit_question_memory` for small held-out sets). Returns the report per
    fingerprint.
    """
    groups: dict[str, list[int]] = {}
    for i, (qtype, context, names, *_rest) in enumerate(rows):
        if memory.get(qtype, names, context) is not None:
            groups.setdefault(fingerprint(qtype, names, context), []).append(i)
    reports: dict[str, dict[str, float]] = {}
    for fp, idx in groups.items():
        stored = memory.questions[fp]
        names = list(rows[idx[0]][2])
        now: list[list[float]] = []
        before: list[list[float]] = []
        labels: list[int] = []
        for i in idx:
            _, _, asked, _, p_now, p_before, label = rows[i]
            order = [list(asked).index(name) for name in names]  # the first row's order
            now.append([p_now[j] for j in order])
            before.append([p_before[j] for j in order])
            labels.append(order.index(label))
        vectors = encode([rows[i][3] for i in idx])
        fitted, reports[fp] = refit_question_memory(
            stored,
            vectors,
            torch.tensor(now, dtype=torch.float64),
            torch.tensor(labels),
            names,
            before=torch.tensor(before, dtype=torch.float64),
        )
        if fitted is None:
            del memory.questions[fp]
        else:
            memory.questions[fp] = fitted
    return reports


class ExampleMemory:
    """The memories of a model's trained questions, keyed by question fingerprint."""

    def __init__(self, questions: dict[str, QuestionMemory] | None = None) -> None:
        self.questions: dict[str, QuestionMemory] = dict(questions or {})

    def __len__(self) -> int:
        return len(self.questions)

    def add(self, question_type: str, memory: QuestionMemory, context: str = "") -> None:
        """Keep ``memory`` for the question of this type, its option names and ``context``
        (:func:`~clef_engine.heads.option_evidence.question_context`)."""
        self.questions[fingerprint(question_type, memory.names, context)] = memory

    def get(
        self, question_type: str, names: Sequence[str], context: str = ""
    ) -> QuestionMemory | None:
        return self.questions.get(fingerprint(question_type, names, context))

    def digest(self) -> str:
        """Short hash of every question's settings, vectors and labels (model version)."""
        h = hashlib.sha256()
        for fp in sorted(self.questions):
            memory = self.questions[fp]
            description = {"fp": fp, "names": memory.names, **asdict(memory.settings)}
            h.update(json.dumps(description, sort_keys=True).encode())
            h.update(memory.vectors.numpy().tobytes())
            h.update(memory.labels.numpy().tobytes())
        return h.hexdigest()[:12]

    def save(self, directory: Path) -> dict[str, Any]:
        """Write ``memory.safetensors``; returns ``config.json["head"]["memory"]``."""
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        for fp, memory in self.questions.items():
            tensors[f"vectors.{fp}"] = memory.vectors.contiguous().cpu()
            tensors[f"labels.{fp}"] = memory.labels.contiguous().cpu()
        save_file(tensors, str(directory / MEMORY_FILE))
        out: dict[str, Any] = {}
        for fp, memory in self.questions.items():
            settings = asdict(memory.settings)
            if settings["temperature"] == 1.0:  # the default is left out
                del settings["temperature"]
            out[fp] = {"names": memory.names, **settings}
        return out

    @classmethod
    def load(
        cls, directory: Path, description: dict[str, Any], *, hidden_size: int | None = None
    ) -> ExampleMemory:
        """Read ``memory.safetensors`` as ``description`` (``config.json["head"]["memory"]``)
        describes it; ``hidden_size``: the width the backbone's pooled vectors have."""
        from clef_engine.errors import ModelLoadError

        where = f"{directory / MEMORY_FILE}: does not match its config.json memory entry"
        if not isinstance(description, dict) or not all(
            isinstance(v, dict) for v in description.values()
        ):
            raise ModelLoadError(f"{where} (expected {{fingerprint: {{names, k, tau, lam}}}})")
        tensors = load_weights(directory, MEMORY_FILE, "an example memory")
        try:
            questions = {}
            for fp, info in description.items():
                settings = MemorySettings(
                    k=int(info["k"]),
                    tau=float(info["tau"]),
                    lam=float(info["lam"]),
                    temperature=float(info.get("temperature", 1.0)),
                )
                questions[fp] = QuestionMemory(
                    tensors[f"vectors.{fp}"], tensors[f"labels.{fp}"], info["names"], settings
                )
                width = questions[fp].vectors.shape[1]
                if hidden_size is not None and width != hidden_size:
                    raise ValueError(
                        f"question {fp} has vectors of width {width}; the backbone's are "
                        f"{hidden_size}"
                    )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{where} ({exc})") from exc
        return cls(questions)
