"""Browser-tool adapters: screenshots and Playwright pages in, page decisions and boxes out.

Anything a browser tool hands over is a state here: Playwright ``page.screenshot()`` bytes,
a sync or async Playwright ``Page`` (screenshotted for you), a PIL image, a path, base64
or a data URL, and LlamaIndex's ``QueryBundle(image_path=...)`` / ``ImageDocument``.
:func:`as_state` / :func:`aas_state` turn them into a plain image state that
``DecisionEngine.decide`` (and every adapter built on it) accepts unchanged.

:class:`ScreenshotClassifier` is a ready-made ``Choice`` over the page types in
:data:`~clef_agents.page_types.PAGE_TYPES`; :meth:`ScreenshotClassifier.locate` answers a
``box`` question ("the sign-in button").

Playwright itself is not imported: pages are duck-typed (``screenshot`` + ``goto``).

Example:
    >>> from clef_agents.vision import ScreenshotClassifier
    >>> classifier = ScreenshotClassifier()
    >>> answer = classifier.classify(page)      # a Playwright Page on a sign-in form
    >>> answer.choice, answer.probabilities["login"] > 0.7   # 0.98 measured
    ('login', True)
    >>> if answer.choice == "login" and answer.probabilities["login"] > 0.7:
    ...     box = classifier.locate(page, "the sign-in button").box
    ...     page.mouse.click(*box.center(1280, 800))  # fractions -> viewport pixels
    >>> box.center(1280, 800)                   # the button's middle, in viewport pixels
    (640.0, 301.0)
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clef_agents._shared import default_engine
from clef_agents.page_types import PAGE_TYPE_TEMPERATURE, PAGE_TYPES
from clef_engine import Box, Choice, DecisionEngine
from clef_engine.backbones.vision import dom
from clef_engine.backbones.vision.images import refuse_url
from clef_engine.backbones.vision.layout import ImageEvidence
from clef_engine.errors import InvalidRequestError
from clef_engine.heads import box as box_head
from clef_engine.schema.answers import BoxAnswer, ChoiceAnswer, DecisionResult

Fetcher = Callable[[str], Any]
"""``url -> image`` (bytes, PIL, ...) or an awaitable of one, for screenshots given as URLs."""
_URL = re.compile(r"^(?:https?|ftp)://", re.IGNORECASE)

DEFAULT_QUESTION_ID = "page_type"
DEFAULT_INSTRUCTIONS = "What kind of web page is shown in this screenshot?"
DEFAULT_VIEWPORT = (1280, 800)


def is_page(obj: Any) -> bool:
    """Whether ``obj`` looks like a Playwright ``Page`` (sync or async)."""
    return callable(getattr(obj, "screenshot", None)) and callable(getattr(obj, "goto", None))


def _image_of(obj: Any) -> Any:
    """Images inside LlamaIndex objects (duck-typed); other values come back unchanged."""
    if isinstance(obj, (str, bytes, bytearray, Path)):
        return obj
    path = getattr(obj, "image_path", None)
    if isinstance(path, str) and path:
        return Path(path)
    image = getattr(obj, "image", None)
    if isinstance(image, str) and image:
        mime = getattr(obj, "image_mimetype", None) or "image/png"
        return image if image.startswith("data:") else f"data:{mime};base64,{image}"
    url = getattr(obj, "image_url", None)
    if isinstance(url, str) and url:
        if url.startswith("data:image/"):
            return url
        raise InvalidRequestError(
            "image URLs are never fetched; pass the image bytes, a path or a data URL",
            field="state",
        )
    return obj


def as_state(obj: Any, *, full_page: bool = False) -> Any:
    """A state ``DecisionEngine.decide`` accepts, from what a browser tool hands over.

    Sync Playwright pages are screenshotted; LlamaIndex ``QueryBundle.image_path`` and
    ``ImageDocument`` images are extracted; anything else is returned unchanged.

    Raises:
        TypeError: ``obj`` is an async Playwright page; use :func:`aas_state`.
    """
    if is_page(obj):
        if inspect.iscoroutinefunction(obj.screenshot):
            raise TypeError("an async Playwright page: use `await aas_state(page)`")
        return obj.screenshot(full_page=full_page)
    return _image_of(obj)


async def aas_state(obj: Any, *, full_page: bool = False) -> Any:
    """Async :func:`as_state`: awaits an async page's screenshot, accepts sync pages too."""
    if is_page(obj):
        shot = obj.screenshot(full_page=full_page)
        return await shot if inspect.isawaitable(shot) else shot
    return _image_of(obj)


def page_type_question(
    page_types: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    instructions: str = DEFAULT_INSTRUCTIONS,
) -> Choice:
    """The ``Choice`` over page types (all of :data:`PAGE_TYPES`, or a subset / your own).

    Page types of :data:`PAGE_TYPES` (all of them or a subset, in any order) carry
    :data:`~clef_agents.page_types.PAGE_TYPE_TEMPERATURE`, the calibration fitted on
    screenshots of real pages; a mapping of your own answers as the engine does (fit its
    temperature with :func:`clef_engine.calibration.fit.fit_choice_temperature`).
    """
    criteria: dict[str, Any]
    temperature = PAGE_TYPE_TEMPERATURE
    if page_types is None:
        criteria = dict(PAGE_TYPES)
    elif isinstance(page_types, Mapping):
        criteria = dict(page_types)
        if criteria != PAGE_TYPES:
            temperature = None  # types of your own: not what the temperature was fitted on
    else:
        names = list(page_types)
        unknown = [n for n in names if n not in PAGE_TYPES]
        if unknown:
            raise InvalidRequestError(
                f"unknown page types {unknown}; known: {sorted(PAGE_TYPES)} (or pass a mapping "
                "of your own)",
                field="page_types",
            )
        criteria = {n: PAGE_TYPES[n] for n in names}
    return Choice(instructions=instructions, criteria=criteria, temperature=temperature)


class ScreenshotClassifier:
    """What kind of page is this? A ready-made, calibrated ``Choice`` for browser agents.

    Args:
        engine: The decision engine (default: the process-wide one that the routers and
            selectors share, :func:`clef_agents._shared.default_engine`, so the model loads
            once).
        page_types: A subset of :data:`PAGE_TYPES` names, or your own criteria mapping.
        question_id: The id the question has in results.
        full_page: Screenshot the full scrollable page when given a Playwright page.
        threads: CPU threads the OCR runs on (default: the CPUs this process may use).
            The engine's image reader is rebuilt with this many threads when it differs,
            so it applies to that engine's images; torch's threads stay the process's.
        fetcher: Called with a URL given as the screenshot (``url -> bytes``, sync or
            async). Without one, a URL is refused (``InvalidRequestError(field=
            "screenshot")``): nothing is fetched behind your back.
        dom: When given a Playwright page, :meth:`locate` uses the page's own geometry
            and names (its DOM) instead of reading the screenshot; ``False`` reads pixels.

    Attributes:
        question: The ``Choice``; use it with ``ClefDecision``/``ClefRouter`` (LangChain)
            or a LlamaIndex selector, with :func:`as_state` of the screenshot as the state.

    Example:
        >>> classifier = ScreenshotClassifier()
        >>> answer = classifier.classify(open("shot.png", "rb").read())   # a sign-in page
        >>> answer.choice, answer.probabilities[answer.choice] > 0.7   # 0.98 measured
        ('login', True)
    """

    def __init__(
        self,
        engine: DecisionEngine | None = None,
        *,
        page_types: Iterable[str] | Mapping[str, Any] | None = None,
        question_id: str = DEFAULT_QUESTION_ID,
        full_page: bool = False,
        threads: int | None = None,
        fetcher: Fetcher | None = None,
        dom: bool = True,
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise InvalidRequestError(f"threads must be at least 1; got {threads}", field="threads")
        self._engine = engine
        self.question = page_type_question(page_types)
        self.question_id = question_id
        self.full_page = full_page
        self.threads = None if threads is None else int(threads)
        self.fetcher = fetcher
        self.dom = dom
        self._prepared = False
        self._threaded = False

    @property
    def engine(self) -> DecisionEngine:
        if self._engine is None:
            self._engine = default_engine()
        if self.threads is not None and not self._threaded:
            self._engine.vision = self._engine.vision.with_threads(self.threads)
            self._threaded = True
        return self._engine

    def _state(self, screenshot: Any) -> Any:
        if isinstance(screenshot, str) and _URL.match(screenshot.strip()):
            if self.fetcher is None:
                raise refuse_url(screenshot.strip(), "screenshot")
            screenshot = self.fetcher(screenshot.strip())
            if inspect.isawaitable(screenshot):
                raise TypeError("an async fetcher: use the async methods (aclassify, ...)")
        return as_state(screenshot, full_page=self.full_page)

    async def _astate(self, screenshot: Any) -> Any:
        if isinstance(screenshot, str) and _URL.match(screenshot.strip()):
            if self.fetcher is None:
                raise refuse_url(screenshot.strip(), "screenshot")
            screenshot = self.fetcher(screenshot.strip())
            if inspect.isawaitable(screenshot):
                screenshot = await screenshot
        return await aas_state(screenshot, full_page=self.full_page)

    def prepare(self) -> None:
        """Embed the page types and fit the prototype head now (else on first use).

        Fitting runs outside ``torch.inference_mode`` (the prototype head needs autograd);
        the engine caches the result by question content.
        """
        if not self._prepared:
            self.engine.prepare_question(self.question)
            self._prepared = True

    @property
    def questions(self) -> dict[str, Choice]:
        """``{question_id: question}``, ready to pass to ``decide`` with more questions."""
        return {self.question_id: self.question}

    @property
    def labels(self) -> list[str]:
        return list(self.question.criteria)

    def decide(self, screenshot: Any, extra: Mapping[str, Any] | None = None) -> DecisionResult:
        """The page-type question plus any ``extra`` questions, in one decision."""
        self.prepare()
        state = self._state(screenshot)
        return self.engine.decide(state, {**self.questions, **(extra or {})})

    async def adecide(
        self, screenshot: Any, extra: Mapping[str, Any] | None = None
    ) -> DecisionResult:
        """Async :meth:`decide` (async Playwright pages welcome)."""
        if not self._prepared:
            await asyncio.get_running_loop().run_in_executor(None, self.prepare)
        state = await self._astate(screenshot)
        return await self.engine.adecide(state, {**self.questions, **(extra or {})})

    def classify(self, screenshot: Any) -> ChoiceAnswer:
        """The page type of one screenshot (bytes, PIL, path, data URL, or a sync Page)."""
        answer = self.decide(screenshot).answers[self.question_id]
        assert isinstance(answer, ChoiceAnswer)
        return answer

    async def aclassify(self, screenshot: Any) -> ChoiceAnswer:
        """Async :meth:`classify`."""
        answer = (await self.adecide(screenshot)).answers[self.question_id]
        assert isinstance(answer, ChoiceAnswer)
        return answer

    def classify_batch(
        self, screenshots: Sequence[Any], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Classify many screenshots in one engine batch; errors stay in their slot."""
        self.prepare()
        states = []
        for shot in screenshots:
            try:
                states.append(self._state(shot))
            except Exception as exc:
                if not return_exceptions:
                    raise
                states.append(exc)
        ok = [s for s in states if not isinstance(s, Exception)]
        results = iter(
            self.engine.decide_batch(ok, self.questions, return_exceptions=return_exceptions)
        )
        out: list[Any] = []
        for state in states:
            if isinstance(state, Exception):
                out.append(state)
                continue
            result = next(results)
            out.append(
                result.answers[self.question_id] if isinstance(result, DecisionResult) else result
            )
        return out

    def locate(self, screenshot: Any, description: str) -> BoxAnswer:
        """Where is ``description`` ("the sign-in button")?

        The box is in fractions (0-1) of the screenshot's height and width, as on the wire;
        ``answer.box.center(width, height)`` is the point to click, in pixels of a
        ``width`` x ``height`` screenshot (the viewport, unless ``full_page``). Given a
        Playwright page (and ``dom``), the page's own elements are ranked instead of what
        OCR reads from its screenshot; such an answer carries ``x_geometry="dom"``.
        """
        if self.dom and is_page(screenshot) and dom.has_dom(screenshot):
            if not inspect.iscoroutinefunction(screenshot.evaluate):
                evidence = dom.page_evidence(screenshot, full_page=self.full_page)
                found = self._from_dom(evidence, description)
                if found is not None:
                    return found
        state = self._state(screenshot)
        answer = self.engine.decide(state, {"box": Box(instructions=description)}).answers["box"]
        assert isinstance(answer, BoxAnswer)
        return answer

    async def alocate(self, screenshot: Any, description: str) -> BoxAnswer:
        """Async :meth:`locate`."""
        if self.dom and is_page(screenshot) and dom.has_dom(screenshot):
            evidence = await dom.apage_evidence(screenshot, full_page=self.full_page)
            found = self._from_dom(evidence, description)
            if found is not None:
                return found
        state = await self._astate(screenshot)
        result = await self.engine.adecide(state, {"box": Box(instructions=description)})
        answer = result.answers["box"]
        assert isinstance(answer, BoxAnswer)
        return answer

    def _from_dom(self, evidence: ImageEvidence, description: str = "") -> BoxAnswer | None:
        """The box answer from a page's DOM elements (``None``: the DOM had none)."""
        if not evidence.elements or not description.strip():
            return None
        embed = self.engine.scoring_context().embed
        answer = box_head.locate(embed, description, [evidence])
        answer.x_geometry = "dom"  # type: ignore[attr-defined]
        return answer


def data_url(png: bytes) -> str:
    """``data:image/png;base64,...`` of PNG bytes (for JSON transports and LlamaIndex)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


__all__ = [
    "DEFAULT_QUESTION_ID",
    "PAGE_TYPES",
    "ScreenshotClassifier",
    "aas_state",
    "as_state",
    "data_url",
    "default_engine",
    "is_page",
    "page_type_question",
]
