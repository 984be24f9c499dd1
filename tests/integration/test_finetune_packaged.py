"""A short run on the packaged MiniLM moves predictions the way the labels say."""

from __future__ import annotations

import pytest

from clef_engine import Choice, DecisionEngine
from clef_engine.train import Example, TrainConfig, Trainer, TrainingSet

pytest.importorskip("peft")
pytestmark = [pytest.mark.slow, pytest.mark.integration]

# Option names that carry no meaning: zero-shot cannot know which is which.
QUESTION = Choice(instructions="Which queue?", criteria=["queue_a", "queue_b"])
CARD = [
    "my card has not arrived yet",
    "when will my new card be delivered",
    "I still haven't received my card",
    "how long does card delivery take",
    "card delivery is late",
    "where is the card you sent me",
]
RATES = [
    "what exchange rate do you use",
    "the currency conversion rate was bad",
    "how is the exchange rate calculated",
    "why was my euro to dollar rate so poor",
    "do you add a margin to exchange rates",
    "which rate applies when I pay abroad",
]


def test_a_few_examples_move_predictions_the_right_way(engine, tmp_path) -> None:
    examples = [Example(t, {"route": 0}) for t in CARD] + [Example(t, {"route": 1}) for t in RATES]
    data = TrainingSet({"route": QUESTION}, examples, "handful")
    probe_card, probe_rate = "my card never came in the post", "is your currency rate fair"

    def p_a(e: DecisionEngine, text: str) -> float:
        return e.decide(text, {"route": QUESTION}).answers["route"].probabilities["queue_a"]

    before = p_a(engine, probe_card), p_a(engine, probe_rate)
    config = TrainConfig(
        epochs=8, lora_rank=4, batch_size=6, val_fraction=0.0, lr=1e-3, progress=False
    )
    Trainer(config).fit(data, tmp_path)
    tuned = DecisionEngine.from_pretrained(tmp_path, device="cpu")
    after = p_a(tuned, probe_card), p_a(tuned, probe_rate)
    assert after[0] > before[0] and after[0] > 0.5
    assert after[1] < before[1] and after[1] < 0.5
