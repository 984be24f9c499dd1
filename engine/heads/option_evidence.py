"""Option-evidence head: each option reads the state for its own evidence.

For one question with ``n`` options and a batch of ``B`` states:

1. every option's embedding (the backbone's pooled vector of its text, or a learned
   vector for questions the head was trained on) plus a question-type embedding forms a
   query that cross-attends to the state's token states: *option-specific evidence*;
2. the ``n`` evidence vectors attend to each other (one transformer layer), so the score
   of an option sees its competitors;
3. one logit per option = ``scale * cos(state, option) + delta``, where ``delta`` comes
   from the evidence; ``delta`` starts at zero, so an untrained head is the zero-shot
   cosine scorer and training only has to learn a correction.

Any number of options and any question type (``choice``; ``noul`` as a (yes, no) pair;
``score`` as its ordered levels) go through the same module. Its cost is a few small
attention products over ``B * n`` queries, next to nothing beside the backbone forward.

Example:
    >>> import torch
    >>> head = OptionEvidenceHead(HeadConfig(hidden_size=32, dim=16, heads=2))
    >>> tokens, mask = torch.randn(3, 7, 32), torch.ones(3, 7, dtype=torch.bool)
    >>> pooled = torch.nn.functional.normalize(torch.randn(3, 32), dim=-1)
    >>> options = torch.nn.functional.normalize(torch.randn(5, 32), dim=-1)
    >>> head(tokens, mask, pooled, options, "choice").shape
    torch.Size([3, 5])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

TYPES = ("choice", "noul", "score")
"""Question types the head scores; the type picks a learned query embedding."""

HEAD_FILE = "head.safetensors"


def fingerprint(question_type: str, names: Sequence[str], context: str = "") -> str:
    """Identity of a question for the head: its type, its option names and, for the types
    whose option names do not say what is asked, ``context`` (:func:`question_context`).

    A ``choice``'s instructions and descriptions are left out on purpose, so the same
    label set asked with different wording still uses the trained option vectors; its
    options are a set (their order does not matter). Score levels are ordered.
    """
    ordered = sorted(names) if question_type == "choice" else list(names)
    parts: list[Any] = [question_type, ordered]
    if context:
        parts.append(context)
    payload = json.dumps(parts, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def question_context(question: Any) -> str:
    """What tells a ``noul`` or ``score`` question apart beyond its type and option names:
    its instructions and option descriptions (``""`` for a ``choice``).

    Every yes/no question has the options ``true``/``false`` and every 3-level score the
    levels ``"0"``..``"2"``, so without this a model trained on "Is it urgent?" would
    answer "Is it spam?" with its urgency head, and two score questions trained together
    would share one head. A reworded ``noul`` or ``score`` is therefore a new question,
    answered zero-shot.
    """
    if str(getattr(question, "type", "")) not in ("noul", "score"):
        return ""
    described = [spec.description or "" for spec in question.option_specs()]
    return json.dumps([question.instructions_text(), described], ensure_ascii=False)


@dataclass
class HeadConfig:
    """Shape and switches of an :class:`OptionEvidenceHead` (stored in ``config.json``)."""

    hidden_size: int
    """Width of the backbone's token states and pooled vectors."""
    dim: int = 256
    """Width of the head's attention layers."""
    heads: int = 4
    dropout: float = 0.1
    evidence: bool = True
    """``False`` keeps only the learned-scale cosine (the "no head" ablation)."""
    option_bank: bool = True
    """Learn a vector per option of each trained question, starting from its text embedding
    (``False``: the text embeddings are kept as they are)."""
    init_scale: float = 20.0
    """Initial inverse temperature of the cosine term (zero-shot choice uses about 20)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class OptionEvidenceHead(nn.Module):
    """Option queries cross-attend to the state, then to each other; one logit per option."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h, d = config.hidden_size, config.dim
        self.log_scale = nn.Parameter(torch.tensor(float(config.init_scale)).log())
        self.bias = nn.Parameter(torch.zeros(len(TYPES)))
        # Trained questions: fingerprint -> [n, H] option vectors (text embedding + delta).
        self.bank = nn.ParameterDict()
        self.bank_names: dict[str, list[str]] = {}
        self.bank_types: dict[str, str] = {}
        self.bank_contexts: dict[str, str] = {}
        # Trained questions answered by a fitted linear head on the pooled vector instead
        # (``TrainConfig(head="prototype")``): fingerprint -> [n, H] weights and [n] biases.
        self.prototype_weight = nn.ParameterDict()
        self.prototype_bias = nn.ParameterDict()
        if not config.evidence:
            return
        self.token_norm = nn.LayerNorm(h)
        self.key = nn.Linear(h, d)
        self.value = nn.Linear(h, d)
        self.query = nn.Linear(h, d)
        self.type_embedding = nn.Embedding(len(TYPES), d)
        self.similarity = nn.Linear(1, d)
        self.cross = nn.MultiheadAttention(
            d, config.heads, dropout=config.dropout, batch_first=True
        )
        self.mix = nn.TransformerEncoderLayer(
            d,
            config.heads,
            dim_feedforward=2 * d,
            dropout=config.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.out_norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 1)
        # Start as the zero-shot scorer: the evidence correction is zero until trained.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    # -- option bank ---------------------------------------------------------------------

    def add_question(
        self,
        question_type: str,
        names: Sequence[str],
        vectors: torch.Tensor,
        context: str = "",
    ) -> str:
        """Register a trained question's option vectors (initialised from their text);
        ``context``: :func:`question_context` of the question. Returns its fingerprint."""
        fp = fingerprint(question_type, names, context)
        if fp not in self.bank:
            # Without the option bank the vectors stay the text embeddings (frozen).
            self.bank[fp] = nn.Parameter(
                vectors.detach().float().clone(), requires_grad=self.config.option_bank
            )
            self.bank_names[fp] = list(names)
            self.bank_types[fp] = question_type
            if context:
                self.bank_contexts[fp] = context
        return fp

    def knows(self, question_type: str, names: Sequence[str], context: str = "") -> bool:
        return fingerprint(question_type, names, context) in self.bank

    def add_prototypes(
        self,
        question_type: str,
        names: Sequence[str],
        weight: torch.Tensor,
        bias: torch.Tensor,
        context: str = "",
    ) -> None:
        """Answer a registered question with ``pooled @ weight.T + bias`` (a prototype head)."""
        fp = fingerprint(question_type, names, context)
        if fp not in self.bank:
            raise KeyError(f"question {fp} is not registered; call add_question first")
        if weight.shape != (len(names), self.config.hidden_size) or bias.shape != (len(names),):
            raise ValueError(
                f"prototype head of {len(names)} options needs weight "
                f"[{len(names)}, {self.config.hidden_size}] and bias [{len(names)}]; "
                f"got {list(weight.shape)} and {list(bias.shape)}"
            )
        self.prototype_weight[fp] = nn.Parameter(weight.detach().float().clone(), False)
        self.prototype_bias[fp] = nn.Parameter(bias.detach().float().clone(), False)

    def prototype_logits(
        self, question_type: str, names: Sequence[str], pooled: torch.Tensor, context: str = ""
    ) -> torch.Tensor | None:
        """Logits ``[B, n]`` of the question's prototype head, or ``None`` if it has none."""
        fp = fingerprint(question_type, names, context)
        if fp not in self.prototype_weight:
            return None
        weight, bias = self.prototype_weight[fp], self.prototype_bias[fp]
        order = self._order(fp, names)
        if order is not None:
            weight, bias = weight[order], bias[order]
        return pooled.to(weight.dtype) @ weight.T + bias

    def _order(self, fp: str, names: Sequence[str]) -> list[int] | None:
        """Stored rows of a trained question asked in another order (``None``: same order)."""
        stored = self.bank_names[fp]
        if stored == list(names):
            return None
        return [stored.index(name) for name in names]  # same set (the fingerprint says so)

    def option_vectors(
        self,
        question_type: str,
        names: Sequence[str],
        text_vectors: torch.Tensor | None,
        context: str = "",
    ) -> torch.Tensor:
        fp = fingerprint(question_type, names, context)
        if fp in self.bank:
            order = self._order(fp, names)
            return self.bank[fp] if order is None else self.bank[fp][order]
        if text_vectors is None:
            raise KeyError(f"the head was not trained on question {fp} and no vectors were given")
        return text_vectors

    # -- forward -------------------------------------------------------------------------

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        pooled: torch.Tensor,
        options: torch.Tensor,
        question_type: str,
    ) -> torch.Tensor:
        """Logits ``[B, n]``.

        Args:
            tokens: ``[B, L, H]`` token states of the states (padding anywhere).
            mask: ``[B, L]`` true for real tokens.
            pooled: ``[B, H]`` normalised state vectors.
            options: ``[n, H]`` option vectors.
            question_type: ``choice``, ``noul`` or ``score``.
        """
        t = TYPES.index(question_type)
        opts = options.to(pooled.dtype)
        sim = pooled @ torch.nn.functional.normalize(opts, dim=-1).T  # [B, n]
        logits = self.log_scale.exp() * sim + self.bias[t]
        if not self.config.evidence:
            return logits
        _b, _n = sim.shape
        kv = self.token_norm(tokens.to(pooled.dtype))
        keys, values = self.key(kv), self.value(kv)
        type_vec = self.type_embedding.weight[t]
        query = self.query(opts).unsqueeze(0) + type_vec  # [1, n, d]
        query = query + self.similarity(sim.unsqueeze(-1))  # [B, n, d]
        evidence, _ = self.cross(
            query, keys, values, key_padding_mask=~mask.bool(), need_weights=False
        )
        mixed = self.mix(query + evidence)  # options attend to each other
        delta = self.out(self.out_norm(mixed)).squeeze(-1)
        return logits + delta

    # -- persistence ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The JSON part of the head (``config.json["head"]``)."""
        return {
            "kind": "option_evidence",
            "config": self.config.to_dict(),
            "questions": {
                fp: {
                    "type": self.bank_types[fp],
                    "names": self.bank_names[fp],
                    **({"context": self.bank_contexts[fp]} if fp in self.bank_contexts else {}),
                    **({"prototype": True} if fp in self.prototype_weight else {}),
                }
                for fp in self.bank
            },
        }

    def save(self, directory: Path) -> dict[str, Any]:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(directory / HEAD_FILE))
        return self.describe()

    @classmethod
    def load(cls, directory: Path, description: dict[str, Any]) -> OptionEvidenceHead:
        from clef_engine.errors import ModelLoadError

        state = load_weights(directory, HEAD_FILE, "a head")
        path = directory / HEAD_FILE
        try:
            head = cls(HeadConfig.from_dict(description["config"]))
            for fp, info in (description.get("questions") or {}).items():
                vectors = state[f"bank.{fp}"]
                head.bank[fp] = nn.Parameter(vectors)
                head.bank_names[fp] = list(info["names"])
                head.bank_types[fp] = str(info["type"])
                if info.get("context"):
                    head.bank_contexts[fp] = str(info["context"])
                if info.get("prototype"):
                    head.prototype_weight[fp] = nn.Parameter(state[f"prototype_weight.{fp}"], False)
                    head.prototype_bias[fp] = nn.Parameter(state[f"prototype_bias.{fp}"], False)
            head.load_state_dict(state)
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{path}: does not match its config.json head entry ({exc})"
            ) from exc
        head.eval()
        return head


def load_weights(directory: Path, filename: str, what: str) -> dict[str, torch.Tensor]:
    """The tensors of ``directory/filename``, which the model dir's config names as ``what``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from clef_engine.errors import ModelLoadError

    path = directory / filename
    if not path.is_file():
        raise ModelLoadError(f"model dir {str(directory)!r} names {what} but has no {filename}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:  # a damaged or unreadable file
        raise ModelLoadError(f"{path}: cannot read the weights ({exc})") from exc


def pad_tokens(states: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``[T_i, H]`` token states into ``[B, L, H]`` plus a ``[B, L]`` mask."""
    width = max(1, max(int(s.shape[0]) for s in states))
    hidden = int(states[0].shape[-1])
    out = states[0].new_zeros(len(states), width, hidden)
    mask = torch.zeros(len(states), width, dtype=torch.bool, device=states[0].device)
    for i, s in enumerate(states):
        out[i, : s.shape[0]] = s
        mask[i, : s.shape[0]] = True
    return out, mask
