"""End to end on the packaged all-MiniLM-L6-v2 with BANKING77 rows (no network)."""

from __future__ import annotations

import json

import pytest

from clef_engine import Choice, DecisionEngine, Noul
from clef_engine.evaluation import columns, label_question, read_records, sample_examples

pytestmark = pytest.mark.integration

# Clear rows of BANKING77 test.csv, with their gold intent.
CLEAR_ROWS = [
    ("I need to know your exchange rates.", "exchange_rate"),
    ("the card payment exchange rate is wrong", "card_payment_wrong_exchange_rate"),
    ("Do you support all fiat currencies?", "fiat_currency_support"),
    ("I can't get my card to work.", "card_not_working"),
    ("My withdrawl is still pending.  Why?", "pending_cash_withdrawal"),
    ("I can't find my card and think it may have been stolen.", "lost_or_stolen_card"),
]


@pytest.fixture(scope="module")
def intents(banking77_dir):
    return json.loads((banking77_dir / "categories.json").read_text())


def test_zero_shot_top_choice_on_clear_rows(engine, banking77_dir, intents):
    test_texts, test_labels = columns(read_records(banking77_dir / "test.csv"), "text", "category")
    gold = dict(zip(test_texts, test_labels))
    question = {"intent": label_question(intents)}
    results = engine.decide_batch([t for t, _ in CLEAR_ROWS], question)
    for (text, label), result in zip(CLEAR_ROWS, results):
        assert gold[text] == label  # the rows really are from the test split
        answer = result.answers["intent"]
        assert answer.choice == label, text
        assert len(answer.probabilities) == 77
        assert answer.probabilities[label] > 1 / 77


def test_ten_shot_prototypes_from_train(engine, banking77_dir, intents):
    texts, labels = columns(read_records(banking77_dir / "train.csv"), "text", "category")
    examples, _ = sample_examples(texts, labels, 10, seed=0)
    question = {"intent": label_question(intents, examples)}
    results = engine.decide_batch([t for t, _ in CLEAR_ROWS], question)
    correct = sum(r.answers["intent"].choice == label for r, (_, label) in zip(results, CLEAR_ROWS))
    assert correct >= len(CLEAR_ROWS) - 1


def test_ten_shot_prototypes_keep_a_cross_fitted_memory(engine, banking77_dir, intents):
    import torch

    texts, labels = columns(read_records(banking77_dir / "train.csv"), "text", "category")
    examples, _ = sample_examples(texts, labels, 10, seed=1)
    question = label_question(intents, examples)
    prepared = engine.prepare_question(question)
    memory = prepared.memory
    # 770 examples + 77 option texts, each voted on by the other folds; on these base
    # vectors the vote lowered the out-of-fold NLL, so the memory is kept.
    assert memory is not None and len(memory) == 770 + 77
    assert 0 < memory.settings.lam <= 1
    state = CLEAR_ROWS[0][0]
    answer = engine.decide(state, {"intent": question}).answers["intent"]
    # Options taught by examples are fitted on the bare model's vectors (examples_engine).
    pooled = engine.examples_engine().backbone.encode([state]).pooled.float()
    alone = torch.softmax(prepared.classifier.logits(pooled).double(), -1)
    mixed = memory.mix(alone, pooled, prepared.names)[0]
    got = torch.tensor([answer.probabilities[n] for n in prepared.names], dtype=torch.float64)
    assert torch.allclose(got, mixed, atol=1e-5)
    assert not torch.allclose(got, alone[0], atol=1e-3)


def test_int8_agrees_with_fp32_on_clear_rows(intents):
    int8 = DecisionEngine(quantize="int8")
    question = {"intent": label_question(intents)}
    for text, label in CLEAR_ROWS[:4]:
        assert int8.decide(text, question).answers["intent"].choice == label


def test_noul_and_small_choices_behave(engine):
    stolen = Noul(instructions="Is the customer reporting a lost or stolen card?")
    yes = engine.decide("Someone stole my wallet with my card in it", {"q": stolen})
    no = engine.decide("What is your exchange rate for euros?", {"q": stolen})
    assert yes.answers["q"].noul > no.answers["q"].noul
    assert yes.answers["q"].noul > 0.5 > no.answers["q"].noul
    route = Choice(
        instructions="Route the ticket",
        criteria={
            "billing": "payments, refunds, invoices",
            "technical": "the app crashes, errors, bugs",
            "sales": "buying, pricing, upgrades",
        },
    )
    result = engine.decide("The app crashes every time I open it", {"route": route})
    assert result.answers["route"].choice == "technical"


def test_long_log_state_is_windowed(engine):
    log = "\n".join(f"2026-11-30 12:00:{i % 60:02d} INFO request ok id={i}" for i in range(400))
    log += "\nERROR database connection refused, service unavailable"
    q = {
        "incident": Choice(
            instructions="What happened?",
            criteria={"outage": "a service failure or error", "normal": "routine operation"},
        )
    }
    result = engine.decide(log, q)
    assert result.x_windows > 5
    assert sum(result.answers["incident"].probabilities.values()) == pytest.approx(1.0)
