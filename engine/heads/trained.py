"""A fine-tuned model's head inside the engine, with zero-shot fallback.

Questions the head was trained on (same type and option names) are scored by the
:class:`~clef_engine.heads.option_evidence.OptionEvidenceHead` on the adapted backbone's token
states (or, for a question trained with ``head="prototype"``, by the linear prototype
head stored with it, on the adapted pooled vector), then calibrated (temperature,
optional histogram binning) and, where the model dir has an example memory for the
question (:mod:`clef_engine.heads.memory`), mixed with the vote of its nearest training
states. Every other question is answered zero-shot by the *base*
backbone (the adapter is not applied), exactly as an engine without a trained head would
answer it; that base backbone is loaded the first time such a question arrives.

Example:
    >>> from clef_engine import Choice, DecisionEngine, Noul
    >>> engine = DecisionEngine.from_pretrained("./out/tickets")  # clef-agents finetune's output
    >>> engine.head.knows(Choice(instructions="route the ticket",
    ...                          criteria=["billing", "tech", "sales"]))  # as trained
    True
    >>> engine.head.knows(Noul(instructions="Is the customer angry?"))  # answered zero-shot
    False
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from clef_engine.calibration.temperature import Calibrator
from clef_engine.heads.base import RequestScorer, Scored, ScoringContext
from clef_engine.heads.memory import ExampleMemory
from clef_engine.heads.option_evidence import (
    OptionEvidenceHead,
    fingerprint,
    pad_tokens,
    question_context,
)
from clef_engine.heads.zero_shot import ZeroShotHead, prepare
from clef_engine.schema.questions import _Question
from clef_engine.schema.render import question_cache_key

if TYPE_CHECKING:
    from clef_engine.schema.request import DecisionRequest


class TrainedHead:
    """The engine's head when the model dir has ``head.safetensors``.

    Args:
        module: The trained option-evidence head.
        calibrator: Calibration of the head's logits (fitted on held-out data).
        base_engine: Builds the engine (its scoring stage) that answers untrained
            questions zero-shot.
        scope: ``"trained"`` (default): the head answers only questions it was trained on;
            ``"all"``: it answers every question (unknown options use their text embedding).
        digest: Hash of the head weights; with the memory's digest it makes
            :attr:`fingerprint`, part of the engine's model version.
        memory: Example memories of trained questions (``None``: none).
    """

    needs_token_states = True
    fine_tuned: ClassVar[bool] = True
    prompted = False
    """Option texts of questions the head has no vectors for carry the question's
    instructions (:func:`~clef_engine.heads.zero_shot.option_texts`): set for a model dir
    trained on such texts (``config.json["scorer"]["option_texts"] == "prompted"``)."""

    def __init__(
        self,
        module: OptionEvidenceHead,
        calibrator: Calibrator | None = None,
        *,
        base_engine: Callable[[], RequestScorer] | None = None,
        scope: str = "trained",
        digest: str = "",
        memory: ExampleMemory | None = None,
    ) -> None:
        if scope not in ("trained", "all"):
            raise ValueError(f"scope must be 'trained' or 'all'; got {scope!r}")
        self.module = module.eval()
        self.calibrator = calibrator or Calibrator(source="identity")
        self.scope = scope
        self._digest = digest
        self.fingerprint = digest
        """Identity of the weights (head, and memory when set), part of the model version."""
        self.memory = memory
        self._make_base = base_engine
        self._base: RequestScorer | None = None
        self._lock = threading.Lock()
        self.zero_shot = ZeroShotHead()
        self.adapter_source: Path | None = None
        """Where the LoRA adapter was loaded from (copied by :meth:`save`)."""

    @property
    def memory(self) -> ExampleMemory | None:
        """The example memory; set it to ``None`` to score with the head alone (e.g. to
        refit its calibration). Setting it updates :attr:`fingerprint`, so the engine's
        model version follows; after changing a memory in place, set it again."""
        return self._memory

    @memory.setter
    def memory(self, value: ExampleMemory | None) -> None:
        self._memory = value if value else None
        self.fingerprint = self._digest + (f"+memory:{value.digest()}" if value else "")

    def save(self, directory: Path) -> dict[str, Any]:
        """Write ``head.safetensors`` (and copy ``adapter/``); returns ``config.json["head"]``."""
        description = self.module.save(directory)
        if self.memory:
            description["memory"] = self.memory.save(directory)
        if self.scope != "trained":
            description["scope"] = self.scope
        source = self.adapter_source
        target = directory / "adapter"
        if source is not None and source.is_dir() and source.resolve() != target.resolve():
            shutil.copytree(source, target, dirs_exist_ok=True)
        return description

    def knows(self, question: _Question) -> bool:
        """Whether the trained head answers ``question`` (else zero-shot fallback)."""
        qtype = str(getattr(question, "type", ""))
        if qtype not in ("choice", "noul", "score"):
            return False
        if self.scope == "all":
            return True
        names = [s.name for s in question.option_specs()]
        return self.module.knows(qtype, names, question_context(question))

    def logits(self, prepared: Any, similarity: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Zero-shot logits (used only when a caller bypasses :meth:`score_requests`)."""
        return self.zero_shot.logits(prepared, similarity, state)

    def base_engine(self) -> RequestScorer:
        """The zero-shot engine on the base backbone (built on first use)."""
        with self._lock:
            if self._base is None:
                if self._make_base is None:
                    raise RuntimeError("this trained head has no base engine for fallback")
                self._base = self._make_base()
            return self._base

    def to(self, device: str | torch.device) -> None:
        """Move the trained module, and the zero-shot engine once built, to ``device``
        (:meth:`DecisionEngine.to` calls this). The module stays fp32 wherever it is: it
        casts its inputs. A zero-shot engine built later is built on the engine's device
        (``from_pretrained`` passes a factory that reads it)."""
        self.module.to(device)
        with self._lock:
            if self._base is not None:
                self._base.to(device)

    # -- scoring -------------------------------------------------------------------------

    def score_requests(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> list[Scored]:
        """Trained questions through the head on the adapted backbone's token states (one
        pass per distinct question); the rest zero-shot by :meth:`base_engine`."""
        trained = [[q for q, v in r.questions.items() if self.knows(v)] for r in requests]
        probabilities: list[dict[str, torch.Tensor]] = [{} for _ in requests]
        prepared: list[dict[str, Any]] = [{} for _ in requests]
        windows = [1] * len(requests)
        tokens = [0] * len(requests)

        rows = [i for i, qs in enumerate(trained) if qs]
        if rows:
            encoded = context.backbone.encode([texts[i] for i in rows], return_tokens=True)
            assert encoded.token_states is not None
            states, mask = pad_tokens([s.float() for s in encoded.token_states])
            pooled = encoded.pooled.float()
            # One head pass per distinct question, over every request that asks it.
            groups: dict[str, list[tuple[int, int, str]]] = {}
            keys: dict[int, str] = {}  # a batch usually shares its question objects
            for j, i in enumerate(rows):
                windows[i], tokens[i] = encoded.windows[j], encoded.tokens[j]
                for qid in trained[i]:
                    q = requests[i].questions[qid]
                    # By content: the same question asked by several requests is one pass;
                    # questions that differ in anything (wording, option order) are not
                    # merged, so each is answered in its own option order and context.
                    if id(q) not in keys:
                        keys[id(q)] = question_cache_key(q)
                    groups.setdefault(keys[id(q)], []).append((j, i, qid))
            for members in groups.values():
                _, i0, qid0 = members[0]
                question = requests[i0].questions[qid0]
                prep = prepare(question, prompted=self.prompted)
                prep.tokens = sum(context.backbone.count_tokens(prep.texts))
                asked = question_context(question)
                vectors = None
                if not self.module.knows(prep.type, prep.names, asked):
                    vectors = context.embed(prep.texts)
                idx = torch.tensor([j for j, _, _ in members])
                probs = self.probabilities(
                    states[idx], mask[idx], pooled[idx], prep.type, prep.names, vectors, asked
                )
                for k, (_, i, qid) in enumerate(members):
                    probabilities[i][qid] = probs[k]
                    prepared[i][qid] = prep
                    tokens[i] += prep.tokens

        fallback = [i for i, r in enumerate(requests) if len(trained[i]) < len(r.questions)]
        if fallback:
            base = self.base_engine()
            subs = []
            for i in fallback:
                rest = {q: v for q, v in requests[i].questions.items() if q not in trained[i]}
                subs.append(requests[i].model_copy(update={"questions": rest}))
            for i, scored in zip(
                fallback, base.score([texts[i] for i in fallback], subs), strict=True
            ):
                probabilities[i].update(scored.probabilities)
                prepared[i].update(scored.prepared)
                windows[i] = scored.windows
                if trained[i]:  # the state was counted already; add the options only
                    tokens[i] += sum(p.tokens for p in scored.prepared.values())
                else:
                    tokens[i] = scored.tokens
        return [
            Scored(
                {q: probabilities[i][q] for q in r.questions},
                {q: prepared[i][q] for q in r.questions},
                windows[i],
                tokens[i],
            )
            for i, r in enumerate(requests)
        ]

    @torch.inference_mode()
    def probabilities(
        self,
        states: torch.Tensor,
        mask: torch.Tensor,
        pooled: torch.Tensor,
        question_type: str,
        names: list[str],
        vectors: torch.Tensor | None = None,
        context: str = "",
    ) -> torch.Tensor:
        """Calibrated probabilities ``[B, n]`` (float64) for one question; ``context``: its
        :func:`~clef_engine.heads.option_evidence.question_context`."""
        device = next(self.module.parameters()).device
        raw = self.module.prototype_logits(question_type, names, pooled.to(device), context)
        if raw is None:
            options = self.module.option_vectors(question_type, names, vectors, context)
            options = options.to(device)
            raw = self.module(
                states.to(device), mask.to(device), pooled.to(device), options, question_type
            )
        logits = self.calibrator.scale(raw.double(), question_type, len(names))
        probs = self.calibrator.adjust(torch.softmax(logits, dim=-1), question_type, len(names))
        memory = self.memory.get(question_type, names, context) if self.memory else None
        if memory is not None:
            probs = memory.mix(probs, pooled.to(device), names)
        return probs


def weights_digest(path: Any) -> str:
    """Short hash of a weight file, for the model version."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


__all__ = ["TrainedHead", "fingerprint", "weights_digest"]
