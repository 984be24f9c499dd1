"""The trainer's model and its forward passes: features, logits per question, evaluation.

:class:`ModelForward` is the base of :class:`clef_engine.train.trainer.Trainer` and of its stage
mixins (:mod:`clef_engine.train.few_shot`, :mod:`clef_engine.train.memory`,
:mod:`clef_engine.train.rl`,
:mod:`clef_engine.train.checkpoint`): it declares the state :meth:`Trainer.build` sets and
computes what every stage reads from the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from clef_engine.calibration.metrics import expected_calibration_error
from clef_engine.heads.option_evidence import OptionEvidenceHead, pad_tokens, question_context
from clef_engine.train.data import TrainingSet

if TYPE_CHECKING:
    from clef_engine.backbones.encoder import EncoderBackbone
    from clef_engine.heads.memory import ExampleMemory
    from clef_engine.train.config import TrainConfig


class ModelForward:
    """The backbone, adapted model and head of a run, and their forward passes."""

    config: TrainConfig
    backbone: EncoderBackbone
    model: Any  # the peft model, or the frozen backbone with lora_rank=0
    head: OptionEvidenceHead
    device: torch.device
    fps: dict[str, str]
    """Fingerprint (type and option set) of each trained question id."""
    memory: ExampleMemory | None
    _cache: dict[str, tuple[torch.Tensor, torch.Tensor]]
    _frozen: bool = False
    """The adapters are fixed for now (the RL stage): :meth:`features` caches, as it does
    for a frozen backbone."""

    def _trainable(self) -> dict[str, torch.nn.Parameter]:
        out = {f"head.{n}": p for n, p in self.head.named_parameters() if p.requires_grad}
        if self.config.lora_rank > 0:
            out.update(
                {f"lora.{n}": p for n, p in self.model.named_parameters() if p.requires_grad}
            )
        return out

    def features(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(token states [B, L, H], mask [B, L], pooled [B, H])`` as the engine computes them.

        With a frozen backbone (``lora_rank=0``), or while the adapters are fixed (the RL
        stage), each text is encoded once (in eval mode) and cached, so later epochs only
        run the head. The cache is in host memory (4 x hidden size bytes per token of each
        state: 1.5 KB a token for MiniLM), so it does not grow on the accelerator.
        """
        if self.config.lora_rank > 0 and not self._frozen:
            return self._forward(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        with torch.no_grad():
            for start in range(0, len(missing), 64):
                chunk = missing[start : start + 64]
                hidden, mask, pooled = self._forward(chunk)
                for i, text in enumerate(chunk):
                    n = int(mask[i].sum())
                    self._cache[text] = (hidden[i, :n].cpu().clone(), pooled[i].cpu().clone())
        tokens, mask = pad_tokens([self._cache[t][0] for t in texts])
        pooled = torch.stack([self._cache[t][1] for t in texts])
        return tokens.to(self.device), mask.to(self.device), pooled.to(self.device)

    @contextmanager
    def fixed_adapters(self) -> Iterator[None]:
        """While the adapters do not train (the RL stage): the model in eval mode, and
        :meth:`features` encodes each state once and caches it, as for a frozen backbone.
        The cache of LoRA features is dropped on the way out."""
        self.model.eval()
        self._frozen = True
        try:
            yield
        finally:
            self._frozen = False
            if self.config.lora_rank > 0:
                self._cache.clear()

    def _forward(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tok = self.backbone.tokenizer
        enc = tok(
            texts,
            padding=True,
            truncation=True,
            max_length=min(
                self.config.max_length or self.backbone.max_length, self.backbone.max_length
            ),
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        m = mask.unsqueeze(-1).float()
        hidden = hidden * m
        pooled = torch.nn.functional.normalize(hidden.sum(1) / m.sum(1).clamp(min=1.0), dim=-1)
        return hidden, mask.bool(), pooled

    def _engine_vectors(self, texts: list[str]) -> torch.Tensor:
        """Adapted pooled vectors of ``texts`` as the loaded model dir computes them: the
        backbone's own windowed encoding (no ``max_length`` truncation) through the adapted
        model (``[N, H]``, CPU)."""
        self.model.eval()
        base, self.backbone.model = self.backbone.model, self.model
        try:
            return self.backbone.encode(texts).pooled.float().cpu()
        finally:
            self.backbone.model = base

    def _question_logits(
        self,
        data: TrainingSet,
        batch: list[int],
        tokens: torch.Tensor,
        mask: torch.Tensor,
        pooled: torch.Tensor,
        head: OptionEvidenceHead | None = None,
    ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """Per question asked in the batch: ``(qid, logits [b, n], targets [b])``."""
        head = head or self.head
        out = []
        for qid, question in data.questions.items():
            rows, target = self._asked(data, batch, qid)
            if not rows:
                continue
            idx = torch.tensor(rows, device=self.device)
            qtype = str(question.type)  # type: ignore[attr-defined]
            context = question_context(question)
            logits = head.prototype_logits(qtype, data.names(qid), pooled[idx], context)
            if logits is None:
                options = head.option_vectors(qtype, data.names(qid), None, context)
                logits = head(tokens[idx], mask[idx], pooled[idx], options, qtype)
            out.append((qid, logits, target))
        return out

    def _asked(
        self, data: TrainingSet, batch: list[int], qid: str
    ) -> tuple[list[int], torch.Tensor]:
        """The rows of ``batch`` whose state is asked ``qid``, and their labels."""
        rows = [r for r, i in enumerate(batch) if qid in data.examples[i].labels]
        labels = [data.examples[batch[r]].labels[qid] for r in rows]
        return rows, torch.tensor(labels, dtype=torch.long, device=self.device)

    def _lengths(self, data: TrainingSet) -> list[int]:
        """Token count of each state, as :meth:`_forward` truncates it."""
        return self._token_counts([ex.state for ex in data.examples])

    def _token_counts(self, texts: list[str]) -> list[int]:
        limit = min(self.config.max_length or self.backbone.max_length, self.backbone.max_length)
        enc = self.backbone.tokenizer(texts, truncation=True, max_length=limit)
        return [len(ids) for ids in enc["input_ids"]]

    @torch.no_grad()
    def evaluate(
        self, data: TrainingSet, head: OptionEvidenceHead | None = None
    ) -> tuple[dict[str, float], list[torch.Tensor], list[int], list[str]]:
        """Raw-logit metrics on ``data`` plus the logits, labels and types themselves."""
        self.model.eval()
        head = head or self.head
        head.eval()
        logits_out: list[torch.Tensor] = []
        labels: list[int] = []
        types: list[str] = []
        order = list(range(len(data)))
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            tokens, mask, pooled = self.features([data.examples[i].state for i in batch])
            for qid, logits, target in self._question_logits(
                data, batch, tokens, mask, pooled, head
            ):
                qtype = str(data.questions[qid].type)  # type: ignore[attr-defined]
                logits_out.extend(logits.detach().double().cpu())
                labels.extend(int(t) for t in target)
                types.extend([qtype] * len(target))
        nll = sum(
            float(-torch.log_softmax(row, -1)[y]) for row, y in zip(logits_out, labels, strict=True)
        ) / max(1, len(labels))
        acc = sum(int(row.argmax()) == y for row, y in zip(logits_out, labels, strict=True)) / max(
            1, len(labels)
        )
        ece = _ece_after(None, logits_out, labels, types)
        return {"accuracy": acc, "nll": nll, "ece": ece}, logits_out, labels, types


def _ece_after(
    calibration: Any, logits: list[torch.Tensor], labels: list[int], types: list[str]
) -> float:
    """Mean ECE over question groups with the same option count (after ``calibration``)."""
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(logits):
        groups.setdefault(int(row.numel()), []).append(i)
    total, weighted = 0, 0.0
    for n, idx in groups.items():
        rows = torch.stack([logits[i] for i in idx]).double()
        if calibration is not None:
            t = types[idx[0]]
            probs = calibration.adjust(torch.softmax(calibration.scale(rows, t, n), -1), t, n)
        else:
            probs = torch.softmax(rows, -1)
        weighted += len(idx) * expected_calibration_error(probs.numpy(), [labels[i] for i in idx])
        total += len(idx)
    return weighted / max(1, total)
