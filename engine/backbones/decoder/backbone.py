"""The ``decoder`` backbone: any local Hugging Face causal LM as a decision model.

The engine's scoring seam (:meth:`DecoderBackbone.score_requests`) turns each request into
one state prefix plus a question block and option answers per question (see
:mod:`clef_engine.backbones.decoder.prompt`), scores every answer with one prefill and one
tree-masked forward (:mod:`clef_engine.backbones.decoder.tree`), and calibrates:

``score_i = mean log p(answer_i | prompt) - prior_weight * mean log p(answer_i | "N/A" state)``

averaged over listing rotations, then ``softmax(score / T)`` with the engine's calibrator
temperature for the question's (type, option-count bucket). The content-free term (the
label prior of Zhao et al., 2021, "Calibrate before use") is computed once per distinct
question and cached.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_engine.backbones.base import Encoded
from clef_engine.backbones.decoder.memory import check_fits, estimate
from clef_engine.backbones.decoder.prompt import (
    BETWEEN,
    CONTENT_FREE_STATE,
    QuestionPlan,
    build_frame,
    plan,
)
from clef_engine.backbones.decoder.tree import Group, Row, TreeScorer
from clef_engine.backbones.encoder import _quiet_transformers
from clef_engine.backbones.hf_dir import NO_REMOTE_CODE, check_hf_dir
from clef_engine.calibration.temperature import Calibrator
from clef_engine.devices import select_device, select_dtype
from clef_engine.errors import (
    InvalidRequestError,
    ModelLoadError,
    UnsupportedQuestionError,
    peft_quietly,
    require,
)
from clef_engine.heads.base import PreparedQuestion, Scored, ScoringContext
from clef_engine.heads.zero_shot import prepare
from clef_engine.schema.render import question_cache_key

if TYPE_CHECKING:
    from clef_engine.schema.questions import _Question
    from clef_engine.schema.request import DecisionRequest

MAX_LORA_RANK = 256
TRUNCATION_MARK = "\n[...]\n"
"""Put where the middle of a state too long for the context window was cut out."""
HEAD_SHARE = 0.25
"""Share of a truncated state's budget kept from its start (the rest from its end)."""
_STRATEGIES = ("shared", "naive")
_Plan = tuple[QuestionPlan, list[list[int]], list[list[int]]]
"""A question's plan with its block and answer token ids."""
CACHE_SIZE = 4096
"""Distinct questions whose plans, token ids and priors are kept."""


def _put(cache: dict[str, Any], key: str, value: Any) -> None:
    """Insert into a bounded cache, dropping the oldest entries (insertion order)."""
    cache[key] = value
    while len(cache) > CACHE_SIZE:
        del cache[next(iter(cache))]


def _is_causal_lm(hf_config: dict[str, Any]) -> bool:
    names = [str(a) for a in hf_config.get("architectures") or []]
    return any(n.endswith("ForCausalLM") or n.endswith("LMHeadModel") for n in names) and not (
        hf_config.get("is_encoder_decoder")
    )


def _read_hf_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise ModelLoadError(
            f"decoder: {str(directory)!r} is not a directory; pass a local Hugging Face "
            "causal-LM directory (nothing is downloaded)"
        )
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"decoder: {str(directory)!r} has no config.json")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"decoder: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"decoder: {path} is not a JSON object")
    check_hf_dir(directory)
    return data


def _causal_lm_config(directory: Path) -> dict[str, Any]:
    """``directory``'s Hugging Face config, refused unless it is a causal LM."""
    hf_config = _read_hf_config(directory)
    if not _is_causal_lm(hf_config):
        archs = hf_config.get("architectures") or [hf_config.get("model_type", "unknown")]
        raise ModelLoadError(
            f"decoder: {str(directory)!r} is not a causal LM (architectures: "
            f"{', '.join(map(str, archs))}); the decoder backbone needs a *ForCausalLM "
            "checkpoint such as Qwen3 or Llama; use backbone='encoder' for encoders"
        )
    return hf_config


def _check_modes(*, prior: str | None, strategy: str, quantize: str | None) -> None:
    """Refuse an unknown ``prior``, ``strategy`` or ``quantize`` before anything loads."""
    if prior not in (None, "content_free"):
        raise ValueError(f"prior: use 'content_free' or None; got {prior!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy: use one of {_STRATEGIES}; got {strategy!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize: unknown mode {quantize!r}; use None or 'int8'")


class DecoderBackbone:
    """A local causal LM (Qwen3, Llama, Mistral, Gemma, ...) that scores option answers.

    Args:
        path: A local Hugging Face causal-LM directory (``config.json``, tokenizer,
            ``*.safetensors``). Never downloaded.
        device: ``"auto"`` (cuda, then mps, then cpu) or an explicit device.
        dtype: ``"auto"`` (bf16 on CUDA, fp32 elsewhere) or a dtype.
        quantize: ``"int8"``: dynamic int8 linear layers (CPU only).
        max_length: Context window used for prompts (default: the model's).
        rotations: Listing rotations averaged per ``choice`` question: an int, or
            ``"auto"`` (every rotation up to 4 options, else 1).
        prior: ``"content_free"`` subtracts each option's score under an ``N/A`` state;
            ``None`` turns it off.
        prior_weight: How much of the content-free score to subtract.
        max_batch_tokens: Bound on ``rows x longest row`` tokens per forward pass.
        strategy: ``"shared"`` (prefill once, tree-masked options) or ``"naive"`` (one
            full forward per option; the reference, for tests and benchmarks).
        use_chat_template: Wrap the prompt in the tokenizer's chat template if it has one.
        adapter: A peft LoRA adapter directory to load on top of the model.
        compile: ``torch.compile`` the decoder (pays off on a GPU for repeated shapes).
        check_memory: Refuse to load (``ModelTooLargeError``) when the estimate exceeds
            the device's free memory.

    Example:
        Skipped by the doctest runner: it needs a local copy of a multi-gigabyte model.

        >>> from clef_engine import DecisionEngine, Choice
        >>> engine = DecisionEngine(backbone="decoder", path="/models/Qwen3-1.7B")  # doctest: +SKIP
        >>> engine.decide("The package arrived broken", {"route": Choice(  # doctest: +SKIP
        ...     instructions="Which team handles this?", criteria=["billing", "shipping"])})
    """

    kind = "decoder"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
        max_length: int | None = None,
        rotations: int | str = "auto",
        prior: str | None = "content_free",
        prior_weight: float = 1.0,
        max_batch_tokens: int = 16384,
        strategy: str = "shared",
        use_chat_template: bool = True,
        adapter: str | os.PathLike[str] | None = None,
        compile: bool = False,
        check_memory: bool = True,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if path is None:
            raise ModelLoadError(
                "decoder: a local causal-LM directory is required, e.g. "
                "DecisionEngine(backbone='decoder', path='/models/Qwen3-1.7B')"
            )
        _check_modes(prior=prior, strategy=strategy, quantize=quantize)
        self.directory = Path(path).expanduser()
        hf_config = _causal_lm_config(self.directory)
        self.device = select_device(device)
        self.dtype = select_dtype(self.device, dtype)
        if quantize == "int8" and self.device.type != "cpu":
            raise ValueError("quantize: 'int8' dynamic quantization runs on the CPU only")
        self.reference = str(self.directory.resolve())
        self.name = self.directory.resolve().name
        self.rotations = rotations
        self.prior = prior
        self.prior_weight = float(prior_weight)
        self.strategy = strategy
        self.quantize = quantize
        self.max_batch_tokens = int(max_batch_tokens)
        self.memory = estimate(self.directory, hf_config, self.dtype, self.max_batch_tokens)
        if check_memory:
            check_fits(self.directory, self.memory, self.device, self.dtype)
        self.tokenizer, self.model = self._load()
        self._set_up_prompt(max_length, use_chat_template)
        self._compile = compile
        self._plans: dict[str, _Plan] = {}
        self._priors: dict[str, torch.Tensor] = {}
        self._prepared: dict[str, PreparedQuestion] = {}
        self._adapter_digest: str | None = None
        if quantize == "int8":
            from clef_engine.backbones.encoder import _quantize_int8

            self.model = _quantize_int8(self.model)
        self._reset_scorer()
        if adapter is not None:
            self.load_adapter(adapter)

    # -- loading ----------------------------------------------------------------------

    def _load(self) -> tuple[Any, Any]:
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = str(self.directory)
        try:
            with _quiet_transformers():
                tokenizer = AutoTokenizer.from_pretrained(directory, **NO_REMOTE_CODE)
                model = AutoModelForCausalLM.from_pretrained(
                    directory,
                    **NO_REMOTE_CODE,
                    use_safetensors=True,
                    dtype=self.dtype,
                    # Tree masks are arbitrary 4-D masks: SDPA takes them, flash-attn not.
                    attn_implementation="sdpa",
                )
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelLoadError(
                f"decoder: cannot load a causal LM from {directory!r}: {exc}"
            ) from exc
        model.eval()
        model.to(self.device)  # type: ignore[arg-type]
        # Long states are cut by us; silence the tokenizer's "too long" warning.
        tokenizer.model_max_length = 1 << 30
        return tokenizer, model

    def _set_up_prompt(self, max_length: int | None, use_chat_template: bool) -> None:
        """Read the context window, prompt frame and pad id off the loaded model and
        tokenizer."""
        text_config = self.model.config.get_text_config()
        self.hidden_size = int(text_config.hidden_size)
        window = int(getattr(text_config, "max_position_embeddings", 0) or 4096)
        self.max_length = int(max_length or window)
        if self.max_length < 64:
            raise ValueError(f"max_length must be at least 64; got {self.max_length}")
        self.use_chat_template = use_chat_template
        self.frame = build_frame(self.tokenizer, use_chat_template=use_chat_template)
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        self.pad_id = int(pad)
        self._head = ([self.frame.bos] if self.frame.bos is not None else []) + self._ids(
            self.frame.head
        )

    def _reset_scorer(self) -> None:
        self.scorer = TreeScorer(
            self.model, pad_id=self.pad_id, max_batch_tokens=self.max_batch_tokens
        )
        if self._compile:
            self.scorer.compile()
        self._priors.clear()

    # -- protocol: tokens, encode, config ----------------------------------------------

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(self._ids(t)) for t in texts]

    @torch.inference_mode()
    def encode(
        self, texts: list[str], *, return_tokens: bool = False, normalize: bool = True
    ) -> Encoded:
        """Mean-pooled final hidden states (texts past ``max_length`` in windows)."""
        if not texts:
            raise InvalidRequestError("nothing to encode", field="texts")
        decoder = self.model.get_decoder()
        pooled, windows, tokens, states = [], [], [], []
        for text in texts:
            ids = self._ids(text) or [self.pad_id]
            parts = [ids[i : i + self.max_length] for i in range(0, len(ids), self.max_length)]
            hidden = [
                decoder(input_ids=torch.tensor([p], device=self.device)).last_hidden_state[0]
                for p in parts
            ]
            full = torch.cat(hidden).float()
            pooled.append(full.mean(dim=0))
            windows.append(len(parts))
            tokens.append(len(ids))
            states.append(full)
        vectors = torch.stack(pooled)
        if normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return Encoded(vectors, windows, tokens, states if return_tokens else None)

    def config(self) -> dict[str, Any]:
        """Backbone reference for ``config.json``; options left at their default are omitted."""
        out: dict[str, Any] = {"kind": self.kind, "path": self.reference}
        out["max_length"] = self.max_length
        if self.rotations != "auto":
            out["rotations"] = self.rotations
        if self.prior != "content_free":
            out["prior"] = self.prior
        if self.prior_weight != 1.0:
            out["prior_weight"] = self.prior_weight
        if not self.use_chat_template:
            out["use_chat_template"] = False
        if self.has_adapter:
            out["adapter_sha256"] = self.adapter_digest()
        return out

    def default_calibrator(self) -> Calibrator:
        """Temperature 1 on log-likelihood margins until :func:`fit_temperature` is run."""
        return Calibrator(source="identity: decoder log-likelihood margins (T=1, not fitted)")

    # -- prompts ----------------------------------------------------------------------

    def _plan(self, question: _Question) -> _Plan:
        cache_key = question_cache_key(question, r=str(self.rotations))
        cached = self._plans.get(cache_key)
        if cached is not None:
            return cached
        try:
            p = plan(question, self.rotations)
        except TypeError as exc:
            raise UnsupportedQuestionError(str(exc), field="questions") from exc
        blocks = [self._ids(BETWEEN + b + self.frame.tail) for b in p.blocks]
        answers = [self._ids(self.frame.answer_prefix + a + self.frame.end) for a in p.answers]
        _put(self._plans, cache_key, (p, blocks, answers))
        return p, blocks, answers

    def _prepare(self, question: _Question) -> PreparedQuestion:
        cache_key = question_cache_key(question)
        prepared = self._prepared.get(cache_key)
        if prepared is None:
            prepared = prepare(question)
            _put(self._prepared, cache_key, prepared)
        return prepared

    def _row(self, state: str, plans: list[_Plan]) -> Row:
        groups = [Group(b, answers) for _, blocks, answers in plans for b in blocks]
        reserve = max(
            (len(b) + max(len(a) for a in answers) for _, blocks, answers in plans for b in blocks),
            default=0,
        )
        budget = self.max_length - len(self._head) - reserve
        state_ids = self._ids(state)
        if len(state_ids) > budget:
            state_ids = self._truncate(state_ids, budget)
        return Row(self._head + state_ids, groups)

    def _truncate(self, ids: list[int], budget: int) -> list[int]:
        mark = self._ids(TRUNCATION_MARK)
        room = budget - len(mark)
        if room < 16:
            raise InvalidRequestError(
                "the questions leave no room for the state in the model's "
                f"{self.max_length}-token window; ask fewer or shorter questions",
                field="questions",
                limit=self.max_length,
            )
        keep_head = int(room * HEAD_SHARE)
        return ids[:keep_head] + mark + ids[len(ids) - (room - keep_head) :]

    # -- scoring ----------------------------------------------------------------------

    def raw_scores(
        self,
        texts: list[str],
        requests: list[DecisionRequest],
        *,
        strategy: str | None = None,
        grad: bool = False,
    ) -> list[dict[str, torch.Tensor]]:
        """Uncalibrated option scores per request and question (the calibrator's input).

        ``mean log p(answer)`` averaged over listing rotations, minus the content-free
        prior; for ``noul`` the two entries are (yes, no). With ``grad=True`` the scores
        carry gradients to trainable parameters (a LoRA adapter) and the prior is
        recomputed (without gradients) instead of read from the cache.
        """
        return self._raw_scores(texts, requests, strategy, grad)[0]

    def _raw_scores(
        self, texts: list[str], requests: list[DecisionRequest], strategy: str | None, grad: bool
    ) -> tuple[list[dict[str, torch.Tensor]], list[Row]]:
        strategy = strategy or self.strategy
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy: use one of {_STRATEGIES}; got {strategy!r}")
        score = self.scorer.score if strategy == "shared" else self.scorer.score_naive
        plans = [{q: self._plan(question) for q, question in r.questions.items()} for r in requests]
        rows = [self._row(t, list(p.values())) for t, p in zip(texts, plans, strict=True)]
        if grad:
            groups = score(rows)
            self._priors.clear()
            with torch.no_grad():
                priors = self._content_free(plans, score) if self.prior else {}
            self._priors.clear()
        else:
            with torch.inference_mode():
                groups = score(rows)
                priors = self._content_free(plans, score) if self.prior else {}
        out = []
        for per_q, scores in zip(plans, groups, strict=True):
            result, at = {}, 0
            for qid, (p, blocks, _) in per_q.items():
                value = torch.stack(scores[at : at + len(blocks)]).mean(dim=0)
                at += len(blocks)
                if self.prior:
                    value = value - self.prior_weight * priors[p.key]
                result[qid] = value
            out.append(result)
        return out, rows

    def _content_free(self, plans: list[dict[str, Any]], score: Any) -> dict[str, torch.Tensor]:
        """Each question's option scores under a content-free state (cached per question)."""
        wanted = {p.key: (p, b, a) for per_q in plans for p, b, a in per_q.values()}
        found = {k: self._priors[k] for k in wanted if k in self._priors}
        missing = [v for k, v in wanted.items() if k not in found]
        if missing:
            rows = [self._row(CONTENT_FREE_STATE, [m]) for m in missing]
            for (p, _, _), scores in zip(missing, score(rows), strict=True):
                found[p.key] = torch.stack(scores).mean(dim=0)
                _put(self._priors, p.key, found[p.key])
        return found

    def score_requests(
        self, context: ScoringContext, texts: list[str], requests: list[DecisionRequest]
    ) -> list[Scored]:
        """The engine's scoring seam (:class:`~clef_engine.heads.base.Scorer`): calibrated
        probabilities for every question, with the engine's calibrator."""
        raw, rows = self._raw_scores(texts, requests, None, False)
        calibrator = context.calibrator
        out = []
        for row, request, scores in zip(rows, requests, raw, strict=True):
            probabilities, prepared = {}, {}
            tokens = len(row.prefix)
            for qid, question in request.questions.items():
                prep = self._prepare(question)
                n = len(prep.names)
                logits = calibrator.scale(scores[qid].unsqueeze(0), prep.type, n)[0]
                probabilities[qid] = torch.softmax(logits.double(), dim=-1)
                prepared[qid] = prep
                _, blocks, answers = self._plan(question)
                tokens += len(blocks[0]) + sum(len(a) for a in answers)
            out.append(Scored(probabilities, prepared, 1, tokens))
        return out

    # -- adapters ---------------------------------------------------------------------

    @property
    def has_adapter(self) -> bool:
        return hasattr(self.model, "peft_config")

    def add_adapter(
        self,
        *,
        rank: int = 16,
        alpha: float | None = None,
        dropout: float = 0.0,
        target_modules: str | list[str] = "all-linear",
    ) -> Any:
        """Wrap the model in a new trainable LoRA adapter (peft); returns the peft model.

        A trainer optimises the peft model's trainable parameters through
        ``raw_scores(..., grad=True)`` (differentiable option scores), then calls
        :meth:`save_adapter`; see ``docs/decoder.md``.
        """
        peft = require("peft", package="peft", extra="train", feature="LoRA adapters")
        if not 1 <= rank <= MAX_LORA_RANK:
            raise ValueError(f"rank: must be 1..{MAX_LORA_RANK}; got {rank}")
        if self.has_adapter:
            raise ValueError("the model already has an adapter")
        config = peft.LoraConfig(
            r=rank,
            lora_alpha=alpha if alpha is not None else 2 * rank,
            lora_dropout=dropout,
            target_modules=target_modules,
            task_type="CAUSAL_LM",
        )
        with peft_quietly():
            self.model = peft.get_peft_model(self.model, config)
        self._adapter_digest = None
        self._reset_scorer()
        return self.model

    def load_adapter(self, directory: str | os.PathLike[str]) -> None:
        """Load a peft LoRA adapter (``adapter_config.json`` + safetensors) for inference."""
        peft = require("peft", package="peft", extra="train", feature="LoRA adapters")
        path = Path(directory)
        if not (path / "adapter_config.json").is_file():
            raise ModelLoadError(f"adapter: {str(path)!r} has no adapter_config.json")
        if self.has_adapter:
            raise ValueError("the model already has an adapter")
        from safetensors import SafetensorError

        from clef_engine.backbones.adapter import read_adapter_config

        read_adapter_config(path)  # a typed error naming the field, before peft reads it

        try:
            with peft_quietly():
                self.model = peft.PeftModel.from_pretrained(
                    self.model, str(path), is_trainable=False
                )
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
            raise ModelLoadError(f"adapter: cannot load {str(path)!r}: {exc}") from exc
        self.model.eval()
        self._adapter_digest = None
        self._reset_scorer()

    def save_adapter(self, directory: str | os.PathLike[str]) -> Path:
        """Write the adapter in peft format (``adapter_config.json`` + safetensors)."""
        if not self.has_adapter:
            raise ValueError("save_adapter: the model has no adapter")
        path = Path(directory)
        self.model.save_pretrained(str(path), safe_serialization=True)
        return path

    def adapter_digest(self) -> str:
        """SHA-256 (12 hex) of the adapter weights, so the model version follows them."""
        if self._adapter_digest is None:
            from peft import get_peft_model_state_dict

            h = hashlib.sha256()
            for name, tensor in sorted(get_peft_model_state_dict(self.model).items()):
                h.update(name.encode())
                h.update(tensor.detach().float().cpu().numpy().tobytes())
            self._adapter_digest = h.hexdigest()[:12]
        return self._adapter_digest
