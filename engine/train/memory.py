"""The trainer's last stage: an example memory per question (:mod:`clef_engine.heads.memory`).

:class:`MemoryStage` is a part of :class:`clef_engine.train.trainer.Trainer`; it encodes the
training states with the adapted model, as the loaded model dir will, and chooses the
memory's settings on the validation split.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import torch

from clef_engine.heads.memory import ExampleMemory, fit_question_memory
from clef_engine.heads.option_evidence import question_context
from clef_engine.train.data import TrainingSet
from clef_engine.train.forward import ModelForward

if TYPE_CHECKING:
    from clef_engine.calibration.temperature import Calibrator


class MemoryStage(ModelForward):
    """Fits :attr:`memory` after the trainer has fitted its calibration."""

    ADD_VALIDATION_TO_MEMORY = True
    """Once the validation split has chosen the memory's settings, its states join the
    memory too (``1 / (1 - val_fraction)`` times the states). On BANKING77 this added 0 to
    0.09 test macro-F1 and lowered test NLL on every seed (``docs/finetune.md``); a probe
    sets it to ``False`` to measure the memory of the training states alone."""

    @torch.no_grad()
    def fit_memory(
        self, train: TrainingSet, val: TrainingSet, calibration: Calibrator
    ) -> dict[str, dict[str, float]]:
        """An example memory per question (:mod:`clef_engine.heads.memory`) into ``self.memory``.

        The memory holds the adapted vectors of the question's states in ``train`` (at most
        ``memory_max_states``); ``k``, ``tau``, the mixture weight and its temperature are
        chosen on ``val`` against the head's probabilities under ``calibration``; the
        ``val`` states then join the memory (:attr:`ADD_VALIDATION_TO_MEMORY`). Questions
        with the same fingerprint (type and option set) share the head's option bank, so
        they share one memory too: their states and held-out states are pooled. Each state
        is encoded once. Returns the fit's report per question id, with the ``seconds`` it
        took.
        """
        cfg = self.config
        self.memory = ExampleMemory()
        reports: dict[str, dict[str, float]] = {}
        rng = random.Random(cfg.seed)
        vectors: dict[str, torch.Tensor] = {}

        def encode(texts: list[str]) -> torch.Tensor:
            missing = [t for t in dict.fromkeys(texts) if t not in vectors]
            if missing:
                vectors.update(zip(missing, self._engine_vectors(missing), strict=True))
            return torch.stack([vectors[t] for t in texts])

        self.held_out = {}
        for qids in self._groups(train.questions):
            started = time.perf_counter()
            qtype = str(train.questions[qids[0]].type)  # type: ignore[attr-defined]
            names = train.names(qids[0])
            context = question_context(train.questions[qids[0]])
            states: list[tuple[str, int]] = []
            for qid in qids:
                _, relabel = _reorder(train.names(qid), names)
                states += [
                    (ex.state, relabel[ex.labels[qid]]) for ex in train.examples if qid in ex.labels
                ]
            held, held_probs, held_y = self._held_out_group(val, qids, calibration)
            if held:
                self.held_out[self.fps[qids[0]]] = (held_probs, held_y)
            if not states or not held:
                continue
            if len(states) > cfg.memory_max_states:
                states = rng.sample(states, cfg.memory_max_states)
            held_vectors = encode(held)
            fitted, report = fit_question_memory(
                encode([state for state, _ in states]),
                torch.tensor([label for _, label in states]),
                names,
                held_vectors,
                held_probs,
                held_y,
            )
            if fitted is not None:  # what the engine answers on the split, before it joins
                self.held_out[self.fps[qids[0]]] = (
                    fitted.mix(held_probs, held_vectors, names),
                    held_y,
                )
            if fitted is not None and self.ADD_VALIDATION_TO_MEMORY:
                # The settings are chosen; the held-out states join the memory they chose.
                fitted = fitted.extended(held_vectors, held_y)
                report["validation_states"] = float(len(held))
            report["seconds"] = round(time.perf_counter() - started, 1)
            reports.update(dict.fromkeys(qids, report))
            if fitted is not None:
                self.memory.add(qtype, fitted, context)
        if not self.memory:
            self.memory = None
        return reports

    def _groups(self, questions: Any) -> list[list[str]]:
        """Trained question ids by fingerprint: questions of one type and option set share
        the head's option bank, and so one memory."""
        groups: dict[str, list[str]] = {}
        for qid in questions:
            groups.setdefault(self.fps[qid], []).append(qid)
        return list(groups.values())

    def _held_out_group(
        self, val: TrainingSet, qids: list[str], calibration: Calibrator
    ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """``(states, probabilities, labels)`` of one fingerprint group on ``val``: the
        head's answers under ``calibration``, in the order of the first question's options."""
        names = val.names(qids[0])
        qtype = str(val.questions[qids[0]].type)  # type: ignore[attr-defined]
        held: list[str] = []
        probs: list[torch.Tensor] = []
        labels: list[torch.Tensor] = []
        for qid in qids:
            order, relabel = _reorder(val.names(qid), names)
            part = val.only(qid)
            if not part.examples:
                continue
            _, logits, y, _ = self.evaluate(part)
            scaled = torch.softmax(calibration.scale(torch.stack(logits), qtype, len(names)), -1)
            probs.append(calibration.adjust(scaled, qtype, len(names))[:, order])
            labels.append(torch.tensor([relabel[t] for t in y]))
            held += [ex.state for ex in part.examples]
        if not held:
            return [], torch.empty(0, len(names), dtype=torch.float64), torch.empty(0)
        return held, torch.cat(probs), torch.cat(labels)

    @torch.no_grad()
    def held_out_probabilities(self, val: TrainingSet, calibration: Calibrator) -> None:
        """:attr:`held_out` without an example memory: the calibrated head on ``val``."""
        self.held_out = {}
        for qids in self._groups(val.questions):
            held, probs, labels = self._held_out_group(val, qids, calibration)
            if held:
                self.held_out[self.fps[qids[0]]] = (probs, labels)


def _reorder(own: list[str], names: list[str]) -> tuple[list[int], list[int]]:
    """A question of a fingerprint group in the order of the group's first question's
    ``names``: ``order`` picks its probability columns, ``relabel`` maps its labels."""
    order = [own.index(name) for name in names]
    return order, [order.index(i) for i in range(len(names))]
