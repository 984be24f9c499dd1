"""Saved confidence thresholds: the fitting math, the levels, persistence, the answers'
``x_abstained``/``x_threshold`` and the gate helpers."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from clef_agents.fake import FakeEngine
from clef_engine import Choice, Noul
from clef_engine.errors import InvalidRequestError, ModelLoadError
from clef_engine.runtime.thresholds import (
    THRESHOLDS_FILE,
    Thresholds,
    fit_rows,
    fit_threshold,
    fit_thresholds,
    question_key,
)
from clef_engine.schema.answers import ChoiceAnswer

ROUTE = Choice(instructions="Route the ticket", criteria=["billing", "tech", "sales"])


def test_precision_target_keeps_the_most_answers_that_reach_it() -> None:
    conf = [0.9, 0.8, 0.7, 0.6, 0.5]
    right = [True, True, False, True, False]
    # Precision of the top k: 1, 1, 2/3, 3/4, 3/5.
    t = fit_threshold(conf, right, target_precision=0.75)
    assert (t.threshold, t.coverage, t.precision, t.reachable) == (0.6, 0.8, 0.75, True)
    t = fit_threshold(conf, right, target_precision=0.9)
    assert (t.threshold, t.coverage, t.precision) == (0.8, 0.4, 1.0)


def test_ties_are_kept_or_dropped_together() -> None:
    # Cutting between the two 0.7s would reach 100 %, but one threshold cannot split them.
    t = fit_threshold([0.9, 0.7, 0.7], [True, True, False], target_precision=0.9)
    assert (t.threshold, t.coverage) == (0.9, pytest.approx(1 / 3))


def test_coverage_target_keeps_that_share_of_the_most_confident() -> None:
    t = fit_threshold([0.5, 0.9, 0.7, 0.6, 0.8], [True] * 5, target_coverage=0.6)
    assert (t.threshold, t.coverage) == (0.7, 0.6)
    assert fit_threshold([0.5, 0.9], [True, False], target_coverage=1.0).threshold == 0.5


def test_unreachable_precision_decides_only_certain_answers() -> None:
    t = fit_threshold([0.9, 0.8], [False, True], target_precision=0.99)
    assert t.threshold == 1.0 and not t.reachable and t.coverage == 0.0
    assert math.isnan(t.precision)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "target_precision"),
        ({"target_precision": 0.9, "target_coverage": 0.5}, "target_precision"),
        ({"target_precision": 1.5}, "target_precision"),
        ({"target_coverage": 0.0}, "target_coverage"),
    ],
)
def test_bad_targets_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        fit_rows([(ROUTE, 0.9, True)], min_rows=1, **kwargs)
    assert info.value.field == field


def test_too_few_rows_names_min_rows() -> None:
    with pytest.raises(InvalidRequestError, match="min_rows") as info:
        fit_rows([(ROUTE, 0.9, True)] * 5, target_precision=0.9, min_rows=10)
    assert info.value.limit == 10


def _rows(question: Any, n: int, cut: float) -> list[tuple[Any, float, bool]]:
    """``n`` answers spread over [0.3, 1): right exactly when at least ``cut``."""
    return [(question, 0.3 + 0.7 * i / n, 0.3 + 0.7 * i / n >= cut) for i in range(n)]


def test_levels_question_then_bucket_then_type() -> None:
    eight = Choice(criteria=[f"o{i}" for i in range(8)])  # bucket 3, like five options
    rows = _rows(ROUTE, 40, 0.5) + _rows(eight, 20, 0.8)
    fitted = fit_rows(rows, target_precision=1.0, min_rows=30)
    # ROUTE has 40 rows: its own threshold; the 8-option question's 20 do not.
    assert set(fitted.question) == {question_key(ROUTE)}
    assert fitted.threshold_for(ROUTE) == pytest.approx(0.5, abs=0.02)
    assert fitted.names[question_key(ROUTE)].startswith("choice [billing, tech, sales")
    # Option order and instructions do not change a choice's key.
    same = Choice(instructions="Another wording", criteria=["sales", "tech", "billing"])
    assert fitted.lookup(same)[0] == "question"  # type: ignore[index]
    # Bucket 3 has only 20 rows: a 5-option choice falls back to the type (all 60 rows).
    five = Choice(criteria=[f"x{i}" for i in range(5)])
    level, t = fitted.lookup(five)  # type: ignore[misc]
    assert level == "type" and t.n == 60
    # Bucket 2 (3..4 options) has ROUTE's 40 rows: a new 4-option choice uses them.
    four = Choice(criteria=["a", "b", "c", "d"])
    assert fitted.lookup(four)[0] == "bucket"  # type: ignore[index]
    # Nothing was fitted for yes/no questions.
    assert fitted.threshold_for(Noul(instructions="Is it urgent?")) is None


def test_yes_no_questions_are_told_apart_by_their_instructions() -> None:
    urgent, angry = Noul(instructions="Is it urgent?"), Noul(instructions="Is it angry?")
    assert question_key(urgent) != question_key(angry)
    fitted = fit_rows(_rows(urgent, 10, 0.9), target_precision=1.0, min_rows=10)
    assert fitted.lookup(urgent)[0] == "question"  # type: ignore[index]
    assert fitted.lookup(angry)[0] == "bucket"  # type: ignore[index]


def test_round_trip_through_json_and_a_directory(tmp_path: Path) -> None:
    fitted = fit_rows(
        _rows(ROUTE, 50, 0.6),
        target_precision=0.9,
        min_rows=10,
        model_version="m@1",
        source="held-out",
    )
    fitted.save(tmp_path)
    data = json.loads((tmp_path / THRESHOLDS_FILE).read_text())
    assert data["target"] == {"precision": 0.9} and data["model_version"] == "m@1"
    loaded = Thresholds.load(tmp_path)
    assert loaded is not None
    assert loaded.question == fitted.question and loaded.type == fitted.type
    assert loaded.threshold_for(ROUTE) == fitted.threshold_for(ROUTE)
    assert Thresholds.load(tmp_path / "nowhere") is None


def test_precision_over_no_answer_survives_json(tmp_path: Path) -> None:
    fitted = fit_rows([(ROUTE, 0.9, False)] * 3, target_precision=0.9, min_rows=3)
    fitted.save(tmp_path)  # NaN precision: written as null, read back as NaN
    assert "NaN" not in (tmp_path / THRESHOLDS_FILE).read_text()
    loaded = Thresholds.load(tmp_path)
    assert loaded is not None and math.isnan(loaded.type["choice"].precision)
    assert not loaded.type["choice"].reachable


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ('{"type": {"choice": {"threshold": 1.5}}}', "type.choice.threshold"),
        ('{"question": []}', "question"),
        ('{"format_version": 9}', "format_version"),
        ("[1, 2]", "(top level)"),
    ],
)
def test_a_bad_file_names_its_field(tmp_path: Path, content: str, field: str) -> None:
    (tmp_path / THRESHOLDS_FILE).write_text(content)
    with pytest.raises(ModelLoadError) as info:
        Thresholds.load(tmp_path)
    assert info.value.field == field


def test_not_json_is_a_model_load_error(tmp_path: Path) -> None:
    (tmp_path / THRESHOLDS_FILE).write_text("{oops")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        Thresholds.load(tmp_path)


def _answer(p: float, **extra: Any) -> ChoiceAnswer:
    return ChoiceAnswer(
        choice="a", probabilities={"a": p, "b": 1 - p}, confidence=2 * p - 1, **extra
    )


def test_fake_engine_answers_carry_the_saved_threshold() -> None:
    fake = FakeEngine(fixed={"r": "billing"}, fixed_probability=0.6)
    assert "x_abstained" not in fake.decide("x", {"r": ROUTE}).to_wire()["answers"]["r"]
    fake.thresholds = fit_rows(_rows(ROUTE, 20, 0.65), target_precision=1.0, min_rows=5)
    t = fake.thresholds.threshold_for(ROUTE)
    assert t is not None and 0.6 < t < 0.7
    wire = fake.decide("x", {"r": ROUTE}).to_wire()["answers"]["r"]
    assert wire["x_abstained"] is True and wire["x_threshold"] == t
    fake.fixed_probability = 0.9
    wire = fake.decide("x", {"r": ROUTE}).to_wire()["answers"]["r"]
    assert wire["x_abstained"] is False


def test_a_router_without_min_confidence_follows_the_saved_threshold() -> None:
    pytest.importorskip("langchain_core")
    from clef_agents.langchain import ClefRouter

    fake = FakeEngine(fixed={"route": "billing"}, fixed_probability=0.6)
    fake.thresholds = fit_rows(_rows(ROUTE, 20, 0.65), target_precision=1.0, min_rows=5)
    router = ClefRouter(
        ROUTE,
        routes={"billing": lambda x: "B", "tech": lambda x: "T", "sales": lambda x: "S"},
        default=lambda x: "human",
        engine=fake,
        return_decision=True,
    )
    for probability in (0.6, 0.9):
        fake.fixed_probability = probability
        out = router.invoke("anything")
        abstained = out["decision"].answers["route"].x_abstained
        assert abstained is (probability == 0.6)
        assert out["output"] == ("human" if abstained else "B")


def test_fit_thresholds_on_a_csv_reaches_its_target(tmp_path: Path) -> None:
    fake = FakeEngine()
    question = Choice(criteria={"billing": "refund invoice", "tech": "bug crash error"})
    rows = ["text,label"]
    for i in range(60):
        rows.append(f"refund invoice number {i},billing")
        rows.append(f"app crash {i},tech")
        rows.append(f"refund crash {i},billing")  # ambiguous: overlap with both
    path = tmp_path / "heldout.csv"
    path.write_text("\n".join(rows) + "\n")
    fitted = fit_thresholds(
        fake, path, target_precision=0.95, min_rows=50, questions={"label": question}
    )
    t = fitted.threshold_for(question)
    assert t is not None and fitted.lookup(question)[0] == "question"  # type: ignore[index]
    # Re-decide every row: the answers kept are as accurate as the report says, >= 95 %.
    kept = right = 0
    for line in rows[1:]:
        text, label = line.rsplit(",", 1)
        answer = fake.decide(text, {"q": question}).answers["q"]
        if answer.top_probability() >= t:
            kept += 1
            right += answer.choice == label  # type: ignore[union-attr]
    assert kept / 180 == pytest.approx(fitted.question[question_key(question)].coverage)
    assert right / kept >= 0.95
    assert 0 < kept < 180  # the ambiguous third is not all decided
    assert fitted.source.endswith("(180 labelled answers)")


def test_engine_round_trip_saves_loads_and_marks_answers(tmp_path: Path, tiny_engine: Any) -> None:
    from clef_engine import DecisionEngine

    tiny_engine.save_pretrained(tmp_path / "plain")
    assert not (tmp_path / "plain" / THRESHOLDS_FILE).exists()
    plain = DecisionEngine.from_pretrained(tmp_path / "plain")
    assert plain.thresholds is None
    answer = plain.decide("my card has not arrived", {"r": ROUTE}).answers["r"]
    assert answer.x_abstained is None and "x_threshold" not in answer.model_dump(exclude_none=True)
    # Thresholds that put the cut in the middle of this engine's answers.
    probs = [
        plain.decide(s, {"r": ROUTE}).answers["r"].top_probability()
        for s in ("refund please", "login bug", "hello", "pin blocked", "cash top up")
    ]
    cut = sorted(probs)[2]
    plain.thresholds = fit_rows(
        [(ROUTE, p, p >= cut) for p in probs],
        target_precision=1.0,
        min_rows=5,
        model_version=plain.model_version,
    )
    plain.save_pretrained(tmp_path / "saved")
    loaded = DecisionEngine.from_pretrained(tmp_path / "saved")
    assert loaded.thresholds is not None and loaded.thresholds.threshold_for(ROUTE) == cut
    results = loaded.decide_batch(["refund please", "login bug", "hello"], {"r": ROUTE})
    for result in results:
        answer = result.answers["r"]
        assert answer.x_threshold == cut
        assert answer.x_abstained is (answer.top_probability() < cut)
    assert {r.answers["r"].x_abstained for r in results} == {True, False}
    # Saving it again without thresholds removes the stale file.
    loaded.thresholds = None
    loaded.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / THRESHOLDS_FILE).exists()


def test_thresholds_of_another_model_version_warn(
    tmp_path: Path, tiny_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from clef_engine import DecisionEngine

    tiny_engine.save_pretrained(tmp_path)
    fit_rows(_rows(ROUTE, 10, 0.5), target_precision=0.9, min_rows=5, model_version="x@0").save(
        tmp_path
    )
    with caplog.at_level(logging.WARNING, logger="clef_engine.runtime.thresholds"):
        loaded = DecisionEngine.from_pretrained(tmp_path)
    assert loaded.thresholds is not None
    assert "fitted for x@0" in caplog.text
