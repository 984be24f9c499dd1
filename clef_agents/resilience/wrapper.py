"""ResilientEngine: retries, time budgets, a confidence gate and rule fallbacks.

:class:`ResilientEngine` wraps a :class:`~engine.DecisionEngine` (or a
:class:`~clef_agents.fake.FakeEngine`, or anything with the same ``decide`` surface) and
keeps that surface, so every adapter (``ClefDecision``, ``ClefRouter``, ``ClefSelector``)
takes it in place of the engine. It adds:

- retries with tenacity's exponential backoff and jitter, for transient errors only
  (timeouts, CUDA out-of-memory, connection errors); a batch retries only its failed
  items; out-of-memory first halves the batch, then moves the engine to the CPU;
- a :class:`RuleFallback` that answers when the engine still fails, when it answers
  below ``min_confidence``, when a call exceeds ``timeout_s``, when every timeout worker
  is still busy with earlier calls, when its result does not answer the request validly
  (:func:`~clef_agents.resilience.checks.result_problem`), or when the engine cannot
  load (loading is retried with exponential backoff, so a model dir fixed later is
  picked up);
- tags on every result: ``x_source`` (``model``, ``rules``, ``default``), the model
  version, and ``x_fallback_reason``; and :class:`Counters` that users can read and log.

Bad input is never "fallen back": :class:`~clef_engine.errors.InvalidRequestError` and
:class:`~clef_engine.errors.UnsupportedQuestionError` reach the caller (or the item's slot).

Example:
    >>> from clef_agents.fake import FakeEngine
    >>> from clef_agents.resilience import Rule, RuleFallback
    >>> rules = RuleFallback([Rule.keywords(["refund", "invoice"], "billing", 0.9)],
    ...                      default="human")
    >>> safe = ResilientEngine(FakeEngine(), fallback=rules, min_confidence=0.99)
    >>> result = safe.decide("refund please", {"route": {"type": "choice",
    ...     "instructions": "Route", "criteria": ["billing", "human"]}})
    >>> result.x_source, result["route"].choice, safe.counters.fallbacks["low_confidence"]
    ('rules', 'billing', 1)
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from clef_agents._gate import ConfidenceGate, engine_thresholds
from clef_agents.resilience.checks import InvalidOutputError, result_problem
from clef_agents.resilience.counters import Counters
from clef_agents.resilience.loading import EngineLoader
from clef_agents.resilience.rules import RuleFallback
from clef_agents.resilience.workers import CallTimeout, TimeoutPool, WorkersBusy
from clef_engine.errors import (
    ClefError,
    InvalidRequestError,
    ModelLoadError,
    UnsupportedQuestionError,
)
from clef_engine.protocol import Engine
from clef_engine.schema.answers import BoxAnswer, DecisionResult
from clef_engine.schema.request import DEFAULT_MODEL, DecisionRequest, questions_from
from clef_engine.slots import Slots

logger = logging.getLogger(__name__)

# -- errors --------------------------------------------------------------------------


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS out-of-memory, recognised by type name or message (torch not imported)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: timeouts, out-of-memory, dropped connections."""
    if isinstance(exc, (InvalidRequestError, UnsupportedQuestionError)):
        return False
    return isinstance(exc, (TimeoutError, ConnectionError)) or is_out_of_memory(exc)


def _is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, (InvalidRequestError, UnsupportedQuestionError))


# -- the wrapper ---------------------------------------------------------------------


def move_to_cpu(engine: Any) -> Any:
    """Default CPU move after out-of-memory: ``engine.to("cpu")``."""
    if not hasattr(engine, "to"):
        raise RuntimeError("the engine cannot be moved to the CPU (it has no .to())")
    return engine.to("cpu") or engine


class _Pending(Exception):
    """Raised inside a retry attempt while some batch items still failed transiently."""


class ResilientEngine:
    """An engine with retries, timeouts, a confidence gate and rule fallbacks.

    Sync calls under ``timeout_s`` run in a pool of ``timeout_workers`` threads, because
    Python cannot interrupt a hung call: a call past its budget is answered by the
    fallback (``timeout``) but keeps its thread until the engine returns. The pool never
    queues: while all its workers are busy, a call is answered by the fallback at once
    with reason ``busy`` (``WorkersBusy`` without a fallback) instead of waiting out its
    budget behind calls that may never end. Size the pool to the engine's real
    concurrency. Async calls use ``asyncio.wait_for`` and no pool.

    Args:
        engine: An engine, or a zero-argument factory that builds one (called on first
            use; while it raises, whatever the exception, every answer comes from
            ``fallback`` with reason ``unavailable``, and the factory is called again
            after ``load_retry_s``, doubling up to ``max_load_retry_s``).
        fallback: The rules that answer when the model does not; ``None`` re-raises.
        min_confidence: Calibrated probability of the given answer below which the
            fallback answers that question (a float in [0, 1], or one per question id);
            equal passes. ``None``, and a question missing from the mapping: the wrapped
            engine's saved threshold for that question, else no gate.
        timeout_s: Time budget of one call, retries included.
        max_attempts: Attempts per item for transient errors.
        backoff_s: First backoff; doubles per attempt with jitter, up to ``max_backoff_s``.
        transient: Which exceptions are retried (default :func:`is_transient`).
        to_cpu: Moves the engine to the CPU after out-of-memory at batch size 1.
        timeout_workers: Threads for sync calls under ``timeout_s`` (see above).
        load_retry_s: Wait before loading again after a failed load; ``None``: a failed
            load is final.
        max_load_retry_s: The longest wait between two load attempts.
        clock: Monotonic seconds for the load backoff (injectable for tests).

    Example:
        >>> from clef_agents.fake import FakeEngine
        >>> safe = ResilientEngine(lambda: FakeEngine(), timeout_s=5.0)
        >>> safe.decide("hi", {"q": {"type": "noul", "instructions": "greeting?"}}).x_source
        'model'
    """

    def __init__(
        self,
        engine: Engine | Callable[[], Engine],
        *,
        fallback: RuleFallback | None = None,
        min_confidence: float | Mapping[str, float] | None = None,
        timeout_s: float | None = None,
        max_attempts: int = 3,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        transient: Callable[[BaseException], bool] = is_transient,
        to_cpu: Callable[[Any], Any] = move_to_cpu,
        timeout_workers: int = 4,
        load_retry_s: float | None = 1.0,
        max_load_retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_attempts < 1:
            raise InvalidRequestError("max_attempts must be at least 1", field="max_attempts")
        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
            raise InvalidRequestError(
                f"timeout_s must be a finite number of seconds > 0, or None; got {timeout_s!r}",
                field="timeout_s",
                limit=0,
            )
        self._engine: Any = engine if hasattr(engine, "decide") else None
        self._loader: EngineLoader | None = None
        if self._engine is None:
            self._loader = EngineLoader(
                engine, retry_s=load_retry_s, max_retry_s=max_load_retry_s, clock=clock
            )
        self.fallback = fallback
        self.min_confidence = min_confidence
        self._gates: dict[str, ConfidenceGate] = {}
        saved = engine_thresholds(self)  # the wrapped engine's, read when answers arrive
        if isinstance(min_confidence, Mapping):
            self._gates = {
                qid: ConfidenceGate(t, saved=saved, field=f"min_confidence.{qid}")
                for qid, t in min_confidence.items()
            }
            min_confidence = None
        self._gate = ConfidenceGate(min_confidence, saved=saved)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.transient = transient
        self.to_cpu = to_cpu
        self.counters = Counters()
        self._workers = TimeoutPool(timeout_workers)

    # -- engine access -----------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """The wrapped engine (loaded on first use, retried when due), or ``None``."""
        if self._engine is None and self._loader is not None:
            self._engine = self._loader.get()
        return self._engine

    @property
    def load_error(self) -> BaseException | None:
        """Why the last load attempt failed; ``None`` once the engine has loaded."""
        return None if self._loader is None else self._loader.error

    @property
    def busy_workers(self) -> int:
        """Timeout workers running a call now (hung calls included)."""
        return self._workers.busy

    @property
    def model_version(self) -> str | None:
        engine = self.engine
        return None if engine is None else getattr(engine, "model_version", None)

    @property
    def model_name(self) -> str:
        return getattr(self.engine, "model_name", DEFAULT_MODEL)

    def __getattr__(self, name: str) -> Any:
        # Anything else (device, head, save_pretrained...) is the wrapped engine's.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.engine, name)

    # -- helpers -----------------------------------------------------------------------

    def _request(self, state: Any, questions: Any, assets: Any = None) -> DecisionRequest:
        if questions is None:
            return DecisionRequest.parse(state)
        payload: dict[str, Any] = {"state": state, "questions": questions_from(questions)}
        if assets:
            payload["assets"] = assets
        return DecisionRequest.parse(payload)

    def _threshold(self, qid: str, question: Any = None) -> float:
        return self._gates.get(qid, self._gate).threshold(qid, question)

    def _stop(self) -> Any:
        stop: Any = stop_after_attempt(self.max_attempts)
        if self.timeout_s is not None:
            stop = stop | stop_after_delay(self.timeout_s)
        return stop

    def _retry_kwargs(self, retry_on: Callable[[BaseException], bool]) -> Any:
        def count(_: RetryCallState) -> None:
            self.counters.add("retries")

        return {
            "stop": self._stop(),
            "wait": wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)
            + wait_random(0, self.backoff_s),
            "retry": retry_if_exception(retry_on),
            "reraise": True,
            "before_sleep": count,
        }

    def _remaining(self, started: float) -> float | None:
        if self.timeout_s is None:
            return None
        left = self.timeout_s - (time.perf_counter() - started)
        if left <= 0:
            raise CallTimeout(f"the call exceeded its budget of {self.timeout_s} s")
        return left

    def _call(self, fn: Callable[[], Any], started: float) -> Any:
        """Run ``fn``; under a budget it runs in a worker thread so a hang cannot block us."""
        remaining = self._remaining(started)
        if remaining is None:
            return fn()
        try:
            return self._workers.run(fn, remaining)
        except CallTimeout:
            raise CallTimeout(f"the call exceeded its budget of {self.timeout_s} s") from None

    async def _acall(self, make: Callable[[], Any], started: float) -> Any:
        remaining = self._remaining(started)
        if remaining is None:
            return await make()
        try:
            return await asyncio.wait_for(make(), remaining)
        except asyncio.TimeoutError:
            raise CallTimeout(f"the call exceeded its budget of {self.timeout_s} s") from None

    def _oom_to_cpu(self) -> bool:
        """Move to the CPU once; False when that is impossible or already done."""
        engine = self._engine
        device = getattr(engine, "device", None)
        if device is not None and str(device).startswith("cpu"):
            return False
        try:
            moved = self.to_cpu(engine)
        except Exception:
            return False
        self._engine = moved if moved is not None else engine
        self.counters.add("cpu_moves")
        return True

    def _fail(self, request: DecisionRequest | None, exc: BaseException) -> Any:
        """The item's final answer after ``exc``: a fallback, or the error itself."""
        if _is_user_error(exc) or request is None or self.fallback is None:
            self.counters.add("errors")
            return exc
        if self._engine is None and self.load_error is not None:
            reason = "unavailable"
        elif isinstance(exc, WorkersBusy):
            reason = "busy"
        elif isinstance(exc, InvalidOutputError):
            reason = "invalid_output"
        elif isinstance(exc, TimeoutError):
            reason = "timeout"
        else:
            reason = "error"
        self.counters.fallback(reason)
        version = getattr(self._engine, "model_version", None)
        return self._with_cause(
            self.fallback.answer(request, reason=reason, model_version=version), exc
        )

    @staticmethod
    def _with_cause(result: DecisionResult, exc: BaseException) -> DecisionResult:
        result.x_fallback_error = f"{type(exc).__name__}: {exc}"  # type: ignore[attr-defined]
        return result

    def _finish(self, request: DecisionRequest | None, outcome: Any) -> Any:
        """Check a model result (validity, confidence) or turn an error into a fallback."""
        if isinstance(outcome, BaseException):
            return self._fail(request, outcome)
        if request is None:
            return outcome
        problem = result_problem(request, outcome)
        if problem is not None:
            logger.warning("the engine's result was rejected: %s", problem)
            return self._fail(request, InvalidOutputError(problem))
        result: DecisionResult = outcome
        if self.fallback is not None:
            low = [
                qid
                for qid, answer in result.answers.items()
                if not isinstance(answer, BoxAnswer)
                and answer.top_probability() < self._threshold(qid, request.questions.get(qid))
            ]
            if low:
                self.counters.fallback("low_confidence")
                keep = {q: a for q, a in result.answers.items() if q not in low}
                fallback = self.fallback.answer(
                    request,
                    reason="low_confidence",
                    model_version=result.x_model_version,
                    keep=keep,
                )
                fallback.x_model_probabilities = {  # type: ignore[attr-defined]
                    q: result.answers[q].top_probability() for q in low
                }
                return fallback
        self.counters.add("model")
        return result

    # -- single --------------------------------------------------------------------------

    def decide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        """:meth:`DecisionEngine.decide` with retries, timeout, confidence gate, fallback."""
        self.counters.add("calls")
        self.counters.add("items")
        request = self._request(state, questions, assets)
        engine = self.engine
        outcome: Any
        if engine is None:
            outcome = self.load_error or ModelLoadError("the engine is not available")
        else:
            started = time.perf_counter()
            try:
                for attempt in Retrying(**self._retry_kwargs(self._retry_single)):
                    with attempt:
                        outcome = self._call(lambda: self._engine.decide(request), started)
            except Exception as exc:
                outcome = exc
        final = self._finish(request, outcome)
        if isinstance(final, BaseException):
            raise final
        return final

    def _retry_single(self, exc: BaseException) -> bool:
        if not self.transient(exc) or isinstance(exc, CallTimeout):
            return False
        if is_out_of_memory(exc):
            return self._oom_to_cpu()
        return True

    async def adecide(
        self, state: Any, questions: Any = None, *, assets: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        """Async :meth:`decide`; never blocks the event loop (the engine's async form runs)."""
        self.counters.add("calls")
        self.counters.add("items")
        request = self._request(state, questions, assets)
        engine = self.engine
        outcome: Any
        if engine is None:
            outcome = self.load_error or ModelLoadError("the engine is not available")
        else:
            started = time.perf_counter()
            try:
                async for attempt in AsyncRetrying(**self._retry_kwargs(self._retry_single)):
                    with attempt:
                        outcome = await self._acall(lambda: self._engine.adecide(request), started)
            except Exception as exc:
                outcome = exc
        final = self._finish(request, outcome)
        if isinstance(final, BaseException):
            raise final
        return final

    # -- batch ---------------------------------------------------------------------------

    def _parse_all(
        self, states: Sequence[Any], questions: Any
    ) -> tuple[list[DecisionRequest | None], list[Any]]:
        """Each item's request, or its own parse error in its slot (questions parsed once)."""
        parsed: list[Any] = []

        def parse(item: Any) -> DecisionRequest:
            if questions is not None and not parsed:
                parsed.append(questions_from(questions))  # invalid: every item's error
            return self._request(item, parsed[0] if parsed else None)

        items = Slots.parse(states, parse, catch=ClefError)
        requests: list[DecisionRequest | None] = [None] * len(states)
        for i, request in zip(items.indexes, items.pending, strict=True):
            requests[i] = request
        return requests, items.slots

    def _batch_call(self, requests: list[DecisionRequest], started: float) -> list[Any]:
        """One engine batch; out-of-memory items are re-run in halves, then on the CPU."""
        try:
            out = _one_per_request(
                self._call(
                    lambda: self._engine.decide_batch(requests, return_exceptions=True), started
                ),
                requests,
            )
        except Exception as exc:
            out = [exc] * len(requests)
        oom = [k for k, r in enumerate(out) if isinstance(r, BaseException) and is_out_of_memory(r)]
        if not oom:
            return out
        sub = [requests[k] for k in oom]
        if len(sub) > 1:
            self.counters.add("oom_splits")
            mid = len(sub) // 2
            redo = self._batch_call(sub[:mid], started) + self._batch_call(sub[mid:], started)
        elif self._oom_to_cpu():
            redo = self._batch_call(sub, started)
        else:
            redo = [out[oom[0]]]
        for k, r in zip(oom, redo, strict=True):
            out[k] = r
        return out

    def decide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        """:meth:`DecisionEngine.decide_batch` with retries of the failed items only.

        Every item gets a result (model, rules or default) or, for bad input, its own
        error, in order. Without ``return_exceptions`` the first such error is raised.
        """
        self.counters.add("calls")
        self.counters.add("items", len(states))
        requests, slots = self._parse_all(states, questions)
        pending = [i for i, r in enumerate(requests) if r is not None]
        if pending and self.engine is None:
            err = self.load_error or ModelLoadError("the engine is not available")
            for i in pending:
                slots[i] = err
            pending = []
        started = time.perf_counter()

        def attempt_once() -> None:
            nonlocal pending
            if not pending:
                return
            try:
                out = self._batch_call([requests[i] for i in pending], started)  # type: ignore[misc]
            except CallTimeout as exc:
                out = [exc] * len(pending)
            retry_next = []
            for i, r in zip(pending, out, strict=True):
                slots[i] = r
                if (
                    isinstance(r, BaseException)
                    and self.transient(r)
                    and not isinstance(r, CallTimeout)
                ):
                    retry_next.append(i)
            pending = retry_next
            if pending:
                raise _Pending(len(pending))

        try:
            for attempt in Retrying(**self._retry_kwargs(_is_pending)):
                with attempt:
                    attempt_once()
        except _Pending:
            pass
        return self._settle(requests, slots, return_exceptions)

    def _settle(
        self, requests: list[DecisionRequest | None], slots: list[Any], return_exceptions: bool
    ) -> list[Any]:
        final = [self._finish(req, slot) for req, slot in zip(requests, slots, strict=True)]
        if not return_exceptions:
            for item in final:
                if isinstance(item, BaseException):
                    raise item
        return final

    async def adecide_batch(
        self, states: Sequence[Any], questions: Any = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        """Async :meth:`decide_batch`; the engine's async batch runs, retries are awaited."""
        self.counters.add("calls")
        self.counters.add("items", len(states))
        requests, slots = self._parse_all(states, questions)
        pending = [i for i, r in enumerate(requests) if r is not None]
        if pending and self.engine is None:
            err = self.load_error or ModelLoadError("the engine is not available")
            for i in pending:
                slots[i] = err
            pending = []
        started = time.perf_counter()

        async def batch(reqs: list[DecisionRequest]) -> list[Any]:
            try:
                out = _one_per_request(
                    await self._acall(
                        lambda: self._engine.adecide_batch(reqs, return_exceptions=True), started
                    ),
                    reqs,
                )
            except Exception as exc:
                out = [exc] * len(reqs)
            oom = [
                k for k, r in enumerate(out) if isinstance(r, BaseException) and is_out_of_memory(r)
            ]
            if not oom:
                return out
            sub = [reqs[k] for k in oom]
            if len(sub) > 1:
                self.counters.add("oom_splits")
                mid = len(sub) // 2
                redo = await batch(sub[:mid]) + await batch(sub[mid:])
            elif self._oom_to_cpu():
                redo = await batch(sub)
            else:
                redo = [out[oom[0]]]
            for k, r in zip(oom, redo, strict=True):
                out[k] = r
            return out

        async def attempt_once() -> None:
            nonlocal pending
            if not pending:
                return
            out = await batch([requests[i] for i in pending])  # type: ignore[misc]
            retry_next = []
            for i, r in zip(pending, out, strict=True):
                slots[i] = r
                if (
                    isinstance(r, BaseException)
                    and self.transient(r)
                    and not isinstance(r, CallTimeout)
                ):
                    retry_next.append(i)
            pending = retry_next
            if pending:
                raise _Pending(len(pending))

        try:
            async for attempt in AsyncRetrying(**self._retry_kwargs(_is_pending)):
                with attempt:
                    await attempt_once()
        except _Pending:
            pass
        return self._settle(requests, slots, return_exceptions)

    def close(self) -> None:
        """Stop the timeout worker threads (and the engine's, where it has ``close``)."""
        self._workers.close()
        close = getattr(self._engine, "close", None)
        if close is not None:
            close()


def _is_pending(exc: BaseException) -> bool:
    return isinstance(exc, _Pending)


def _one_per_request(out: Any, requests: Sequence[DecisionRequest]) -> list[Any]:
    """The engine's batch output as a list, which must hold one item per request."""
    items = list(out)
    if len(items) != len(requests):
        raise InvalidOutputError(
            f"the engine's batch returned {len(items)} results for {len(requests)} requests"
        )
    return items
