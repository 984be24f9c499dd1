"""The question model: validation, limits and their error messages, rendering."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from engine.errors import InvalidRequestError
from engine.schema import (
    Choice,
    DecisionRequest,
    Noul,
    Score,
    choice_confidence,
    render_value,
    score_confidence,
)
from engine.schema.limits import MAX_CHOICE_OPTIONS, MAX_JSON_DEPTH


def _request(**questions):
    return {"state": "hello", "questions": questions}


def test_choice_accepts_names_descriptions_and_examples():
    q = Choice(
        instructions="Route",
        criteria={"billing": "money matters", "bug": None, "sales": {"examples": ["buy more"]}},
    )
    specs = q.option_specs()
    assert [s.name for s in specs] == ["billing", "bug", "sales"]
    assert specs[0].description == "money matters"
    assert specs[1].description is None
    assert specs[2].examples == ("buy more",)


def test_choice_list_shorthand_and_duplicates():
    assert list(Choice(instructions="x", criteria=["a", "b"]).criteria) == ["a", "b"]
    with pytest.raises(ValidationError, match="unique"):
        Choice(instructions="x", criteria=["a", "a"])


@pytest.mark.parametrize("n", [0, 1, MAX_CHOICE_OPTIONS + 1, 300])
def test_choice_option_count_limits(n):
    criteria = {f"o{i}": None for i in range(n)}
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse(
            _request(q={"type": "choice", "instructions": "x", "criteria": criteria})
        )
    assert info.value.field == "questions.q.criteria"
    assert "2..255" in str(info.value)


def test_choice_with_255_options_is_valid():
    criteria = {f"o{i}": None for i in range(MAX_CHOICE_OPTIONS)}
    req = DecisionRequest.parse(
        _request(q={"type": "choice", "instructions": "x", "criteria": criteria})
    )
    assert len(req.questions["q"].option_specs()) == 255


@pytest.mark.parametrize("levels", [["only"], [str(i) for i in range(11)]])
def test_score_level_limits(levels):
    with pytest.raises(InvalidRequestError, match=r"2\.\.10 levels"):
        DecisionRequest.parse(
            _request(q={"type": "score", "instructions": "x", "criteria": levels})
        )


def test_unknown_question_type_names_the_question():
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse(_request(q={"type": "ranking", "instructions": "x"}))
    assert info.value.field == "questions.q"
    assert "ranking" in str(info.value)


@pytest.mark.parametrize("qid", ["", "   "])
def test_question_ids_must_be_non_empty(qid):
    with pytest.raises(InvalidRequestError, match="non-empty"):
        DecisionRequest.parse(
            {"state": "x", "questions": {qid: {"type": "noul", "instructions": "ok?"}}}
        )


def test_at_least_one_question():
    with pytest.raises(InvalidRequestError, match="at least one question") as info:
        DecisionRequest.parse({"state": "x", "questions": {}})
    assert info.value.field == "questions"


@pytest.mark.parametrize("state", ["", "   ", [], None])
def test_empty_state_is_refused(state):
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse(
            {"state": state, "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
        )
    assert info.value.field == "state"


def test_noul_needs_instructions_or_a_side_and_only_true_false():
    with pytest.raises(ValidationError, match="needs instructions"):
        Noul()
    with pytest.raises(ValidationError, match="only 'true' and 'false'"):
        Noul(instructions="x", criteria={"maybe": "y"})
    q = Noul(criteria={"true": "the user is angry"})
    assert q.sides() == (True, False)


def test_errors_keep_every_entry_for_the_server():
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse(
            {
                "state": "x",
                "questions": {
                    "a": {"type": "choice", "instructions": "x", "criteria": ["one"]},
                    "b": {"type": "score", "instructions": "x", "criteria": ["one"]},
                },
            }
        )
    locs = [e["loc"] for e in info.value.errors]
    assert ("questions", "a", "criteria") in locs
    assert ("questions", "b", "criteria") in locs


def test_request_must_be_an_object():
    with pytest.raises(InvalidRequestError, match="JSON object") as info:
        DecisionRequest.parse(["not", "a", "request"])
    assert info.value.field == "body"


def test_unknown_top_level_fields_are_ignored():
    req = DecisionRequest.parse(
        {
            "state": "x",
            "questions": {"q": {"type": "noul", "instructions": "ok?"}},
            "temperature": 0.3,
        }
    )
    assert req.state == "x"


# -- rendering -----------------------------------------------------------------------


def test_json_rendering_is_independent_of_key_order():
    a = render_value({"b": 1, "a": {"y": [1, 2], "x": None}})
    b = render_value({"a": {"x": None, "y": [1, 2]}, "b": 1})
    assert a == b
    assert a.splitlines() == ["a.x: null", "a.y[0]: 1", "a.y[1]: 2", "b: 1"]


def test_messages_render_as_role_lines_from_dicts_and_objects():
    class Msg:  # duck-typed like langchain_core.messages.HumanMessage
        def __init__(self, type_, content):
            self.type = type_
            self.content = content

    dicts = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    objects = [Msg("human", "hi"), Msg("ai", "hello")]
    assert render_value(dicts) == "user: hi\nassistant: hello"
    req = DecisionRequest.parse(
        {"state": objects, "questions": {"q": {"type": "noul", "instructions": "x"}}}
    )
    assert render_value(req.state) == render_value(dicts)


def test_nan_and_deep_nesting_are_refused():
    with pytest.raises(InvalidRequestError, match="finite"):
        render_value({"x": math.nan})
    deep: object = 1
    for _ in range(MAX_JSON_DEPTH + 2):
        deep = {"k": deep}
    with pytest.raises(InvalidRequestError, match=f"deeper than {MAX_JSON_DEPTH}") as info:
        render_value(deep)
    assert info.value.limit == MAX_JSON_DEPTH


# -- confidence formulas -------------------------------------------------------------


def test_choice_confidence_formula():
    assert choice_confidence([0.25, 0.25, 0.25, 0.25]) == pytest.approx(0.0)
    assert choice_confidence([1.0, 0.0, 0.0, 0.0]) == pytest.approx(1.0)
    # (0.7 - 1/3) / (1 - 1/3) = 0.55
    assert choice_confidence([0.7, 0.2, 0.1]) == pytest.approx(0.55)


def test_score_confidence_formula():
    # D(uniform) is taken around the centre of the scale (jevcompat's formula check):
    # for 3 levels (1 + 0 + 1) / 3 = 2/3. Uniform p: D(p) = 1 around mode 0 -> clipped to 0.
    assert score_confidence([1 / 3, 1 / 3, 1 / 3]) == pytest.approx(0.0, abs=1e-12)
    # mode 0; D(p) = 0.2 + 0.1 * 2 = 0.4 -> 1 - 0.4 / (2/3) = 0.4
    assert score_confidence([0.7, 0.2, 0.1]) == pytest.approx(0.4)
    # mode 1; D(p) = 0.25 + 0.25 = 0.5; D(uniform) = (1+0+1)/3 -> 1 - 0.75 = 0.25
    assert score_confidence([0.25, 0.5, 0.25]) == pytest.approx(0.25)
    assert score_confidence([0.0, 1.0, 0.0]) == pytest.approx(1.0)
    # mode 1; D(p) = 0.1*1 + 0.1*1 = 0.2; D(uniform) = (1+0+1)/3 = 2/3 -> 1 - 0.3 = 0.7
    assert score_confidence([0.1, 0.8, 0.1]) == pytest.approx(0.7)


def test_score_legend():
    q = Score(instructions="urgency", criteria=["low", {"level": "mid"}, "high"])
    assert q.legend() == {"0": "low", "1": "level: mid", "2": "high"}
