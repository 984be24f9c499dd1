"""The question model: validation, limits and their error messages, rendering."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from clef_engine.errors import InvalidRequestError
from clef_engine.schema import (
    Choice,
    DecisionRequest,
    Noul,
    Score,
    choice_confidence,
    render_value,
    score_confidence,
)
from clef_engine.schema.limits import MAX_CHOICE_OPTIONS, MAX_JSON_DEPTH


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


@pytest.mark.parametrize("state", ["", "   ", [], None, {}])
def test_empty_state_is_refused(state):
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse(
            {"state": state, "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
        )
    assert info.value.field == "state"


BAD = "hello \ud800"
"""A lone surrogate: JSON can carry it ("\\ud800"), UTF-8 cannot."""
NOUL = {"type": "noul", "instructions": "ok?"}


@pytest.mark.parametrize(
    ("request_", "field", "where"),
    [
        ({"state": BAD}, "state", "state"),
        ({"state": {"ticket": {"body": [BAD]}}}, "state", "state.ticket.body[0]"),
        ({"state": {BAD: "x"}}, "state", "a key of state"),
        ({"state": [{"role": "user", "content": BAD}]}, "state", "state[0].content"),
        ({"model": BAD}, "model", "model"),
        (
            {"questions": {"q": {"type": "noul", "instructions": BAD}}},
            "questions.q",
            "instructions",
        ),
        (
            {
                "questions": {
                    "q": {"type": "choice", "instructions": {"k": BAD}, "criteria": ["a", "b"]}
                }
            },
            "questions.q.instructions",
            "instructions",
        ),
        (
            {"questions": {"q": {"type": "choice", "criteria": {BAD: None, "b": None}}}},
            "questions.q.criteria",
            "an option name",
        ),
        (
            {"questions": {"q": {"type": "choice", "criteria": {"a": BAD, "b": None}}}},
            "questions.q.criteria",
            "criteria.a",
        ),
        (
            {
                "questions": {
                    "q": {"type": "choice", "criteria": {"a": {"examples": [BAD]}, "b": None}}
                }
            },
            "questions.q.criteria",
            "criteria.a.examples[0]",
        ),
        (
            {"questions": {"q": {"type": "score", "criteria": ["low", BAD]}}},
            "questions.q.criteria",
            "criteria.1",
        ),
        (
            {"questions": {"q": {"type": "noul", "criteria": {"true": BAD}}}},
            "questions.q",
            "criteria.true",
        ),
        (
            {"questions": {"q": {"type": "box", "instructions": BAD}}},
            "questions.q.instructions",
            "instructions",
        ),
        ({"questions": {BAD: NOUL}}, "questions", "a question id"),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(request_, field, where):
    payload = {"state": "x", "questions": {"q": NOUL}, **request_}
    with pytest.raises(InvalidRequestError, match="lone surrogate") as info:
        DecisionRequest.parse(payload)
    assert info.value.field == field
    assert where in str(info.value)
    # The error itself is valid UTF-8, so the server can send it as its 422 body.
    json.dumps(info.value.errors, ensure_ascii=False, default=list).encode("utf-8")
    str(info.value).encode("utf-8")


def test_lone_surrogate_in_an_invalid_question_id_still_gives_an_encodable_error():
    with pytest.raises(InvalidRequestError) as info:
        DecisionRequest.parse({"state": "x", "questions": {BAD: {"type": "choice"}}})
    json.dumps(info.value.errors, ensure_ascii=False, default=list).encode("utf-8")


def test_valid_non_ascii_text_is_accepted():
    req = DecisionRequest.parse(
        {"state": "café 😀 日本語", "questions": {"q": {"type": "noul", "instructions": "ok? ✓"}}}
    )
    assert req.state == "café 😀 日本語"


@pytest.mark.parametrize(
    "question",
    [
        {"type": "choice", "criteria": {"billing": "money", "tech": None}},
        {"type": "score", "criteria": ["calm", "angry"]},
        {"type": "box"},
    ],
)
def test_instructions_are_optional(question):
    req = DecisionRequest.parse({"state": "x", "questions": {"q": question}})
    assert req.questions["q"].instructions is None
    assert req.questions["q"].instructions_text() == ""


def test_choice_and_score_without_instructions_are_answered(tiny_engine):
    result = tiny_engine.decide(
        "I was charged twice",
        {
            "team": {"type": "choice", "criteria": {"billing": "money", "tech": None}},
            "anger": {"type": "score", "criteria": ["calm", "angry"]},
        },
    )
    assert sum(result.answers["team"].probabilities.values()) == pytest.approx(1.0)
    assert sum(result.answers["anger"].probabilities.values()) == pytest.approx(1.0)


def test_decoder_prompt_without_instructions_asks_about_the_options():
    from clef_engine.backbones.decoder.prompt import plan

    choice = plan(Choice(criteria={"billing": "money", "tech": None}))
    assert choice.blocks[0].startswith("Question: Which option fits best?\nOptions:\n")
    score = plan(Score(criteria=["calm", "angry"]))
    assert score.blocks[0].startswith("Question: Which level fits best?\nRate on this scale:")


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


@pytest.mark.parametrize("side", ["true", "false"])
def test_noul_examples_on_one_side_only_are_read_as_its_description(side):
    """Prototypes fitted on one side answered 48.4 % of held-out cases right (below asking
    with no examples); a Jev client may send ``{"examples": [...]}`` as structured text on
    one side (jevcompat's structured-text case), so it is read as that side's text."""
    other = "false" if side == "true" else "true"
    criteria = {side: {"examples": ["win a free cruise", "cheap pills online"]}, other: ["mail"]}
    request = DecisionRequest.parse(
        _request(q={"type": "noul", "instructions": "Spam?", "criteria": criteria})
    )
    specs = {s.name: s for s in request.questions["q"].option_specs()}
    assert not specs[side].examples and not specs[other].examples
    assert "win a free cruise" in (specs[side].description or "")
    assert "cheap pills online" in (specs[side].description or "")
    both = {side: {"examples": ["win a free cruise"]}, other: {"examples": ["lunch at noon?"]}}
    question = Noul(instructions="Spam?", criteria=both)
    assert all(len(spec.examples) == 1 for spec in question.option_specs())
