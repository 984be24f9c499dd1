"""Training data: both layouts, and specific errors for unusable data."""

from __future__ import annotations

import json

import pytest

from clef_engine.errors import InvalidRequestError
from clef_engine.train.data import (
    TrainingDataError,
    load_eval_data,
    load_training_data,
    load_unlabeled,
    sample_per_label,
    split,
    split_indices,
)


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_text_label_csv_becomes_one_choice_question(tmp_path) -> None:
    path = write(tmp_path, "d.csv", "text,category\nhi,a\nyo,b\nhey,a\n")
    data = load_training_data(path)
    assert list(data.questions) == ["category"]
    assert data.names("category") == ["a", "b"]
    assert [ex.labels["category"] for ex in data.examples] == [0, 1, 0]


def test_several_questions_per_state_jsonl(tmp_path) -> None:
    rows = [
        {"state": {"msg": "refund please"}, "question": "route", "label": "billing"},
        {"state": {"msg": "refund please"}, "question": "urgent", "label": "yes"},
        {"state": {"msg": "site down"}, "question": "route", "label": "tech"},
        {"state": {"msg": "site down"}, "question": "urgent", "label": "no"},
        {"state": {"msg": "site down"}, "question": "level", "label": "high"},
        {"state": {"msg": "refund please"}, "question": "level", "label": "0"},
    ]
    path = write(tmp_path, "d.jsonl", "\n".join(json.dumps(r) for r in rows))
    questions = {
        "route": {"type": "choice", "instructions": "Route", "criteria": ["billing", "tech"]},
        "urgent": {"type": "noul", "instructions": "Urgent?"},
        "level": {"type": "score", "instructions": "Severity", "criteria": ["low", "high"]},
    }
    data = load_training_data(path, questions=questions)
    assert len(data) == 2  # merged by state
    assert data.examples[0].labels == {"route": 0, "urgent": 0, "level": 0}
    assert data.examples[1].labels == {"route": 1, "urgent": 1, "level": 1}
    assert data.examples[0].state == "msg: refund please"


def test_empty_data_is_refused(tmp_path) -> None:
    with pytest.raises(TrainingDataError, match="no labelled rows"):
        load_training_data(write(tmp_path, "d.csv", "text,label\n"))
    with pytest.raises(TrainingDataError, match="no such file"):
        load_training_data(tmp_path / "missing.csv")


def test_one_label_is_refused(tmp_path) -> None:
    with pytest.raises(
        TrainingDataError, match=r"only one label \('a'\); training needs at least 2"
    ):
        load_training_data(write(tmp_path, "d.csv", "text,label\nx,a\ny,a\n"))


def test_unknown_labels_in_eval_data_are_refused(tmp_path) -> None:
    train = load_training_data(write(tmp_path, "t.csv", "text,label\nx,a\ny,b\n"))
    path = write(tmp_path, "e.csv", "text,label\nx,a\nz,zebra\n")
    with pytest.raises(TrainingDataError, match="row 2: label 'zebra' is not an option") as info:
        load_eval_data(path, train.questions)
    assert info.value.field == "data.rows[2].label"
    assert isinstance(info.value, InvalidRequestError)


def test_missing_column_and_empty_cells(tmp_path) -> None:
    with pytest.raises(TrainingDataError, match="cannot find the label column"):
        load_training_data(write(tmp_path, "d.csv", "text,foo\nx,a\n"))
    with pytest.raises(TrainingDataError, match="no label column 'cat'"):
        load_training_data(write(tmp_path, "d.csv", "text,label\nx,a\n"), label_col="cat")
    with pytest.raises(TrainingDataError, match="row 2 has an empty 'label'"):
        load_training_data(write(tmp_path, "d.csv", "text,label\nx,a\ny,\n"))


def test_noul_and_score_labels(tmp_path) -> None:
    path = write(tmp_path, "d.csv", "text,label\nx,yes\ny,maybe\n")
    with pytest.raises(TrainingDataError, match="'maybe' is not an option"):
        load_training_data(path, questions={"q": {"type": "noul", "instructions": "ok?"}})


def test_sample_per_label_and_stratified_split(tmp_path) -> None:
    lines = ["text,label"] + [f"t{i},{'abc'[i % 3]}" for i in range(60)]
    data = load_training_data(write(tmp_path, "d.csv", "\n".join(lines)))
    few = sample_per_label(data, 4, seed=1)
    assert len(few) == 12
    assert sample_per_label(data, 4, seed=1).examples == few.examples
    train, val = split(data, 0.2, seed=0)
    assert len(val) == 12 and len(train) == 48
    assert sorted({ex.labels["label"] for ex in val.examples}) == [0, 1, 2]
    assert not {ex.state for ex in val.examples} & {ex.state for ex in train.examples}
    with pytest.raises(TrainingDataError, match="at least 1"):
        sample_per_label(data, 0)


def test_a_split_sharing_part_of_another_seeds_split(tmp_path) -> None:
    lines = ["text,label"] + [f"t{i},{'abc'[i % 3]}" for i in range(300)]
    data = load_training_data(write(tmp_path, "d.csv", "\n".join(lines)))
    base = split_indices(data, 0.2, seed=0)
    assert split(data, 0.2, seed=0)[1].examples == data.subset(base[1]).examples
    assert split_indices(data, 0.2, seed=0, base_seed=0, shared=0.5) == base
    assert split_indices(data, 0.2, seed=3, base_seed=0, shared=1.0) == base
    assert split_indices(data, 0.2, seed=3, base_seed=0, shared=0.0) == split_indices(
        data, 0.2, seed=3
    )
    train, val = split_indices(data, 0.2, seed=3, base_seed=0, shared=0.5)
    assert len(val) == len(base[1]) == 60 and sorted(train + val) == list(range(300))
    # Per label: ceil(0.5 * 20) = 10 of the base split's states, the other 10 its own.
    for label in range(3):
        mine = [i for i in val if data.examples[i].labels["label"] == label]
        theirs = [i for i in base[1] if data.examples[i].labels["label"] == label]
        assert len(mine) == 20 and 10 <= len(set(mine) & set(theirs)) < 20
    with pytest.raises(ValueError, match=r"shared must be in \[0, 1\]; got 1.5"):
        split_indices(data, 0.2, seed=3, base_seed=0, shared=1.5)


def test_length_grouped_batches_hold_every_state_once_and_pad_less() -> None:
    import random

    from clef_engine.train.trainer import _batches

    rng = random.Random(0)
    lengths = [rng.randrange(4, 80) for _ in range(1000)]
    plain = _batches(1000, 32, random.Random(1))
    grouped = _batches(1000, 32, random.Random(1), lengths)
    for batches in (plain, grouped):
        assert sorted(i for b in batches for i in b) == list(range(1000))
        assert all(1 <= len(b) <= 32 for b in batches)

    def padded(batches: list[list[int]]) -> int:
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)

    assert padded(grouped) < 0.6 * padded(plain)
    longest = [max(lengths[i] for i in b) for b in grouped]
    assert longest != sorted(longest, reverse=True)  # batch order is shuffled
    assert _batches(1000, 32, random.Random(2), lengths) != grouped  # new epoch, new grouping


def test_unlabelled_states_are_read_once_each_and_bad_files_are_named(tmp_path) -> None:
    path = write(tmp_path, "u.csv", "text,label\nlost card,x\nfee?,\nlost card,y\n")
    assert load_unlabeled(path) == ["lost card", "fee?"]  # labels ignored, repeats kept once
    lines = [json.dumps({"utterance": "a"}), json.dumps({"utterance": "b", "other": 1})]
    assert load_unlabeled(write(tmp_path, "u.jsonl", "\n".join(lines))) == ["a", "b"]
    with pytest.raises(TrainingDataError, match="no unlabelled rows") as info:
        load_unlabeled(write(tmp_path, "e.csv", "text\n"))
    assert info.value.field == "unlabeled"
    with pytest.raises(TrainingDataError, match="row 2 has an empty 'text'") as info:
        load_unlabeled(write(tmp_path, "b.csv", "text\nfine\n  \n"))
    assert info.value.field == "unlabeled.rows[2].text"
    other = write(tmp_path, "o.csv", "text,body\nignored,a\nskipped,b\n")
    assert load_unlabeled(other, text_col="body") == ["a", "b"]  # the column asked for
    with pytest.raises(TrainingDataError, match="no text column 'body'") as info:
        load_unlabeled(path, text_col="body")
    assert info.value.field == "unlabeled.body"
    with pytest.raises(TrainingDataError, match="no such file") as info:
        load_unlabeled(tmp_path / "missing.csv")
    assert info.value.field == "unlabeled"
    with pytest.raises(TrainingDataError, match=r"not valid JSON \(line 1") as info:
        load_unlabeled(write(tmp_path, "u.json", '[{"text": "a"'))
    assert info.value.field == "unlabeled"
