"""The batch-slot helper, and the batch paths built on it keeping each item's error."""

from __future__ import annotations

import pytest

from clef_agents.fake import FakeEngine
from clef_engine.errors import ClefError, InvalidRequestError
from clef_engine.slots import Slots

QUESTIONS = {"q": {"type": "choice", "instructions": "Route", "criteria": ["billing", "tech"]}}


def test_slots_keep_each_error_in_its_place_and_fill_the_rest_in_order() -> None:
    slots = Slots.parse(["1", "x", "3", "y"], int)
    assert slots.pending == [1, 3] and slots.indexes == [0, 2] and slots.errors == [1, 3]
    out = slots.fill([10, 30])
    assert out[0] == 10 and out[2] == 30
    assert isinstance(out[1], ValueError) and isinstance(out[3], ValueError)


def test_slots_refuse_a_result_count_that_does_not_match() -> None:
    slots = Slots.parse(["1", "2"], int)
    with pytest.raises(ValueError, match="1 results for 2 pending"):
        slots.fill([1])


def test_slots_catch_only_the_item_errors_asked_for() -> None:
    def convert(item: str) -> str:
        if item == "bad":
            raise InvalidRequestError("bad item", field="state")
        if item == "bug":
            raise KeyError(item)
        return item

    parsed = Slots.parse(["ok", "bad"], convert, catch=ClefError)
    assert parsed.pending == ["ok"] and isinstance(parsed.slots[1], InvalidRequestError)
    with pytest.raises(KeyError):
        Slots.parse(["ok", "bug"], convert, catch=ClefError)
    with pytest.raises(InvalidRequestError):
        Slots.parse(["ok", "bad"], convert, catch=ClefError, raise_errors=True)


def test_empty_batch_has_nothing_pending() -> None:
    slots = Slots.parse([], int)
    assert slots.pending == [] and slots.fill([]) == []


def test_fake_engine_batch_keeps_a_bad_item_in_its_slot() -> None:
    out = FakeEngine().decide_batch(["refund", "", "crash"], QUESTIONS, return_exceptions=True)
    assert out[0].answers["q"].choice and out[2].answers["q"].choice
    assert isinstance(out[1], InvalidRequestError)
    with pytest.raises(InvalidRequestError):
        FakeEngine().decide_batch(["refund", ""], QUESTIONS)
