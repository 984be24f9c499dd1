"""One process-wide default engine: routers, selectors and the screenshot classifier share it."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import clef_engine
from clef_agents import _shared, vision
from clef_agents.fake import FakeEngine


class CountingEngine(FakeEngine):
    built: ClassVar[list[CountingEngine]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        CountingEngine.built.append(self)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[CountingEngine]:
    """Stand a FakeEngine in for DecisionEngine and forget any default built before."""
    CountingEngine.built = []
    monkeypatch.setattr(clef_engine, "DecisionEngine", CountingEngine)
    monkeypatch.setattr(_shared, "_DEFAULT", None)
    return CountingEngine.built


def test_screenshot_classifier_and_routers_get_the_same_engine(
    counted: list[CountingEngine],
) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from clef_agents.langchain import ClefRouter
    from clef_agents.llama_index import ClefSelector

    classifier = vision.ScreenshotClassifier()
    router = ClefRouter({"a": "x", "b": "y"}, routes={"a": lambda v: v, "b": lambda v: v})
    selector = ClefSelector()
    assert classifier.engine is router.engine is selector.engine
    assert vision.default_engine() is _shared.default_engine() is router.engine
    assert len(counted) == 1  # the model loads once, not once per module


def test_the_default_engine_is_built_on_first_use_only(counted: list[CountingEngine]) -> None:
    classifier = vision.ScreenshotClassifier()
    assert counted == []
    assert classifier.engine is _shared.default_engine()
    assert len(counted) == 1
