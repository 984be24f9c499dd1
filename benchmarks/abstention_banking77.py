"""Abstention and out-of-scope on BANKING77, through the library a user calls.

Two questions, one pass over the data (every request asks all the questions, so each
state is read once):

1. **Decided automatically at 95 % precision.** Thresholds fitted with
   ``clef_engine.runtime.thresholds.fit_rows`` on a validation split carved out of
   train.csv (13 rows per intent, none of them an example), then applied to test rows (16
   per intent, 1,232 rows): the share of test answers at or above the threshold, and their
   accuracy. For the 77-intent question zero-shot (the packaged general model) and taught
   with 10 examples per intent.
2. **Out of scope.** 16 of the 77 intents are held out (drawn with seed 0, listed in the
   JSON): the question has the other 61. Eight held-out intents teach ``none_of_these``
   (100 examples from their train rows); the other eight are the out-of-scope test rows
   (all 320 of their test rows), so the test asks about kinds of out-of-scope input the
   option never saw ("unseen"). The "seen" setting teaches the option with 100 train rows
   of the test's own eight intents. In-scope test rows: 16 per intent (976 rows). The
   margin (``none_below``) is fitted on the validation rows for at most 1 point of
   in-scope cost (``margin_for_cost``); the test reports what it cost there.

Run from the repo root (16 to 30 minutes on 2 shared cores: 9 to 21 to fit the six
questions' prototypes, 7 to 9 to decide 2,425 rows)::

    python -m benchmarks.abstention_banking77 [--cache /tmp/abstention.json]

Writes benchmarks/results/abstention_banking77.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks._common import shared_data, write_result
from clef_engine import Choice, DecisionEngine
from clef_engine.evaluation import columns, label_question, read_records
from clef_engine.runtime.none_of_these import apply_margin, margin_for_cost
from clef_engine.runtime.thresholds import fit_rows
from clef_engine.schema.answers import ChoiceAnswer
from clef_engine.schema.questions import NONE_OF_THESE

SEED = 0
HELD_OUT = 16
EXAMPLES_PER_INTENT = 10
NONE_EXAMPLES = 100
VAL_PER_INTENT = 13
TEST_PER_INTENT = 16
TARGET_PRECISION = 0.95
MAX_VAL_COST = 0.01


def _by_label(texts: list[str], labels: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for text, label in zip(texts, labels, strict=True):
        out[label].append(text)
    return out


def build_splits(rng: random.Random) -> dict[str, Any]:
    data = shared_data() / "banking77"
    train = _by_label(*columns(read_records(data / "train.csv"), "text", "category"))
    test = _by_label(*columns(read_records(data / "test.csv"), "text", "category"))
    intents = sorted(train)
    held = sorted(rng.sample(intents, HELD_OUT))
    oos_teach, oos_test = held[: HELD_OUT // 2], held[HELD_OUT // 2 :]
    in_scope = [i for i in intents if i not in held]
    for rows in train.values():
        rng.shuffle(rows)
    examples = {i: train[i][:EXAMPLES_PER_INTENT] for i in intents}  # the 77-intent question's
    used = dict.fromkeys(intents, EXAMPLES_PER_INTENT)

    def draw_none(group: list[str]) -> list[str]:
        pool = [(i, t) for i in group for t in train[i][used[i] :]]
        rng.shuffle(pool)
        chosen = pool[:NONE_EXAMPLES]
        for i, _ in chosen:
            used[i] += 1
        return [t for _, t in chosen]

    none_unseen = draw_none(oos_teach)
    none_seen = draw_none(oos_test)
    # The validation rows are none of the examples above (each intent's rows were shuffled
    # and the examples taken from the front, so the rows after them are unused).
    val: list[tuple[str, str]] = []
    for i in intents:
        taken = set(examples[i]) | set(none_unseen) | set(none_seen)
        rows = [t for t in train[i] if t not in taken]
        val.extend((t, i) for t in rows[:VAL_PER_INTENT])
    test_rows: list[tuple[str, str]] = []
    for i in intents:
        rows = test[i][:]
        rng.shuffle(rows)
        keep = rows if i in oos_test else rows[:TEST_PER_INTENT]
        test_rows.extend((t, i) for t in keep)
    return {
        "intents": intents,
        "in_scope": in_scope,
        "oos_teach": oos_teach,
        "oos_test": oos_test,
        "examples": examples,
        "none_unseen": none_unseen,
        "none_seen": none_seen,
        "val": val,
        "test": test_rows,
    }


def questions(splits: dict[str, Any]) -> dict[str, Choice]:
    k61 = label_question(splits["in_scope"], {i: splits["examples"][i] for i in splits["in_scope"]})
    criteria = k61.criteria
    return {
        "zero_shot_77": label_question(splits["intents"]),
        "ten_shot_77": label_question(splits["intents"], splits["examples"]),
        "ten_shot_61": k61,
        "none_described": Choice(
            instructions=k61.instructions, criteria=criteria, none_of_these=True
        ),
        "none_unseen": Choice(
            instructions=k61.instructions, criteria=criteria, none_of_these=splits["none_unseen"]
        ),
        "none_seen": Choice(
            instructions=k61.instructions, criteria=criteria, none_of_these=splits["none_seen"]
        ),
    }


def decide_all(
    engine: DecisionEngine, rows: list[tuple[str, str]], asked: dict[str, Choice]
) -> list[dict[str, ChoiceAnswer]]:
    out = []
    batch = 64
    for start in range(0, len(rows), batch):
        chunk = [t for t, _ in rows[start : start + batch]]
        for result in engine.decide_batch(chunk, asked):
            out.append(result.answers)  # type: ignore[arg-type]
        print(f"  {start + len(chunk)}/{len(rows)}", flush=True)
    return out


def abstention(
    name: str,
    question: Choice,
    val: list[tuple[str, str]],
    val_answers: list[dict[str, ChoiceAnswer]],
    test: list[tuple[str, str]],
    test_answers: list[dict[str, ChoiceAnswer]],
) -> dict[str, Any]:
    fit = fit_rows(
        [
            (question, a[name].top_probability(), a[name].choice == y)
            for (_, y), a in zip(val, val_answers, strict=True)
        ],
        target_precision=TARGET_PRECISION,
        min_rows=100,
    )
    t = fit.threshold_for(question)
    assert t is not None
    kept = [(a[name].choice == y) for (_, y), a in zip(test, test_answers, strict=True)]
    probs = [a[name].top_probability() for a in test_answers]
    decided = [k for k, p in zip(kept, probs, strict=True) if p >= t]
    return {
        "threshold": round(t, 5),
        "val_rows": len(val),
        "test_rows": len(test),
        "accuracy_all": round(sum(kept) / len(kept), 4),
        "decided_automatically": round(len(decided) / len(kept), 4),
        "precision_of_decided": round(sum(decided) / len(decided), 4) if decided else None,
    }


def out_of_scope(
    name: str,
    val: list[tuple[str, str]],
    val_answers: list[dict[str, ChoiceAnswer]],
    test: list[tuple[str, str]],
    test_answers: list[dict[str, ChoiceAnswer]],
    in_scope: set[str],
    baseline_accuracy: float,
    margin: bool,
) -> dict[str, Any]:
    def as_rows(rows: list[tuple[str, str]], answers: list[dict[str, ChoiceAnswer]]) -> Any:
        out = []
        for (_, y), a in zip(rows, answers, strict=True):
            probabilities = dict(a[name].probabilities)
            probabilities.setdefault(NONE_OF_THESE, 0.0)  # the threshold-only baseline
            out.append((probabilities, y if y in in_scope else NONE_OF_THESE))
        return out

    below = None
    if margin:
        val_rows = [r for r in as_rows(val, val_answers) if r[1] != NONE_OF_THESE]
        below = margin_for_cost(val_rows, max_in_scope_cost=MAX_VAL_COST)
    right_in = n_in = caught = n_out = 0
    for probabilities, y in as_rows(test, test_answers):
        answer = ChoiceAnswer(choice="", probabilities=probabilities, confidence=0.0)
        answer.choice = max(probabilities, key=probabilities.__getitem__)
        if below is not None:
            apply_margin(answer, below)
        if y == NONE_OF_THESE:
            n_out += 1
            caught += answer.choice == NONE_OF_THESE
        else:
            n_in += 1
            right_in += answer.choice == y
    accuracy = right_in / n_in
    return {
        "none_below": None if below is None else round(below, 5),
        "oos_recall": round(caught / n_out, 4),
        "in_scope_accuracy": round(accuracy, 4),
        "in_scope_cost_points": round(100 * (baseline_accuracy - accuracy), 2),
        "oos_test_rows": n_out,
        "in_scope_test_rows": n_in,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cache",
        metavar="JSON",
        help="keep the answers' probabilities here, and read them back on a rerun (to change "
        "the analysis without deciding again)",
    )
    args = parser.parse_args()
    rng = random.Random(SEED)
    splits = build_splits(rng)
    asked = questions(splits)
    engine = DecisionEngine()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        saved = json.loads(cache.read_text())
        val_answers, test_answers = (
            [{q: ChoiceAnswer(**a) for q, a in row.items()} for row in saved[part]]
            for part in ("val", "test")
        )
        prepare_s, decide_s = saved["prepare_s"], saved["decide_s"]
    else:
        t0 = time.perf_counter()
        for q in asked.values():
            engine.prepare_question(q)
        prepare_s = time.perf_counter() - t0
        print("validation", len(splits["val"]), flush=True)
        t0 = time.perf_counter()
        val_answers = decide_all(engine, splits["val"], asked)
        print("test", len(splits["test"]), flush=True)
        test_answers = decide_all(engine, splits["test"], asked)
        decide_s = time.perf_counter() - t0
        if cache is not None:
            dump = {
                part: [
                    {q: a.model_dump(include={"choice", "probabilities", "confidence"})
                     for q, a in row.items()}
                    for row in answers
                ]
                for part, answers in (("val", val_answers), ("test", test_answers))
            }  # fmt: skip
            cache.write_text(json.dumps({**dump, "prepare_s": prepare_s, "decide_s": decide_s}))
    in_scope = set(splits["in_scope"])
    oos_test = set(splits["oos_test"])
    # The balanced 77-intent test: 16 rows per intent.
    count: dict[str, int] = defaultdict(int)
    balanced = []
    for i, (_, y) in enumerate(splits["test"]):
        if count[y] < TEST_PER_INTENT:
            count[y] += 1
            balanced.append(i)
    test77 = [splits["test"][i] for i in balanced]
    answers77 = [test_answers[i] for i in balanced]
    # The out-of-scope test: in-scope rows and the unseen intents' rows.
    keep = [i for i, (_, y) in enumerate(splits["test"]) if y in in_scope or y in oos_test]
    test_oos = [splits["test"][i] for i in keep]
    answers_oos = [test_answers[i] for i in keep]
    baseline = sum(
        a["ten_shot_61"].choice == y
        for (_, y), a in zip(test_oos, answers_oos, strict=True)
        if y in in_scope
    ) / sum(y in in_scope for _, y in test_oos)
    result: dict[str, Any] = {
        "setup": {
            "seed": SEED,
            "held_out_intents": {"teach_none_of_these": splits["oos_teach"],
                                 "out_of_scope_test": splits["oos_test"]},
            "in_scope_intents": len(splits["in_scope"]),
            "examples_per_intent": EXAMPLES_PER_INTENT,
            "none_of_these_examples": NONE_EXAMPLES,
            "validation_rows": len(splits["val"]),
            "test_rows_77": len(test77),
            "target_precision": TARGET_PRECISION,
            "max_validation_cost": MAX_VAL_COST,
            "model": engine.model_version,
        },
        "abstention": {
            name: abstention(name, asked[name], splits["val"], val_answers, test77, answers77)
            for name in ("zero_shot_77", "ten_shot_77")
        },
        "out_of_scope": {
            "in_scope_accuracy_without_option": round(baseline, 4),
            "threshold_only": out_of_scope(
                "ten_shot_61", splits["val"], val_answers, test_oos, answers_oos,
                in_scope, baseline, margin=True,
            ),
        },
        "timing_s": {"prepare_questions": round(prepare_s, 1), "decide": round(decide_s, 1)},
    }  # fmt: skip
    for name in ("none_described", "none_unseen", "none_seen"):
        for margin in (False, True):
            key = f"{name}{'_with_margin' if margin else ''}"
            result["out_of_scope"][key] = out_of_scope(
                name, splits["val"], val_answers, test_oos, answers_oos, in_scope, baseline, margin
            )
    print(result["abstention"], result["out_of_scope"], sep="\n", flush=True)
    print(write_result("abstention_banking77", result))


if __name__ == "__main__":
    main()
