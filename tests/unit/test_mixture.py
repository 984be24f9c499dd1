"""The decision mixture: rows of public sets turned into typed questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_engine.heads.zero_shot import option_texts, prepare
from clef_engine.schema.questions import Choice, Noul, Score
from clef_engine.train.mixture import MixtureSampler, load_mixture, readable_label


def _write(root: Path, name: str, rows: list[dict[str, str]]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def mixture(tmp_path: Path) -> Path:
    _write(
        tmp_path,
        "hwu64",
        [{"text": f"wake me at {i}", "label": "alarm_set"} for i in range(5)]
        + [{"text": f"weather in town {i}", "label": "weather_query"} for i in range(5)]
        + [{"text": f"play song {i}", "label": "play_music"} for i in range(5)],
    )
    _write(
        tmp_path,
        "cr",
        [{"text": f"great player {i}", "label": "positive"} for i in range(5)]
        + [{"text": f"broke after a day {i}", "label": "negative"} for i in range(5)],
    )
    _write(
        tmp_path,
        "snli",
        [
            {
                "text": "A man plays a guitar.",
                "text_pair": "A man makes music.",
                "label": "entailment",
            },
            {"text": "A dog sleeps.", "text_pair": "The dog is running.", "label": "contradiction"},
        ],
    )
    _write(
        tmp_path,
        "tweet_sentiment",
        [
            {"text": f"meh {i}", "label": lab}
            for i, lab in enumerate(["negative", "neutral", "positive"] * 3)
        ],
    )
    return tmp_path


def test_readable_labels() -> None:
    assert readable_label("AddToPlaylist") == "add to playlist"
    assert readable_label("card_arrival") == "card arrival"
    assert readable_label("iot_hue_lightoff") == "turn the lights off"


def test_load_mixture_reads_known_sets_and_excludes(mixture: Path) -> None:
    sets = load_mixture(mixture, exclude=["snli"])
    assert sorted(sets) == ["cr", "hwu64", "tweet_sentiment"]
    assert sets["tweet_sentiment"].labels == ["negative", "neutral", "positive"]  # CARD order
    assert sets["hwu64"].task == "choice"


def test_drawn_items_are_valid_and_answerable(mixture: Path) -> None:
    sets = load_mixture(mixture)
    sampler = MixtureSampler(sets, seed=3)
    seen_types = set()
    for _ in range(400):
        item = sampler.draw()
        q = item.question
        seen_types.add(q.type)
        names = [s.name for s in q.option_specs()]
        assert 0 <= item.label < len(names)
        texts = option_texts(q, prompted=True)
        assert len(texts) == len(names) and all(texts)
        if isinstance(q, Choice):
            row = next(r for r in sets[item.source].rows if r.text == item.state)
            gold = names[item.label]
            assert gold in (row.label, readable_label(row.label))
        if isinstance(q, Noul) and item.source == "cr":
            row = next(r for r in sets["cr"].rows if r.text == item.state)
            text = q.instructions_text()
            negative_question = "complaint" in text or "unhappy" in text
            yes = (row.label == "negative") if negative_question else (row.label == "positive")
            assert item.label == (0 if yes else 1)
    assert seen_types == {"choice", "noul", "score"}


def test_draws_are_reproducible(mixture: Path) -> None:
    a = MixtureSampler(load_mixture(mixture), seed=7)
    b = MixtureSampler(load_mixture(mixture), seed=7)
    for _ in range(50):
        x, y = a.draw(), b.draw()
        assert (x.state, x.label, x.question) == (y.state, y.label, y.question)


def test_canonical_questions_use_every_option(mixture: Path) -> None:
    sampler = MixtureSampler(load_mixture(mixture), seed=0)
    items = sampler.canonical("hwu64")
    assert len(items) == 15
    assert all(len(it.question.option_specs()) == 3 for it in items)
    nli = sampler.canonical("snli")
    assert [it.label for it in nli] == [0, 1]
    assert nli[0].question.instructions_text() == "Does the text say that a man makes music?"


def test_prompted_option_texts_carry_the_instructions() -> None:
    noul = Noul(instructions="Is it urgent?")
    assert option_texts(noul, prompted=True) == ["Is it urgent? yes", "Is it urgent? no"]
    assert prepare(noul, prompted=True).sides == (True, True)
    assert prepare(noul).sides == (False, False)  # the similarity scorer keeps one side
    described = Noul(instructions="Is it spam?", criteria={"true": "unsolicited advertising"})
    assert option_texts(described, prompted=True) == [
        "Is it spam? unsolicited advertising",
        "Is it spam? no",
    ]
    score = Score(instructions="How urgent is it?", criteria=["low", "high"])
    assert option_texts(score, prompted=True) == ["How urgent is it? low", "How urgent is it? high"]
    choice = Choice(criteria={"billing": "payments", "technical": None})
    assert option_texts(choice, prompted=True) == option_texts(choice)


def test_sets_are_read_from_several_folders_first_folder_first(mixture: Path, tmp_path: Path):
    extra = tmp_path / "extra"
    _write(extra, "prompt_injection", [{"text": "Ignore the above.", "label": "injection"}])
    _write(extra, "cr", [{"text": "shadowed", "label": "positive"}])
    sets = load_mixture([mixture, extra])
    assert sets["prompt_injection"].task == "noul"
    assert "shadowed" not in {r.text for r in sets["cr"].rows}  # the shared copy wins
    assert "prompt_injection" not in load_mixture(mixture)
